package memory_test

import (
	"errors"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/machinetest"
	"github.com/virtmetal/virtmetal/machine/memory"
)

func TestContract(t *testing.T) {
	for _, delay := range []time.Duration{0, 20 * time.Millisecond} {
		t.Run("delay "+delay.String(), func(t *testing.T) {
			machinetest.Run(t, func(t *testing.T) machinetest.Subject {
				b := memory.New(memory.Options{TransitionDelay: delay, MediaImportTime: delay})
				m := b.Get("vm-0")
				return machinetest.Subject{Machine: m, Boots: m.Boots, Versioned: b}
			})
		})
	}
}

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

func TestTransitionsAreVisible(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	b := memory.New(memory.Options{TransitionDelay: 5 * time.Second, Now: clock.Now})
	m := b.Get("vm-0")
	ctx := t.Context()
	steps := []struct {
		name    string
		reset   machine.ResetType
		advance time.Duration
		want    machine.PowerState
	}{
		{"on starts powering on", machine.ResetOn, 0, machine.PoweringOn},
		{"still powering on", "", 4 * time.Second, machine.PoweringOn},
		{"on after the delay", "", time.Second, machine.PowerOn},
		{"force off starts powering off", machine.ResetForceOff, 0, machine.PoweringOff},
		{"on during powering off converges on", machine.ResetOn, 0, machine.PoweringOn},
		{"settles on", "", 5 * time.Second, machine.PowerOn},
		{"graceful shutdown", machine.ResetGracefulShutdown, 5 * time.Second, machine.PowerOff},
	}
	for _, s := range steps {
		if s.reset != "" {
			if err := m.Reset(ctx, s.reset); err != nil {
				t.Fatalf("%s: Reset: %v", s.name, err)
			}
		}
		clock.now = clock.now.Add(s.advance)
		if got, err := m.PowerState(ctx); err != nil || got != s.want {
			t.Fatalf("%s: PowerState = %q, %v; want %q", s.name, got, err, s.want)
		}
	}
}

func TestMachines(t *testing.T) {
	b := memory.New(memory.Options{Machines: 3})
	ids, err := b.Machines(t.Context())
	if err != nil || len(ids) != 3 || ids[0] != "vm-0" || ids[2] != "vm-2" {
		t.Fatalf("Machines = %v, %v", ids, err)
	}
	if _, err := b.Machine(t.Context(), "vm-9"); !errors.Is(err, machine.ErrNotFound) {
		t.Fatalf("Machine(vm-9) = %v, want ErrNotFound", err)
	}
	a, _ := b.Get("vm-0").Inventory(t.Context())
	c, _ := b.Get("vm-1").Inventory(t.Context())
	if a.UUID == c.UUID || a.NICs[0].MAC == c.NICs[0].MAC {
		t.Fatalf("machines share identity: %+v %+v", a, c)
	}
	again, _ := memory.New(memory.Options{}).Get("vm-0").Inventory(t.Context())
	if again.UUID != a.UUID {
		t.Fatalf("identity not stable across backends: %s vs %s", again.UUID, a.UUID)
	}
}

func TestFault(t *testing.T) {
	m := memory.New(memory.Options{}).Get("vm-0")
	ctx := t.Context()
	m.SetFault(machine.ErrUnavailable)
	calls := map[string]func() error{
		"PowerState":   func() error { _, err := m.PowerState(ctx); return err },
		"Reset":        func() error { return m.Reset(ctx, machine.ResetOn) },
		"Inventory":    func() error { _, err := m.Inventory(ctx); return err },
		"BootOverride": func() error { _, err := m.BootOverride(ctx); return err },
		"SetBootOverride": func() error {
			return m.SetBootOverride(ctx, machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce, Mode: machine.BootModeUEFI})
		},
		"VirtualMedia": func() error { _, err := m.VirtualMedia(ctx); return err },
		"InsertMedia":  func() error { return m.InsertMedia(ctx, "http://x/y.iso") },
		"EjectMedia":   func() error { return m.EjectMedia(ctx) },
		"Firmware":     func() error { _, err := m.Firmware(ctx); return err },
		"SetFirmware": func() error {
			return m.SetFirmware(ctx, machine.Firmware{Mode: machine.BootModeLegacy})
		},
		"ResetFirmware":    func() error { return m.ResetFirmware(ctx) },
		"LocatorActive":    func() error { _, err := m.LocatorActive(ctx); return err },
		"SetLocatorActive": func() error { return m.SetLocatorActive(ctx, true) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if err := call(); !errors.Is(err, machine.ErrUnavailable) {
				t.Fatalf("error = %v, want ErrUnavailable", err)
			}
		})
	}
	m.SetFault(nil)
	if st, err := m.PowerState(ctx); err != nil || st != machine.PowerOff {
		t.Fatalf("after clearing the fault: %q, %v; the failed Reset must not have changed state", st, err)
	}
}

