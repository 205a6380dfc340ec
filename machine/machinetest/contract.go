// Package machinetest is the contract test suite every machine backend must
// pass. A backend's own test calls Run with a constructor for a fresh,
// powered-off machine.
package machinetest

import (
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/machine"
)

// Subject is one fresh machine under test and the means to observe it. Its
// guest, where it runs, is sim/console's, named after the machine.
type Subject struct {
	// Machine starts powered off, with no boot override and no media.
	Machine machine.Machine
	// Boots returns the device of every boot so far, oldest first, as the
	// "hardware" saw it (the in-memory history, or the bootOrder a VMI
	// started with).
	Boots func() []machine.BootTarget
	// Versioned is the machine's backend where it implements
	// machine.Versioned, else nil.
	Versioned machine.Versioned
	// FinishImport, when set, completes the fetch of the inserted image
	// where nothing here would (a cluster without CDI's importer); nil
	// when imports finish by themselves.
	FinishImport func(t *testing.T)
}

// Run runs the contract suite. newSubject is called once per subtest.
func Run(t *testing.T, newSubject func(t *testing.T) Subject) {
	t.Helper()
	tests := []struct {
		name string
		run  func(t *testing.T, s Subject)
	}{
		{"inventory", testInventory},
		{"power on and off are idempotent", testPowerIdempotent},
		{"back-to-back actions converge", testConverge},
		{"restart of an off machine powers it on", testRestartFromOff},
		{"restart boots again", testRestartBoots},
		{"once override lasts exactly one boot", testBootOnce},
		{"continuous override stays", testBootContinuous},
		{"disabled override clears", testBootDisabled},
		{"invalid arguments", testInvalid},
		{"virtual media", testMedia},
		{"firmware applies at the next boot", testFirmware},
		{"boot mode is the firmware's", testBootModeIsFirmware},
		{"refused firmware changes nothing", testFirmwareRefused},
		{"locator light", testLocator},
		{"every write changes the state version", testStateVersion},
		{"consoles live as long as a boot", testConsoles},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, newSubject(t))
		})
	}
}

var (
	uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	macPattern  = regexp.MustCompile(`^([0-9a-f]{2}:){5}[0-9a-f]{2}$`)
)

func testInventory(t *testing.T, s Subject) {
	ctx := t.Context()
	inv, err := s.Machine.Inventory(ctx)
	if err != nil {
		t.Fatalf("Inventory: %v", err)
	}
	if !uuidPattern.MatchString(inv.UUID) {
		t.Errorf("UUID %q is not a lower-case RFC 4122 UUID", inv.UUID)
	}
	if inv.Manufacturer == "" || inv.MemoryMiB < 1 {
		t.Errorf("inventory lacks manufacturer or memory: %+v", inv)
	}
	if c := inv.CPU; c.Sockets < 1 || c.Cores < 1 || c.Threads < 1 {
		t.Errorf("CPU topology %d sockets × %d cores × %d threads: each must be at least 1", c.Sockets, c.Cores, c.Threads)
	}
	if len(inv.NICs) == 0 {
		t.Fatalf("no NICs: a machine without a MAC cannot PXE boot")
	}
	for _, n := range inv.NICs {
		if !macPattern.MatchString(n.MAC) {
			t.Errorf("NIC %q MAC %q is not lower-case colon-separated", n.Name, n.MAC)
		}
	}
	if s.Machine.ID() == "" {
		t.Errorf("empty ID")
	}
	again, err := s.Machine.Inventory(ctx)
	if err != nil || again.UUID != inv.UUID || again.NICs[0].MAC != inv.NICs[0].MAC {
		t.Errorf("inventory not stable between reads: %+v then %+v (%v)", inv, again, err)
	}
}

