package ipmi

import (
	"context"

	"github.com/virtmetal/virtmetal/machine"
)

// unlockedMachine is the machine as handlers call it: each call releases
// the server's lock (so one slow backend call does not stall other
// clients' packets) and has a deadline (so a hung backend answers "node
// busy" instead of never). Handlers hold the lock when they call, and must
// expect the session table to have changed when the call returns.
type unlockedMachine struct {
	machine.Machine
	s *Server
}

func unlocked[T any](m unlockedMachine, ctx context.Context, call func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, m.s.callLimit)
	defer cancel()
	m.s.mu.Unlock()
	defer m.s.mu.Lock()
	return call(ctx)
}

type nothing struct{}

func unlockedErr(m unlockedMachine, ctx context.Context, call func(context.Context) error) error {
	_, err := unlocked(m, ctx, func(ctx context.Context) (nothing, error) { return nothing{}, call(ctx) })
	return err
}

func (m unlockedMachine) Inventory(ctx context.Context) (machine.Inventory, error) {
	return unlocked(m, ctx, m.Machine.Inventory)
}

func (m unlockedMachine) PowerState(ctx context.Context) (machine.PowerState, error) {
	return unlocked(m, ctx, m.Machine.PowerState)
}

func (m unlockedMachine) Reset(ctx context.Context, r machine.ResetType) error {
	return unlockedErr(m, ctx, func(ctx context.Context) error { return m.Machine.Reset(ctx, r) })
}

func (m unlockedMachine) BootOverride(ctx context.Context) (machine.BootOverride, error) {
	return unlocked(m, ctx, m.Machine.BootOverride)
}

func (m unlockedMachine) SetBootOverride(ctx context.Context, o machine.BootOverride) error {
	return unlockedErr(m, ctx, func(ctx context.Context) error { return m.Machine.SetBootOverride(ctx, o) })
}

func (m unlockedMachine) VirtualMedia(ctx context.Context) (machine.VirtualMedia, error) {
	return unlocked(m, ctx, m.Machine.VirtualMedia)
}

func (m unlockedMachine) InsertMedia(ctx context.Context, url string) error {
	return unlockedErr(m, ctx, func(ctx context.Context) error { return m.Machine.InsertMedia(ctx, url) })
}

func (m unlockedMachine) EjectMedia(ctx context.Context) error {
	return unlockedErr(m, ctx, m.Machine.EjectMedia)
}
