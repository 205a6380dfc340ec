package kubevirt_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/kubetest/realkubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
)

// KubeVirt's real control plane with its node stand-in, for the package.
var cluster *kubevirttest.Cluster

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var err error
	cluster, err = kubevirttest.StartReal(ctx, "kv", realkubevirt.Options{KeepDir: os.Getenv("REALKUBEVIRT_KEEP") != ""})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = cluster.Stop() }()
	return m.Run()
}

const testUUID = "5AD0B6E3-6A5D-4C7E-9F1B-3C2D1E0F9A8B"

// newVM creates a powered-off VM with a disk, a CD-ROM-less layout, one NIC
// with a fixed MAC, EFI firmware and 2 cores / 1Gi; change adjusts it.
func newVM(t testing.TB, namespace, name string, change func(vm *kubevirtv1.VirtualMachine)) *kubevirtv1.VirtualMachine {
	t.Helper()
	vm := newVMObject(namespace, name)
	if change != nil {
		change(vm)
	}
	if err := cluster.Client.Create(context.Background(), vm); err != nil {
		t.Fatalf("creating VM: %v", err)
	}
	return vm
}

// newVMObject is the VM newVM creates, not yet created.
func newVMObject(namespace, name string) *kubevirtv1.VirtualMachine {
	halted := kubevirtv1.RunStrategyHalted
	memory := resource.MustParse("1Gi")
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &halted,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				Spec: kubevirtv1.VirtualMachineInstanceSpec{
					Domain: kubevirtv1.DomainSpec{
						CPU:    &kubevirtv1.CPU{Cores: 2},
						Memory: &kubevirtv1.Memory{Guest: &memory},
						Firmware: &kubevirtv1.Firmware{
							UUID:   testUUID,
							Serial: "serial-" + name,
							// KubeVirt turns secure boot on when efi says nothing, and then
							// requires SMM.
							Bootloader: &kubevirtv1.Bootloader{EFI: &kubevirtv1.EFI{SecureBoot: ptr.To(false)}},
						},
						Devices: kubevirtv1.Devices{
							Disks: []kubevirtv1.Disk{{
								Name:       "root",
								DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}},
							}},
							Interfaces: []kubevirtv1.Interface{{
								Name:                   "default",
								MacAddress:             "02:AB:CD:00:00:01",
								InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}},
							}},
						},
					},
					Networks: []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
					Volumes: []kubevirtv1.Volume{{
						Name:         "root",
						VolumeSource: kubevirtv1.VolumeSource{ContainerDisk: &kubevirtv1.ContainerDiskSource{Image: "containerdisks/fedora:latest"}},
					}},
				},
			},
		},
	}
}

// getVM reads the VM as an admin.
func getVM(t testing.TB, namespace, name string) *kubevirtv1.VirtualMachine {
	t.Helper()
	vm := &kubevirtv1.VirtualMachine{}
	if err := cluster.Client.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, vm); err != nil {
		t.Fatalf("get VM: %v", err)
	}
	return vm
}

// updateVM changes the VM as an admin, retrying when virt-controller wrote
// it in between.
func updateVM(t testing.TB, namespace, name string, change func(vm *kubevirtv1.VirtualMachine)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		vm := getVM(t, namespace, name)
		change(vm)
		return cluster.Client.Update(context.Background(), vm)
	})
	if err != nil {
		t.Fatalf("updating VM %s/%s: %v", namespace, name, err)
	}
}

// powerOnBehindTheBMC sets the VM's runStrategy Always, as someone with
// kubectl would.
func powerOnBehindTheBMC(t testing.TB, namespace, name string) {
	t.Helper()
	updateVM(t, namespace, name, func(vm *kubevirtv1.VirtualMachine) {
		vm.Spec.RunStrategy = ptr.To(kubevirtv1.RunStrategyAlways)
	})
}
