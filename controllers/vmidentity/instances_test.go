package vmidentity

import (
	"context"
	"net/http"
	"reflect"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	poolv1beta1 "kubevirt.io/api/pool/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// Bodies as clients send them, each with a field this kubevirt.io/api
// version does not know inside the domain.
func vmiJSON(namespace, name, metadata, domain string) []byte {
	return []byte(`{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance","metadata":{"name":"` + name + `","namespace":"` + namespace + `"` + metadata + `},` +
		`"spec":{"domain":` + domain + `}}`)
}

func replicaSetJSON(namespace, name, templateMetadata, domain string) []byte {
	return []byte(`{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstanceReplicaSet","metadata":{"name":"` + name + `","namespace":"` + namespace + `"},` +
		`"spec":{"selector":{},"template":{"metadata":{` + templateMetadata + `},"spec":{"domain":` + domain + `}}}}`)
}

func poolJSON(namespace, name, templateMetadata, domain string) []byte {
	return []byte(`{"apiVersion":"pool.kubevirt.io/v1beta1","kind":"VirtualMachinePool","metadata":{"name":"` + name + `","namespace":"` + namespace + `"},` +
		`"spec":{"selector":{},"virtualMachineTemplate":{"metadata":{` + templateMetadata + `},"spec":{"template":{"spec":{"domain":` + domain + `}}}}}}`)
}

// web1's identity in team-a, as the fake cluster holds it.
const (
	web1Serial = "web1.team-a"
	web1UUID   = "0f8c2f4e-3a1b-4c5d-8e9f-a0b1c2d3e4f5"
	web1MAC    = "02:00:00:00:00:01"
)

func web1Domain() string {
	return `{"firmware":{"serial":"` + web1Serial + `","uuid":"` + web1UUID + `"},"devices":{"interfaces":[{"name":"default","macAddress":"` + web1MAC + `"}]}}`
}

func controlledByJSON(kind, apiVersion, name string) string {
	return `,"ownerReferences":[{"apiVersion":"` + apiVersion + `","kind":"` + kind + `","name":"` + name + `","uid":"u1","controller":true}]`
}

func TestInstanceValidatingHandlers(t *testing.T) {
	ctx := context.Background()
	web1 := newVM("team-a", "web1", withSerial(web1Serial), withUUID(web1UUID), withInterface("default", web1MAC))
	s := newStamper(t, testRange, interceptor.Funcs{}, web1)
	vmis, replicaSets, pools := s.vmiValidatingHandler(), s.replicaSetValidatingHandler(), s.poolValidatingHandler()
	claims := map[string]string{
		"serial": `{"firmware":{"serial":"web1.team-a"}}`,
		"UUID":   `{"firmware":{"uuid":"` + strings.ToUpper(web1UUID) + `"}}`,
		"MAC":    `{"devices":{"interfaces":[{"name":"nic","macAddress":"02-00-00-00-00-01"}]}}`,
	}
	messages := map[string]string{
		"serial": `.firmware.serial "web1.team-a" names VM team-a/web1`,
		"UUID":   `.firmware.uuid "` + strings.ToUpper(web1UUID) + `" is the SMBIOS UUID of VM team-a/web1`,
		"MAC":    `: interface "nic": macAddress 02-00-00-00-00-01 is used by VM team-a/web1`,
	}
	type testCase struct {
		name        string
		handler     admission.Handler
		req         admission.Request
		wantAllowed bool
		wantCode    int32
		wantMessage string
	}
	var tests []testCase
	for claim, domain := range claims {
		tests = append(tests,
			testCase{"VMI claiming web1's " + claim, vmis, admissionRequest(admissionv1.Create, "free", "x", vmiJSON("free", "x", "", domain)),
				false, http.StatusForbidden, "spec.domain" + messages[claim]},
			testCase{"replica set claiming web1's " + claim, replicaSets, admissionRequest(admissionv1.Update, "free", "x", replicaSetJSON("free", "x", "", domain)),
				false, http.StatusForbidden, "spec.template.spec.domain" + messages[claim]},
			testCase{"pool claiming web1's " + claim, pools, admissionRequest(admissionv1.Create, "free", "x", poolJSON("free", "x", "", domain)),
				false, http.StatusForbidden, "spec.virtualMachineTemplate.spec.template.spec.domain" + messages[claim]},
		)
	}
	tests = append(tests, []testCase{
		{"web1's own VMI", vmis, admissionRequest(admissionv1.Create, "team-a", "web1",
			vmiJSON("team-a", "web1", controlledByJSON("VirtualMachine", "kubevirt.io/v1", "web1"), web1Domain())), true, http.StatusOK, ""},
		{"web1's own VMI, owner named in an older version", vmis, admissionRequest(admissionv1.Update, "team-a", "web1",
			vmiJSON("team-a", "web1", controlledByJSON("VirtualMachine", "kubevirt.io/v1alpha3", "web1"), web1Domain())), true, http.StatusOK, ""},
		{"VMI of web1's name, no controller", vmis, admissionRequest(admissionv1.Create, "team-a", "web1",
			vmiJSON("team-a", "web1", "", web1Domain())), false, http.StatusForbidden, "names VM team-a/web1"},
		{"VMI controlled by web1 under another name", vmis, admissionRequest(admissionv1.Create, "team-a", "web2",
			vmiJSON("team-a", "web2", controlledByJSON("VirtualMachine", "kubevirt.io/v1", "web1"), web1Domain())), false, http.StatusForbidden, "names VM team-a/web1"},
		{"VMI controlled by a replica set of web1's name", vmis, admissionRequest(admissionv1.Create, "team-a", "web1",
			vmiJSON("team-a", "web1", controlledByJSON("VirtualMachineInstanceReplicaSet", "kubevirt.io/v1", "web1"), web1Domain())), false, http.StatusForbidden, "names VM team-a/web1"},
		{"VMI controlled by a VirtualMachine of another group", vmis, admissionRequest(admissionv1.Create, "team-a", "web1",
			vmiJSON("team-a", "web1", controlledByJSON("VirtualMachine", "example.com/v1", "web1"), web1Domain())), false, http.StatusForbidden, "names VM team-a/web1"},
		{"VMI owned, not controlled, by web1", vmis, admissionRequest(admissionv1.Create, "team-a", "web1",
			vmiJSON("team-a", "web1", `,"ownerReferences":[{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","name":"web1","uid":"u1"}]`, web1Domain())),
			false, http.StatusForbidden, "names VM team-a/web1"},
		{"web1's VMI in another namespace", vmis, admissionRequest(admissionv1.Create, "team-b", "web1",
			vmiJSON("team-b", "web1", controlledByJSON("VirtualMachine", "kubevirt.io/v1", "web1"), web1Domain())), false, http.StatusForbidden, "names VM team-a/web1"},
		{"replica set of web1's namespace naming web1", replicaSets, admissionRequest(admissionv1.Create, "team-a", "web1",
			replicaSetJSON("team-a", "web1", "", web1Domain())), false, http.StatusForbidden, "names VM team-a/web1"},
		{"pool of web1's namespace naming web1", pools, admissionRequest(admissionv1.Create, "team-a", "web1",
			poolJSON("team-a", "web1", "", web1Domain())), false, http.StatusForbidden, "names VM team-a/web1"},
		{"VMI with its own identity", vmis, admissionRequest(admissionv1.Create, "free", "x",
			vmiJSON("free", "x", "", `{"firmware":{"serial":"x.free","uuid":"`+DerivedUUID("free", "x", 0)+`"},"devices":{"interfaces":[{"name":"a","macAddress":"02:00:00:00:00:02"}]}}`)), true, http.StatusOK, ""},
		{"replica set without a template", replicaSets, admissionRequest(admissionv1.Create, "free", "x",
			[]byte(`{"metadata":{"name":"x"},"spec":{"selector":{}}}`)), true, http.StatusOK, "no template"},
		{"pool without a VMI template", pools, admissionRequest(admissionv1.Create, "free", "x",
			[]byte(`{"metadata":{"name":"x"},"spec":{"selector":{},"virtualMachineTemplate":{"spec":{}}}}`)), true, http.StatusOK, "no template"},
		{"VMI being deleted", vmis, admissionRequest(admissionv1.Update, "free", "x",
			[]byte(`{"metadata":{"name":"x","deletionTimestamp":"2026-01-01T00:00:00Z"},"spec":{"domain":{"firmware":{"serial":"web1.team-a"}}}}`)), true, http.StatusOK, "being deleted"},
		{"pool deleted", pools, admissionRequest(admissionv1.Delete, "free", "x", nil), true, http.StatusOK, ""},
		{"VMI not JSON", vmis, admissionRequest(admissionv1.Create, "free", "x", []byte("[")), false, http.StatusBadRequest, "decoding VirtualMachineInstance"},
		{"pool not JSON", pools, admissionRequest(admissionv1.Create, "free", "x", []byte("[")), false, http.StatusBadRequest, "decoding VirtualMachinePool"},
	}...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := tc.handler.Handle(ctx, tc.req)
			if resp.Allowed != tc.wantAllowed || resp.Result == nil || resp.Result.Code != tc.wantCode ||
				!strings.Contains(resp.Result.Message, tc.wantMessage) {
				t.Fatalf("response %+v, result %+v", resp.AdmissionResponse, resp.Result)
			}
		})
	}

	t.Run("reader failure is an internal error", func(t *testing.T) {
		s := newStamper(t, testRange, interceptor.Funcs{List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
			return errInjected
		}})
		resp := s.replicaSetValidatingHandler().Handle(ctx, admissionRequest(admissionv1.Create, "free", "x", replicaSetJSON("free", "x", "", claims["MAC"])))
		if resp.Allowed || resp.Result.Code != http.StatusInternalServerError || !strings.Contains(resp.Result.Message, errInjected.Error()) {
			t.Fatalf("response %+v, result %+v", resp.AdmissionResponse, resp.Result)
		}
	})
}

