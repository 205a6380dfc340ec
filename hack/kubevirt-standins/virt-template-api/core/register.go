// Package api is a stand-in for kubevirt.io/virt-template-api/core v0.2.0,
// whose module zip the Go module proxy refuses (see
// hack/kubevirt-standins/README.md). It declares only the names
// kubevirt.io/kubevirt v1.9.0 compiles against, with the upstream values.
package api

const (
	// GroupName is the API group of VirtualMachineTemplate.
	GroupName = "template.kubevirt.io"

	SingularResourceName = "virtualmachinetemplate"
	PluralResourceName   = SingularResourceName + "s"
)
