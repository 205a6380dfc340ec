package kubevirt

import (
	"context"
	"encoding/json"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/machine"
)

// Annotations on the VM that hold the boot override, so it survives a BMC
// restart.
const (
	// overrideAnnotation holds the override as JSON (overrideState).
	overrideAnnotation = "virtmetal.io/boot-override"
	// savedOrderAnnotation holds the bootOrder the override replaced
	// (savedOrder), to restore when it ends.
	savedOrderAnnotation = "virtmetal.io/saved-boot-order"
)

// overrideState is the stored override.
type overrideState struct {
	Target  machine.BootTarget  `json:"target"`
	Enabled machine.BootEnabled `json:"enabled"`
	// SetDuringVMI is the UID of the VMI that was running when a Once
	// override was set: that boot did not use it, the next VMI will.
	SetDuringVMI string `json:"setDuringVMI,omitempty"`
}

// savedOrder is every device's bootOrder (nil: none) by device name.
type savedOrder struct {
	Disks      map[string]*uint `json:"disks"`
	Interfaces map[string]*uint `json:"interfaces"`
}

// BootOverride reports the stored override; a Once override a VMI has
// already started with reads as consumed even before the VM is rewritten.
func (m *Machine) BootOverride(ctx context.Context) (machine.BootOverride, error) {
	vm, vmi, err := m.b.read(ctx)
	if err != nil {
		return machine.BootOverride{}, err
	}
	mode := bootMode(vm)
	state, ok := storedOverride(vm)
	if !ok || onceConsumed(vm, vmi) {
		return machine.BootOverride{Target: machine.BootNone, Enabled: machine.BootDisabled, Mode: mode}, nil
	}
	return machine.BootOverride{Target: state.Target, Enabled: state.Enabled, Mode: mode}, nil
}

// SetBootOverride rewrites the VM's bootOrder for the target, keeping the
// order it replaces to restore when the override ends, and its firmware
// for another mode.
func (m *Machine) SetBootOverride(ctx context.Context, o machine.BootOverride) error {
	if err := m.Capabilities().CheckBootOverride(o); err != nil {
		return err
	}
	o = o.Normalize()
	// The loop that restarts stale starts waits until this one has acted.
	m.b.restartMu.Lock()
	defer m.b.restartMu.Unlock()
	restart := false
	vmi, err := m.b.updateVM(ctx, func(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) (bool, error) {
		fw := firmwareOf(&vm.Spec.Template.Spec)
		fw.Mode = o.Mode
		if err := fw.Check(m.Capabilities()); err != nil {
			return false, err
		}
		modeChanged, err := applyFirmware(vm, fw)
		if err != nil {
			return false, err
		}
		changed, err := applyOverride(vm, vmi, o)
		restart = err == nil && startsWithoutOverride(vm, vmi)
		return changed || modeChanged, err
	})
	if err != nil || !restart {
		return err
	}
	// MaaS, reading PoweringOn as off, sets PXE and sends On, which does
	// nothing to a start under way: that start is restarted instead.
	m.b.log.Info("boot override set while the VM was starting: restarting that start so it boots the override", "target", o.Target)
	return m.b.restartNow(ctx, vmi.UID)
}

// startsWithoutOverride reports whether vmi is a start under way (its guest
// has not booted) made from the template as it was before the VM's boot
// override: the template has the override's device first, the VMI does
// not, and would boot without it. Nothing has booted yet, so the start can
// be restarted, where the runStrategy makes KubeVirt replace a deleted VMI
// (from the template, override included). This happens to a VMI that
// exists when the override is set, and to one virt-controller creates from
// the template it read just before the override was written.
func startsWithoutOverride(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) bool {
	state, ok := storedOverride(vm)
	if !ok || vmi == nil || vmi.DeletionTimestamp != nil || guestStarted(vmi) {
		return false
	}
	strategy, err := vm.RunStrategy()
	if err != nil || strategy != kubevirtv1.RunStrategyAlways && strategy != kubevirtv1.RunStrategyRerunOnFailure {
		return false
	}
	return firstBootDevice(&vm.Spec.Template.Spec) == state.Target && firstBootDevice(&vmi.Spec) != state.Target
}

