package machine_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/machinetest"
	"github.com/virtmetal/virtmetal/machine/memory"
)

// TestInterceptKeepsTheContract: an intercepted machine passes the backend
// contract suite, so a decorator built on Intercept changes nothing a
// protocol sees.
func TestInterceptKeepsTheContract(t *testing.T) {
	pass := func(ctx context.Context, _ machine.Call, call func(context.Context) error) error {
		return call(ctx)
	}
	machinetest.Run(t, func(t *testing.T) machinetest.Subject {
		b := memory.New(memory.Options{TransitionDelay: 10 * time.Millisecond})
		m := b.Get("vm-0")
		intercepted, err := machine.InterceptBackend(b, pass).Machine(t.Context(), "vm-0")
		if err != nil {
			t.Fatal(err)
		}
		return machinetest.Subject{Machine: intercepted, Boots: m.Boots, Versioned: b}
	})
}

// TestInterceptSeesEveryCall: each method is named to the interceptor, its
// error comes back as is, and an interceptor that refuses keeps the call
// from the machine.
func TestInterceptSeesEveryCall(t *testing.T) {
	ctx := t.Context()
	calls := []struct {
		op   machine.Operation
		call func(m machine.Machine) error
	}{
		{machine.OpInventory, func(m machine.Machine) error { _, err := m.Inventory(ctx); return err }},
		{machine.OpPowerState, func(m machine.Machine) error { _, err := m.PowerState(ctx); return err }},
		{machine.OpReset, func(m machine.Machine) error { return m.Reset(ctx, machine.ResetOn) }},
		{machine.OpBootOverride, func(m machine.Machine) error { _, err := m.BootOverride(ctx); return err }},
		{machine.OpSetBootOverride, func(m machine.Machine) error {
			return m.SetBootOverride(ctx, machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce, Mode: machine.BootModeUEFI})
		}},
		{machine.OpVirtualMedia, func(m machine.Machine) error { _, err := m.VirtualMedia(ctx); return err }},
		{machine.OpInsertMedia, func(m machine.Machine) error { return m.InsertMedia(ctx, "http://x/y.iso") }},
		{machine.OpEjectMedia, func(m machine.Machine) error { return m.EjectMedia(ctx) }},
		{machine.OpFirmware, func(m machine.Machine) error { _, err := m.Firmware(ctx); return err }},
		{machine.OpSetFirmware, func(m machine.Machine) error {
			return m.SetFirmware(ctx, machine.Firmware{Mode: machine.BootModeUEFI, SecureBoot: true})
		}},
		{machine.OpResetFirmware, func(m machine.Machine) error { return m.ResetFirmware(ctx) }},
		{machine.OpLocatorActive, func(m machine.Machine) error { _, err := m.LocatorActive(ctx); return err }},
		{machine.OpSetLocator, func(m machine.Machine) error { return m.SetLocatorActive(ctx, true) }},
	}
	refused := errors.New("refused by the interceptor")
	for _, tt := range calls {
		t.Run(string(tt.op), func(t *testing.T) {
			inner := memory.New(memory.Options{}).Get("vm-0")
			var seen []machine.Operation
			m := machine.Intercept(inner, func(ctx context.Context, c machine.Call, call func(context.Context) error) error {
				seen = append(seen, c.Op)
				if c.Machine != "vm-0" || c.IsWrite() != (c.Arg != "" || c.Op == machine.OpEjectMedia || c.Op == machine.OpResetFirmware) {
					t.Errorf("call %+v", c)
				}
				return call(ctx)
			})
			inner.SetFault(machine.ErrUnavailable)
			if err := tt.call(m); !errors.Is(err, machine.ErrUnavailable) {
				t.Errorf("error = %v, want the machine's ErrUnavailable", err)
			}
			if len(seen) != 1 || seen[0] != tt.op {
				t.Errorf("interceptor saw %v, want [%s]", seen, tt.op)
			}

			inner.SetFault(nil)
			blocked := machine.Intercept(inner, func(context.Context, machine.Call, func(context.Context) error) error { return refused })
			if err := tt.call(blocked); !errors.Is(err, refused) {
				t.Errorf("error = %v, want the interceptor's", err)
			}
			if st, _ := inner.PowerState(ctx); st != machine.PowerOff {
				t.Errorf("a refused call reached the machine: power %s", st)
			}
		})
	}
}

// TestInterceptBackendKeepsOptionalInterfaces: Readiness, Versioned and
// StateStore come from the wrapped backend.
func TestInterceptBackendKeepsOptionalInterfaces(t *testing.T) {
	pass := func(ctx context.Context, _ machine.Call, call func(context.Context) error) error {
		return call(ctx)
	}
	b := memory.New(memory.Options{})
	b.Get("vm-0")
	ib := machine.InterceptBackend(b, pass)
	want, _ := b.StateVersion("vm-0")
	if got, ok := ib.(machine.Versioned).StateVersion("vm-0"); !ok || got != want {
		t.Errorf("StateVersion = %d, %v; want the backend's %d", got, ok, want)
	}
	if err := ib.(machine.Readiness).Ready(); err != nil {
		t.Errorf("Ready = %v", err)
	}
	if _, err := ib.Machine(t.Context(), "nope"); !errors.Is(err, machine.ErrNotFound) {
		t.Errorf("unknown machine: %v", err)
	}
	ids, err := ib.Machines(t.Context())
	if err != nil || len(ids) != 1 {
		t.Errorf("Machines = %v, %v", ids, err)
	}
	store := ib.(machine.StateStore)
	if err := store.SaveState(t.Context(), "k", []byte("kept")); err != nil {
		t.Fatalf("SaveState: %v", err)
	}
	if got, err := b.LoadState(t.Context(), "k"); err != nil || string(got) != "kept" {
		t.Errorf("the backend's LoadState = %q, %v; want what was saved through the wrapper", got, err)
	}
	if got, err := store.LoadState(t.Context(), "k"); err != nil || string(got) != "kept" {
		t.Errorf("LoadState = %q, %v", got, err)
	}
	stateless := machine.InterceptBackend(statelessBackend{b}, pass).(machine.StateStore)
	if _, err := stateless.LoadState(t.Context(), "k"); !errors.Is(err, machine.ErrNotSupported) {
		t.Errorf("LoadState of a backend that keeps no state = %v, want ErrNotSupported", err)
	}
	if err := stateless.SaveState(t.Context(), "k", nil); !errors.Is(err, machine.ErrNotSupported) {
		t.Errorf("SaveState of a backend that keeps no state = %v, want ErrNotSupported", err)
	}
}

// statelessBackend hides every optional interface of its backend.
type statelessBackend struct{ machine.Backend }

// TestChain runs the interceptors outermost first, each once, around one
// call of the machine.
func TestChain(t *testing.T) {
	var order []string
	step := func(name string) machine.Interceptor {
		return func(ctx context.Context, c machine.Call, call func(context.Context) error) error {
			order = append(order, name+" "+string(c.Op)+" "+c.Arg)
			return call(ctx)
		}
	}
	inner := memory.New(memory.Options{}).Get("vm-0")
	m := machine.Intercept(inner, machine.Chain(step("outer"), step("inner")))
	if err := m.Reset(t.Context(), machine.ResetForceOff); err != nil {
		t.Fatal(err)
	}
	want := []string{"outer Reset ForceOff", "inner Reset ForceOff"}
	if !slices.Equal(order, want) {
		t.Errorf("order %q, want %q", order, want)
	}
}