func TestInstanceMutatingHandlers(t *testing.T) {
	ctx := context.Background()
	s := newStamper(t, testRange, interceptor.Funcs{})
	const fixed = `{"futureField":{"keep":true},"firmware":{"serial":"fleet.team-a","uuid":"` + web1UUID + `","bootloader":{"efi":{}}},` +
		`"devices":{"interfaces":[{"name":"a","macAddress":"02:00:00:00:00:07"},{"name":"b","bridge":{}}]}}`

	domains := []struct {
		kind    string
		handler admission.Handler
		body    func(namespace, templateMetadata, domain string) []byte
		domain  func(t *testing.T, raw []byte, resp admission.Response) kubevirtv1.DomainSpec
	}{
		{"VirtualMachineInstanceReplicaSet", s.replicaSetMutatingHandler(),
			func(ns, meta, domain string) []byte { return replicaSetJSON(ns, "fleet", meta, domain) },
			func(t *testing.T, raw []byte, resp admission.Response) kubevirtv1.DomainSpec {
				var rs kubevirtv1.VirtualMachineInstanceReplicaSet
				decodePatched(t, raw, resp, &rs)
				return rs.Spec.Template.Spec.Domain
			}},
		{"VirtualMachinePool", s.poolMutatingHandler(),
			func(ns, meta, domain string) []byte { return poolJSON(ns, "fleet", meta, domain) },
			func(t *testing.T, raw []byte, resp admission.Response) kubevirtv1.DomainSpec {
				var pool poolv1beta1.VirtualMachinePool
				decodePatched(t, raw, resp, &pool)
				return pool.Spec.VirtualMachineTemplate.Spec.Template.Spec.Domain
			}},
	}
	for _, d := range domains {
		t.Run(d.kind+": template identity removed in an enrolled namespace", func(t *testing.T) {
			raw := d.body("team-a", "", fixed)
			resp := d.handler.Handle(ctx, admissionRequest(admissionv1.Create, "team-a", "fleet", raw))
			if !resp.Allowed || len(resp.Warnings) != 3 {
				t.Fatalf("response %+v", resp.AdmissionResponse)
			}
			if w := strings.Join(resp.Warnings, "\n"); !strings.Contains(w, `spec.domain.firmware.serial "fleet.team-a" removed`) ||
				!strings.Contains(w, `spec.domain.devices.interfaces[0].macAddress "02:00:00:00:00:07" removed`) {
				t.Errorf("warnings %q", resp.Warnings)
			}
			domain := d.domain(t, raw, resp)
			if fw := domain.Firmware; fw == nil || fw.Serial != "" || fw.UUID != "" || fw.Bootloader == nil || fw.Bootloader.EFI == nil {
				t.Errorf("firmware = %+v", fw)
			}
			if ifaces := domain.Devices.Interfaces; len(ifaces) != 2 || ifaces[0].MacAddress != "" || ifaces[1].Bridge == nil {
				t.Errorf("interfaces = %+v", ifaces)
			}
		})
		unchanged := []struct {
			name    string
			req     admission.Request
			message string
		}{
			{"namespace not enrolled", admissionRequest(admissionv1.Create, "free", "fleet", d.body("free", "", fixed)), "not enrolled"},
			{"template opted out", admissionRequest(admissionv1.Update, "team-a", "fleet",
				d.body("team-a", `"annotations":{"virtmetal.io/bmc":"disabled"}`, fixed)), "not enrolled"},
			{"template without identity", admissionRequest(admissionv1.Create, "team-a", "fleet",
				d.body("team-a", "", `{"firmware":{"bootloader":{"efi":{}}},"devices":{"interfaces":[{"name":"a"}]}}`)), ""},
			{"no domain", admissionRequest(admissionv1.Create, "team-a", "fleet", d.body("team-a", "", `null`)), ""},
			{"deleted", admissionRequest(admissionv1.Delete, "team-a", "fleet", nil), ""},
		}
		for _, tc := range unchanged {
			t.Run(d.kind+": unchanged: "+tc.name, func(t *testing.T) {
				resp := d.handler.Handle(ctx, tc.req)
				if !resp.Allowed || len(resp.Patches) != 0 || len(resp.Warnings) != 0 || !strings.Contains(resp.Result.Message, tc.message) {
					t.Fatalf("response %+v, patches %v", resp.AdmissionResponse, resp.Patches)
				}
			})
		}
	}

	t.Run("enrolment failure is an internal error", func(t *testing.T) {
		s := newStamper(t, testRange, interceptor.Funcs{})
		s.Enrolled = func(context.Context, *kubevirtv1.VirtualMachine) (bool, error) { return false, errInjected }
		resp := s.poolMutatingHandler().Handle(ctx, admissionRequest(admissionv1.Create, "team-a", "fleet", poolJSON("team-a", "fleet", "", fixed)))
		if resp.Allowed || resp.Result.Code != http.StatusInternalServerError {
			t.Fatalf("response %+v, result %+v", resp.AdmissionResponse, resp.Result)
		}
	})
}

