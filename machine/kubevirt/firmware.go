package kubevirt

import (
	"context"
	"encoding/json"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/machine"
)

// Annotations on the VM for the firmware and the locator light.
const (
	// originalFirmwareAnnotation holds the firmware the VM had before the
	// BMC first changed it (originalFirmware), for ResetFirmware.
	originalFirmwareAnnotation = "virtmetal.io/original-firmware"
	// locatorAnnotation is "true" while the locator light is on: a VM has
	// no light, so its state is kept where every BMC replica reads it.
	locatorAnnotation = "virtmetal.io/locator-active"
)

// originalFirmware is what SetFirmware may change: the bootloader and the
// SMM feature Secure Boot needs.
type originalFirmware struct {
	Bootloader *kubevirtv1.Bootloader   `json:"bootloader"`
	SMM        *kubevirtv1.FeatureState `json:"smm"`
}

// firmwareOf is the firmware a VM template or VMI spec boots with: BIOS
// unless an EFI bootloader is named, whose secureBoot defaults to true in
// KubeVirt.
func firmwareOf(spec *kubevirtv1.VirtualMachineInstanceSpec) machine.Firmware {
	fw := spec.Domain.Firmware
	if fw == nil || fw.Bootloader == nil || fw.Bootloader.EFI == nil {
		return machine.Firmware{Mode: machine.BootModeLegacy}
	}
	secure := fw.Bootloader.EFI.SecureBoot
	return machine.Firmware{Mode: machine.BootModeUEFI, SecureBoot: secure == nil || *secure}
}

// bootMode is the VM's firmware interface for its next boot.
func bootMode(vm *kubevirtv1.VirtualMachine) machine.BootMode {
	return firmwareOf(&vm.Spec.Template.Spec).Mode
}

// bootModes are the firmware interfaces a VM of that architecture can
// have: KubeVirt offers SeaBIOS on amd64 only.
func bootModes(vm *kubevirtv1.VirtualMachine) []machine.BootMode {
	if architecture(vm.Spec.Template.Spec.Architecture) == machine.ArchAMD64 {
		return []machine.BootMode{machine.BootModeUEFI, machine.BootModeLegacy}
	}
	return []machine.BootMode{bootMode(vm)}
}

// Firmware reads the next boot's firmware from the VM's template and the
// current one from the VMI, while there is one that has not ended.
func (m *Machine) Firmware(ctx context.Context) (machine.FirmwareState, error) {
	vm, vmi, err := m.b.read(ctx)
	if err != nil {
		return machine.FirmwareState{}, err
	}
	next := firmwareOf(&vm.Spec.Template.Spec)
	state := machine.FirmwareState{Next: next, Current: next}
	if vmi != nil && vmi.DeletionTimestamp == nil && !vmi.IsFinal() {
		// A VMI boots with the spec it was created with.
		state.Current, state.Booted = firmwareOf(&vmi.Spec), vmi.CreationTimestamp.Time
	}
	state.Product = firmwareProduct(state.Current, architecture(vm.Spec.Template.Spec.Architecture))
	return state, nil
}

// firmwareProduct names the firmware KubeVirt boots a guest with: EDK II
// builds (OVMF on amd64, AAVMF on arm64) for EFI, SeaBIOS otherwise.
func firmwareProduct(f machine.Firmware, arch machine.Architecture) string {
	switch {
	case f.Mode == machine.BootModeLegacy:
		return "SeaBIOS"
	case arch == machine.ArchAMD64:
		return "OVMF (UEFI)"
	case arch == machine.ArchARM64:
		return "AAVMF (UEFI)"
	}
	return "EDK II (UEFI)"
}

// SetFirmware writes the firmware into the VM's template: KubeVirt boots
// the next VMI with it.
func (m *Machine) SetFirmware(ctx context.Context, f machine.Firmware) error {
	if err := f.Check(m.Capabilities()); err != nil {
		return err
	}
	_, err := m.b.updateVM(ctx, func(vm *kubevirtv1.VirtualMachine, _ *kubevirtv1.VirtualMachineInstance) (bool, error) {
		return applyFirmware(vm, f)
	})
	return err
}

