package conformance_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
	"github.com/virtmetal/virtmetal/redfish"
)

// TestSuiteOnKubeVirtBackend runs the whole conformance suite, writes
// included, against a BMC on the KubeVirt backend (the package's envtest API server, CDI
// installed so that virtual media is served): no warning, no failure.
func TestSuiteOnKubeVirtBackend(t *testing.T) {
	ns := cluster.NewNamespace(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	halted := kubevirtv1.RunStrategyHalted
	memory := resource.MustParse("1Gi")
	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "conformant"},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &halted,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{
					CPU:      &kubevirtv1.CPU{Cores: 2},
					Memory:   &kubevirtv1.Memory{Guest: &memory},
					Firmware: &kubevirtv1.Firmware{UUID: "5b0c6f5e-2f3a-4d1b-8e6c-7a9d0e1f2a3b", Bootloader: &kubevirtv1.Bootloader{EFI: &kubevirtv1.EFI{SecureBoot: ptr.To(false)}}},
					Devices: kubevirtv1.Devices{
						Interfaces: []kubevirtv1.Interface{{Name: "pxe", MacAddress: "02:00:00:00:09:01", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}}}},
						// A disk of known size on SATA and one of unknown size:
						// Storage's Drives and Volumes from a VM's spec.
						Disks: []kubevirtv1.Disk{
							{Name: "root", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusSATA}}},
							{Name: "image", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}},
						},
					},
					Resources: kubevirtv1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: memory}},
				},
				Networks: []kubevirtv1.Network{{Name: "pxe", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
				Volumes: []kubevirtv1.Volume{
					{Name: "root", VolumeSource: kubevirtv1.VolumeSource{EmptyDisk: &kubevirtv1.EmptyDiskSource{Capacity: resource.MustParse("20Gi")}}},
					{Name: "image", VolumeSource: kubevirtv1.VolumeSource{ContainerDisk: &kubevirtv1.ContainerDiskSource{Image: "containerdisks/fedora:latest"}}},
				},
			}},
		},
	}
	if err := cluster.Client.Create(ctx, vm); err != nil {
		t.Fatalf("creating VM: %v", err)
	}
	backend := kubevirttest.StartBackend(t, cluster.Config, ns, "conformant", kubevirt.Options{})
	server, err := redfish.NewServer(redfish.Config{
		Backend:  backend,
		Accounts: []redfish.Account{{Username: suiteUser, Password: suitePass, Role: redfish.RoleAdministrator}},
		Logger:   logr.Discard(),
		// The suite's push subscription POSTs to its receiver on 127.0.0.1.
		EventDestinationsAllowLoopback: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewTLSServer(server)
	t.Cleanup(ts.Close)
	// One machine: 44 resources, its virtual CD, processor, memory, drives
	// and volumes among them.
	requireClean(t, runSuite(t, ts, suiteUser, suitePass), 44)
}
