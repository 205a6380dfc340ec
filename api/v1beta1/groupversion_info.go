// Package v1beta1 holds the bmc.virtmetal.io/v1beta1 API: VirtualMachineBMC,
// the BMC of one KubeVirt VirtualMachine.
//
// +kubebuilder:object:generate=true
// +groupName=bmc.virtmetal.io
package v1beta1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API's group and version.
	GroupVersion = schema.GroupVersion{Group: "bmc.virtmetal.io", Version: "v1beta1"}

	// SchemeBuilder registers the API's types.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the API's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