func testPowerIdempotent(t *testing.T, s Subject) {
	ctx := t.Context()
	waitPower(t, s, machine.PowerOff)
	mustReset(t, s, machine.ResetForceOff) // already off: no-op
	if s.Machine.Capabilities().SupportsReset(machine.ResetGracefulShutdown) {
		mustReset(t, s, machine.ResetGracefulShutdown)
	}
	waitPower(t, s, machine.PowerOff)
	if n := len(s.Boots()); n != 0 {
		t.Fatalf("powering off an off machine booted it %d times", n)
	}
	mustReset(t, s, machine.ResetOn)
	mustReset(t, s, machine.ResetOn) // on or powering on: no-op
	waitPower(t, s, machine.PowerOn)
	mustReset(t, s, machine.ResetOn)
	if s.Machine.Capabilities().SupportsReset(machine.ResetForceOn) {
		mustReset(t, s, machine.ResetForceOn)
	}
	if n := len(s.Boots()); n != 1 {
		t.Fatalf("On when already on booted again: %d boots, want 1", n)
	}
	mustReset(t, s, machine.ResetForceOff)
	waitPower(t, s, machine.PowerOff)
	mustReset(t, s, machine.ResetForceOff)
	if st, err := s.Machine.PowerState(ctx); err != nil || st != machine.PowerOff {
		t.Fatalf("PowerState = %q, %v; want Off", st, err)
	}
}

// testConverge is MaaS's power cycle: ForceOff then On, back to back,
// without waiting in between.
func testConverge(t *testing.T, s Subject) {
	mustReset(t, s, machine.ResetOn)
	mustReset(t, s, machine.ResetForceOff)
	waitPower(t, s, machine.PowerOff)
	mustReset(t, s, machine.ResetOn)
	waitPower(t, s, machine.PowerOn)
	mustReset(t, s, machine.ResetForceOff)
	mustReset(t, s, machine.ResetOn)
	waitPower(t, s, machine.PowerOn)
}

func testRestartFromOff(t *testing.T, s Subject) {
	caps := s.Machine.Capabilities()
	for _, r := range []machine.ResetType{machine.ResetForceRestart, machine.ResetGracefulRestart, machine.ResetPowerCycle} {
		if !caps.SupportsReset(r) {
			continue
		}
		waitPower(t, s, machine.PowerOff)
		before := len(s.Boots())
		mustReset(t, s, r)
		waitPower(t, s, machine.PowerOn)
		waitBoots(t, s, before+1)
		mustReset(t, s, machine.ResetForceOff)
		waitPower(t, s, machine.PowerOff)
	}
}

func testRestartBoots(t *testing.T, s Subject) {
	mustReset(t, s, machine.ResetOn)
	waitPower(t, s, machine.PowerOn)
	waitBoots(t, s, 1)
	mustReset(t, s, machine.ResetForceRestart)
	waitBoots(t, s, 2)
	waitPower(t, s, machine.PowerOn)
}

func testBootOnce(t *testing.T, s Subject) {
	ctx := t.Context()
	// The baseline: what the machine boots from with no override.
	mustReset(t, s, machine.ResetOn)
	waitPower(t, s, machine.PowerOn)
	baseline := waitBoots(t, s, 1)[0]
	mustReset(t, s, machine.ResetForceOff)
	waitPower(t, s, machine.PowerOff)

	target := otherTarget(s.Machine.Capabilities(), baseline)
	mode := currentMode(t, s)
	once := machine.BootOverride{Target: target, Enabled: machine.BootOnce, Mode: mode}
	if err := s.Machine.SetBootOverride(ctx, once); err != nil {
		t.Fatalf("SetBootOverride(%+v): %v", once, err)
	}
	if err := s.Machine.SetBootOverride(ctx, once); err != nil {
		t.Fatalf("setting the same override again: %v", err)
	}
	if got, err := s.Machine.BootOverride(ctx); err != nil || got != once {
		t.Fatalf("BootOverride = %+v, %v; want %+v", got, err, once)
	}
	mustReset(t, s, machine.ResetOn)
	waitPower(t, s, machine.PowerOn)
	if got := waitBoots(t, s, 2)[1]; got != target {
		t.Fatalf("booted from %q with a Once %q override", got, target)
	}
	cleared := machine.BootOverride{Target: machine.BootNone, Enabled: machine.BootDisabled, Mode: mode}
	poll.True(t, "Once override consumed", func() bool {
		got, err := s.Machine.BootOverride(ctx)
		return err == nil && got == cleared
	})
	mustReset(t, s, machine.ResetForceRestart)
	waitPower(t, s, machine.PowerOn)
	if got := waitBoots(t, s, 3)[2]; got != baseline {
		t.Fatalf("second boot after a Once override came from %q, want the baseline %q", got, baseline)
	}
}

