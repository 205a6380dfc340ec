package kubevirt

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/machine"
)

// Machine is the VM as a machine. Capabilities reflect the VM as it was
// when Backend.Machine returned it; everything else reads the VM anew.
type Machine struct {
	b        *Backend
	modes    []machine.BootMode
	media    bool
	consoles []machine.ConsoleKind
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
// bootOrder can express, the firmware modes of the VM's architecture, and
// the consoles its devices give it.
func (m *Machine) Capabilities() machine.Capabilities {
	return machine.Capabilities{
		ResetTypes:   resetTypes,
		BootTargets:  []machine.BootTarget{machine.BootPxe, machine.BootHdd, machine.BootCd},
		BootModes:    m.modes,
		VirtualMedia: m.media,
		Consoles:     m.consoles,
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
	// poweredOn is the runStrategy a BMC's On writes. A server whose OS
	// powers it off stays off, and MaaS relies on that (its enlistment and
	// commissioning environments end with poweroff): with Always KubeVirt
	// would start a new VMI at once. RerunOnFailure restarts only a VMI that
	// failed, as a server's power-restore policy would.
	poweredOn = kubevirtv1.RunStrategyRerunOnFailure
)

// Reset translates a power action into runStrategy and KubeVirt's start,
// stop and restart subresources. It acts on the desired state, never on
// the (lagging) status, so actions issued back to back converge on the
// last one.
func (m *Machine) Reset(ctx context.Context, r machine.ResetType) error {
	if err := m.Capabilities().CheckReset(r); err != nil {
		return err
	}
	switch r {
	case machine.ResetOn, machine.ResetForceOn:
		return m.b.powerOn(ctx)
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

// powerOn writes runStrategy RerunOnFailure, which starts a VM coming from
// another strategy. A VM that already has it and is off (its guest powered
// off, or a start failed for good) starts only through virt-api's start.
// Where no virt-api serves it, Always is the one way to start the VM, at
// the price of restarts after a guest poweroff; it is written at once while
// virt-api is known to be missing, since a VMI the fallbacks delete under
// RerunOnFailure would not come back.
func (b *Backend) powerOn(ctx context.Context) error {
	target := poweredOn
	if b.subresourcesMissing.Load() {
		target = always
	}
	if _, err := b.writeRunStrategy(ctx, target); err != nil {
		return err
	}
	vm, vmi, err := b.readLive(ctx)
	if err != nil {
		return err
	}
	if endingOrEnded(vm, vmi) {
		// Once a VMI stopped under RerunOnFailure is gone, virt-controller
		// leaves the VM off, and virt-api refuses start while the VMI runs:
		// restart keeps the stop and asks for a start after it.
		result, err := b.callSubresource(ctx, "restart", &kubevirtv1.RestartOptions{})
		if err != nil || result == subresourceDone || result == subresourceNotServed {
			return err
		}
		// Refused: the VMI is gone by now.
		if vm, vmi, err = b.readLive(ctx); err != nil {
			return err
		}
	}
	if !stoppedForGood(vm, vmi) {
		return nil
	}
	result, err := b.callSubresource(ctx, "start", &kubevirtv1.StartOptions{})
	if err != nil || result != subresourceNotServed {
		// Refused: a start is already requested, or the VMI runs again.
		return err
	}
	_, err = b.writeRunStrategy(ctx, always)
	return err
}

// stoppedForGood reports whether virt-controller has settled a VM with
// runStrategy RerunOnFailure as off: it acted on that strategy, no start is
// requested, and there is no VMI or only one that ended.
func stoppedForGood(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) bool {
	strategy, err := vm.RunStrategy()
	if err != nil || strategy != poweredOn || vm.Status.RunStrategy != poweredOn || startRequested(vm) {
		return false
	}
	return vmi == nil || vmi.Status.Phase == kubevirtv1.Succeeded
}

// endingOrEnded reports whether the VM has a VMI that ended, or is on its
// way out: being deleted or asked to stop.
func endingOrEnded(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) bool {
	if vmi == nil {
		return false
	}
	if vmi.IsFinal() || vmi.DeletionTimestamp != nil {
		return true
	}
	for _, r := range vm.Status.StateChangeRequests {
		if r.Action == kubevirtv1.StopRequest && r.UID != nil && *r.UID == vmi.UID {
			return true
		}
	}
	return false
}

func startRequested(vm *kubevirtv1.VirtualMachine) bool {
	for _, r := range vm.Status.StateChangeRequests {
		if r.Action == kubevirtv1.StartRequest {
			return true
		}
	}
	return false
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

// restart powers on a VM that is off and restarts one that is on through
// virt-api's restart, which has virt-controller stop the VMI (at once when
// forced, with its grace period otherwise) and start a new one, whatever
// the strategy.
func (m *Machine) restart(ctx context.Context, force bool) error {
	vm, vmi, err := m.b.readLive(ctx)
	if err != nil {
		return err
	}
	if strategy, _ := vm.RunStrategy(); strategy == halted || vmi == nil || vmi.DeletionTimestamp != nil || vmi.IsFinal() {
		return m.b.powerOn(ctx) // off or on its way there
	}
	if _, err := m.b.writeRunStrategy(ctx, poweredOn); err != nil {
		return err
	}
	options := &kubevirtv1.RestartOptions{}
	if force {
		options.GracePeriodSeconds = &gracePeriodNone
	}
	return m.b.restartVMI(ctx, vmi.UID, options)
}

// restartNow replaces the VMI with that UID at once.
func (b *Backend) restartNow(ctx context.Context, uid types.UID) error {
	return b.restartVMI(ctx, uid, &kubevirtv1.RestartOptions{GracePeriodSeconds: &gracePeriodNone})
}

// restartVMI asks virt-api to restart the VMI with that UID. Refused
// because that VMI ended meanwhile, it powers on what is off now. Where
// virt-api does not serve restart, or refuses it for a VMI still there, the
// VM is set to Always and the VMI deleted, so virt-controller replaces it.
func (b *Backend) restartVMI(ctx context.Context, uid types.UID, options *kubevirtv1.RestartOptions) error {
	result, err := b.callSubresource(ctx, "restart", options)
	if err != nil || result == subresourceDone {
		return err
	}
	if result == subresourceRefused {
		_, vmi, err := b.readLive(ctx)
		if err != nil {
			return err
		}
		if vmi == nil || vmi.UID != uid || vmi.IsFinal() {
			return b.powerOn(ctx)
		}
	}
	if _, err := b.writeRunStrategy(ctx, always); err != nil {
		return err
	}
	return b.deleteVMI(ctx, uid, options.GracePeriodSeconds)
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
	case strategy == halted && vmi == nil && preparingVolumes(vm.Status.PrintableStatus):
		// KubeVirt shows a VM's volumes being prepared (a media import)
		// whether or not it is to run: with nothing running and nothing
		// to start, the machine is off.
		return machine.PowerOff
	case strategy == poweredOn && observed == machine.PowerOff && !stoppedForGood(vm, vmi):
		// virt-controller has not acted on the strategy or the start yet.
		return machine.PoweringOn
	case strategy == always && observed == machine.PowerOff:
		return machine.PoweringOn
	case strategy == halted && (observed == machine.PowerOn || observed == machine.PoweringOn || observed == machine.Paused):
		return machine.PoweringOff
	}
	return observed
}

// preparingVolumes says whether a printableStatus is about the VM's volumes
// rather than a start.
func preparingVolumes(status kubevirtv1.VirtualMachinePrintableStatus) bool {
	switch status {
	case kubevirtv1.VirtualMachineStatusProvisioning, kubevirtv1.VirtualMachineStatusWaitingForVolumeBinding,
		kubevirtv1.VirtualMachineStatusPvcNotFound, kubevirtv1.VirtualMachineStatusDataVolumeError:
		return true
	}
	return false
}

func observedPower(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) machine.PowerState {
	if vmi != nil && vmi.DeletionTimestamp != nil {
		return machine.PoweringOff
	}
	switch vm.Status.PrintableStatus {
	case kubevirtv1.VirtualMachineStatusRunning, kubevirtv1.VirtualMachineStatusMigrating:
		return machine.PowerOn
	case kubevirtv1.VirtualMachineStatusPaused:
		return machine.Paused
	case kubevirtv1.VirtualMachineStatusStopping, kubevirtv1.VirtualMachineStatusTerminating:
		return machine.PoweringOff
	}
	// virt-controller writes the VM's status after it has seen the VMI's,
	// and under load (its VM updates conflicting with others' and backing
	// off) a guest runs, and PXE boots, many seconds before its VM stops
	// saying Stopped or Starting. Reading PoweringOn then, MaaS takes the
	// machine for off and sends On with a PXE boot once, which boots
	// nothing: the running VMI is the truth.
	if vmi != nil && vmi.IsRunning() {
		return runningPower(vmi)
	}
	switch vm.Status.PrintableStatus {
	case kubevirtv1.VirtualMachineStatusStopped:
		return machine.PowerOff
	case kubevirtv1.VirtualMachineStatusStarting, kubevirtv1.VirtualMachineStatusProvisioning,
		kubevirtv1.VirtualMachineStatusWaitingForVolumeBinding, kubevirtv1.VirtualMachineStatusWaitingForReceiver,
		kubevirtv1.VirtualMachineStatusCrashLoopBackOff, kubevirtv1.VirtualMachineStatusUnschedulable,
		kubevirtv1.VirtualMachineStatusErrImagePull, kubevirtv1.VirtualMachineStatusImagePullBackOff,
		kubevirtv1.VirtualMachineStatusPvcNotFound, kubevirtv1.VirtualMachineStatusDataVolumeError:
		// Not running yet, and KubeVirt keeps trying.
		return machine.PoweringOn
	}
	// No (or an unknown) printableStatus: go by the VMI.
	if vmi == nil || vmi.IsFinal() {
		return machine.PowerOff
	}
	return machine.PoweringOn
}

// runningPower is a running VMI's state, as virt-controller prints it: On
// unless paused.
func runningPower(vmi *kubevirtv1.VirtualMachineInstance) machine.PowerState {
	for _, c := range vmi.Status.Conditions {
		if c.Type == kubevirtv1.VirtualMachineInstancePaused && c.Status == corev1.ConditionTrue {
			return machine.Paused
		}
	}
	return machine.PowerOn
}
