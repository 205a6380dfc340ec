package realkubevirt_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/deploy/bmc"
	"github.com/virtmetal/virtmetal/internal/kubetest"
	"github.com/virtmetal/virtmetal/internal/kubetest/realkubevirt"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
)

// bmcMachine runs the kubevirt backend for the VM as the controller's
// bmc-server would: as the VM's ServiceAccount, holding only the per-VM
// Role deploy/bmc renders. Any 403 is a bug in that Role or the backend.
func bmcMachine(t testing.TB, namespace, vm string) machine.Machine {
	t.Helper()
	ctx := context.Background()
	objs, err := bmc.RBACObjects(bmc.RBACParams{Namespace: namespace, VMName: vm})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetNamespace() == "" && o.GetKind() != "ClusterRole" && o.GetKind() != "ClusterRoleBinding" {
			o.SetNamespace(namespace)
		}
		if err := cluster.Client.Create(ctx, o); err != nil {
			t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	return machineAs(t, namespace, vm)
}

// machineAs runs the kubevirt backend for the VM as its bmc-server's
// ServiceAccount, "bmc-<vm>", with whatever RBAC that account was given.
func machineAs(t testing.TB, namespace, vm string) machine.Machine {
	t.Helper()
	ctx := context.Background()
	cfg, err := cluster.ConfigFor(kubetest.ServiceAccountUser(namespace, "bmc-"+vm), "system:serviceaccounts", "system:serviceaccounts:"+namespace)
	if err != nil {
		t.Fatal(err)
	}
	b := kubevirttest.StartBackend(t, cfg, namespace, vm, kubevirt.Options{Logger: logr.Discard()})
	m, err := b.Machine(ctx, vm)
	if err != nil {
		t.Fatalf("Machine: %v", err)
	}
	return m
}

// newHaltedVM creates a powered-off VM as a tenant would.
func newHaltedVM(t testing.TB) (namespace string, key client.ObjectKey) {
	t.Helper()
	ns := newNamespace(t)
	if err := cluster.Client.Create(context.Background(), newVM(ns, "vm", kubevirtv1.RunStrategyHalted)); err != nil {
		t.Fatal(err)
	}
	return ns, client.ObjectKey{Namespace: ns, Name: "vm"}
}

// waitPower waits until the machine reads want and KubeVirt's objects
// agree: a Running VMI for On, none (or one that ended) for Off. It returns
// the running VMI's UID.
func waitPower(t *testing.T, m machine.Machine, key client.ObjectKey, want machine.PowerState) types.UID {
	t.Helper()
	var uid types.UID
	eventually(t, "power "+string(want), func() (bool, error) {
		st, err := m.PowerState(context.Background())
		if err != nil || st != want {
			return false, fmt.Errorf("PowerState %s, %v", st, err)
		}
		vmi := &kubevirtv1.VirtualMachineInstance{}
		err = cluster.Client.Get(context.Background(), key, vmi)
		switch want {
		case machine.PowerOn:
			uid = vmi.UID
			return err == nil && vmi.Status.Phase == kubevirtv1.Running, fmt.Errorf("VMI phase %q, %v", vmi.Status.Phase, err)
		default:
			return client.IgnoreNotFound(err) == nil && (err != nil || vmi.IsFinal()), fmt.Errorf("VMI phase %q, %v", vmi.Status.Phase, err)
		}
	})
	return uid
}

// Every ResetType the backend advertises, from On and from Off, against
// KubeVirt's own virt-controller and virt-api, with the per-VM Role: each
// ends in the state Redfish reports, read back from the real objects; a
// restart of a running VM makes a new VMI.
func TestEveryResetOnRealKubeVirt(t *testing.T) {
	tests := []struct {
		reset   machine.ResetType
		want    machine.PowerState
		restart bool // from On, a new VMI
	}{
		{machine.ResetOn, machine.PowerOn, false},
		{machine.ResetForceOn, machine.PowerOn, false},
		{machine.ResetForceOff, machine.PowerOff, false},
		{machine.ResetGracefulShutdown, machine.PowerOff, false},
		{machine.ResetGracefulRestart, machine.PowerOn, true},
		{machine.ResetForceRestart, machine.PowerOn, true},
		{machine.ResetPowerCycle, machine.PowerOn, true},
	}
	for _, from := range []machine.PowerState{machine.PowerOff, machine.PowerOn} {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%s from %s", tc.reset, from), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				ns, key := newHaltedVM(t)
				m := bmcMachine(t, ns, "vm")
				var before types.UID
				if from == machine.PowerOn {
					if err := m.Reset(ctx, machine.ResetOn); err != nil {
						t.Fatalf("Reset On: %v", err)
					}
					before = waitPower(t, m, key, machine.PowerOn)
				}
				if err := m.Reset(ctx, tc.reset); err != nil {
					t.Fatalf("Reset %s: %v", tc.reset, err)
				}
				if tc.restart && from == machine.PowerOn {
					eventually(t, "a new VMI", func() (bool, error) {
						vmi := &kubevirtv1.VirtualMachineInstance{}
						err := cluster.Client.Get(ctx, key, vmi)
						return err == nil && vmi.UID != before, err
					})
				}
				if after := waitPower(t, m, key, tc.want); !tc.restart && from == machine.PowerOn && tc.want == machine.PowerOn && after != before {
					t.Errorf("VMI %s before, %s after: %s made a new VMI", before, after, tc.reset)
				}
			})
		}
	}
}

