package events

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/virtmetal/virtmetal/machine"
)

// WatcherOptions configure a Watcher. Zero fields take the defaults.
type WatcherOptions struct {
	// Interval is how often StateVersion is asked (default 100 ms; it is
	// cheap and makes no remote call).
	Interval time.Duration
	// ReadEvery is how often a machine whose backend cannot tell its
	// version is read anyway (default 2 s).
	ReadEvery time.Duration
}

// Watcher turns the changes of a backend's machines into a Feed's events:
// each difference between two reads of a machine is one event, so a change
// is reported once, whether it was made through this BMC, another one, the
// guest or the cluster's API.
type Watcher struct {
	backend   machine.Backend
	versioned machine.Versioned
	notifier  machine.ChangeNotifier // nil: the poll alone finds changes
	readiness machine.Readiness      // nil: always ready
	feed      *Feed
	interval  time.Duration
	readEvery time.Duration

	mu       sync.Mutex
	machines map[string]*watched
}

// watched is one machine: its lock orders its reads and their events.
type watched struct {
	mu       sync.Mutex
	seen     bool // state holds a first read
	state    snapshot
	version  uint64
	versOK   bool
	lastRead time.Time
}

// snapshot is what events are told from.
type snapshot struct {
	present bool
	power   machine.PowerState
	boot    machine.BootOverride
	media   machine.VirtualMedia
}

// NewWatcher watches b's machines into f. Run polls; Intercept reports the
// writes it sees at once.
func NewWatcher(b machine.Backend, f *Feed, opts WatcherOptions) *Watcher {
	v, _ := b.(machine.Versioned)
	n, _ := b.(machine.ChangeNotifier)
	r, _ := b.(machine.Readiness)
	return &Watcher{
		backend: b, versioned: v, notifier: n, readiness: r, feed: f,
		interval:  cmp.Or(opts.Interval, 100*time.Millisecond),
		readEvery: cmp.Or(opts.ReadEvery, 2*time.Second),
		machines:  map[string]*watched{},
	}
}

// Run reads every machine once (what it sees first is no event), then
// reports its changes until ctx ends: at once when the backend tells
// (machine.ChangeNotifier), else at the next poll, and only while the
// backend is ready (machine.Readiness). It returns ctx's error.
func (w *Watcher) Run(ctx context.Context) error {
	timer := time.NewTimer(w.interval)
	defer timer.Stop()
	for {
		var changed <-chan struct{} // nil blocks: only the timer wakes
		if w.notifier != nil {
			changed = w.notifier.Changed()
		}
		next := w.interval
		// A backend that is not ready would answer from its API rather
		// than its cache: polls wait, so a shared bmc-server starting
		// thousands of VMs does not read each of them through to the
		// API server every ReadEvery until its cache has synced. Readiness
		// may come without a change to tell of it: it is asked again soon.
		if w.readiness == nil || w.readiness.Ready() == nil {
			ids, err := w.backend.Machines(ctx)
			if err == nil {
				for _, id := range ids {
					w.poll(ctx, id)
				}
			}
		} else {
			next = min(next, readinessRecheck)
		}
		timer.Reset(next)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		case <-changed:
		}
	}
}

// readinessRecheck is how often Run asks a backend that is not ready
// whether it is, whatever the poll interval.
const readinessRecheck = 100 * time.Millisecond

// Intercept is a machine.Interceptor: a write through it is followed at
// once by a read of its machine, so the write's change is published before
// the write returns, in order with the machine's other changes.
func (w *Watcher) Intercept(ctx context.Context, c machine.Call, call func(context.Context) error) error {
	if !c.IsWrite() {
		return call(ctx)
	}
	// Without a first read the write's change would be taken for the
	// starting state.
	readCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	m := w.machine(c.Machine)
	m.mu.Lock()
	if !m.seen {
		w.readLocked(readCtx, c.Machine, m)
	}
	m.mu.Unlock()
	err := call(ctx)
	m.mu.Lock()
	// The poll, woken by the write's notification, may have read it
	// already; a read at the version that follows the write is enough.
	if !w.readAtCurrentVersion(c.Machine, m) {
		w.readLocked(readCtx, c.Machine, m)
	}
	m.mu.Unlock()
	return err
}

