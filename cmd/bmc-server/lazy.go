package main

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/virtmetal/virtmetal/machine"
)

// lazyMachine is a backend's machine looked up at each call, so IPMI can
// start while the backend cannot answer yet (an API server down at start)
// and answer "node busy" until it can, rather than the process exiting.
type lazyMachine struct {
	backend machine.Backend
	id      string
	// last is the most recent lookup, for Capabilities, which has no
	// context to look up with.
	last atomic.Pointer[machine.Machine]
}

var (
	_ machine.Machine   = (*lazyMachine)(nil)
	_ machine.Readiness = (*lazyMachine)(nil)
)

func (m *lazyMachine) get(ctx context.Context) (machine.Machine, error) {
	got, err := m.backend.Machine(ctx, m.id)
	if err != nil {
		return nil, err
	}
	m.last.Store(&got)
	return got, nil
}

func (m *lazyMachine) ID() string { return m.id }

// Ready is the backend's readiness, and once that is there, a first
// lookup (from a synced cache: no network) so Capabilities has an answer.
func (m *lazyMachine) Ready() error {
	if r, ok := m.backend.(machine.Readiness); ok {
		if err := r.Ready(); err != nil {
			return err
		}
	}
	if m.last.Load() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
		defer cancel()
		if _, err := m.get(ctx); err != nil {
			return machine.Errorf(machine.ErrUnavailable, "looking up machine %s: %v", m.id, err)
		}
	}
	return nil
}

// lookupTimeout bounds the first lookup.
const lookupTimeout = 2 * time.Second

// Capabilities are those of the last lookup; IPMI asks only once Ready.
func (m *lazyMachine) Capabilities() machine.Capabilities {
	if last := m.last.Load(); last != nil {
		return (*last).Capabilities()
	}
	return machine.Capabilities{}
}

func call[T any](m *lazyMachine, ctx context.Context, f func(machine.Machine) (T, error)) (T, error) {
	got, err := m.get(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	return f(got)
}

func callErr(m *lazyMachine, ctx context.Context, f func(machine.Machine) error) error {
	got, err := m.get(ctx)
	if err != nil {
		return err
	}
	return f(got)
}

func (m *lazyMachine) Inventory(ctx context.Context) (machine.Inventory, error) {
	return call(m, ctx, func(x machine.Machine) (machine.Inventory, error) { return x.Inventory(ctx) })
}

func (m *lazyMachine) PowerState(ctx context.Context) (machine.PowerState, error) {
	return call(m, ctx, func(x machine.Machine) (machine.PowerState, error) { return x.PowerState(ctx) })
}

func (m *lazyMachine) Reset(ctx context.Context, r machine.ResetType) error {
	return callErr(m, ctx, func(x machine.Machine) error { return x.Reset(ctx, r) })
}

func (m *lazyMachine) BootOverride(ctx context.Context) (machine.BootOverride, error) {
	return call(m, ctx, func(x machine.Machine) (machine.BootOverride, error) { return x.BootOverride(ctx) })
}

func (m *lazyMachine) SetBootOverride(ctx context.Context, o machine.BootOverride) error {
	return callErr(m, ctx, func(x machine.Machine) error { return x.SetBootOverride(ctx, o) })
}

func (m *lazyMachine) VirtualMedia(ctx context.Context) (machine.VirtualMedia, error) {
	return call(m, ctx, func(x machine.Machine) (machine.VirtualMedia, error) { return x.VirtualMedia(ctx) })
}

func (m *lazyMachine) InsertMedia(ctx context.Context, url string) error {
	return callErr(m, ctx, func(x machine.Machine) error { return x.InsertMedia(ctx, url) })
}

func (m *lazyMachine) EjectMedia(ctx context.Context) error {
	return callErr(m, ctx, func(x machine.Machine) error { return x.EjectMedia(ctx) })
}
