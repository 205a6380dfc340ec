package maas

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
)

// Credentials are a BMC's Redfish user and password.
type Credentials struct {
	Username string
	Password string
}

// EnrolledVM is a VM that has a VirtualMachineBMC, as one cycle read it:
// only these VMs are the reconciler's, whatever MaaS machines claim.
type EnrolledVM struct {
	VM     VMRef
	BMCUID types.UID
	// Credentials come from the BMC's credentials Secret, or from the VM's
	// entry of its namespace's shared Secret; CredentialsErr says why they
	// could not (wrapping ErrNotFound or ErrInvalidArgument).
	Credentials    Credentials
	CredentialsErr error
	// VMFound is false when the VirtualMachine does not exist (yet).
	VMFound bool
	// MACs are the interface MACs of the VM's spec, normalised (see
	// NormalizeMAC); empty when the spec sets none and the running
	// instance's are needed (Cluster.InstanceMACs).
	MACs []string
	// FirmwareUUID is the VM's SMBIOS system UUID (spec firmware.uuid), ""
	// when not set.
	FirmwareUUID string
	// Proof is the VM's machine proof (spec chassis.asset, see
	// bmcspec.NewMachineProof), "" while it has none. A secret: never
	// logged, reported or put in an error.
	Proof string
	// Reported is what the VirtualMachineBMC's status holds of the
	// reconciler's part: the maas block and the MaaSMachine condition.
	Reported MachineStatus
}

// MachineStatus is the reconciler's part of a VirtualMachineBMC's status.
type MachineStatus struct {
	// MaaS is the VM's machine; nil when the VM has none (verified).
	MaaS *v1beta1.MaaSStatus
	// Condition is the MaaSMachine condition; nil only in what was read
	// from a VirtualMachineBMC that has none.
	Condition *metav1.Condition
}

// Cluster is the Kubernetes side of the reconciler. Reads are one list per
// kind per cycle, so a cycle's cost does not grow with the number of VMs.
type Cluster interface {
	// Enrolled lists the VirtualMachineBMCs, with their VMs and credentials.
	Enrolled(ctx context.Context) (map[VMRef]*EnrolledVM, error)
	// InstanceMACs lists the running instances' interface MACs, normalised,
	// for VMs whose spec sets none.
	InstanceMACs(ctx context.Context) (map[VMRef][]string, error)
	// ReportStatus writes the reconciler's part of the VM's
	// VirtualMachineBMC status (server-side apply as FieldManager), leaving
	// the rest alone. Idempotent.
	ReportStatus(ctx context.Context, vm VMRef, status MachineStatus) error
	// RecordEvent records an Event on the VM's VirtualMachineBMC.
	RecordEvent(ctx context.Context, vm *EnrolledVM, eventType, reason, message string) error
}

// FieldManager is the server-side apply field manager of the reconciler's
// status writes; the controller's is "virtmetal-controller".
const FieldManager = "virtmetal-maas-reconciler"

// NormalizeMAC spells a MAC the way MaaS does (lower case, colons); "" when
// it is not a 48-bit MAC.
func NormalizeMAC(mac string) string {
	hw, err := net.ParseMAC(strings.TrimSpace(mac))
	if err != nil || len(hw) != 6 {
		return ""
	}
	return hw.String()
}

// NormalizeUUID spells an SMBIOS UUID in lower case without braces.
func NormalizeUUID(uuid string) string {
	return strings.ToLower(strings.Trim(strings.TrimSpace(uuid), "{}"))
}

