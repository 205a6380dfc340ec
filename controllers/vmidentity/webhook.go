package vmidentity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubevirtv1 "kubevirt.io/api/core/v1"
	poolv1beta1 "kubevirt.io/api/pool/v1beta1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/virtmetal/virtmetal/internal/bmcspec"
)

// Webhook paths, as in the markers below and the generated configurations.
const (
	MutatePath   = "/mutate-kubevirt-io-v1-virtualmachine"
	ValidatePath = "/validate-kubevirt-io-v1-virtualmachine"
)

// +kubebuilder:webhook:path=/mutate-kubevirt-io-v1-virtualmachine,mutating=true,failurePolicy=fail,sideEffects=None,groups=kubevirt.io,resources=virtualmachines,verbs=create;update,versions=v1,name=mvirtualmachine.bmc.virtmetal.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-kubevirt-io-v1-virtualmachine,mutating=false,failurePolicy=fail,sideEffects=None,groups=kubevirt.io,resources=virtualmachines,verbs=create;update,versions=v1,name=vvirtualmachine.bmc.virtmetal.io,admissionReviewVersions=v1

// SetupWebhooks registers the mutating and validating webhooks of every
// kind that makes a VMI on mgr's webhook server.
func (s *Stamper) SetupWebhooks(mgr ctrl.Manager) {
	server := mgr.GetWebhookServer()
	server.Register(MutatePath, &admission.Webhook{Handler: s.MutatingHandler()})
	server.Register(ValidatePath, &admission.Webhook{Handler: s.ValidatingHandler()})
	s.setupInstanceWebhooks(server)
}

// MutatingHandler stamps enrolled VMs on create and update.
func (s *Stamper) MutatingHandler() admission.Handler {
	return objectHandler[*kubevirtv1.VirtualMachine]{kind: "VirtualMachine", handle: s.mutate}
}

// ValidatingHandler refuses VMs that claim an enrolled VM's identity, in
// every namespace.
func (s *Stamper) ValidatingHandler() admission.Handler {
	return objectHandler[*kubevirtv1.VirtualMachine]{kind: "VirtualMachine", handle: s.validate}
}

// decoder knows every kind the webhooks decode.
var decoder = func() admission.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{kubevirtv1.AddToScheme, poolv1beta1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err) // static registration: cannot fail
		}
	}
	return admission.NewDecoder(scheme)
}()

// objectHandler decodes the object of an admission request for handle.
// Operations other than create and update, and objects being deleted, are
// allowed untouched: deletion must never be blocked (e.g. KubeVirt
// removing its finalizer).
type objectHandler[T client.Object] struct {
	kind   string
	handle func(context.Context, admission.Request, T) admission.Response
}

func (h objectHandler[T]) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	obj := reflect.New(reflect.TypeFor[T]().Elem()).Interface().(T)
	if err := decoder.Decode(req, obj); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding %s: %w", h.kind, err))
	}
	if obj.GetDeletionTimestamp() != nil {
		return admission.Allowed("being deleted")
	}
	// The request, not the body, says which object this is (the body may
	// omit the namespace).
	if req.Namespace != "" {
		obj.SetNamespace(req.Namespace)
	}
	if req.Name != "" {
		obj.SetName(req.Name)
	}
	return h.handle(ctx, req, obj)
}

func (s *Stamper) mutate(ctx context.Context, req admission.Request, vm *kubevirtv1.VirtualMachine) admission.Response {
	if vm.Name == "" {
		// generateName: the serial, UUID and MACs derive from the name, which
		// the API server picks after admission. The reconciler stamps it.
		return admission.Allowed("no name yet")
	}
	enrolled, err := s.enrolled(ctx, vm)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if !enrolled {
		return admission.Allowed("not enrolled")
	}
	proofWarning, err := carryProof(req, vm)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	warnings, err := s.Stamp(ctx, vm)
	if proofWarning != "" {
		warnings = append(warnings, proofWarning)
	}
	switch {
	case errors.Is(err, ErrInvalidVM):
		return admission.Denied(err.Error())
	case err != nil:
		return admission.Errored(http.StatusInternalServerError, err)
	}
	patched, err := applyIdentity(req.Object.Raw, vm)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, patched).WithWarnings(warnings...)
}

