package vmidentity

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	poolv1beta1 "kubevirt.io/api/pool/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// Every other door to a VMI has webhooks too: a VirtualMachineInstance
// made directly, a VirtualMachineInstanceReplicaSet's VMIs and a
// VirtualMachinePool's VMs carry whatever serial, UUID and MACs their
// spec or template sets, and the guest (and MaaS's commissioning script)
// reads them from SMBIOS and the wire. Each is validated as a VM is, in
// every namespace; see instanceMutation for what is mutated and why.
const (
	ValidateVMIPath        = "/validate-kubevirt-io-v1-virtualmachineinstance"
	ValidateReplicaSetPath = "/validate-kubevirt-io-v1-virtualmachineinstancereplicaset"
	MutateReplicaSetPath   = "/mutate-kubevirt-io-v1-virtualmachineinstancereplicaset"
	ValidatePoolPath       = "/validate-pool-kubevirt-io-v1beta1-virtualmachinepool"
	MutatePoolPath         = "/mutate-pool-kubevirt-io-v1beta1-virtualmachinepool"
)

// +kubebuilder:webhook:path=/validate-kubevirt-io-v1-virtualmachineinstance,mutating=false,failurePolicy=fail,sideEffects=None,groups=kubevirt.io,resources=virtualmachineinstances,verbs=create;update,versions=v1,name=vvirtualmachineinstance.bmc.virtmetal.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-kubevirt-io-v1-virtualmachineinstancereplicaset,mutating=false,failurePolicy=fail,sideEffects=None,groups=kubevirt.io,resources=virtualmachineinstancereplicasets,verbs=create;update,versions=v1,name=vvirtualmachineinstancereplicaset.bmc.virtmetal.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/mutate-kubevirt-io-v1-virtualmachineinstancereplicaset,mutating=true,failurePolicy=fail,sideEffects=None,groups=kubevirt.io,resources=virtualmachineinstancereplicasets,verbs=create;update,versions=v1,name=mvirtualmachineinstancereplicaset.bmc.virtmetal.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-pool-kubevirt-io-v1beta1-virtualmachinepool,mutating=false,failurePolicy=fail,sideEffects=None,groups=pool.kubevirt.io,resources=virtualmachinepools,verbs=create;update,versions=v1beta1,name=vvirtualmachinepool.bmc.virtmetal.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/mutate-pool-kubevirt-io-v1beta1-virtualmachinepool,mutating=true,failurePolicy=fail,sideEffects=None,groups=pool.kubevirt.io,resources=virtualmachinepools,verbs=create;update,versions=v1beta1,name=mvirtualmachinepool.bmc.virtmetal.io,admissionReviewVersions=v1

// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachineinstances,verbs=get;list;watch

// inUse says whether a VM other than self, or a VMI other than self's own,
// has value in its index field: derived UUIDs and MACs of the range go
// only where no one has them. VMIs count because one made directly (or by
// a replica set) is no VM: without them, a tenant could run one with the
// MAC and UUID the next enrolled VM's name derives, before that VM exists,
// and the two would share them.
func (s *Stamper) inUse(ctx context.Context, self types.NamespacedName, index, value string) (bool, error) {
	vms, err := s.holders(ctx, self, index, value)
	if err != nil || len(vms) > 0 {
		return len(vms) > 0, err
	}
	var vmis kubevirtv1.VirtualMachineInstanceList
	if err := s.Reader.List(ctx, &vmis, client.MatchingFields{index: value}); err != nil {
		return false, fmt.Errorf("listing VirtualMachineInstances by %s %s: %w", index, value, err)
	}
	for i := range vmis.Items {
		if controllingVM(&vmis.Items[i]) != self || self == (types.NamespacedName{}) {
			return true, nil
		}
	}
	return false, nil
}

