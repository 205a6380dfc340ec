package kubevirt

import (
	"context"

	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/machine"
)

// Machine is the VM as a machine. Capabilities reflect the VM as it was
// when Backend.Machine returned it; everything else reads the VM anew.
type Machine struct {
	b     *Backend
	mode  machine.BootMode
	media bool
}

var _ machine.Machine = (*Machine)(nil)

// ID is the VM name.
func (m *Machine) ID() string { return m.b.vmName }

// resetTypes is every reset but Nmi: KubeVirt has no API to inject one.
var resetTypes = []machine.ResetType{
	machine.ResetOn, machine.ResetForceOn, machine.ResetForceOff, machine.ResetGracefulShutdown,
	machine.ResetGracefulRestart, machine.ResetForceRestart, machine.ResetPowerCycle,
}

// Capabilities lists the resets KubeVirt can do, the boot targets a VM's
// bootOrder can express, and the VM's one firmware mode.
func (m *Machine) Capabilities() machine.Capabilities {
	return machine.Capabilities{
		ResetTypes:   resetTypes,
		BootTargets:  []machine.BootTarget{machine.BootPxe, machine.BootHdd, machine.BootCd},
		BootModes:    []machine.BootMode{m.mode},
		VirtualMedia: m.media,
	}
}

// PowerState combines what was asked (runStrategy) with what KubeVirt
// reports (printableStatus, VMI phase).
func (m *Machine) PowerState(ctx context.Context) (machine.PowerState, error) {
	vm, vmi, err := m.b.read(ctx)
	if err != nil {
		return "", err
	}
	return powerState(vm, vmi), nil
}

var (
	gracePeriodNone int64 = 0
	halted                = kubevirtv1.RunStrategyHalted
	always                = kubevirtv1.RunStrategyAlways
)

// Reset translates a power action into runStrategy and KubeVirt's stop and
// restart subresources. It acts on the desired state, never on the
// (lagging) status, so actions issued back to back converge on the last one.
func (m *Machine) Reset(ctx context.Context, r machine.ResetType) error {
	if err := m.Capabilities().CheckReset(r); err != nil {
		return err
	}
	switch r {
	case machine.ResetOn, machine.ResetForceOn:
		_, err := m.b.writeRunStrategy(ctx, always)
		return err
	case machine.ResetGracefulShutdown:
		// virt-controller stops the VMI with the VM's grace period (ACPI).
		_, err := m.b.writeRunStrategy(ctx, halted)
		return err
	case machine.ResetForceOff:
		return m.forceOff(ctx)
	case machine.ResetForceRestart, machine.ResetPowerCycle:
		return m.restart(ctx, true)
	default: // GracefulRestart: CheckReset admitted nothing else
		return m.restart(ctx, false)
	}
}

// forceOff stops the VM at once. virt-handler shuts a VMI down within the
// VMI's own terminationGracePeriodSeconds, which only KubeVirt may change:
// the stop subresource with gracePeriod 0 does, so it comes first. Deleting
// the VMI cannot shorten that wait (custom resources ignore a delete's grace
// period), so it is only the fallback where no virt-api serves the
// subresource.
func (m *Machine) forceOff(ctx context.Context) error {
	result, err := m.b.callSubresource(ctx, "stop", &kubevirtv1.StopOptions{GracePeriod: &gracePeriodNone})
	if err != nil {
		return err
	}
	// stop leaves the strategies Manual and RerunOnFailure as they are, and
	// a refused stop (already off) changes nothing: Off is Halted for a BMC.
	vmi, err := m.b.writeRunStrategy(ctx, halted)
	if err != nil || vmi == nil || result != subresourceNotServed {
		return err
	}
	return m.b.deleteVMI(ctx, vmi.UID, &gracePeriodNone)
}

