package kubevirt_test

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
)

// TestOverrideWhileStarting plays MaaS's power-on sequence against a VM
// caught mid-start (the VMI exists, the guest has not booted): MaaS reads
// PoweringOn as off, so it skips its power-off, sets a one-time PXE boot
// and sends On. The machine must boot from the network, once.
func TestOverrideWhileStarting(t *testing.T) {
	ns := cluster.NewNamespace(t)
	newVM(t, ns, "vm", func(vm *kubevirtv1.VirtualMachine) {
		always := kubevirtv1.RunStrategyAlways
		vm.Spec.RunStrategy = &always
		vm.Annotations = map[string]string{cluster.HoldStartAnnotation(): "test"}
	})
	m := mustMachine(t, kubevirttest.StartBackend(t, cluster.Config, ns, "vm", kubevirt.Options{}), "vm")
	ctx := t.Context()
	waitPower(t, m, machine.PoweringOn)

	if err := m.SetBootOverride(ctx, machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce, Mode: machine.BootModeUEFI}); err != nil {
		t.Fatalf("SetBootOverride while starting: %v", err)
	}
	if err := m.Reset(ctx, machine.ResetOn); err != nil {
		t.Fatalf("On while starting: %v", err)
	}
	// Let the start finish.
	vm := getVM(t, ns, "vm")
	patch := client.MergeFrom(vm.DeepCopy())
	delete(vm.Annotations, cluster.HoldStartAnnotation())
	if err := cluster.Client.Patch(ctx, vm, patch); err != nil {
		t.Fatal(err)
	}
	waitPower(t, m, machine.PowerOn)
	if boots := cluster.Boots(ns, "vm"); !slices.Equal(boots, []machine.BootTarget{machine.BootPxe}) {
		t.Fatalf("boots = %v, want [Pxe]: the start under way must use the override", boots)
	}
	poll.True(t, "the Once override consumed by that boot", func() bool {
		o, err := m.BootOverride(ctx)
		return err == nil && o.Enabled == machine.BootDisabled
	})
	// The next start boots the disk again.
	if err := m.Reset(ctx, machine.ResetForceRestart); err != nil {
		t.Fatal(err)
	}
	poll.True(t, "a second boot", func() bool { return len(cluster.Boots(ns, "vm")) == 2 })
	if boots := cluster.Boots(ns, "vm"); boots[1] != machine.BootHdd {
		t.Fatalf("boots = %v, want the disk after the Once override", boots)
	}
}

// TestStartFromTheTemplateBeforeTheOverride: virt-controller can create a
// VMI from the template as it read it just before a boot override was
// written, so the BMC that wrote it saw no VMI to restart. The backend
// restarts such a start as soon as it sees it: the guest boots the
// override, once.
func TestStartFromTheTemplateBeforeTheOverride(t *testing.T) {
	ns := cluster.NewNamespace(t)
	newVM(t, ns, "vm", func(vm *kubevirtv1.VirtualMachine) {
		always := kubevirtv1.RunStrategyAlways
		vm.Spec.RunStrategy = &always
		vm.Annotations = map[string]string{cluster.HoldStartAnnotation(): "test"}
	})
	ctx := t.Context()
	stale := &kubevirtv1.VirtualMachineInstance{}
	poll.True(t, "the VMI of the start under way", func() bool {
		return cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vm"}, stale) == nil
	})
	// The override as a BMC writes it, after that VMI was made.
	vm := &kubevirtv1.VirtualMachine{}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vm"}, vm); err != nil {
			return err
		}
		if err := kubevirt.WriteOverride(vm, machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce, Mode: machine.BootModeUEFI}); err != nil {
			return err
		}
		return cluster.Client.Update(ctx, vm)
	})
	if err != nil {
		t.Fatal(err)
	}

	m := mustMachine(t, kubevirttest.StartBackend(t, cluster.Config, ns, "vm", kubevirt.Options{}), "vm")
	poll.True(t, "the start made again from the template", func() bool {
		vmi := &kubevirtv1.VirtualMachineInstance{}
		return cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vm"}, vmi) == nil && vmi.UID != stale.UID
	})
	release := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+cluster.HoldStartAnnotation()+`":null}}}`))
	if err := cluster.Client.Patch(ctx, vm, release); err != nil {
		t.Fatal(err)
	}
	waitPower(t, m, machine.PowerOn)
	if boots := cluster.Boots(ns, "vm"); !slices.Equal(boots, []machine.BootTarget{machine.BootPxe}) {
		t.Fatalf("boots = %v, want [Pxe]: the start under way must boot the override", boots)
	}
	poll.True(t, "the Once override consumed by that boot", func() bool {
		o, err := m.BootOverride(ctx)
		return err == nil && o.Enabled == machine.BootDisabled
	})
}