func testBootContinuous(t *testing.T, s Subject) {
	ctx := t.Context()
	caps := s.Machine.Capabilities()
	target := otherTarget(caps, machine.BootHdd)
	o := machine.BootOverride{Target: target, Enabled: machine.BootContinuous, Mode: currentMode(t, s)}
	if err := s.Machine.SetBootOverride(ctx, o); err != nil {
		t.Fatalf("SetBootOverride(%+v): %v", o, err)
	}
	mustReset(t, s, machine.ResetOn)
	waitPower(t, s, machine.PowerOn)
	waitBoots(t, s, 1)
	mustReset(t, s, machine.ResetForceRestart)
	waitPower(t, s, machine.PowerOn)
	boots := waitBoots(t, s, 2)
	if boots[0] != target || boots[1] != target {
		t.Fatalf("boots = %v with a Continuous %q override", boots, target)
	}
	if got, err := s.Machine.BootOverride(ctx); err != nil || got != o {
		t.Fatalf("BootOverride after two boots = %+v, %v; want %+v", got, err, o)
	}
}

func testBootDisabled(t *testing.T, s Subject) {
	ctx := t.Context()
	mode := currentMode(t, s)
	set := machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootContinuous, Mode: mode}
	if err := s.Machine.SetBootOverride(ctx, set); err != nil {
		t.Fatalf("SetBootOverride: %v", err)
	}
	for _, clear := range []machine.BootOverride{
		{Target: machine.BootPxe, Enabled: machine.BootDisabled, Mode: mode},
		{Target: machine.BootNone, Enabled: machine.BootContinuous, Mode: mode},
	} {
		if err := s.Machine.SetBootOverride(ctx, clear); err != nil {
			t.Fatalf("SetBootOverride(%+v): %v", clear, err)
		}
		want := machine.BootOverride{Target: machine.BootNone, Enabled: machine.BootDisabled, Mode: mode}
		if got, err := s.Machine.BootOverride(ctx); err != nil || got != want {
			t.Fatalf("after %+v: BootOverride = %+v, %v; want %+v", clear, got, err, want)
		}
		if err := s.Machine.SetBootOverride(ctx, set); err != nil {
			t.Fatalf("SetBootOverride: %v", err)
		}
	}
}

func testInvalid(t *testing.T, s Subject) {
	ctx := t.Context()
	mode := currentMode(t, s)
	caps := s.Machine.Capabilities()
	cases := []struct {
		name string
		call func() error
		want error
	}{
		{"unknown reset", func() error { return s.Machine.Reset(ctx, "Explode") }, machine.ErrInvalidArgument},
		{"unknown boot target", func() error {
			return s.Machine.SetBootOverride(ctx, machine.BootOverride{Target: "Floppy", Enabled: machine.BootOnce, Mode: mode})
		}, machine.ErrInvalidArgument},
		{"unknown boot duration", func() error {
			return s.Machine.SetBootOverride(ctx, machine.BootOverride{Target: machine.BootPxe, Enabled: "Twice", Mode: mode})
		}, machine.ErrInvalidArgument},
		{"unknown boot mode", func() error {
			return s.Machine.SetBootOverride(ctx, machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce, Mode: "OpenFirmware"})
		}, machine.ErrInvalidArgument},
	}
	for _, r := range machine.AllResetTypes {
		if !caps.SupportsReset(r) {
			cases = append(cases, struct {
				name string
				call func() error
				want error
			}{"unsupported reset " + string(r), func() error { return s.Machine.Reset(ctx, r) }, machine.ErrNotSupported})
		}
	}
	before, err := s.Machine.BootOverride(ctx)
	if err != nil {
		t.Fatalf("BootOverride: %v", err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, tc.want) {
				t.Fatalf("error = %v, want %v", err, tc.want)
			}
		})
	}
	if after, err := s.Machine.BootOverride(ctx); err != nil || after != before {
		t.Fatalf("a refused call changed the boot override: %+v -> %+v (%v)", before, after, err)
	}
	if st, err := s.Machine.PowerState(ctx); err != nil || st != machine.PowerOff {
		t.Fatalf("a refused call changed power: %q (%v)", st, err)
	}
}