// NewKubeCluster connects to the API server of cfg. The client knows the
// few kinds the reconciler uses without asking discovery, so a run costs
// only the cycle's own requests.
func NewKubeCluster(cfg *rest.Config) (KubeCluster, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, kubevirtv1.AddToScheme, v1beta1.AddToScheme} {
		if err := add(scheme); err != nil {
			return KubeCluster{}, err
		}
	}
	mapper := meta.NewDefaultRESTMapper(nil)
	for _, gvk := range []schema.GroupVersionKind{
		corev1.SchemeGroupVersion.WithKind("Secret"),
		corev1.SchemeGroupVersion.WithKind("Event"),
		kubevirtv1.SchemeGroupVersion.WithKind("VirtualMachine"),
		kubevirtv1.SchemeGroupVersion.WithKind("VirtualMachineInstance"),
		v1beta1.GroupVersion.WithKind("VirtualMachineBMC"),
	} {
		mapper.Add(gvk, meta.RESTScopeNamespace)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme, Mapper: mapper})
	if err != nil {
		return KubeCluster{}, fmt.Errorf("kubernetes client: %w", err)
	}
	return KubeCluster{Client: c}, nil
}

// KubeCluster implements Cluster with a controller-runtime client whose scheme
// knows corev1, KubeVirt's core/v1 and virtmetal's v1beta1.
type KubeCluster struct {
	Client client.Client
	// Now stamps Events; time.Now when nil.
	Now func() time.Time
}

func (k KubeCluster) now() time.Time {
	if k.Now != nil {
		return k.Now()
	}
	return time.Now()
}

