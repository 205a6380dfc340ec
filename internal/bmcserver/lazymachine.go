package bmcserver

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/virtmetal/virtmetal/machine"
)

// lazyMachine is a backend's machine looked up at each call, so IPMI can
// start while the backend cannot answer yet (an API server down at start)
// and answer "node busy" until it can, rather than the process exiting.
type lazyMachine struct {
	machine.Forwarder
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

func newLazyMachine(backend machine.Backend, id string) *lazyMachine {
	m := &lazyMachine{backend: backend, id: id}
	m.Forwarder = machine.Forwarder{MachineID: id, Target: m.get}
	return m
}

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
			return fmt.Errorf("%w: looking up machine %s: %w", machine.ErrUnavailable, m.id, err)
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