// TrimInstance is the cache transform of VirtualMachineInstances: it keeps
// what the identity checks read (who a VMI is, who controls it, its
// serial, UUID and MACs), so that caching every VMI of the cluster costs
// little.
func TrimInstance(obj any) (any, error) {
	vmi, ok := obj.(*kubevirtv1.VirtualMachineInstance)
	if !ok {
		return obj, nil
	}
	trimmed := &kubevirtv1.VirtualMachineInstance{TypeMeta: vmi.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: vmi.Name, Namespace: vmi.Namespace, UID: vmi.UID, ResourceVersion: vmi.ResourceVersion,
		OwnerReferences: vmi.OwnerReferences, DeletionTimestamp: vmi.DeletionTimestamp,
	}}
	if fw := vmi.Spec.Domain.Firmware; fw != nil {
		trimmed.Spec.Domain.Firmware = &kubevirtv1.Firmware{Serial: fw.Serial, UUID: fw.UUID}
	}
	for _, iface := range vmi.Spec.Domain.Devices.Interfaces {
		trimmed.Spec.Domain.Devices.Interfaces = append(trimmed.Spec.Domain.Devices.Interfaces,
			kubevirtv1.Interface{Name: iface.Name, MacAddress: iface.MacAddress})
	}
	return trimmed, nil
}

func (s *Stamper) setupInstanceWebhooks(server webhook.Server) {
	server.Register(ValidateVMIPath, &admission.Webhook{Handler: s.vmiValidatingHandler()})
	server.Register(ValidateReplicaSetPath, &admission.Webhook{Handler: s.replicaSetValidatingHandler()})
	server.Register(MutateReplicaSetPath, &admission.Webhook{Handler: s.replicaSetMutatingHandler()})
	server.Register(ValidatePoolPath, &admission.Webhook{Handler: s.poolValidatingHandler()})
	server.Register(MutatePoolPath, &admission.Webhook{Handler: s.poolMutatingHandler()})
}

// VMIs have no mutating webhook, on purpose. A VMI is never enrolled (a
// BMC drives a VM), so it gets no identity of its own; the VMI that
// virt-controller makes for a VM copies the VM's template, already
// stamped, and must stay exactly as virt-controller made it; a replica
// set's VMIs have no name to derive one from when admitted, and their
// template lost any fixed identity (instanceMutation). A webhook that
// changed nothing would only make every VMI start wait for the
// controller.
func (s *Stamper) vmiValidatingHandler() admission.Handler {
	return objectHandler[*kubevirtv1.VirtualMachineInstance]{kind: "VirtualMachineInstance", handle: s.validateVMI}
}

func (s *Stamper) replicaSetValidatingHandler() admission.Handler {
	return objectHandler[*kubevirtv1.VirtualMachineInstanceReplicaSet]{kind: "VirtualMachineInstanceReplicaSet", handle: s.validateReplicaSet}
}

func (s *Stamper) replicaSetMutatingHandler() admission.Handler {
	return objectHandler[*kubevirtv1.VirtualMachineInstanceReplicaSet]{kind: "VirtualMachineInstanceReplicaSet", handle: s.mutateReplicaSet}
}

func (s *Stamper) poolValidatingHandler() admission.Handler {
	return objectHandler[*poolv1beta1.VirtualMachinePool]{kind: "VirtualMachinePool", handle: s.validatePool}
}

func (s *Stamper) poolMutatingHandler() admission.Handler {
	return objectHandler[*poolv1beta1.VirtualMachinePool]{kind: "VirtualMachinePool", handle: s.mutatePool}
}

func (s *Stamper) validateVMI(ctx context.Context, _ admission.Request, vmi *kubevirtv1.VirtualMachineInstance) admission.Response {
	return validationResponse(s.validateDomain(ctx, domainClaim{self: controllingVM(vmi), path: "spec.domain", domain: &vmi.Spec.Domain}))
}

// controllingVM is the VM whose identity vmi may carry: the VM of the same
// name that controls it, as virt-controller makes a VM's VMI. Zero for
// every other VMI (made directly, or by a replica set). An owner reference
// names an object of the VMI's own namespace, so no tenant can point one
// at another tenant's VM.
func controllingVM(vmi *kubevirtv1.VirtualMachineInstance) types.NamespacedName {
	ref := metav1.GetControllerOf(vmi)
	if ref == nil || vmi.Name == "" || ref.Name != vmi.Name || ref.Kind != kubevirtv1.VirtualMachineGroupVersionKind.Kind {
		return types.NamespacedName{}
	}
	if gv, err := schema.ParseGroupVersion(ref.APIVersion); err != nil || gv.Group != kubevirtv1.VirtualMachineGroupVersionKind.Group {
		return types.NamespacedName{}
	}
	return types.NamespacedName{Namespace: vmi.Namespace, Name: vmi.Name}
}