func testMedia(t *testing.T, s Subject) {
	ctx := t.Context()
	const image = "http://images.example/installer.iso"
	if !s.Machine.Capabilities().VirtualMedia {
		if err := s.Machine.InsertMedia(ctx, image); !errors.Is(err, machine.ErrNotSupported) {
			t.Fatalf("InsertMedia without the capability: %v, want ErrNotSupported", err)
		}
		return
	}
	if vm := media(t, s); vm.Inserted || vm.State != "" {
		t.Fatalf("a fresh machine's drive: %+v, want empty", vm)
	}
	if err := s.Machine.InsertMedia(ctx, "not a url"); !errors.Is(err, machine.ErrInvalidArgument) {
		t.Fatalf("InsertMedia(bad URL) = %v, want ErrInvalidArgument", err)
	}
	if err := s.Machine.InsertMedia(ctx, image); err != nil {
		t.Fatalf("InsertMedia: %v", err)
	}
	poll.True(t, "media inserted", func() bool {
		vm, err := s.Machine.VirtualMedia(ctx)
		return err == nil && vm.Inserted && vm.Image == image
	})
	if vm := media(t, s); vm.State == "" || vm.Percent < 0 || vm.Percent > 100 {
		t.Errorf("inserted media reads %+v: want a State and a Percent within 0-100", vm)
	}
	// Inserting the same image again (a client's retry) is a no-op,
	// while the import runs as after it.
	if err := s.Machine.InsertMedia(ctx, image); err != nil {
		t.Fatalf("InsertMedia of the image already inserted = %v, want nil", err)
	}
	if s.FinishImport != nil {
		s.FinishImport(t)
	}
	poll.True(t, "media ready", func() bool {
		vm, err := s.Machine.VirtualMedia(ctx)
		return err == nil && vm.State == machine.MediaReady && vm.Percent == 100
	})
	if err := s.Machine.InsertMedia(ctx, image); err != nil {
		t.Fatalf("InsertMedia of the ready image again = %v, want nil", err)
	}
	if err := s.Machine.InsertMedia(ctx, image+"?other"); !errors.Is(err, machine.ErrConflict) {
		t.Fatalf("InsertMedia of another image = %v, want ErrConflict", err)
	}
	if vm := media(t, s); !vm.Inserted || vm.Image != image || vm.State != machine.MediaReady {
		t.Fatalf("after the refused insert: %+v, want %s still inserted and ready", vm, image)
	}
	if err := s.Machine.EjectMedia(ctx); err != nil {
		t.Fatalf("EjectMedia: %v", err)
	}
	poll.True(t, "media ejected", func() bool {
		vm, err := s.Machine.VirtualMedia(ctx)
		return err == nil && !vm.Inserted && vm.Image == "" && vm.State == ""
	})
	// A CD drive is write-protected, with media or without.
	if vm := media(t, s); !vm.WriteProtected {
		t.Fatalf("the empty drive: %+v, want it write-protected", vm)
	}
	if err := s.Machine.EjectMedia(ctx); err != nil {
		t.Fatalf("EjectMedia of an empty drive: %v", err)
	}
}

func media(t *testing.T, s Subject) machine.VirtualMedia {
	t.Helper()
	vm, err := s.Machine.VirtualMedia(t.Context())
	if err != nil {
		t.Fatalf("VirtualMedia: %v", err)
	}
	return vm
}

func mustReset(t *testing.T, s Subject, r machine.ResetType) {
	t.Helper()
	if err := s.Machine.Reset(t.Context(), r); err != nil {
		t.Fatalf("Reset(%s): %v", r, err)
	}
}

func waitPower(t *testing.T, s Subject, want machine.PowerState) {
	t.Helper()
	poll.True(t, "power "+string(want), func() bool {
		st, err := s.Machine.PowerState(t.Context())
		return err == nil && st == want
	})
}

func waitBoots(t *testing.T, s Subject, n int) []machine.BootTarget {
	t.Helper()
	var boots []machine.BootTarget
	poll.True(t, "boot count", func() bool {
		boots = s.Boots()
		return len(boots) >= n
	})
	if len(boots) != n {
		t.Fatalf("boots = %v, want exactly %d", boots, n)
	}
	return boots
}

func currentMode(t *testing.T, s Subject) machine.BootMode {
	t.Helper()
	o, err := s.Machine.BootOverride(t.Context())
	if err != nil {
		t.Fatalf("BootOverride: %v", err)
	}
	return o.Mode
}

// otherTarget picks a supported target different from not, preferring Pxe:
// the one provisioning depends on.
func otherTarget(caps machine.Capabilities, not machine.BootTarget) machine.BootTarget {
	for _, t := range []machine.BootTarget{machine.BootPxe, machine.BootCd, machine.BootHdd} {
		if t != not && caps.SupportsBootTarget(t) {
			return t
		}
	}
	return not
}