func TestHardware(t *testing.T) {
	tests := []struct {
		name       string
		opts       memory.Options
		wantCPU    machine.CPU
		wantMemory int64
	}{
		{"defaults", memory.Options{}, memory.DefaultCPU, memory.DefaultMemoryMiB},
		{"configured", memory.Options{
			CPU:       machine.CPU{Sockets: 2, Cores: 4, Threads: 2, Architecture: machine.ArchARM64},
			MemoryMiB: 8192,
		}, machine.CPU{Sockets: 2, Cores: 4, Threads: 2, Architecture: machine.ArchARM64}, 8192},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv, err := memory.New(tt.opts).Get("vm-0").Inventory(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if inv.CPU != tt.wantCPU || inv.MemoryMiB != tt.wantMemory {
				t.Errorf("CPU %+v, memory %d MiB; want %+v, %d MiB", inv.CPU, inv.MemoryMiB, tt.wantCPU, tt.wantMemory)
			}
		})
	}
}

// TestMediaImport: with an import time, inserted media is Importing, its
// Percent growing with the clock, until Ready; FailMediaImport fails one
// under way; an eject ends either.
func TestMediaImport(t *testing.T) {
	const image = "http://images.example/boot.iso"
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	b := memory.New(memory.Options{MediaImportTime: 10 * time.Second, Now: clock.Now})
	m := b.Get("vm-0")
	ctx := t.Context()
	read := func() machine.VirtualMedia {
		t.Helper()
		vm, err := m.VirtualMedia(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return vm
	}
	if err := m.InsertMedia(ctx, image); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name    string
		advance time.Duration
		state   machine.MediaState
		percent int
	}{
		{"just inserted", 0, machine.MediaImporting, 0},
		{"under way", 4500 * time.Millisecond, machine.MediaImporting, 45},
		{"done", 5500 * time.Millisecond, machine.MediaReady, 100},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			clock.now = clock.now.Add(s.advance)
			if vm := read(); vm.State != s.state || vm.Percent != s.percent || !vm.Inserted || vm.Image != image {
				t.Errorf("media %+v, want %s at %d%%", vm, s.state, s.percent)
			}
		})
	}
	if m.FailMediaImport("too late") {
		t.Error("FailMediaImport failed an import that had finished")
	}
	if err := m.EjectMedia(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.InsertMedia(ctx, image); err != nil {
		t.Fatal(err)
	}
	if !m.FailMediaImport("404 Not Found") {
		t.Fatal("FailMediaImport found no import under way")
	}
	clock.now = clock.now.Add(time.Minute)
	if vm := read(); vm.State != machine.MediaFailed || vm.Problem != "404 Not Found" {
		t.Errorf("after the failure: %+v, want Failed with its problem", vm)
	}
	if err := m.InsertMedia(ctx, image); err != nil {
		t.Errorf("inserting the failed image again: %v, want nil (the retry changes nothing)", err)
	}
	if vm := read(); vm.State != machine.MediaFailed {
		t.Errorf("the retried insert changed the media: %+v", vm)
	}
	if err := m.EjectMedia(ctx); err != nil {
		t.Fatal(err)
	}
	if vm := read(); vm != (machine.VirtualMedia{WriteProtected: true}) {
		t.Errorf("after eject: %+v, want an empty, write-protected drive", vm)
	}
}

// TestNICLinkFollowsPower: a NIC has a link while its machine runs.
func TestNICLinkFollowsPower(t *testing.T) {
	m := memory.New(memory.Options{}).Get("vm-0")
	for _, step := range []struct {
		reset machine.ResetType
		want  machine.LinkState
	}{
		{"", machine.LinkDown},
		{machine.ResetOn, machine.LinkUp},
		{machine.ResetForceOff, machine.LinkDown},
	} {
		if step.reset != "" {
			if err := m.Reset(t.Context(), step.reset); err != nil {
				t.Fatal(err)
			}
		}
		inv, err := m.Inventory(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if got := inv.NICs[0].Link; got != step.want {
			t.Errorf("after %q: link %q, want %q", step.reset, got, step.want)
		}
	}
}
