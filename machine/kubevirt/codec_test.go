package kubevirt

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
)

// TestStdlibJSONDecodesAsApimachinery decodes what the API server sends
// with the backend's decoder and with apimachinery's own JSON serializer,
// the one it replaces, and wants the same objects, kinds and errors.
func TestStdlibJSONDecodesAsApimachinery(t *testing.T) {
	apimachinery, ours := jsonDecoders(t)

	vm := codecVM()
	vmJSON := mustJSON(t, vm)
	list := mustJSON(t, &kubevirtv1.VirtualMachineInstanceList{
		TypeMeta: metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstanceList"},
		ListMeta: metav1.ListMeta{ResourceVersion: "42"},
		Items: []kubevirtv1.VirtualMachineInstance{{
			ObjectMeta: metav1.ObjectMeta{Name: "node-1", Namespace: "tenant-a"},
			Spec:       vm.Spec.Template.Spec,
			Status: kubevirtv1.VirtualMachineInstanceStatus{
				Phase:      kubevirtv1.Running,
				Interfaces: []kubevirtv1.VirtualMachineInstanceNetworkInterface{{Name: "default", MAC: "02:00:00:00:00:01", IP: "10.0.0.7"}},
			},
		}},
	})
	dataVolume := mustJSON(t, &cdiv1beta1.DataVolume{
		TypeMeta:   metav1.TypeMeta{APIVersion: "cdi.kubevirt.io/v1beta1", Kind: "DataVolume"},
		ObjectMeta: metav1.ObjectMeta{Name: "node-1-media", Namespace: "tenant-a"},
		Spec: cdiv1beta1.DataVolumeSpec{
			Source:  &cdiv1beta1.DataVolumeSource{HTTP: &cdiv1beta1.DataVolumeSourceHTTP{URL: "https://images.example/boot.iso"}},
			Storage: &cdiv1beta1.StorageSpec{Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("8Gi")}}},
		},
		Status: cdiv1beta1.DataVolumeStatus{Phase: cdiv1beta1.ImportInProgress, Progress: "42.0%"},
	})
	status := `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"virtualmachines.kubevirt.io \"node-2\" not found","reason":"NotFound","details":{"name":"node-2","group":"kubevirt.io","kind":"virtualmachines"},"code":404}`
	secret := `{"metadata":{"name":"node-1-bmc-state","namespace":"tenant-a","resourceVersion":"7"},"data":{"state":"e30="},"type":"Opaque"}`

	tests := []struct {
		name     string
		data     string
		defaults *schema.GroupVersionKind
		into     func() runtime.Object
	}{
		{"a VM, nothing to decode into", vmJSON, nil, nil},
		{"a VM into a VM", vmJSON, nil, func() runtime.Object { return &kubevirtv1.VirtualMachine{} }},
		{"a VM into a VMI: the data's kind wins", vmJSON, nil, func() runtime.Object { return &kubevirtv1.VirtualMachineInstance{} }},
		{"a VMI list", list, nil, func() runtime.Object { return &kubevirtv1.VirtualMachineInstanceList{} }},
		{"a DataVolume", dataVolume, nil, nil},
		{"a watch event, which names no kind", `{"type":"MODIFIED","object":` + vmJSON + `}`, nil, func() runtime.Object { return &metav1.WatchEvent{} }},
		{"an error's Status", status, nil, nil},
		{"an error's Status into a Status", status, nil, func() runtime.Object { return &metav1.Status{} }},
		{"a Secret that names no kind, with defaults", secret, &schema.GroupVersionKind{Version: "v1", Kind: "Secret"}, nil},
		{"a Secret that names no kind, into a Secret", secret, nil, func() runtime.Object { return &corev1.Secret{} }},
		{"into an unregistered type", vmJSON, nil, func() runtime.Object { return &corev1.Pod{} }},
		{"no kind", `{"apiVersion":"kubevirt.io/v1","metadata":{"name":"node-1"}}`, nil, nil},
		{"no version", `{"kind":"VirtualMachine","metadata":{"name":"node-1"}}`, nil, nil},
		{"a kind the backend does not know", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"node-1"}}`, nil, nil},
		{"not JSON", `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine",`, nil, nil},
		{"a field of the wrong type", `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","spec":{"runStrategy":7}}`, nil, nil},
		{"as raw bytes", vmJSON, nil, func() runtime.Object { return &runtime.Unknown{} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var wantInto, gotInto runtime.Object
			if tt.into != nil {
				wantInto, gotInto = tt.into(), tt.into()
			}
			want, wantKind, wantErr := apimachinery.Decode([]byte(tt.data), tt.defaults, wantInto)
			got, gotKind, gotErr := ours.Decode([]byte(tt.data), tt.defaults, gotInto)
			if errorClass(gotErr) != errorClass(wantErr) { // "none" when nil
				t.Fatalf("error %v (%s), apimachinery's %v (%s)", gotErr, errorClass(gotErr), wantErr, errorClass(wantErr))
			}
			if wantErr != nil {
				return
			}
			if !reflect.DeepEqual(gotKind, wantKind) {
				t.Errorf("kind %v, apimachinery's %v", gotKind, wantKind)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("decoded\n%s\napimachinery's\n%s", mustJSON(t, got), mustJSON(t, want))
			}
		})
	}
}