// guestStarted reports whether the VMI's guest has booted (it is running or
// has run); before that, the VMI is only being scheduled and set up.
func guestStarted(vmi *kubevirtv1.VirtualMachineInstance) bool {
	switch vmi.Status.Phase {
	case kubevirtv1.Running, kubevirtv1.Succeeded, kubevirtv1.Failed:
		return true
	}
	return false
}

// applyOverride changes vm to carry o; vmi is the current VMI (or nil).
func applyOverride(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance, o machine.BootOverride) (bool, error) {
	current, hasCurrent := storedOverride(vm)
	if o.Target == machine.BootNone {
		if !hasCurrent {
			return false, nil
		}
		restoreOrder(vm)
		return true, nil
	}
	if hasCurrent && current.Target == o.Target && current.Enabled == o.Enabled {
		return false, nil // the same override again: keep when it was set
	}
	spec := &vm.Spec.Template.Spec
	if !hasCurrent {
		saved, err := json.Marshal(captureOrder(spec))
		if err != nil {
			return false, err
		}
		setAnnotation(vm, savedOrderAnnotation, string(saved))
	}
	if err := orderFor(spec, o.Target); err != nil {
		return false, err
	}
	state := overrideState{Target: o.Target, Enabled: o.Enabled}
	// A VMI whose guest already booted did not use the override; the next
	// one will. One still starting is restarted by SetBootOverride.
	if o.Enabled == machine.BootOnce && vmi != nil && guestStarted(vmi) {
		state.SetDuringVMI = string(vmi.UID)
	}
	data, err := json.Marshal(state)
	if err != nil {
		return false, err
	}
	setAnnotation(vm, overrideAnnotation, string(data))
	return true, nil
}

// consumeOnce ends a Once override the VMI has started with: it restores
// the previous order and reports whether it changed vm.
func consumeOnce(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) bool {
	if !onceConsumed(vm, vmi) {
		return false
	}
	restoreOrder(vm)
	return true
}

// onceConsumed reports whether a VMI other than the one running when the
// Once override was set has started from the override's device. Checking
// the VMI's own bootOrder (not just that it is new) leaves the override in
// place for a VMI virt-controller created from the template before the
// override reached it.
func onceConsumed(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) bool {
	state, ok := storedOverride(vm)
	if !ok || state.Enabled != machine.BootOnce || vmi == nil || string(vmi.UID) == state.SetDuringVMI {
		return false
	}
	return firstBootDevice(&vmi.Spec) == state.Target
}

func storedOverride(vm *kubevirtv1.VirtualMachine) (overrideState, bool) {
	raw, ok := vm.Annotations[overrideAnnotation]
	if !ok {
		return overrideState{}, false
	}
	var s overrideState
	if err := json.Unmarshal([]byte(raw), &s); err != nil || s.Target == "" || s.Target == machine.BootNone {
		return overrideState{}, false
	}
	return s, true
}

// restoreOrder puts back the saved bootOrder and forgets the override.
func restoreOrder(vm *kubevirtv1.VirtualMachine) {
	var saved savedOrder
	if raw, ok := vm.Annotations[savedOrderAnnotation]; ok {
		if err := json.Unmarshal([]byte(raw), &saved); err == nil {
			spec := &vm.Spec.Template.Spec
			for i := range spec.Domain.Devices.Disks {
				spec.Domain.Devices.Disks[i].BootOrder = saved.Disks[spec.Domain.Devices.Disks[i].Name]
			}
			for i := range spec.Domain.Devices.Interfaces {
				spec.Domain.Devices.Interfaces[i].BootOrder = saved.Interfaces[spec.Domain.Devices.Interfaces[i].Name]
			}
		}
	}
	delete(vm.Annotations, overrideAnnotation)
	delete(vm.Annotations, savedOrderAnnotation)
}