// version is the backend's StateVersion of id; ok is false when it cannot
// tell.
func (w *Watcher) version(id string) (uint64, bool) {
	if w.versioned == nil {
		return 0, false
	}
	return w.versioned.StateVersion(id)
}

// readAtCurrentVersion tells whether m's last read is at the version the
// backend reports now. Callers hold m.mu.
func (w *Watcher) readAtCurrentVersion(id string, m *watched) bool {
	v, ok := w.version(id)
	return ok && m.seen && m.versOK && v == m.version
}

func (w *Watcher) machine(id string) *watched {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.machines[id]
	if m == nil {
		m = &watched{}
		w.machines[id] = m
	}
	return m
}

// poll reads the machine when its version moved, or when the backend
// cannot tell and ReadEvery has passed.
func (w *Watcher) poll(ctx context.Context, id string) {
	m := w.machine(id)
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, known := w.version(id); known && w.readAtCurrentVersion(id, m) ||
		!known && m.seen && time.Since(m.lastRead) < w.readEvery {
		return
	}
	w.readLocked(ctx, id, m)
}

// readLocked reads the machine and publishes what differs from the last
// read. A read that fails for another reason than the machine's absence
// changes nothing: the next one tells.
func (w *Watcher) readLocked(ctx context.Context, id string, m *watched) {
	// Asked before reading, so the state read is at least this new.
	version, versOK := w.version(id)
	now, err := w.read(ctx, id)
	if err != nil {
		return
	}
	m.lastRead = time.Now()
	m.version, m.versOK = version, versOK
	if !m.seen {
		m.seen, m.state = true, now
		return
	}
	for _, e := range differences(id, m.state, now) {
		w.feed.Publish(e)
	}
	m.state = now
}

func (w *Watcher) read(ctx context.Context, id string) (snapshot, error) {
	mc, err := w.backend.Machine(ctx, id)
	if errors.Is(err, machine.ErrNotFound) {
		return snapshot{}, nil
	}
	if err != nil {
		return snapshot{}, err
	}
	s := snapshot{present: true}
	if s.power, err = mc.PowerState(ctx); err != nil {
		return absentOrFailed(err)
	}
	if s.boot, err = mc.BootOverride(ctx); err != nil {
		return absentOrFailed(err)
	}
	if mc.Capabilities().VirtualMedia {
		if s.media, err = mc.VirtualMedia(ctx); err != nil {
			return absentOrFailed(err)
		}
	}
	return s, nil
}

func absentOrFailed(err error) (snapshot, error) {
	if errors.Is(err, machine.ErrNotFound) {
		return snapshot{}, nil
	}
	return snapshot{}, err
}

// differences are the events that lead from before to after, power first:
// a power-on is what uses up a Once override.
func differences(id string, before, after snapshot) []Event {
	switch {
	case before.present && !after.present:
		return []Event{{Kind: MachineRemoved, Machine: id}}
	case !before.present && !after.present:
		return nil
	}
	var out []Event
	if !before.present {
		out = append(out, Event{Kind: MachineAdded, Machine: id})
	}
	if after.power != before.power {
		out = append(out, Event{Kind: PowerChanged, Machine: id, Power: after.power})
	}
	if after.boot != before.boot {
		out = append(out, Event{Kind: BootOverrideChanged, Machine: id, Boot: after.boot})
	}
	if after.media.Inserted != before.media.Inserted || after.media.Image != before.media.Image {
		if before.media.Inserted {
			out = append(out, Event{Kind: MediaEjected, Machine: id})
		}
		if after.media.Inserted {
			out = append(out, Event{Kind: MediaInserted, Machine: id, Image: after.media.Image})
		}
	}
	return out
}
