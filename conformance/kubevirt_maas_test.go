package conformance_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
)

// TestKubeVirtMaaSPowerSequence drives MaaS's Redfish power sequence through
// the Redfish server on the KubeVirt backend, against a real API server and
// a simulated virt-controller: the one-time PXE boot lands on the VM's
// bootOrder, the VMI starts with the NIC first, and the VM's own order is
// back afterwards.
func TestKubeVirtMaaSPowerSequence(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	// A running VM that boots from its disk (bootOrder 1), as MaaS finds it.
	ns, name := cluster.NewNamespace(t), "node-1"
	vm := pxeVM(ns, name, "02:00:00:00:01:01")
	createRunning(t, vm)

	backend := kubevirttest.StartBackend(t, cluster.Config, ns, name, kubevirt.Options{})
	ts := serveBMC(t, backend)

	// Discovery: the collection names the VM, the system describes it.
	status, _, body := kvRequest(t, ts, http.MethodGet, "/redfish/v1/Systems", nil, "")
	members, _ := body["Members"].([]any)
	if status != http.StatusOK || len(members) != 1 || members[0].(map[string]any)["@odata.id"] != "/redfish/v1/Systems/"+name {
		t.Fatalf("GET Systems: %d %v", status, body)
	}
	system := "/redfish/v1/Systems/" + name
	status, header, body := kvRequest(t, ts, http.MethodGet, system, nil, "")
	etag := header.Get("ETag")
	if status != http.StatusOK || body["PowerState"] != "On" || etag == "" {
		t.Fatalf("GET system: %d ETag %q %v", status, etag, body)
	}
	if boot, _ := body["Boot"].(map[string]any); boot["BootSourceOverrideMode"] != "UEFI" {
		t.Fatalf("Boot = %v, want mode UEFI (the VM's firmware)", body["Boot"])
	}

	// MaaS: one-time PXE, ForceOff, wait Off, On, wait On.
	patch := map[string]any{"Boot": map[string]any{"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}}
	if status, _, body := kvRequest(t, ts, http.MethodPatch, system, patch, etag); status/100 != 2 {
		t.Fatalf("PATCH Boot: %d %v", status, body)
	}
	reset := system + "/Actions/ComputerSystem.Reset"
	if status, _, body := kvRequest(t, ts, http.MethodPost, reset, map[string]any{"ResetType": "ForceOff"}, ""); status/100 != 2 {
		t.Fatalf("ForceOff: %d %v", status, body)
	}
	kvWaitPower(t, ts, system, "Off")
	if status, _, body := kvRequest(t, ts, http.MethodPost, reset, map[string]any{"ResetType": "On"}, ""); status/100 != 2 {
		t.Fatalf("On: %d %v", status, body)
	}
	kvWaitPower(t, ts, system, "On")

	if boots := cluster.Boots(ns, name); !slices.Equal(boots, []machine.BootTarget{machine.BootHdd, machine.BootPxe}) {
		t.Fatalf("boots = %v, want [Hdd Pxe]: the first VMI from disk, the one after On from the NIC", boots)
	}
	poll.True(t, "the VM's own boot order back", func() bool {
		got := &kubevirtv1.VirtualMachine{}
		if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(vm), got); err != nil {
			return false
		}
		devices := got.Spec.Template.Spec.Domain.Devices
		return devices.Disks[0].BootOrder != nil && *devices.Disks[0].BootOrder == 1 && devices.Interfaces[0].BootOrder == nil
	})
	_, _, body = kvRequest(t, ts, http.MethodGet, system, nil, "")
	if boot, _ := body["Boot"].(map[string]any); boot["BootSourceOverrideEnabled"] != "Disabled" {
		t.Fatalf("Boot after the one-time boot = %v, want the override Disabled", body["Boot"])
	}

	// The same sequence against a VM caught mid-start: its VMI exists but
	// the guest has not booted. MaaS reads PoweringOn as off, so it skips
	// ForceOff, sets the one-time PXE boot and sends On; the start under
	// way must boot from the network.
	t.Run("VM caught mid-start", func(t *testing.T) {
		const starting = "node-2"
		caught := vm.DeepCopy()
		caught.ObjectMeta = metav1.ObjectMeta{Namespace: ns, Name: starting, Annotations: map[string]string{cluster.HoldStartAnnotation(): "test"}}
		caught.Status = kubevirtv1.VirtualMachineStatus{}
		always := kubevirtv1.RunStrategyAlways
		caught.Spec.RunStrategy = &always
		if err := cluster.Client.Create(ctx, caught); err != nil {
			t.Fatalf("creating VM: %v", err)
		}
		backend := kubevirttest.StartBackend(t, cluster.Config, ns, starting, kubevirt.Options{})
		ts := serveBMC(t, backend)
		system := "/redfish/v1/Systems/" + starting
		kvWaitPower(t, ts, system, "PoweringOn")
		_, header, _ := kvRequest(t, ts, http.MethodGet, system, nil, "")
		if status, _, body := kvRequest(t, ts, http.MethodPatch, system, patch, header.Get("ETag")); status/100 != 2 {
			t.Fatalf("PATCH Boot: %d %v", status, body)
		}
		if status, _, body := kvRequest(t, ts, http.MethodPost, system+"/Actions/ComputerSystem.Reset", map[string]any{"ResetType": "On"}, ""); status/100 != 2 {
			t.Fatalf("On: %d %v", status, body)
		}
		// A merge patch: the VM's status keeps changing meanwhile.
		release := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+cluster.HoldStartAnnotation()+`":null}}}`))
		if err := cluster.Client.Patch(ctx, caught, release); err != nil {
			t.Fatalf("letting the start finish: %v", err)
		}
		kvWaitPower(t, ts, system, "On")
		if boots := cluster.Boots(ns, starting); !slices.Equal(boots, []machine.BootTarget{machine.BootPxe}) {
			t.Fatalf("boots = %v, want [Pxe]: the start under way must use the one-time PXE boot", boots)
		}
	})
}

