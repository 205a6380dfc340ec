package kubevirt_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/kubetest"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
	virtsim "github.com/virtmetal/virtmetal/sim/kubevirt"
)

// One API server and one simulated virt-controller for the package.
var (
	cluster *kubevirttest.Cluster
	env     *kubetest.Env
	sim     *virtsim.Simulator
)

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	var err error
	cluster, err = kubevirttest.Start("kv", virtsim.Options{StartDelay: 50 * time.Millisecond, StopDelay: 100 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = cluster.Stop() }()
	env, sim = cluster.Env, cluster.Sim
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
	if err := env.Client.Create(context.Background(), vm); err != nil {
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
							UUID:       testUUID,
							Serial:     "serial-" + name,
							Bootloader: &kubevirtv1.Bootloader{EFI: &kubevirtv1.EFI{}},
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
						VolumeSource: kubevirtv1.VolumeSource{ContainerDisk: &kubevirtv1.ContainerDiskSource{Image: "quay.io/containerdisks/fedora:latest"}},
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
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, vm); err != nil {
		t.Fatalf("get VM: %v", err)
	}
	return vm
}