// carryProof decides which machine proof vm may keep before Stamp: on
// create none (a VM's YAML copied from another must not bring its proof,
// nor may a user choose one: Stamp gives a fresh one); on update the old
// object's, whatever the request says, so a client that omits it (a GitOps
// apply) neither drops nor rotates it, and none when the old object had
// none. It returns the warning for a value it replaced, without the value.
func carryProof(req admission.Request, vm *kubevirtv1.VirtualMachine) (string, error) {
	if vm.Spec.Template == nil {
		return "", nil // Stamp refuses it
	}
	domain := &vm.Spec.Template.Spec.Domain
	sent := ""
	if domain.Chassis != nil {
		sent = domain.Chassis.Asset
	}
	kept := ""
	if req.Operation == admissionv1.Update && len(req.OldObject.Raw) > 0 {
		old := &kubevirtv1.VirtualMachine{}
		if err := json.Unmarshal(req.OldObject.Raw, old); err != nil {
			return "", fmt.Errorf("decoding the old VirtualMachine: %w", err)
		}
		if old.Spec.Template != nil && old.Spec.Template.Spec.Domain.Chassis != nil && bmcspec.IsMachineProof(old.Spec.Template.Spec.Domain.Chassis.Asset) {
			kept = old.Spec.Template.Spec.Domain.Chassis.Asset
		}
	}
	if kept == "" && sent == "" {
		return "", nil
	}
	if domain.Chassis == nil {
		domain.Chassis = &kubevirtv1.Chassis{}
	}
	domain.Chassis.Asset = kept
	if sent == "" || sent == kept {
		return "", nil
	}
	if kept != "" {
		return proofPath + " is kept: a VM's machine proof never changes once given", nil
	}
	return proofPath + " replaced by a fresh machine proof: each VM gets its own, so a copied VM never carries another's", nil
}

// applyIdentity writes vm's identity fields into the raw object, leaving
// every other field as sent: re-encoding the typed VM would drop fields
// this kubevirt.io/api version does not know, and the patch would delete
// them.
func applyIdentity(raw []byte, vm *kubevirtv1.VirtualMachine) ([]byte, error) {
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("decoding VirtualMachine: %w", err)
	}
	domainPath := []string{"spec", "template", "spec", "domain"}
	fw := vm.Spec.Template.Spec.Domain.Firmware
	firmware, err := objectAt(obj, append(domainPath, "firmware")...)
	if err != nil {
		return nil, err
	}
	firmware["serial"] = fw.Serial
	firmware["uuid"] = string(fw.UUID)
	chassis, err := objectAt(obj, append(domainPath, "chassis")...)
	if err != nil {
		return nil, err
	}
	chassis["asset"] = vm.Spec.Template.Spec.Domain.Chassis.Asset
	if ifaces := vm.Spec.Template.Spec.Domain.Devices.Interfaces; len(ifaces) > 0 {
		devices, err := objectAt(obj, append(domainPath, "devices")...)
		if err != nil {
			return nil, err
		}
		list, ok := devices["interfaces"].([]any)
		if !ok || len(list) != len(ifaces) {
			return nil, errors.New("spec.template.spec.domain.devices.interfaces: not the list that was decoded")
		}
		for i, iface := range ifaces {
			entry, ok := list[i].(map[string]any)
			if !ok {
				return nil, fmt.Errorf("spec.template.spec.domain.devices.interfaces[%d] is not an object", i)
			}
			entry["macAddress"] = iface.MacAddress
		}
	}
	return json.Marshal(obj)
}

// objectAt returns the object at path, creating missing or null levels.
func objectAt(obj map[string]any, path ...string) (map[string]any, error) {
	for i, key := range path {
		switch next := obj[key].(type) {
		case map[string]any:
			obj = next
		case nil:
			created := map[string]any{}
			obj[key], obj = created, created
		default:
			return nil, fmt.Errorf("%v is not an object", path[:i+1])
		}
	}
	return obj, nil
}

func (s *Stamper) validate(ctx context.Context, _ admission.Request, vm *kubevirtv1.VirtualMachine) admission.Response {
	return validationResponse(s.Validate(ctx, vm))
}

// validationResponse answers with a validation's outcome: a claim is refused, a
// failure to check is an error (the API server then fails closed).
func validationResponse(err error) admission.Response {
	switch {
	case errors.Is(err, ErrIdentityClaimed), errors.Is(err, ErrDuplicateMAC):
		return admission.Denied(err.Error())
	case err != nil:
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.Allowed("")
}