// validateReplicaSet and validatePool check the template: it carries no
// VM's own identity, not even one of its namespace's VMs (its instances
// get other names).
func (s *Stamper) validateReplicaSet(ctx context.Context, _ admission.Request, rs *kubevirtv1.VirtualMachineInstanceReplicaSet) admission.Response {
	if rs.Spec.Template == nil {
		return admission.Allowed("no template")
	}
	return validationResponse(s.validateDomain(ctx, domainClaim{path: "spec.template.spec.domain", domain: &rs.Spec.Template.Spec.Domain}))
}

func (s *Stamper) validatePool(ctx context.Context, _ admission.Request, pool *poolv1beta1.VirtualMachinePool) admission.Response {
	vm := pool.Spec.VirtualMachineTemplate
	if vm == nil || vm.Spec.Template == nil {
		return admission.Allowed("no template")
	}
	return validationResponse(s.validateDomain(ctx, domainClaim{
		path: "spec.virtualMachineTemplate.spec.template.spec.domain", domain: &vm.Spec.Template.Spec.Domain,
	}))
}

func (s *Stamper) mutateReplicaSet(ctx context.Context, req admission.Request, rs *kubevirtv1.VirtualMachineInstanceReplicaSet) admission.Response {
	if rs.Spec.Template == nil {
		return admission.Allowed("no template")
	}
	return s.instanceMutation(ctx, req, rs, rs.Spec.Template.ObjectMeta.Annotations, "spec", "template", "spec", "domain")
}

func (s *Stamper) mutatePool(ctx context.Context, req admission.Request, pool *poolv1beta1.VirtualMachinePool) admission.Response {
	if pool.Spec.VirtualMachineTemplate == nil {
		return admission.Allowed("no template")
	}
	return s.instanceMutation(ctx, req, pool, pool.Spec.VirtualMachineTemplate.ObjectMeta.Annotations,
		"spec", "virtualMachineTemplate", "spec", "template", "spec", "domain")
}

// instanceMutation removes the serial, the UUID and the MACs a replica
// set's or pool's template sets, in enrolled namespaces (opted-out
// templates excepted, as their VMs are). A template is copied into every
// instance, so they would all carry one identity: MaaS would take them for
// one machine, and a pool's VMs, admitted in parallel, could all keep the
// one UUID before the cache shows the first. Without it, the VM webhook
// stamps each pool VM from its own name, and each VMI of a replica set
// (never enrolled: no VM, no BMC) gets libvirt's random UUID and no serial
// the commissioning script reads. Metadata is the template's: KubeVirt
// copies a pool template's annotations into its VMs.
func (s *Stamper) instanceMutation(ctx context.Context, req admission.Request, owner metav1.Object, annotations map[string]string, domainPath ...string) admission.Response {
	probe := &kubevirtv1.VirtualMachine{}
	probe.Namespace, probe.Name, probe.Annotations = owner.GetNamespace(), owner.GetName(), annotations
	enrolled, err := s.enrolled(ctx, probe)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if !enrolled {
		return admission.Allowed("not enrolled")
	}
	var obj map[string]any
	if err := json.Unmarshal(req.Object.Raw, &obj); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	domain := existingObjectAt(obj, domainPath...)
	var warnings []string
	drop := func(fields map[string]any, key, path string) {
		if value, _ := fields[key].(string); value != "" {
			warnings = append(warnings, fmt.Sprintf("%s %q removed: every instance of this template would carry the same one", path, value))
		}
		delete(fields, key)
	}
	prefix := strings.Join(domainPath, ".")
	if firmware := existingObjectAt(domain, "firmware"); firmware != nil {
		drop(firmware, "serial", prefix+".firmware.serial")
		drop(firmware, "uuid", prefix+".firmware.uuid")
	}
	interfaces, _ := existingObjectAt(domain, "devices")["interfaces"].([]any)
	for i, entry := range interfaces {
		if iface, ok := entry.(map[string]any); ok {
			drop(iface, "macAddress", fmt.Sprintf("%s.devices.interfaces[%d].macAddress", prefix, i))
		}
	}
	if len(warnings) == 0 {
		return admission.Allowed("")
	}
	patched, err := json.Marshal(obj)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, patched).WithWarnings(warnings...)
}

// existingObjectAt returns the object at path, or nil where there is none.
func existingObjectAt(obj map[string]any, path ...string) map[string]any {
	for _, key := range path {
		next, ok := obj[key].(map[string]any)
		if !ok {
			return nil
		}
		obj = next
	}
	return obj
}