// Enrolled implements Cluster with three lists: VirtualMachineBMCs, the
// Secrets labelled as virtmetal's, and VirtualMachines. A credentials Secret
// without the label is not read, and reported as missing.
func (k KubeCluster) Enrolled(ctx context.Context) (map[VMRef]*EnrolledVM, error) {
	var bmcs v1beta1.VirtualMachineBMCList
	if err := k.Client.List(ctx, &bmcs); err != nil {
		return nil, kubeError("list VirtualMachineBMCs", err)
	}
	var secrets corev1.SecretList
	if err := k.Client.List(ctx, &secrets, client.MatchingLabels{v1beta1.LabelManagedBy: v1beta1.ManagedByValue}); err != nil {
		return nil, kubeError("list Secrets labelled "+v1beta1.LabelManagedBy+"="+v1beta1.ManagedByValue, err)
	}
	var vms kubevirtv1.VirtualMachineList
	if err := k.Client.List(ctx, &vms); err != nil {
		return nil, kubeError("list VirtualMachines", err)
	}
	secretsByKey := make(map[types.NamespacedName]*corev1.Secret, len(secrets.Items))
	for i := range secrets.Items {
		s := &secrets.Items[i]
		secretsByKey[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = s
	}
	vmsByRef := make(map[VMRef]*kubevirtv1.VirtualMachine, len(vms.Items))
	for i := range vms.Items {
		vm := &vms.Items[i]
		vmsByRef[VMRef{Namespace: vm.Namespace, Name: vm.Name}] = vm
	}

	enrolled := make(map[VMRef]*EnrolledVM, len(bmcs.Items))
	for i := range bmcs.Items {
		bmc := &bmcs.Items[i]
		ref := VMRef{Namespace: bmc.Namespace, Name: bmc.Name}
		e := &EnrolledVM{VM: ref, BMCUID: bmc.UID, Reported: reportedStatus(bmc)}
		e.Credentials, e.CredentialsErr = credentialsFor(bmc, secretsByKey)
		if vm, ok := vmsByRef[ref]; ok {
			e.VMFound = true
			e.MACs, e.FirmwareUUID, e.Proof = specIdentity(vm)
		}
		enrolled[ref] = e
	}
	return enrolled, nil
}

// credentialsFor reads the credentials of bmc's VM from the Secret bmc
// names, else from the VM's own Secret "<vm>-bmc", else from the VM's entry
// of its namespace's shared Secret: the controller's shared workload mode
// enrolls a VM without a Secret of its own. A VM enrolled before keeps its
// own Secret, so that one wins; a Secret the user named is the only place
// looked in, since they said where.
func credentialsFor(bmc *v1beta1.VirtualMachineBMC, secrets map[types.NamespacedName]*corev1.Secret) (Credentials, error) {
	if name := bmc.Spec.CredentialsSecret; name != "" {
		return credentialsFrom(secrets[types.NamespacedName{Namespace: bmc.Namespace, Name: name}], bmc.Namespace, name)
	}
	own := types.NamespacedName{Namespace: bmc.Namespace, Name: v1beta1.CredentialsSecretName(bmc.Name)}
	if secret := secrets[own]; secret != nil {
		return credentialsFrom(secret, own.Namespace, own.Name)
	}
	// The VM's own namespace only: another namespace's entries are another
	// tenant's, whatever their names.
	shared := types.NamespacedName{Namespace: bmc.Namespace, Name: bmcspec.SharedSecret}
	var entries map[string][]byte
	if secret := secrets[shared]; secret != nil {
		entries = secret.Data
	}
	// Only this VM's entry is decoded: a cycle decodes each entry it needs
	// once, and no other.
	raw, found := entries[bmc.Name]
	if !found {
		return Credentials{}, fmt.Errorf("neither credentials Secret %s nor entry %q of the shared Secret %s (labelled %s=%s): %w",
			own, bmc.Name, shared, v1beta1.LabelManagedBy, v1beta1.ManagedByValue, ErrNotFound)
	}
	// The decoding error is left out: it can quote the entry's characters,
	// the password's among them.
	entry, ok := bmcspec.ParseCredentials(raw)
	if !ok {
		return Credentials{}, fmt.Errorf(`entry %q of the shared Secret %s must be a JSON object with non-empty "username" and "password": %w`,
			bmc.Name, shared, ErrInvalidArgument)
	}
	return Credentials{Username: entry.Username, Password: entry.Password}, nil
}

func credentialsFrom(secret *corev1.Secret, namespace, name string) (Credentials, error) {
	key := namespace + "/" + name
	if secret == nil {
		return Credentials{}, fmt.Errorf("credentials Secret %s (labelled %s=%s): %w", key, v1beta1.LabelManagedBy, v1beta1.ManagedByValue, ErrNotFound)
	}
	username, password, ok := v1beta1.CredentialsOf(secret)
	if !ok {
		return Credentials{}, fmt.Errorf("credentials Secret %s must have non-empty %q and %q: %w",
			key, v1beta1.SecretUsernameKey, v1beta1.SecretPasswordKey, ErrInvalidArgument)
	}
	return Credentials{Username: username, Password: password}, nil
}

func specIdentity(vm *kubevirtv1.VirtualMachine) (macs []string, firmwareUUID, proof string) {
	if vm.Spec.Template == nil {
		return nil, "", ""
	}
	domain := vm.Spec.Template.Spec.Domain
	for _, iface := range domain.Devices.Interfaces {
		if mac := NormalizeMAC(iface.MacAddress); mac != "" {
			macs = append(macs, mac)
		}
	}
	if domain.Firmware != nil {
		firmwareUUID = NormalizeUUID(string(domain.Firmware.UUID))
	}
	if domain.Chassis != nil && bmcspec.IsMachineProof(domain.Chassis.Asset) {
		proof = domain.Chassis.Asset
	}
	return macs, firmwareUUID, proof
}

func reportedStatus(bmc *v1beta1.VirtualMachineBMC) MachineStatus {
	var reported MachineStatus
	if bmc.Status.MaaS != nil {
		reported.MaaS = bmc.Status.MaaS.DeepCopy()
	}
	for i := range bmc.Status.Conditions {
		if bmc.Status.Conditions[i].Type == v1beta1.ConditionMaaSMachine {
			reported.Condition = bmc.Status.Conditions[i].DeepCopy()
		}
	}
	return reported
}

// InstanceMACs implements Cluster with one list of VirtualMachineInstances.
func (k KubeCluster) InstanceMACs(ctx context.Context) (map[VMRef][]string, error) {
	var vmis kubevirtv1.VirtualMachineInstanceList
	if err := k.Client.List(ctx, &vmis); err != nil {
		return nil, kubeError("list VirtualMachineInstances", err)
	}
	out := make(map[VMRef][]string, len(vmis.Items))
	for _, vmi := range vmis.Items {
		ref := VMRef{Namespace: vmi.Namespace, Name: vmi.Name}
		for _, iface := range vmi.Status.Interfaces {
			if mac := NormalizeMAC(iface.MAC); mac != "" {
				out[ref] = append(out[ref], mac)
			}
		}
	}
	return out, nil
}

// ReportStatus implements Cluster with a server-side apply of status.maas and
// the MaaSMachine condition only: other conditions are the controller's, and
// a maas block left out is removed (the fields are this manager's).
func (k KubeCluster) ReportStatus(ctx context.Context, vm VMRef, status MachineStatus) error {
	applied := map[string]any{}
	if status.Condition != nil {
		c := status.Condition
		applied["conditions"] = []any{map[string]any{
			"type":               c.Type,
			"status":             string(c.Status),
			"reason":             c.Reason,
			"message":            c.Message,
			"lastTransitionTime": c.LastTransitionTime.UTC().Format(time.RFC3339),
		}}
	}
	if m := status.MaaS; m != nil {
		block := map[string]any{}
		for key, value := range map[string]string{"systemID": m.SystemID, "statusName": m.StatusName, "hostname": m.Hostname, "pool": m.Pool} {
			if value != "" {
				block[key] = value
			}
		}
		if m.LastUpdateTime != nil {
			block["lastUpdateTime"] = m.LastUpdateTime.UTC().Format(time.RFC3339)
		}
		if len(m.Problems) > 0 {
			problems := make([]any, 0, len(m.Problems))
			for _, p := range m.Problems {
				problem := map[string]any{"reason": p.Reason, "message": p.Message, "cycles": int64(p.Cycles),
					"since": p.Since.UTC().Format(time.RFC3339)}
				if p.RetryAfter != nil {
					problem["retryAfter"] = p.RetryAfter.UTC().Format(time.RFC3339)
				}
				if len(p.Machines) > 0 {
					machines := make([]any, 0, len(p.Machines))
					for _, id := range p.Machines {
						machines = append(machines, id)
					}
					problem["machines"] = machines
				}
				problems = append(problems, problem)
			}
			block["problems"] = problems
		}
		applied["maas"] = block
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1beta1.GroupVersion.String(),
		"kind":       "VirtualMachineBMC",
		"metadata":   map[string]any{"namespace": vm.Namespace, "name": vm.Name},
		"status":     applied,
	}}
	err := k.Client.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldManager), client.ForceOwnership)
	if err != nil {
		return kubeError("status of VirtualMachineBMC "+vm.String(), err)
	}
	return nil
}

// RecordEvent implements Cluster with a core/v1 Event.
func (k KubeCluster) RecordEvent(ctx context.Context, vm *EnrolledVM, eventType, reason, message string) error {
	now := metav1.NewTime(k.now())
	event := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: vm.VM.Namespace, GenerateName: vm.VM.Name + "."},
		InvolvedObject: corev1.ObjectReference{
			APIVersion: v1beta1.GroupVersion.String(), Kind: "VirtualMachineBMC",
			Namespace: vm.VM.Namespace, Name: vm.VM.Name, UID: vm.BMCUID,
		},
		Type: eventType, Reason: reason, Message: message,
		Source:         corev1.EventSource{Component: FieldManager},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if err := k.Client.Create(ctx, event); err != nil {
		return kubeError("event on VirtualMachineBMC "+vm.VM.String(), err)
	}
	return nil
}

func kubeError(what string, err error) error {
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s: %w", what, ErrNotFound)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s: %w: %w", what, ErrForbidden, err)
	}
	return fmt.Errorf("%s: %w: %w", what, ErrUnavailable, err)
}