// restart makes a new VMI: with runStrategy Always virt-controller starts
// one where there is none (the VM is off) and replaces one that stops. A
// forced restart asks virt-api (restart, gracePeriodSeconds 0); where that
// is not served or refused (the VMI went meanwhile), and for a graceful
// restart, deleting the VMI makes virt-controller replace it.
func (m *Machine) restart(ctx context.Context, force bool) error {
	vmi, err := m.b.writeRunStrategy(ctx, always)
	if err != nil || vmi == nil {
		return err
	}
	if !force {
		return m.b.deleteVMI(ctx, vmi.UID, nil)
	}
	return m.b.restartNow(ctx, vmi.UID)
}

// restartNow replaces the VMI with that UID at once: virt-api's restart
// with gracePeriodSeconds 0, or, where that is not served or is refused,
// deleting the VMI.
func (b *Backend) restartNow(ctx context.Context, uid types.UID) error {
	result, err := b.callSubresource(ctx, "restart", &kubevirtv1.RestartOptions{GracePeriodSeconds: &gracePeriodNone})
	if err != nil || result == subresourceDone {
		return err
	}
	return b.deleteVMI(ctx, uid, &gracePeriodNone)
}

// setRunStrategy writes runStrategy directly (clearing the deprecated
// spec.running, which excludes it), whatever it was before.
func setRunStrategy(s kubevirtv1.VirtualMachineRunStrategy) func(*kubevirtv1.VirtualMachine, *kubevirtv1.VirtualMachineInstance) (bool, error) {
	return func(vm *kubevirtv1.VirtualMachine, _ *kubevirtv1.VirtualMachineInstance) (bool, error) {
		if vm.Spec.Running == nil && vm.Spec.RunStrategy != nil && *vm.Spec.RunStrategy == s {
			return false, nil
		}
		vm.Spec.Running = nil
		vm.Spec.RunStrategy = &s
		return true, nil
	}
}

// powerState maps KubeVirt's view onto a BMC's. The status lags the spec, so
// a runStrategy the status has not caught up with shows as the transition
// it will cause.
func powerState(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) machine.PowerState {
	observed := observedPower(vm, vmi)
	strategy, err := vm.RunStrategy()
	if err != nil {
		return observed
	}
	switch {
	case (strategy == always || strategy == kubevirtv1.RunStrategyRerunOnFailure) && observed == machine.PowerOff:
		return machine.PoweringOn
	case strategy == halted && (observed == machine.PowerOn || observed == machine.PoweringOn || observed == machine.Paused):
		return machine.PoweringOff
	}
	return observed
}

func observedPower(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) machine.PowerState {
	if vmi != nil && vmi.DeletionTimestamp != nil {
		return machine.PoweringOff
	}
	switch vm.Status.PrintableStatus {
	case kubevirtv1.VirtualMachineStatusRunning, kubevirtv1.VirtualMachineStatusMigrating:
		return machine.PowerOn
	case kubevirtv1.VirtualMachineStatusStopped:
		return machine.PowerOff
	case kubevirtv1.VirtualMachineStatusPaused:
		return machine.Paused
	case kubevirtv1.VirtualMachineStatusStopping, kubevirtv1.VirtualMachineStatusTerminating:
		return machine.PoweringOff
	case kubevirtv1.VirtualMachineStatusStarting, kubevirtv1.VirtualMachineStatusProvisioning,
		kubevirtv1.VirtualMachineStatusWaitingForVolumeBinding, kubevirtv1.VirtualMachineStatusWaitingForReceiver,
		kubevirtv1.VirtualMachineStatusCrashLoopBackOff, kubevirtv1.VirtualMachineStatusUnschedulable,
		kubevirtv1.VirtualMachineStatusErrImagePull, kubevirtv1.VirtualMachineStatusImagePullBackOff,
		kubevirtv1.VirtualMachineStatusPvcNotFound, kubevirtv1.VirtualMachineStatusDataVolumeError:
		// Not running yet, and KubeVirt keeps trying.
		return machine.PoweringOn
	}
	// No (or an unknown) printableStatus: go by the VMI.
	if vmi == nil {
		return machine.PowerOff
	}
	switch vmi.Status.Phase {
	case kubevirtv1.Running:
		return machine.PowerOn
	case kubevirtv1.Succeeded, kubevirtv1.Failed:
		return machine.PowerOff
	default:
		return machine.PoweringOn
	}
}
