package vmidentity

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/virtmetal/virtmetal/internal/bmcspec"
)

func admissionRequest(op admissionv1.Operation, namespace, name string, raw []byte) admission.Request {
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:       "uid",
		Operation: op,
		Namespace: namespace,
		Name:      name,
		Object:    runtime.RawExtension{Raw: raw},
	}}
}

// vmJSON is a VM as a client sends it, with a field this kubevirt.io/api
// version does not know.
func vmJSON(namespace, name, domain string) []byte {
	return []byte(`{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"` + name + `","namespace":"` + namespace + `"},` +
		`"spec":{"runStrategy":"Halted","template":{"spec":{"domain":` + domain + `}}}}`)
}

// applyPatch applies a response's patch to the request's object.
func applyPatch(t *testing.T, raw []byte, resp admission.Response) *kubevirtv1.VirtualMachine {
	t.Helper()
	vm := &kubevirtv1.VirtualMachine{}
	decodePatched(t, raw, resp, vm)
	return vm
}

// decodePatched applies a response's patch to the request's object,
// checks that a field unknown to the types survived, and decodes the
// result into out.
func decodePatched(t *testing.T, raw []byte, resp admission.Response, out any) {
	t.Helper()
	patched := applied(t, raw, resp)
	if !strings.Contains(string(patched), `"futureField":{"keep":true}`) {
		t.Errorf("patch dropped a field unknown to the types: %s", patched)
	}
	if err := json.Unmarshal(patched, out); err != nil {
		t.Fatal(err)
	}
}