// ResetFirmware puts back the bootloader and SMM feature the VM had before
// the BMC's first change.
func (m *Machine) ResetFirmware(ctx context.Context) error {
	_, err := m.b.updateVM(ctx, func(vm *kubevirtv1.VirtualMachine, _ *kubevirtv1.VirtualMachineInstance) (bool, error) {
		raw, ok := vm.Annotations[originalFirmwareAnnotation]
		if !ok {
			return false, nil
		}
		var original originalFirmware
		if err := json.Unmarshal([]byte(raw), &original); err != nil {
			return false, machine.Errorf(machine.ErrConflict, "annotation %s is not readable: %v", originalFirmwareAnnotation, err)
		}
		domain := &vm.Spec.Template.Spec.Domain
		if domain.Firmware == nil {
			domain.Firmware = &kubevirtv1.Firmware{}
		}
		domain.Firmware.Bootloader = original.Bootloader
		if domain.Features != nil || original.SMM != nil {
			if domain.Features == nil {
				domain.Features = &kubevirtv1.Features{}
			}
			domain.Features.SMM = original.SMM
		}
		delete(vm.Annotations, originalFirmwareAnnotation)
		return true, nil
	})
	return err
}

// applyFirmware changes vm's template to boot with f, first keeping what
// it replaces. Secure Boot is stated, never left to KubeVirt's default,
// and turns on SMM, which KubeVirt requires for it; turning Secure Boot
// off leaves SMM as it is.
func applyFirmware(vm *kubevirtv1.VirtualMachine, f machine.Firmware) (bool, error) {
	domain := &vm.Spec.Template.Spec.Domain
	if domain.Firmware == nil {
		domain.Firmware = &kubevirtv1.Firmware{}
	}
	loader := &kubevirtv1.Bootloader{BIOS: &kubevirtv1.BIOS{}}
	if old := domain.Firmware.Bootloader; f.Mode == machine.BootModeLegacy && old != nil && old.BIOS != nil {
		loader.BIOS = old.BIOS.DeepCopy()
	}
	if f.Mode == machine.BootModeUEFI {
		efi := &kubevirtv1.EFI{}
		if old := domain.Firmware.Bootloader; old != nil && old.EFI != nil {
			efi = old.EFI.DeepCopy()
		}
		efi.SecureBoot = ptr.To(f.SecureBoot)
		loader = &kubevirtv1.Bootloader{EFI: efi}
	}
	needsSMM := f.SecureBoot && !smmEnabled(domain)
	if equality.Semantic.DeepEqual(loader, domain.Firmware.Bootloader) && !needsSMM {
		return false, nil
	}
	if _, saved := vm.Annotations[originalFirmwareAnnotation]; !saved {
		original := originalFirmware{Bootloader: domain.Firmware.Bootloader}
		if domain.Features != nil {
			original.SMM = domain.Features.SMM
		}
		data, err := json.Marshal(original)
		if err != nil {
			return false, err
		}
		setAnnotation(vm, originalFirmwareAnnotation, string(data))
	}
	domain.Firmware.Bootloader = loader
	if needsSMM {
		if domain.Features == nil {
			domain.Features = &kubevirtv1.Features{}
		}
		domain.Features.SMM = &kubevirtv1.FeatureState{Enabled: ptr.To(true)}
	}
	return true, nil
}

func smmEnabled(domain *kubevirtv1.DomainSpec) bool {
	f := domain.Features
	return f != nil && f.SMM != nil && (f.SMM.Enabled == nil || *f.SMM.Enabled)
}

// LocatorActive reads the locator annotation.
func (m *Machine) LocatorActive(ctx context.Context) (bool, error) {
	vm, _, err := m.b.read(ctx)
	if err != nil {
		return false, err
	}
	return vm.Annotations[locatorAnnotation] == "true", nil
}

// SetLocatorActive writes the locator annotation (removes it for off).
func (m *Machine) SetLocatorActive(ctx context.Context, on bool) error {
	_, err := m.b.updateVM(ctx, func(vm *kubevirtv1.VirtualMachine, _ *kubevirtv1.VirtualMachineInstance) (bool, error) {
		if (vm.Annotations[locatorAnnotation] == "true") == on {
			return false, nil
		}
		if on {
			setAnnotation(vm, locatorAnnotation, "true")
		} else {
			delete(vm.Annotations, locatorAnnotation)
		}
		return true, nil
	})
	return err
}