// testStateVersion: once a write that changes the machine has returned,
// StateVersion no longer reports the number from before it, so nobody
// serves an answer rendered before the write; a ChangeNotifier has told
// of it.
func testStateVersion(t *testing.T, s Subject) {
	if s.Versioned == nil {
		return // the backend does not report versions: there is nothing to keep
	}
	ctx := t.Context()
	id := s.Machine.ID()
	mode := machine.BootModeUEFI // the firmware SetFirmware leaves
	writes := []struct {
		name  string
		write func() error
	}{
		{"Reset On", func() error { return s.Machine.Reset(ctx, machine.ResetOn) }},
		{"SetBootOverride", func() error {
			return s.Machine.SetBootOverride(ctx, machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootContinuous, Mode: mode})
		}},
		{"InsertMedia", func() error { return s.Machine.InsertMedia(ctx, "http://images.test/boot.iso") }},
		{"EjectMedia", func() error { return s.Machine.EjectMedia(ctx) }},
		{"SetFirmware", func() error {
			fw := firmware(t, s).Next
			fw.SecureBoot = !fw.SecureBoot // a change, whatever the machine had
			return s.Machine.SetFirmware(ctx, fw)
		}},
		{"ResetFirmware", func() error { return s.Machine.ResetFirmware(ctx) }},
		{"SetLocatorActive", func() error { return s.Machine.SetLocatorActive(ctx, true) }},
		{"Reset ForceOff", func() error { return s.Machine.Reset(ctx, machine.ResetForceOff) }},
	}
	for _, w := range writes {
		if (w.name == "InsertMedia" || w.name == "EjectMedia") && !s.Machine.Capabilities().VirtualMedia {
			continue
		}
		var changed <-chan struct{}
		if n, ok := s.Versioned.(machine.ChangeNotifier); ok {
			changed = n.Changed()
		}
		before, ok := s.Versioned.StateVersion(id)
		if !ok {
			t.Fatalf("before %s: no state version while the backend serves", w.name)
		}
		if err := w.write(); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
		if after, ok := s.Versioned.StateVersion(id); !ok || after == before {
			t.Errorf("after %s: StateVersion %d (ok %v), the same as before the write", w.name, after, ok)
		}
		if changed != nil {
			select {
			case <-changed:
			default:
				t.Errorf("after %s: the ChangeNotifier's channel is still open", w.name)
			}
		}
	}
}

func firmware(t *testing.T, s Subject) machine.FirmwareState {
	t.Helper()
	st, err := s.Machine.Firmware(t.Context())
	if err != nil {
		t.Fatalf("Firmware: %v", err)
	}
	return st
}

func mustSetFirmware(t *testing.T, s Subject, f machine.Firmware) {
	t.Helper()
	if err := s.Machine.SetFirmware(t.Context(), f); err != nil {
		t.Fatalf("SetFirmware(%+v): %v", f, err)
	}
}

// testFirmware: a change made while the machine runs is pending until the
// next boot, then current; ResetFirmware brings back the first firmware.
func testFirmware(t *testing.T, s Subject) {
	initial := firmware(t, s)
	if initial.Pending() {
		t.Fatalf("an off machine has a pending firmware change: %+v", initial)
	}
	secure := machine.Firmware{Mode: machine.BootModeUEFI, SecureBoot: true}
	mustSetFirmware(t, s, secure)
	mustSetFirmware(t, s, secure) // again: a no-op
	if got := firmware(t, s); got.Next != secure || got.Current != secure {
		t.Fatalf("off: Firmware = %+v after SetFirmware(%+v)", got, secure)
	}
	if got := firmware(t, s); !got.Booted.IsZero() {
		t.Fatalf("off: the firmware was applied at %v, want no time", got.Booted)
	}
	mustReset(t, s, machine.ResetOn)
	waitPower(t, s, machine.PowerOn)
	var firstBoot time.Time
	poll.True(t, "the time the firmware was applied", func() bool {
		got, err := s.Machine.Firmware(t.Context())
		firstBoot = got.Booted
		return err == nil && !got.Booted.IsZero()
	})
	plain := machine.Firmware{Mode: machine.BootModeUEFI}
	mustSetFirmware(t, s, plain)
	if got := firmware(t, s); got.Next != plain || got.Current != secure || !got.Pending() {
		t.Fatalf("running: Firmware = %+v, want next %+v pending over current %+v", got, plain, secure)
	}
	before := len(s.Boots())
	mustReset(t, s, machine.ResetForceRestart)
	waitBoots(t, s, before+1)
	waitPower(t, s, machine.PowerOn)
	poll.True(t, "firmware applied by the restart", func() bool {
		got, err := s.Machine.Firmware(t.Context())
		return err == nil && got.Current == plain && !got.Pending() && !got.Booted.Before(firstBoot)
	})
	mustSetFirmware(t, s, secure)
	if err := s.Machine.ResetFirmware(t.Context()); err != nil {
		t.Fatalf("ResetFirmware: %v", err)
	}
	if got := firmware(t, s); got.Next != initial.Next {
		t.Fatalf("after ResetFirmware: next %+v, want the first firmware %+v", got.Next, initial.Next)
	}
	if err := s.Machine.ResetFirmware(t.Context()); err != nil {
		t.Fatalf("ResetFirmware again: %v", err)
	}
}