func TestMutatingHandler(t *testing.T) {
	ctx := context.Background()
	s := newStamper(t, testRange, interceptor.Funcs{})
	h := s.MutatingHandler()
	const devices = `"devices":{"interfaces":[{"name":"default","masquerade":{}},{"name":"fixed","bridge":{},"macAddress":"02:00:00:00:10:00"}]}`

	t.Run("enrolled VM is stamped", func(t *testing.T) {
		raw := vmJSON("team-a", "web1", `{"futureField":{"keep":true},`+devices+`}`)
		resp := h.Handle(ctx, admissionRequest(admissionv1.Create, "team-a", "web1", raw))
		if !resp.Allowed || resp.PatchType == nil || len(resp.Warnings) != 0 {
			t.Fatalf("response %+v", resp.AdmissionResponse)
		}
		vm := applyPatch(t, raw, resp)
		fw := vm.Spec.Template.Spec.Domain.Firmware
		if fw == nil || fw.Serial != "web1.team-a" || string(fw.UUID) != DerivedUUID("team-a", "web1", 0) {
			t.Errorf("firmware = %+v", fw)
		}
		got := macs(vm)
		if !strings.HasPrefix(got[0], "02:00:00:") || got[1] != "02:00:00:00:10:00" {
			t.Errorf("MACs = %v", got)
		}
	})
	t.Run("user serial replaced with a warning, other firmware kept", func(t *testing.T) {
		raw := vmJSON("team-a", "web1", `{"futureField":{"keep":true},"firmware":{"serial":"mine","bootloader":{"efi":{}}}}`)
		resp := h.Handle(ctx, admissionRequest(admissionv1.Update, "team-a", "web1", raw))
		if !resp.Allowed || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], `"mine" replaced by "web1.team-a"`) {
			t.Fatalf("response %+v", resp.AdmissionResponse)
		}
		vm := applyPatch(t, raw, resp)
		if fw := vm.Spec.Template.Spec.Domain.Firmware; fw.Serial != "web1.team-a" || fw.Bootloader == nil || fw.Bootloader.EFI == nil {
			t.Errorf("firmware = %+v", fw)
		}
	})
	t.Run("stamped VM needs no patch", func(t *testing.T) {
		proof := bmcspec.NewMachineProof()
		raw := vmJSON("team-a", "web1", `{"futureField":{"keep":true},"chassis":{"asset":"`+proof+`"},"firmware":{"serial":"web1.team-a","uuid":"`+DerivedUUID("team-a", "web1", 0)+`"}}`)
		req := admissionRequest(admissionv1.Update, "team-a", "web1", raw)
		req.OldObject.Raw = raw
		resp := h.Handle(ctx, req)
		if !resp.Allowed || len(resp.Patches) != 0 || resp.PatchType != nil {
			t.Fatalf("response %+v, patches %v", resp.AdmissionResponse, resp.Patches)
		}
	})
	t.Run("machine proof", func(t *testing.T) {
		own, copied := bmcspec.NewMachineProof(), bmcspec.NewMachineProof()
		withAsset := func(asset string) []byte {
			if asset == "" {
				return vmJSON("team-a", "web1", `{"futureField":{"keep":true}}`)
			}
			return vmJSON("team-a", "web1", `{"futureField":{"keep":true},"chassis":{"asset":"`+asset+`","serial":"c1"}}`)
		}
		tests := []struct {
			name        string
			op          admissionv1.Operation
			old, sent   string // chassis.asset of the old object (update) and of the request
			want        string // "" for a fresh proof
			wantWarning string
		}{
			{name: "create without one gets a fresh one", op: admissionv1.Create},
			{name: "create with another VM's (a copied YAML) gets a fresh one", op: admissionv1.Create, sent: copied, wantWarning: "replaced by a fresh machine proof"},
			{name: "create with a user's asset tag gets a fresh one", op: admissionv1.Create, sent: "ACME-0001", wantWarning: "replaced by a fresh machine proof"},
			{name: "update that omits it keeps the old one", op: admissionv1.Update, old: own, want: own},
			{name: "update with another keeps the old one", op: admissionv1.Update, old: own, sent: copied, want: own, wantWarning: "is kept"},
			{name: "update of a VM from before proofs gets a fresh one", op: admissionv1.Update, old: "ACME-0001", sent: "ACME-0001", wantWarning: "replaced by a fresh machine proof"},
			{name: "update of a VM from before proofs ignores a proof sent", op: admissionv1.Update, sent: copied, wantWarning: "replaced by a fresh machine proof"},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				raw := withAsset(tc.sent)
				req := admissionRequest(tc.op, "team-a", "web1", raw)
				if tc.op == admissionv1.Update {
					req.OldObject.Raw = withAsset(tc.old)
				}
				resp := h.Handle(ctx, req)
				if !resp.Allowed {
					t.Fatalf("response %+v", resp.AdmissionResponse)
				}
				got := applyPatch(t, raw, resp).Spec.Template.Spec.Domain.Chassis
				if got == nil || !bmcspec.IsMachineProof(got.Asset) || (tc.want != "" && got.Asset != tc.want) ||
					(tc.want == "" && (got.Asset == copied || got.Asset == own)) {
					t.Errorf("chassis = %+v, want %q (fresh when empty)", got, tc.want)
				}
				if tc.sent != "" && got.Serial != "c1" {
					t.Errorf("the chassis' other fields were not kept: %+v", got)
				}
				warnings := strings.Join(resp.Warnings, "\n")
				if tc.wantWarning != "" && !strings.Contains(warnings, tc.wantWarning) || tc.wantWarning == "" && warnings != "" {
					t.Errorf("warnings %q, want %q", warnings, tc.wantWarning)
				}
				for _, secret := range []string{own, copied, got.Asset, "vmp1-"} {
					if strings.Contains(warnings, secret) {
						t.Errorf("a proof in the warnings: %q", warnings)
					}
				}
			})
		}
	})

	tests := []struct {
		name        string
		req         admission.Request
		wantAllowed bool
		wantCode    int32
		wantMessage string
	}{
		{"VM of a namespace not enrolled", admissionRequest(admissionv1.Create, "free", "web1", vmJSON("free", "web1", `{}`)), true, http.StatusOK, "not enrolled"},
		{"opted-out VM", admissionRequest(admissionv1.Create, "team-a", "web1",
			[]byte(`{"metadata":{"name":"web1","namespace":"team-a","annotations":{"virtmetal.io/bmc":"disabled"}},"spec":{"template":{"spec":{"domain":{}}}}}`)), true, http.StatusOK, "not enrolled"},
		{"generateName", admissionRequest(admissionv1.Create, "team-a", "", vmJSON("team-a", "", `{}`)), true, http.StatusOK, "no name yet"},
		{"delete", admissionRequest(admissionv1.Delete, "team-a", "web1", nil), true, http.StatusOK, ""},
		{"VM being deleted", admissionRequest(admissionv1.Update, "team-a", "web1",
			[]byte(`{"metadata":{"name":"web1","namespace":"team-a","deletionTimestamp":"2026-01-01T00:00:00Z"},"spec":{"template":{"spec":{"domain":{}}}}}`)), true, http.StatusOK, "being deleted"},
		{"no object", admissionRequest(admissionv1.Create, "team-a", "web1", nil), false, http.StatusBadRequest, "no content"},
		{"not JSON", admissionRequest(admissionv1.Create, "team-a", "web1", []byte("{nope")), false, http.StatusBadRequest, "decoding VirtualMachine"},
		{"wrong types", admissionRequest(admissionv1.Create, "team-a", "web1", []byte(`{"spec":{"template":{"spec":{"domain":{"firmware":"x"}}}}}`)), false, http.StatusBadRequest, "decoding VirtualMachine"},
		{"no template", admissionRequest(admissionv1.Create, "team-a", "web1", []byte(`{"metadata":{"name":"web1"},"spec":{}}`)), false, http.StatusForbidden, "has no spec.template"},
		{"interfaces null", admissionRequest(admissionv1.Create, "team-a", "web1", vmJSON("team-a", "web1", `{"devices":{"interfaces":null}}`)), true, http.StatusOK, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.Handle(ctx, tc.req)
			code, message := int32(http.StatusOK), "" // a patch response has no Result
			if resp.Result != nil {
				code, message = resp.Result.Code, resp.Result.Message
			}
			if resp.Allowed != tc.wantAllowed || code != tc.wantCode || !strings.Contains(message, tc.wantMessage) {
				t.Fatalf("response %+v, result %+v", resp.AdmissionResponse, resp.Result)
			}
			if !tc.wantAllowed && len(resp.Patches) != 0 {
				t.Errorf("refused with patches %v", resp.Patches)
			}
		})
	}

	t.Run("reader failure is an internal error", func(t *testing.T) {
		s := newStamper(t, testRange, interceptor.Funcs{List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
			return errInjected
		}})
		resp := s.MutatingHandler().Handle(ctx, admissionRequest(admissionv1.Create, "team-a", "web1", vmJSON("team-a", "web1", `{}`)))
		if resp.Allowed || resp.Result.Code != http.StatusInternalServerError || !strings.Contains(resp.Result.Message, errInjected.Error()) {
			t.Fatalf("response %+v, result %+v", resp.AdmissionResponse, resp.Result)
		}
	})
}