// A guest that powers itself off stays off, as a server's does (MaaS's
// enlistment and commissioning end with poweroff), and reads Off; On then
// starts it again. A guest reboot keeps the VM on, with the same VMI.
func TestGuestPowerOffOnRealKubeVirt(t *testing.T) {
	ctx := context.Background()
	ns, key := newHaltedVM(t)
	m := bmcMachine(t, ns, "vm")
	if err := m.Reset(ctx, machine.ResetOn); err != nil {
		t.Fatalf("Reset On: %v", err)
	}
	first := waitPower(t, m, key, machine.PowerOn)

	if err := node.RebootGuest(ctx, ns, "vm"); err != nil {
		t.Fatalf("RebootGuest: %v", err)
	}
	if again := waitPower(t, m, key, machine.PowerOn); again != first {
		t.Errorf("VMI %s after a guest reboot, want %s (the same)", again, first)
	}

	node.ShutdownGuest(ns, "vm")
	waitPower(t, m, key, machine.PowerOff)
	eventually(t, "virt-controller settles the VM off", func() (bool, error) {
		vm := &kubevirtv1.VirtualMachine{}
		if err := cluster.Client.Get(ctx, key, vm); err != nil {
			return false, err
		}
		return vm.Status.PrintableStatus == kubevirtv1.VirtualMachineStatusStopped && vm.Status.RunStrategy == kubevirtv1.RunStrategyRerunOnFailure,
			fmt.Errorf("printableStatus %q, status.runStrategy %q", vm.Status.PrintableStatus, vm.Status.RunStrategy)
	})
	// Settled, nothing is left to start it; still, give virt-controller
	// the time a restart would take.
	time.Sleep(2 * time.Second)
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := cluster.Client.Get(ctx, key, vmi); err == nil && !vmi.IsFinal() {
		t.Fatalf("a VMI %s (phase %s) after the guest powered off, want none", vmi.UID, vmi.Status.Phase)
	}
	if st, err := m.PowerState(ctx); err != nil || st != machine.PowerOff {
		t.Fatalf("PowerState after the guest powered off = %s, %v; want Off", st, err)
	}

	if err := m.Reset(ctx, machine.ResetOn); err != nil {
		t.Fatalf("Reset On after the guest powered off: %v", err)
	}
	if next := waitPower(t, m, key, machine.PowerOn); next == first {
		t.Errorf("On after the guest powered off kept VMI %s, want a new one", first)
	}
}