// testBootModeIsFirmware: BootOverride's mode is the firmware's, and a
// SetBootOverride with another mode configures it.
func testBootModeIsFirmware(t *testing.T, s Subject) {
	ctx := t.Context()
	caps := s.Machine.Capabilities()
	mustSetFirmware(t, s, machine.Firmware{Mode: machine.BootModeUEFI}) // Secure Boot would keep Legacy out
	for _, mode := range []machine.BootMode{machine.BootModeLegacy, machine.BootModeUEFI} {
		if !caps.SupportsBootMode(mode) {
			continue
		}
		o := machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootContinuous, Mode: mode}
		if err := s.Machine.SetBootOverride(ctx, o); err != nil {
			t.Fatalf("SetBootOverride(%+v): %v", o, err)
		}
		if got, err := s.Machine.BootOverride(ctx); err != nil || got != o {
			t.Fatalf("BootOverride = %+v, %v; want %+v", got, err, o)
		}
		if got := firmware(t, s); got.Next.Mode != mode {
			t.Fatalf("Firmware = %+v after a %s boot override", got, mode)
		}
	}
}

// testFirmwareRefused: Secure Boot without UEFI, unknown or unsupported
// modes, are refused and change nothing.
func testFirmwareRefused(t *testing.T, s Subject) {
	ctx := t.Context()
	mustSetFirmware(t, s, machine.Firmware{Mode: machine.BootModeUEFI, SecureBoot: true})
	before := firmware(t, s)
	cases := []struct {
		name string
		call func() error
		want error
	}{
		{"secure boot on legacy", func() error {
			return s.Machine.SetFirmware(ctx, machine.Firmware{Mode: machine.BootModeLegacy, SecureBoot: true})
		}, machine.ErrConflict},
		{"legacy boot override under secure boot", func() error {
			return s.Machine.SetBootOverride(ctx, machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce, Mode: machine.BootModeLegacy})
		}, machine.ErrConflict},
		{"unknown mode", func() error { return s.Machine.SetFirmware(ctx, machine.Firmware{Mode: "OpenFirmware"}) }, machine.ErrInvalidArgument},
	}
	if !s.Machine.Capabilities().SupportsBootMode(machine.BootModeLegacy) {
		cases = cases[2:]
		cases = append(cases, struct {
			name string
			call func() error
			want error
		}{"unsupported legacy", func() error { return s.Machine.SetFirmware(ctx, machine.Firmware{Mode: machine.BootModeLegacy}) }, machine.ErrNotSupported})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, tc.want) {
				t.Fatalf("error = %v, want %v", err, tc.want)
			}
			if after := firmware(t, s); after != before {
				t.Fatalf("a refused call changed the firmware: %+v -> %+v", before, after)
			}
		})
	}
}

func testLocator(t *testing.T, s Subject) {
	ctx := t.Context()
	for _, on := range []bool{false, true, true, false} {
		if err := s.Machine.SetLocatorActive(ctx, on); err != nil {
			t.Fatalf("SetLocatorActive(%v): %v", on, err)
		}
		if got, err := s.Machine.LocatorActive(ctx); err != nil || got != on {
			t.Fatalf("LocatorActive = %v, %v; want %v", got, err, on)
		}
	}
}