func TestValidatingHandler(t *testing.T) {
	ctx := context.Background()
	webA := newVM("team-a", "web1", withSerial("web1.team-a"), withInterface("default", "02:00:00:00:00:01"))
	tests := []struct {
		name        string
		funcs       interceptor.Funcs
		req         admission.Request
		wantAllowed bool
		wantCode    int32
		wantMessage string
	}{
		{"own identity", interceptor.Funcs{}, admissionRequest(admissionv1.Update, "team-a", "web1",
			vmJSON("team-a", "web1", `{"firmware":{"serial":"web1.team-a"},"devices":{"interfaces":[{"name":"default","macAddress":"02:00:00:00:00:01"}]}}`)), true, http.StatusOK, ""},
		{"serial claiming another namespace's VM", interceptor.Funcs{}, admissionRequest(admissionv1.Create, "free", "web1",
			vmJSON("free", "web1", `{"firmware":{"serial":"web1.team-a"}}`)), false, http.StatusForbidden, `serial "web1.team-a" names VM team-a/web1`},
		{"namespace taken from the request, not the body", interceptor.Funcs{}, admissionRequest(admissionv1.Create, "free", "web1",
			[]byte(`{"metadata":{"name":"web1","namespace":"team-a"},"spec":{"template":{"spec":{"domain":{"firmware":{"serial":"web1.team-a"}}}}}}`)), false, http.StatusForbidden, "identity of another enrolled VM claimed"},
		{"duplicate MAC", interceptor.Funcs{}, admissionRequest(admissionv1.Create, "free", "x",
			vmJSON("free", "x", `{"devices":{"interfaces":[{"name":"default","macAddress":"02:00:00:00:00:01"}]}}`)), false, http.StatusForbidden, "macAddress 02:00:00:00:00:01 is used by VM team-a/web1"},
		{"VM being deleted", interceptor.Funcs{}, admissionRequest(admissionv1.Update, "free", "web1",
			[]byte(`{"metadata":{"name":"web1","namespace":"free","deletionTimestamp":"2026-01-01T00:00:00Z"},"spec":{"template":{"spec":{"domain":{"firmware":{"serial":"web1.team-a"}}}}}}`)), true, http.StatusOK, "being deleted"},
		{"not JSON", interceptor.Funcs{}, admissionRequest(admissionv1.Create, "free", "x", []byte("[")), false, http.StatusBadRequest, "decoding VirtualMachine"},
		{"reader failure", interceptor.Funcs{Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return errInjected
		}}, admissionRequest(admissionv1.Create, "free", "web1", vmJSON("free", "web1", `{"firmware":{"serial":"web1.team-a"}}`)), false, http.StatusInternalServerError, errInjected.Error()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newStamper(t, testRange, tc.funcs, webA).ValidatingHandler()
			resp := h.Handle(ctx, tc.req)
			if resp.Allowed != tc.wantAllowed || resp.Result == nil || resp.Result.Code != tc.wantCode ||
				!strings.Contains(resp.Result.Message, tc.wantMessage) {
				t.Fatalf("response %+v, result %+v", resp.AdmissionResponse, resp.Result)
			}
		})
	}
}