// virt-controller writes a VM's status after it has seen the VMI's, and
// under load that lags by many seconds (in the lab's 50 VMs, a VM read
// Stopped well after its guest had PXE booted). A running guest reads On
// meanwhile, not PoweringOn: MaaS takes PoweringOn for off and sends On
// with a PXE boot once, which would boot nothing. virt-controller is
// stopped here to hold the VM's status back.
func TestPowerStateAheadOfVMStatus(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	key := client.ObjectKey{Namespace: ns, Name: "vm"}
	vm := newVM(ns, "vm", kubevirtv1.RunStrategyAlways)
	vm.Annotations = map[string]string{realkubevirt.HoldStartAnnotation: "test"}
	if err := cluster.Client.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	m := bmcMachine(t, ns, "vm")
	eventually(t, "the VM Starting, its VMI Scheduled", func() (bool, error) {
		vm, vmi := &kubevirtv1.VirtualMachine{}, &kubevirtv1.VirtualMachineInstance{}
		if err := cluster.Client.Get(ctx, key, vm); err != nil {
			return false, err
		}
		if err := cluster.Client.Get(ctx, key, vmi); err != nil {
			return false, err
		}
		return vm.Status.PrintableStatus == kubevirtv1.VirtualMachineStatusStarting && vmi.Status.Phase == kubevirtv1.Scheduled,
			fmt.Errorf("printableStatus %q, VMI phase %q", vm.Status.PrintableStatus, vmi.Status.Phase)
	})
	if st, err := m.PowerState(ctx); err != nil || st != machine.PoweringOn {
		t.Fatalf("PowerState while the VMI is Scheduled = %s, %v; want PoweringOn", st, err)
	}

	cluster.StopVirtController()
	t.Cleanup(func() {
		if err := cluster.StartVirtController(context.Background()); err != nil {
			t.Errorf("starting virt-controller again: %v", err)
		}
	})
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+realkubevirt.HoldStartAnnotation+`":null}}}`))
	if err := cluster.Client.Patch(ctx, &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm"}}, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the guest running", func() (bool, error) {
		vmi := &kubevirtv1.VirtualMachineInstance{}
		err := cluster.Client.Get(ctx, key, vmi)
		return err == nil && vmi.Status.Phase == kubevirtv1.Running, fmt.Errorf("VMI phase %q, %v", vmi.Status.Phase, err)
	})
	eventually(t, "PowerState On", func() (bool, error) {
		st, err := m.PowerState(ctx)
		return err == nil && st == machine.PowerOn, fmt.Errorf("PowerState %s, %v", st, err)
	})
	got := &kubevirtv1.VirtualMachine{}
	if err := cluster.Client.Get(ctx, key, got); err != nil {
		t.Fatal(err)
	}
	if got.Status.PrintableStatus != kubevirtv1.VirtualMachineStatusStarting {
		t.Fatalf("the VM's printableStatus is %q: virt-controller was to hold it at Starting", got.Status.PrintableStatus)
	}
}

// A VM made the kubectl way, with spec.running instead of runStrategy: the
// backend powers it on and off through the strategy, which virt-api's
// validator accepts because the backend clears spec.running with it.
func TestSpecRunningVMOnRealKubeVirt(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	vm := newVM(ns, "vm", "")
	vm.Spec.RunStrategy, vm.Spec.Running = nil, ptr.To(false)
	if err := cluster.Client.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(vm)
	m := bmcMachine(t, ns, "vm")
	for _, step := range []struct {
		reset machine.ResetType
		want  machine.PowerState
	}{{machine.ResetOn, machine.PowerOn}, {machine.ResetForceOff, machine.PowerOff}, {machine.ResetOn, machine.PowerOn}} {
		if err := m.Reset(ctx, step.reset); err != nil {
			t.Fatalf("Reset %s: %v", step.reset, err)
		}
		waitPower(t, m, key, step.want)
	}
}

