// Package v1beta1 is a stand-in for kubevirt.io/virt-template-api/core/v1beta1
// v0.2.0, whose module zip the Go module proxy refuses (see
// hack/kubevirt-standins/README.md). It declares the names
// kubevirt.io/kubevirt v1.9.0 compiles against (VirtualMachineTemplate and
// its Spec, Status and Parameter, ConditionReady, DeepCopy), with the
// upstream JSON field names, and registers the type with its list so a
// client built on Scheme can list and watch the resource.
package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	templateapi "kubevirt.io/virt-template-api/core"
)

// ConditionReady is the condition type of a template ready to be processed.
const ConditionReady = "Ready"

// SchemeGroupVersion is template.kubevirt.io/v1beta1.
var SchemeGroupVersion = schema.GroupVersion{Group: templateapi.GroupName, Version: "v1beta1"}

var (
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	AddToScheme   = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &VirtualMachineTemplate{}, &VirtualMachineTemplateList{})
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}

// VirtualMachineTemplate is a VirtualMachine with parameters.
type VirtualMachineTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty,omitzero"`

	Spec   VirtualMachineTemplateSpec   `json:"spec"`
	Status VirtualMachineTemplateStatus `json:"status,omitempty,omitzero"`
}

// VirtualMachineTemplateSpec holds the templated VirtualMachine.
type VirtualMachineTemplateSpec struct {
	VirtualMachine *runtime.RawExtension `json:"virtualMachine"`
	Parameters     []Parameter           `json:"parameters,omitempty"`
	Message        string                `json:"message,omitempty"`
}

// Parameter is substituted for ${Name} when the template is processed.
type Parameter struct {
	Name        string `json:"name"`
	DisplayName string `json:"displayName,omitempty"`
	Description string `json:"description,omitempty"`
	Value       string `json:"value,omitempty"`
	Generate    string `json:"generate,omitempty"`
	From        string `json:"from,omitempty"`
	Required    bool   `json:"required,omitempty"`
}

// VirtualMachineTemplateStatus is the observed state of a template.
type VirtualMachineTemplateStatus struct {
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// VirtualMachineTemplateList is a list of templates, as a list call returns.
type VirtualMachineTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty,omitzero"`
	Items           []VirtualMachineTemplate `json:"items"`
}

// DeepCopyInto copies in into out.
func (in *VirtualMachineTemplate) DeepCopyInto(out *VirtualMachineTemplate) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if in.Spec.VirtualMachine != nil {
		out.Spec.VirtualMachine = in.Spec.VirtualMachine.DeepCopy()
	}
	if in.Spec.Parameters != nil {
		out.Spec.Parameters = make([]Parameter, len(in.Spec.Parameters))
		copy(out.Spec.Parameters, in.Spec.Parameters)
	}
	if in.Status.Conditions != nil {
		out.Status.Conditions = make([]metav1.Condition, len(in.Status.Conditions))
		for i := range in.Status.Conditions {
			in.Status.Conditions[i].DeepCopyInto(&out.Status.Conditions[i])
		}
	}
}

// DeepCopy returns a copy of in.
func (in *VirtualMachineTemplate) DeepCopy() *VirtualMachineTemplate {
	if in == nil {
		return nil
	}
	out := new(VirtualMachineTemplate)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *VirtualMachineTemplate) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyObject implements runtime.Object.
func (in *VirtualMachineTemplateList) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := new(VirtualMachineTemplateList)
	*out = *in
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]VirtualMachineTemplate, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
	return out
}