// applied is the request's object with a response's patch applied.
func applied(t *testing.T, raw []byte, resp admission.Response) []byte {
	t.Helper()
	ops, err := json.Marshal(resp.Patches)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(ops)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := patch.Apply(raw)
	if err != nil {
		t.Fatalf("patch %s does not apply to %q: %v", ops, raw, err)
	}
	return patched
}

// FuzzMutatingHandler: whatever object arrives, each mutating handler (of
// VMs, VMI replica sets and VM pools) answers without panicking, and a
// patch it returns applies to the object.
func FuzzMutatingHandler(f *testing.F) {
	for _, seed := range []string{
		string(vmJSON("team-a", "web1", `{"futureField":{"keep":true},"devices":{"interfaces":[{"name":"a"},{"name":"b","macAddress":"02:00:00:00:00:01"}]}}`)),
		string(vmJSON("team-a", "web1", `{"firmware":null,"devices":null}`)),
		`{"metadata":{"name":"web1","namespace":"team-a"},"spec":{"template":null}}`,
		`{"spec":{"template":{"spec":{"domain":{"devices":{"interfaces":[null]}}}}}}`,
		string(replicaSetJSON("team-a", "web1", "", `{"firmware":{"serial":"x","uuid":null},"devices":{"interfaces":[null,{"macAddress":"02:00:00:00:00:01"}]}}`)),
		string(poolJSON("team-a", "web1", `"annotations":null`, `{"firmware":{"uuid":"u"},"devices":{"interfaces":{}}}`)),
		`{"spec":{"virtualMachineTemplate":{"spec":{"template":{"spec":{"domain":[]}}}}}}`,
		`null`, `[]`, ``,
	} {
		f.Add([]byte(seed))
	}
	s := newStamper(f, "02:00:00:00:00:00-02:00:00:00:00:0f", interceptor.Funcs{})
	handlers := []admission.Handler{s.MutatingHandler(), s.replicaSetMutatingHandler(), s.poolMutatingHandler()}
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, h := range handlers {
			resp := h.Handle(context.Background(), admissionRequest(admissionv1.Create, "team-a", "web1", raw))
			if !resp.Allowed && (resp.Result == nil || resp.Result.Message == "") {
				t.Fatalf("refused without a message: %+v", resp.AdmissionResponse)
			}
			if len(resp.Patches) > 0 {
				applied(t, raw, resp)
			}
		}
	})
}