// Boot overrides on the real control plane: Pxe Once boots the network
// once, and the next start the disk; Continuous stays until disabled. The
// node stand-in records each boot's first device from the VMI's spec.
func TestBootOverrideOnRealKubeVirt(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	vm := newVM(ns, "vm", kubevirtv1.RunStrategyHalted)
	spec := &vm.Spec.Template.Spec
	spec.Domain.Devices.Disks = []kubevirtv1.Disk{{Name: "root", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}}}
	spec.Volumes = []kubevirtv1.Volume{{Name: "root", VolumeSource: kubevirtv1.VolumeSource{ContainerDisk: &kubevirtv1.ContainerDiskSource{Image: "example.invalid/disk:1"}}}}
	spec.Domain.Devices.Interfaces = []kubevirtv1.Interface{{Name: "default", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}}}}
	spec.Networks = []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}}
	if err := cluster.Client.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(vm)
	m := bmcMachine(t, ns, "vm")
	mode := m.Capabilities().BootModes[0]
	boots := 0
	step := func(o *machine.BootOverride, reset machine.ResetType, want string) {
		t.Helper()
		if o != nil {
			o.Mode = mode
			if err := m.SetBootOverride(ctx, *o); err != nil {
				t.Fatalf("SetBootOverride %+v: %v", *o, err)
			}
		}
		if err := m.Reset(ctx, reset); err != nil {
			t.Fatalf("Reset %s: %v", reset, err)
		}
		boots++
		eventually(t, fmt.Sprintf("boot %d", boots), func() (bool, error) {
			got := node.Boots(ns, "vm")
			return len(got) >= boots, fmt.Errorf("boots %v", got)
		})
		waitPower(t, m, key, machine.PowerOn)
		if got := node.Boots(ns, "vm"); len(got) != boots || got[boots-1] != want {
			t.Fatalf("boots %v, want boot %d from %s", got, boots, want)
		}
	}
	step(&machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce}, machine.ResetOn, "interface/default")
	eventually(t, "the Once override consumed", func() (bool, error) {
		o, err := m.BootOverride(ctx)
		return err == nil && o.Enabled == machine.BootDisabled, fmt.Errorf("override %+v, %v", o, err)
	})
	step(nil, machine.ResetForceRestart, "disk/root")
	step(&machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootContinuous}, machine.ResetForceRestart, "interface/default")
	step(nil, machine.ResetGracefulRestart, "interface/default")
	step(&machine.BootOverride{Target: machine.BootHdd, Enabled: machine.BootDisabled}, machine.ResetForceRestart, "disk/root")
}

// BenchmarkReset is machine/kubevirt's BenchmarkReset on the real control
// plane, with the per-VM Role.
func BenchmarkReset(b *testing.B) {
	ns, key := newHaltedVM(b)
	kubevirttest.BenchmarkResets(b, bmcMachine(b, ns, "vm"), cluster.Client, key)
}

// concurrentResets has 8 clients act on the machine at once, On and
// ForceOff mixed, as several provisioning tools or retries would, and
// returns how many of them got an error.
func concurrentResets(tb testing.TB, m machine.Machine) int64 {
	var failures atomic.Int64
	var wg sync.WaitGroup
	for c := range 8 {
		reset := []machine.ResetType{machine.ResetOn, machine.ResetForceOff}[c%2]
		wg.Go(func() {
			if err := m.Reset(context.Background(), reset); err != nil {
				failures.Add(1)
				tb.Logf("Reset %s: %v", reset, err)
			}
		})
	}
	wg.Wait()
	return failures.Load()
}

// Concurrent On and ForceOff on one VM all succeed: virt-api's stop fails
// with 500 when two calls race on the VM's state change requests, which
// the backend must absorb.
func TestConcurrentResetsOnRealKubeVirt(t *testing.T) {
	ns, key := newHaltedVM(t)
	m := bmcMachine(t, ns, "vm")
	for round := range 10 {
		if n := concurrentResets(t, m); n != 0 {
			t.Fatalf("round %d: %d of 8 concurrent resets failed", round, n)
		}
	}
	// The last writes decide; either way KubeVirt settles on what the
	// machine reports.
	eventually(t, "a settled power state", func() (bool, error) {
		st, err := m.PowerState(context.Background())
		return err == nil && (st == machine.PowerOn || st == machine.PowerOff), fmt.Errorf("PowerState %s, %v", st, err)
	})
	st, _ := m.PowerState(context.Background())
	waitPower(t, m, key, st)
}

// BenchmarkConcurrentReset: concurrentResets' 8 clients per iteration;
// errors are counted (want 0).
func BenchmarkConcurrentReset(b *testing.B) {
	ns, _ := newHaltedVM(b)
	m := bmcMachine(b, ns, "vm")
	var failures int64
	for b.Loop() {
		failures += concurrentResets(b, m)
	}
	b.ReportMetric(float64(failures), "errors")
}

