// Package crds holds the CustomResourceDefinitions (KubeVirt's
// VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceReplicaSet,
// VirtualMachinePool and instancetypes, CDI's DataVolume) that envtest
// installs. They are generated, with KubeVirt's real OpenAPI schemas, by
// hack/crdgen.
package crds

import "embed"

//go:generate go run ../../hack/crdgen -out .

// FS holds the CRD YAML files.
//
//go:embed *.yaml
var FS embed.FS