// TestStampSkipsWhatVMIsHold: a VMI made before an enrolled VM (directly or
// by a replica set) holds the MAC and UUID that VM's name derives; the VM
// gets others. The VM's own VMI does not count.
func TestStampSkipsWhatVMIsHold(t *testing.T) {
	ctx := context.Background()
	fresh := newStamper(t, testRange, interceptor.Funcs{})
	first := newVM("team-a", "web1", withInterface("default", ""))
	if _, err := fresh.Stamp(ctx, first); err != nil {
		t.Fatal(err)
	}
	derivedUUID, derivedMAC := string(first.Spec.Template.Spec.Domain.Firmware.UUID), macs(first)[0]
	squatter := func(namespace, name string, owner ...metav1.OwnerReference) *kubevirtv1.VirtualMachineInstance {
		vmi := &kubevirtv1.VirtualMachineInstance{}
		vmi.Namespace, vmi.Name, vmi.OwnerReferences = namespace, name, owner
		vmi.Spec.Domain.Firmware = &kubevirtv1.Firmware{UUID: types.UID(derivedUUID)}
		vmi.Spec.Domain.Devices.Interfaces = []kubevirtv1.Interface{{Name: "default", MacAddress: derivedMAC}}
		return vmi
	}
	web1Controls := metav1.OwnerReference{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: "web1", UID: "u", Controller: ptr.To(true)}
	tests := []struct {
		name      string
		vmi       *kubevirtv1.VirtualMachineInstance
		wantFresh bool
	}{
		{"a VMI of another namespace", squatter("team-b", "early"), true},
		{"a VMI of the namespace, not the VM's", squatter("team-a", "web1"), true},
		{"the VM's own VMI", squatter("team-a", "web1", web1Controls), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStamperWith(t, testRange, interceptor.Funcs{}, tc.vmi)
			vm := newVM("team-a", "web1", withInterface("default", ""))
			if _, err := s.Stamp(ctx, vm); err != nil {
				t.Fatal(err)
			}
			gotUUID, gotMAC := string(vm.Spec.Template.Spec.Domain.Firmware.UUID), macs(vm)[0]
			if fresh := gotUUID != derivedUUID && gotMAC != derivedMAC; fresh != tc.wantFresh {
				t.Fatalf("UUID %s, MAC %s (derived %s, %s): want other ones %v", gotUUID, gotMAC, derivedUUID, derivedMAC, tc.wantFresh)
			}
		})
	}
}