// Boot mode Legacy → UEFI, then Secure Boot, written by the backend with
// the per-VM Role: virt-api's VM validator accepts each write (Secure Boot
// needs SMM), the VMI KubeVirt starts carries them, and ResetFirmware puts
// the VM's own BIOS back.
func TestFirmwareOnRealKubeVirt(t *testing.T) {
	ctx := context.Background()
	ns, key := newHaltedVM(t)
	m := bmcMachine(t, ns, "vm")
	legacy := machine.Firmware{Mode: machine.BootModeLegacy}
	if got, err := m.Firmware(ctx); err != nil || got.Next != legacy {
		t.Fatalf("Firmware = %+v, %v; want %+v", got, err, legacy)
	}
	// BootSourceOverrideMode alone: no device override, the firmware only.
	uefi := machine.BootOverride{Target: machine.BootNone, Enabled: machine.BootDisabled, Mode: machine.BootModeUEFI}
	if err := m.SetBootOverride(ctx, uefi); err != nil {
		t.Fatalf("SetBootOverride(%+v): %v", uefi, err)
	}
	secure := machine.Firmware{Mode: machine.BootModeUEFI, SecureBoot: true}
	if err := m.SetFirmware(ctx, secure); err != nil {
		t.Fatalf("SetFirmware(%+v): %v", secure, err)
	}
	if err := m.SetLocatorActive(ctx, true); err != nil {
		t.Fatalf("SetLocatorActive: %v", err)
	}
	if err := m.Reset(ctx, machine.ResetOn); err != nil {
		t.Fatalf("Reset On: %v", err)
	}
	waitPower(t, m, key, machine.PowerOn)
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := cluster.Client.Get(ctx, key, vmi); err != nil {
		t.Fatal(err)
	}
	domain := vmi.Spec.Domain
	if fw := domain.Firmware; fw == nil || fw.Bootloader == nil || fw.Bootloader.EFI == nil || !ptr.Deref(fw.Bootloader.EFI.SecureBoot, true) {
		t.Errorf("VMI firmware %+v, want EFI with Secure Boot", domain.Firmware)
	}
	if domain.Features == nil || domain.Features.SMM == nil || !ptr.Deref(domain.Features.SMM.Enabled, true) {
		t.Errorf("VMI features %+v, want SMM enabled", domain.Features)
	}
	if got, err := m.Firmware(ctx); err != nil || got.Current != secure || got.Pending() {
		t.Errorf("running: Firmware = %+v, %v; want current %+v", got, err, secure)
	}
	if on, err := m.LocatorActive(ctx); err != nil || !on {
		t.Errorf("LocatorActive = %v, %v; want true", on, err)
	}
	if err := m.ResetFirmware(ctx); err != nil {
		t.Fatalf("ResetFirmware: %v", err)
	}
	vm := &kubevirtv1.VirtualMachine{}
	if err := cluster.Client.Get(ctx, key, vm); err != nil {
		t.Fatal(err)
	}
	if fw := vm.Spec.Template.Spec.Domain.Firmware; fw != nil && fw.Bootloader != nil {
		t.Errorf("after ResetFirmware: bootloader %+v, want the VM's own (none)", fw.Bootloader)
	}
	if got, err := m.Firmware(ctx); err != nil || got.Next != legacy || got.Current != secure {
		t.Errorf("after ResetFirmware: Firmware = %+v, %v; want next %+v while the VMI runs %+v", got, err, legacy, secure)
	}
	// The validator is the one that matters: Secure Boot without SMM is
	// refused, so the backend's writes above were checked.
	vm.Spec.Template.Spec.Domain.Firmware.Bootloader = &kubevirtv1.Bootloader{EFI: &kubevirtv1.EFI{SecureBoot: ptr.To(true)}}
	vm.Spec.Template.Spec.Domain.Features = &kubevirtv1.Features{SMM: &kubevirtv1.FeatureState{Enabled: ptr.To(false)}}
	if err := cluster.Client.Update(ctx, vm); err == nil {
		t.Errorf("virt-api accepted Secure Boot without SMM: the check above proves nothing")
	}
}