func captureOrder(spec *kubevirtv1.VirtualMachineInstanceSpec) savedOrder {
	saved := savedOrder{Disks: map[string]*uint{}, Interfaces: map[string]*uint{}}
	for _, d := range spec.Domain.Devices.Disks {
		saved.Disks[d.Name] = d.BootOrder
	}
	for _, n := range spec.Domain.Devices.Interfaces {
		saved.Interfaces[n.Name] = n.BootOrder
	}
	return saved
}

// orderFor numbers the boot devices with the target's first:
// Pxe: first NIC, disks, CD-ROMs; Hdd: disks, first NIC, CD-ROMs;
// Cd: CD-ROMs, disks, first NIC. Other NICs do not boot.
func orderFor(spec *kubevirtv1.VirtualMachineInstanceSpec, target machine.BootTarget) error {
	devices := &spec.Domain.Devices
	var disks, cdroms []*kubevirtv1.Disk
	for i := range devices.Disks {
		if devices.Disks[i].CDRom != nil {
			cdroms = append(cdroms, &devices.Disks[i])
		} else {
			disks = append(disks, &devices.Disks[i])
		}
	}
	for i := range devices.Interfaces {
		devices.Interfaces[i].BootOrder = nil
	}
	orders := func(ds []*kubevirtv1.Disk) []**uint {
		out := make([]**uint, len(ds))
		for i, d := range ds {
			out[i] = &d.BootOrder
		}
		return out
	}
	var nic []**uint // the first NIC's bootOrder, when there is a NIC
	if len(devices.Interfaces) > 0 {
		nic = []**uint{&devices.Interfaces[0].BootOrder}
	}
	var groups [][]**uint
	switch target {
	case machine.BootPxe:
		if nic == nil {
			return machine.Errorf(machine.ErrConflict, "the VM has no network interface to PXE boot from")
		}
		groups = [][]**uint{nic, orders(disks), orders(cdroms)}
	case machine.BootHdd:
		if len(disks) == 0 {
			return machine.Errorf(machine.ErrConflict, "the VM has no disk to boot from")
		}
		groups = [][]**uint{orders(disks), nic, orders(cdroms)}
	case machine.BootCd:
		if len(cdroms) == 0 {
			return machine.Errorf(machine.ErrConflict, "the VM has no CD-ROM drive: insert virtual media first")
		}
		groups = [][]**uint{orders(cdroms), orders(disks), nic}
	default:
		return machine.Errorf(machine.ErrNotSupported, "boot target %q", target)
	}
	next := uint(1)
	for _, g := range groups {
		for _, order := range g {
			n := next
			*order = &n
			next++
		}
	}
	return nil
}

// firstBootDevice is the device a VMI boots from: the lowest bootOrder, or
// without any, the first disk (libvirt's default), or the network.
func firstBootDevice(spec *kubevirtv1.VirtualMachineInstanceSpec) machine.BootTarget {
	best, target := uint(0), machine.BootTarget("")
	consider := func(order *uint, t machine.BootTarget) {
		if order != nil && (target == "" || *order < best) {
			best, target = *order, t
		}
	}
	for _, d := range spec.Domain.Devices.Disks {
		consider(d.BootOrder, diskTarget(d))
	}
	for _, n := range spec.Domain.Devices.Interfaces {
		consider(n.BootOrder, machine.BootPxe)
	}
	if target != "" {
		return target
	}
	if disks := spec.Domain.Devices.Disks; len(disks) > 0 {
		return diskTarget(disks[0])
	}
	return machine.BootPxe
}

func diskTarget(d kubevirtv1.Disk) machine.BootTarget {
	if d.CDRom != nil {
		return machine.BootCd
	}
	return machine.BootHdd
}

func setAnnotation(vm *kubevirtv1.VirtualMachine, key, value string) {
	if vm.Annotations == nil {
		vm.Annotations = map[string]string{}
	}
	vm.Annotations[key] = value
}
