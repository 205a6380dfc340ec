package conformance_test

import (
	"context"
	"net/http"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
)

// BenchmarkKubeVirtRedfish measures Redfish on the KubeVirt backend against
// a real API server: a status poll (served from the informer cache) and a
// power action, timed until the API server's VM shows the new runStrategy.
func BenchmarkKubeVirtRedfish(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)

	ns, name := cluster.NewNamespace(b), "bench"
	halted := kubevirtv1.RunStrategyHalted
	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &halted,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{
					Memory:   &kubevirtv1.Memory{Guest: ptr.To(resource.MustParse("1Gi"))},
					Firmware: &kubevirtv1.Firmware{UUID: "8d1f3c52-4a6b-4e0f-9b7a-2c5d8e1f0a34", Serial: name + "." + ns},
					Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{{
						Name: "pxe", MacAddress: "02:00:00:00:02:01",
						InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}},
					}}},
				},
				Networks: []kubevirtv1.Network{{Name: "pxe", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
			}},
		},
	}
	if err := cluster.Client.Create(ctx, vm); err != nil {
		b.Fatalf("creating VM: %v", err)
	}
	backend := kubevirttest.StartBackend(b, cluster.Config, ns, name, kubevirt.Options{})
	ts := serveBMC(b, backend)
	system := "/redfish/v1/Systems/" + name

	b.Run("GetSystem", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if status, _, _ := kvRequest(b, ts, http.MethodGet, system, nil, ""); status != http.StatusOK {
				b.Fatalf("GET system: %d", status)
			}
		}
	})
	b.Run("ResetUntilRunStrategy", func(b *testing.B) {
		steps := []struct {
			reset string
			want  kubevirtv1.VirtualMachineRunStrategy
		}{{"On", kubevirtv1.RunStrategyRerunOnFailure}, {"ForceOff", kubevirtv1.RunStrategyHalted}}
		i := 0
		for b.Loop() {
			step := steps[i%len(steps)]
			i++
			body := map[string]any{"ResetType": step.reset}
			if status, _, _ := kvRequest(b, ts, http.MethodPost, system+"/Actions/ComputerSystem.Reset", body, ""); status/100 != 2 {
				b.Fatalf("Reset %s: %d", step.reset, status)
			}
			got := &kubevirtv1.VirtualMachine{}
			if err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, got); err != nil {
				b.Fatal(err)
			}
			if got.Spec.RunStrategy == nil || *got.Spec.RunStrategy != step.want {
				b.Fatalf("after %s the API server has runStrategy %v, want %s", step.reset, got.Spec.RunStrategy, step.want)
			}
		}
	})
}
