package kubevirt_test

import (
	"encoding/json"
	"errors"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
)

// TestFirmwareWritesTheVM checks each firmware write on the VM object:
// the bootloader, the SMM feature Secure Boot needs, and that
// ResetFirmware puts back exactly what the VM had.
func TestFirmwareWritesTheVM(t *testing.T) {
	ns := cluster.NewNamespace(t)
	newVM(t, ns, "vm", nil)
	original := getVM(t, ns, "vm").Spec.Template.Spec.Domain
	b := kubevirttest.StartBackend(t, cluster.Config, ns, "vm", kubevirt.Options{})
	m := mustMachine(t, b, "vm")
	ctx := t.Context()

	type wantVM struct {
		bios       bool
		secureBoot *bool // nil: not stated (KubeVirt's default, on)
		smm        bool
		restored   bool // the VM's own firmware is back, none saved
	}
	on, off := true, false
	steps := []struct {
		name  string
		write func() error
		want  wantVM
		fw    machine.Firmware
	}{
		{"secure boot on", func() error {
			return m.SetFirmware(ctx, machine.Firmware{Mode: machine.BootModeUEFI, SecureBoot: true})
		}, wantVM{secureBoot: &on, smm: true}, machine.Firmware{Mode: machine.BootModeUEFI, SecureBoot: true}},
		{"secure boot off keeps SMM", func() error {
			return m.SetFirmware(ctx, machine.Firmware{Mode: machine.BootModeUEFI})
		}, wantVM{secureBoot: &off, smm: true}, machine.Firmware{Mode: machine.BootModeUEFI}},
		{"legacy by boot override", func() error {
			return m.SetBootOverride(ctx, machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce, Mode: machine.BootModeLegacy})
		}, wantVM{bios: true, smm: true}, machine.Firmware{Mode: machine.BootModeLegacy}},
		{"reset to the VM's own", func() error { return m.ResetFirmware(ctx) },
			// newVM's own: efi with secureBoot false, no SMM.
			wantVM{secureBoot: &off, restored: true}, machine.Firmware{Mode: machine.BootModeUEFI}},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			if err := step.write(); err != nil {
				t.Fatal(err)
			}
			vm := getVM(t, ns, "vm")
			domain := vm.Spec.Template.Spec.Domain
			loader := domain.Firmware.Bootloader
			switch {
			case step.want.bios && (loader == nil || loader.BIOS == nil || loader.EFI != nil):
				t.Errorf("bootloader %+v, want bios", loader)
			case !step.want.bios && (loader == nil || loader.EFI == nil):
				t.Errorf("bootloader %+v, want efi", loader)
			case !step.want.bios && !equalBool(loader.EFI.SecureBoot, step.want.secureBoot):
				t.Errorf("efi.secureBoot %v, want %v", ptrText(loader.EFI.SecureBoot), ptrText(step.want.secureBoot))
			}
			smm := domain.Features != nil && domain.Features.SMM != nil && domain.Features.SMM.Enabled != nil && *domain.Features.SMM.Enabled
			if smm != step.want.smm {
				t.Errorf("features.smm enabled %v, want %v", smm, step.want.smm)
			}
			_, saved := vm.Annotations["virtmetal.io/original-firmware"]
			if saved == step.want.restored {
				t.Errorf("original-firmware annotation kept: %v, want %v", saved, !step.want.restored)
			}
			if got, err := m.Firmware(ctx); err != nil || got.Next != step.fw {
				t.Errorf("Firmware = %+v, %v; want next %+v", got, err, step.fw)
			}
		})
	}
	after := getVM(t, ns, "vm").Spec.Template.Spec.Domain
	if a, b := jsonOf(t, after.Firmware.Bootloader), jsonOf(t, original.Firmware.Bootloader); a != b || after.Features != nil && after.Features.SMM != nil {
		t.Errorf("after ResetFirmware: bootloader %s features %+v; want the VM's own %s", a, after.Features, b)
	}
	if err := m.SetFirmware(ctx, machine.Firmware{Mode: machine.BootModeLegacy, SecureBoot: true}); !errors.Is(err, machine.ErrConflict) {
		t.Errorf("SetFirmware(Legacy, Secure Boot) = %v, want ErrConflict", err)
	}
}

// TestFirmwareCurrentIsTheVMI: while a VMI runs, the current firmware is
// the VMI's, and a change waits in the template for the next one.
func TestFirmwareCurrentIsTheVMI(t *testing.T) {
	ns := cluster.NewNamespace(t)
	newVM(t, ns, "vm", func(vm *kubevirtv1.VirtualMachine) {
		vm.Spec.Template.Spec.Domain.Firmware.Bootloader = &kubevirtv1.Bootloader{BIOS: &kubevirtv1.BIOS{}}
	})
	b := kubevirttest.StartBackend(t, cluster.Config, ns, "vm", kubevirt.Options{})
	m := mustMachine(t, b, "vm")
	ctx := t.Context()
	if err := m.Reset(ctx, machine.ResetOn); err != nil {
		t.Fatal(err)
	}
	waitPower(t, m, machine.PowerOn)
	uefi := machine.Firmware{Mode: machine.BootModeUEFI, SecureBoot: true}
	if err := m.SetFirmware(ctx, uefi); err != nil {
		t.Fatal(err)
	}
	legacy := machine.Firmware{Mode: machine.BootModeLegacy}
	if got, err := m.Firmware(ctx); err != nil || got.Next != uefi || got.Current != legacy {
		t.Fatalf("Firmware = %+v, %v; want next %+v over the VMI's %+v", got, err, uefi, legacy)
	}
}

// TestLocatorIsAnAnnotation: the locator light is kept on the VM.
func TestLocatorIsAnAnnotation(t *testing.T) {
	ns := cluster.NewNamespace(t)
	newVM(t, ns, "vm", nil)
	b := kubevirttest.StartBackend(t, cluster.Config, ns, "vm", kubevirt.Options{})
	m := mustMachine(t, b, "vm")
	for _, on := range []bool{true, false} {
		if err := m.SetLocatorActive(t.Context(), on); err != nil {
			t.Fatal(err)
		}
		value, ok := getVM(t, ns, "vm").Annotations["virtmetal.io/locator-active"]
		if ok != on || on && value != "true" {
			t.Errorf("after SetLocatorActive(%v): annotation %q (present %v)", on, value, ok)
		}
	}
}

func equalBool(a, b *bool) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func ptrText(p *bool) any {
	if p == nil {
		return "unset"
	}
	return *p
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