// pxeVM is a running VM with UEFI firmware (Secure Boot off), 2 cores,
// 2Gi, a 20Gi disk it boots from (bootOrder 1) and a NIC with that MAC.
func pxeVM(namespace, name, mac string) *kubevirtv1.VirtualMachine {
	always := kubevirtv1.RunStrategyAlways
	memory := resource.MustParse("2Gi")
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &always,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{
					CPU:      &kubevirtv1.CPU{Cores: 2},
					Memory:   &kubevirtv1.Memory{Guest: &memory},
					Firmware: &kubevirtv1.Firmware{Bootloader: &kubevirtv1.Bootloader{EFI: &kubevirtv1.EFI{SecureBoot: ptr.To(false)}}},
					Devices: kubevirtv1.Devices{
						Disks: []kubevirtv1.Disk{{Name: "root", BootOrder: ptr.To(uint(1)), DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}}},
						Interfaces: []kubevirtv1.Interface{{
							Name: "pxe", MacAddress: mac,
							InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}},
						}},
					},
					Resources: kubevirtv1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: memory}},
				},
				Networks: []kubevirtv1.Network{{Name: "pxe", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
				Volumes:  []kubevirtv1.Volume{{Name: "root", VolumeSource: kubevirtv1.VolumeSource{EmptyDisk: &kubevirtv1.EmptyDiskSource{Capacity: resource.MustParse("20Gi")}}}},
			}},
		},
	}
}

// createRunning creates the VM and waits until KubeVirt reports it
// Running (at once for a VM that is not to run).
func createRunning(t testing.TB, vm *kubevirtv1.VirtualMachine) {
	t.Helper()
	ctx := t.Context()
	if err := cluster.Client.Create(ctx, vm); err != nil {
		t.Fatalf("creating VM: %v", err)
	}
	if vm.Spec.RunStrategy == nil || *vm.Spec.RunStrategy != kubevirtv1.RunStrategyAlways {
		return
	}
	poll.True(t, "the VM running", func() bool {
		got := &kubevirtv1.VirtualMachine{}
		return cluster.Client.Get(ctx, client.ObjectKeyFromObject(vm), got) == nil && got.Status.PrintableStatus == kubevirtv1.VirtualMachineStatusRunning
	})
}

func kvRequest(t testing.TB, ts *httptest.Server, method, path string, body any, ifMatch string) (int, http.Header, map[string]any) {
	t.Helper()
	var payload bytes.Buffer
	if body != nil {
		if err := json.NewEncoder(&payload).Encode(body); err != nil {
			t.Fatal(err)
		}
	}
	req, err := http.NewRequestWithContext(t.Context(), method, ts.URL+path, &payload)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth(maasUser, maasPass)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if ifMatch != "" {
		req.Header.Set("If-Match", ifMatch)
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var decoded map[string]any
	if resp.StatusCode != http.StatusNoContent {
		_ = json.NewDecoder(resp.Body).Decode(&decoded)
	}
	return resp.StatusCode, resp.Header, decoded
}

func kvWaitPower(t *testing.T, ts *httptest.Server, system, want string) {
	t.Helper()
	poll.True(t, "PowerState "+want, func() bool {
		status, _, body := kvRequest(t, ts, http.MethodGet, system, nil, "")
		return status == http.StatusOK && body["PowerState"] == want
	})
}