func TestTrimInstance(t *testing.T) {
	vmi := &kubevirtv1.VirtualMachineInstance{}
	vmi.Namespace, vmi.Name = "team-a", "web1"
	vmi.OwnerReferences = []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: "web1", UID: "u", Controller: ptr.To(true)}}
	vmi.Labels = map[string]string{"big": "label"}
	vmi.Spec.Domain.Firmware = &kubevirtv1.Firmware{Serial: web1Serial, UUID: web1UUID, Bootloader: &kubevirtv1.Bootloader{EFI: &kubevirtv1.EFI{}}}
	vmi.Spec.Domain.Devices.Interfaces = []kubevirtv1.Interface{{Name: "default", MacAddress: web1MAC, InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}}}}
	vmi.Status.Phase = kubevirtv1.Running
	out, err := TrimInstance(vmi)
	if err != nil {
		t.Fatal(err)
	}
	trimmed := out.(*kubevirtv1.VirtualMachineInstance)
	if !reflect.DeepEqual(IndexMACs(trimmed), IndexMACs(vmi)) || !reflect.DeepEqual(IndexUUID(trimmed), IndexUUID(vmi)) ||
		controllingVM(trimmed) != controllingVM(vmi) || trimmed.Spec.Domain.Firmware.Serial != web1Serial {
		t.Fatalf("trimmed %+v lost what the checks read", trimmed)
	}
	if trimmed.Labels != nil || trimmed.Status.Phase != "" || trimmed.Spec.Domain.Firmware.Bootloader != nil || trimmed.Spec.Domain.Devices.Interfaces[0].Bridge != nil {
		t.Errorf("trimmed keeps more than the checks read: %+v", trimmed)
	}
	if other, _ := TrimInstance("not a VMI"); other != "not a VMI" {
		t.Errorf("other objects changed: %v", other)
	}
}