// jsonDecoders returns apimachinery's JSON serializer for the backend's
// kinds and the backend's decoder.
func jsonDecoders(tb testing.TB) (apimachinery runtime.Serializer, ours stdlibJSON) {
	tb.Helper()
	scheme := backendScheme()
	for _, info := range serializer.NewCodecFactory(scheme).WithoutConversion().SupportedMediaTypes() {
		if info.MediaType == runtime.ContentTypeJSON {
			return info.Serializer, stdlibJSON{Serializer: info.Serializer, scheme: scheme}
		}
	}
	tb.Fatal("apimachinery has no JSON serializer")
	return nil, stdlibJSON{}
}

// BenchmarkDecodeVM decodes a VM as a watch delivers it, with the
// backend's decoder beside apimachinery's.
func BenchmarkDecodeVM(b *testing.B) {
	apimachinery, ours := jsonDecoders(b)
	data := []byte(mustJSON(b, codecVM()))
	for _, decoder := range []struct {
		name string
		runtime.Decoder
	}{{"apimachinery", apimachinery}, {"stdlib", ours}} {
		b.Run(decoder.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := decoder.Decode(data, nil, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// errorClass names which of apimachinery's decoding errors err is.
func errorClass(err error) string {
	switch {
	case err == nil:
		return "none"
	case runtime.IsMissingKind(err):
		return "missing kind"
	case runtime.IsMissingVersion(err):
		return "missing version"
	case runtime.IsNotRegisteredError(err):
		return "not registered"
	default:
		return "other"
	}
}

// codecVM is a VM with what a decoder can get wrong: quantities, times,
// pointers, maps, embedded structs, KubeVirt's own spec decoding and
// fields it keeps unknown.
func codecVM() *kubevirtv1.VirtualMachine {
	always := kubevirtv1.RunStrategyAlways
	return &kubevirtv1.VirtualMachine{
		TypeMeta: metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "node-1", Namespace: "tenant-a", UID: "0d3c6a8e-1d0c-4d8e-9f1b-7a2f6e5d4c3b", ResourceVersion: "41", Generation: 3,
			CreationTimestamp: metav1.NewTime(time.Date(2026, 12, 6, 9, 30, 0, 0, time.UTC)),
			Labels:            map[string]string{"app": "node"},
			Annotations:       map[string]string{"virtmetal.io/boot-override": `{"target":"Pxe","once":true}`},
		},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &always,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"kubevirt.io/vm": "node-1"}},
				Spec: kubevirtv1.VirtualMachineInstanceSpec{
					Domain: kubevirtv1.DomainSpec{
						Resources: kubevirtv1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")}},
						CPU:       &kubevirtv1.CPU{Cores: 2},
						Firmware: &kubevirtv1.Firmware{
							UUID: "5b0c7f2e-8a43-4b0e-9d51-000000000001", Serial: "node-1.tenant-a",
							Bootloader: &kubevirtv1.Bootloader{EFI: &kubevirtv1.EFI{SecureBoot: ptr.To(false)}},
						},
						Clock: &kubevirtv1.Clock{ClockOffset: kubevirtv1.ClockOffset{UTC: &kubevirtv1.ClockOffsetUTC{}}},
						Devices: kubevirtv1.Devices{
							Disks: []kubevirtv1.Disk{{Name: "root", BootOrder: ptr.To(uint(2)), DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: "virtio"}}}},
							Interfaces: []kubevirtv1.Interface{{
								Name: "default", MacAddress: "02:00:00:00:00:01", BootOrder: ptr.To(uint(1)),
								InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}},
							}},
						},
					},
					Networks: []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
					Volumes: []kubevirtv1.Volume{{Name: "root", VolumeSource: kubevirtv1.VolumeSource{
						DataVolume: &kubevirtv1.DataVolumeSource{Name: "node-1-root"},
					}}},
				},
			},
		},
		Status: kubevirtv1.VirtualMachineStatus{
			Created: true, Ready: true, PrintableStatus: kubevirtv1.VirtualMachineStatusRunning,
			Conditions: []kubevirtv1.VirtualMachineCondition{{
				Type: kubevirtv1.VirtualMachineReady, Status: corev1.ConditionTrue,
				LastTransitionTime: metav1.NewTime(time.Date(2026, 12, 6, 9, 31, 0, 0, time.UTC)),
			}},
		},
	}
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestCodecsDecodeJSONWithStdlib checks that the REST clients' JSON, objects
// and watch events alike, goes through stdlibJSON.
func TestCodecsDecodeJSONWithStdlib(t *testing.T) {
	var found bool
	for _, info := range newCodecs(backendScheme()).SupportedMediaTypes() {
		if info.MediaType != runtime.ContentTypeJSON {
			continue
		}
		found = true
		if _, ok := info.Serializer.(stdlibJSON); !ok {
			t.Errorf("objects decode with %T", info.Serializer)
		}
		if info.StreamSerializer == nil {
			t.Fatal("no stream serializer for watches")
		}
		if _, ok := info.StreamSerializer.Serializer.(stdlibJSON); !ok {
			t.Errorf("watch events decode with %T", info.StreamSerializer.Serializer)
		}
	}
	if !found {
		t.Error("no JSON serializer")
	}
}
