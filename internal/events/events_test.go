package events_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/internal/events"
	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
)

func TestSubscribeResumes(t *testing.T) {
	f := events.NewFeed(events.Options{History: 4})
	for range 6 {
		f.Publish(events.Event{Kind: events.AccountsChanged})
	}
	tests := []struct {
		after        uint64
		wantIDs      []uint64
		wantComplete bool
	}{
		{0, nil, true},                   // a new client starts from now
		{6, nil, true},                   // it has seen everything
		{4, []uint64{5, 6}, true},        // it missed two, both kept
		{2, []uint64{3, 4, 5, 6}, true},  // the oldest kept is the next one
		{1, []uint64{3, 4, 5, 6}, false}, // 2 is gone
		{99, nil, false},                 // not an ID of this feed (a restarted BMC)
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint("after ", tt.after), func(t *testing.T) {
			s, complete := f.Subscribe(tt.after)
			defer s.Close()
			if complete != tt.wantComplete {
				t.Errorf("complete = %v, want %v", complete, tt.wantComplete)
			}
			var got []uint64
			for len(s.C) > 0 {
				got = append(got, (<-s.C).ID)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.wantIDs) {
				t.Errorf("replayed %v, want %v", got, tt.wantIDs)
			}
		})
	}
}

// TestSubscribeSince: a subscriber that wants what happened since a time
// gets the kept events of that time or later, from the feed's very first
// one when all are that recent.
func TestSubscribeSince(t *testing.T) {
	start := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	now := start
	f := events.NewFeed(events.Options{History: 4, Now: func() time.Time { return now }})
	for range 3 {
		f.Publish(events.Event{Kind: events.AccountsChanged})
		now = now.Add(time.Minute)
	}
	tests := []struct {
		since   time.Time
		wantIDs []uint64
	}{
		{start.Add(-time.Hour), []uint64{1, 2, 3}}, // all, the first included
		{start.Add(time.Minute), []uint64{2, 3}},   // from one of that time on
		{start.Add(90 * time.Second), []uint64{3}},
		{now, nil},
	}
	for _, tt := range tests {
		t.Run(tt.since.Format(time.TimeOnly), func(t *testing.T) {
			s := f.SubscribeSince(tt.since)
			defer s.Close()
			var got []uint64
			for len(s.C) > 0 {
				got = append(got, (<-s.C).ID)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.wantIDs) {
				t.Errorf("replayed %v, want %v", got, tt.wantIDs)
			}
		})
	}
}

func TestSlowSubscriberIsDroppedNotWaitedFor(t *testing.T) {
	f := events.NewFeed(events.Options{History: 1000})
	slow, _ := f.Subscribe(0)
	fast, _ := f.Subscribe(0)
	received := 0
	for range 500 {
		f.Publish(events.Event{Kind: events.AccountsChanged})
		for len(fast.C) > 0 {
			<-fast.C
			received++
		}
	}
	if received != 500 {
		t.Errorf("the subscriber that kept up got %d of 500", received)
	}
	n := 0
	for range slow.C {
		n++
	}
	if !slow.Lagged() || n == 0 || n >= 500 {
		t.Errorf("slow subscriber: lagged %v after %d events; want dropped with what it had buffered", slow.Lagged(), n)
	}
	if f.Subscribers() != 1 {
		t.Errorf("%d subscribers, want the one that kept up", f.Subscribers())
	}
	// What it lost is in the history: it resumes complete.
	again, complete := f.Subscribe(uint64(n))
	defer again.Close()
	if !complete || len(again.C) != 500-n {
		t.Errorf("resumed after %d: complete %v with %d events, want all %d", n, complete, len(again.C), 500-n)
	}
	fast.Close()
	fast.Close() // twice is fine
	if _, open := <-fast.C; open || fast.Lagged() {
		t.Error("a closed subscription must end without being marked lagged")
	}
}

// kinds drains what s has received within a moment of the last event.
func kinds(t *testing.T, s *events.Subscription, want int) []string {
	t.Helper()
	var got []string
	timeout := time.After(5 * time.Second)
	for len(got) < want {
		select {
		case e := <-s.C:
			got = append(got, describe(e))
		case <-timeout:
			t.Fatalf("got %v, waited for %d events", got, want)
		}
	}
	select {
	case e := <-s.C:
		t.Errorf("one event too many: %s after %v", describe(e), got)
	case <-time.After(150 * time.Millisecond):
	}
	return got
}

func describe(e events.Event) string {
	switch e.Kind {
	case events.PowerChanged:
		return fmt.Sprintf("%s %s %s", e.Machine, e.Kind, e.Power)
	case events.BootOverrideChanged:
		return fmt.Sprintf("%s %s %s %s", e.Machine, e.Kind, e.Boot.Target, e.Boot.Enabled)
	case events.MediaInserted:
		return fmt.Sprintf("%s %s %s", e.Machine, e.Kind, e.Image)
	}
	return fmt.Sprintf("%s %s", e.Machine, e.Kind)
}

// TestWatcherReportsEveryChangeOnce: MaaS's power sequence made through the
// BMC (the intercepted backend) and changes made around it (straight on
// the machine, as another client or the cluster would) are each reported
// once, in order.
func TestWatcherReportsEveryChangeOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := memory.New(memory.Options{Machines: 2})
	f := events.NewFeed(events.Options{})
	w := events.NewWatcher(b, f, events.WatcherOptions{Interval: 10 * time.Millisecond})
	bmc := machine.InterceptBackend(b, w.Intercept)
	s, _ := f.Subscribe(0)
	defer s.Close()
	go func() { _ = w.Run(ctx) }()
	vm0, _ := bmc.Machine(ctx, "vm-0")
	must(t, vm0.Reset(ctx, machine.ResetOn))
	must(t, vm0.Reset(ctx, machine.ResetForceOff))
	must(t, vm0.SetBootOverride(ctx, machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce, Mode: machine.BootModeUEFI}))
	must(t, vm0.Reset(ctx, machine.ResetOn))
	must(t, vm0.Reset(ctx, machine.ResetOn)) // already on: nothing changes, nothing told
	got := kinds(t, s, 5)
	want := []string{
		"vm-0 PowerChanged On",
		"vm-0 PowerChanged Off",
		"vm-0 BootOverrideChanged Pxe Once",
		"vm-0 PowerChanged On",
		"vm-0 BootOverrideChanged None Disabled", // used up by that boot
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("events\n got %v\nwant %v", got, want)
	}

	// Not through the BMC: the backend's notification (or the poll) finds
	// each. Each change waits for its event: changes closer together than
	// the watcher's read of the machine are seen as their sum.
	vm1 := b.Get("vm-1")
	for _, step := range []struct {
		change func() error
		want   string
	}{
		{func() error { return vm1.InsertMedia(ctx, "https://images.example/boot.iso") }, "vm-1 MediaInserted https://images.example/boot.iso"},
		{func() error { return vm1.EjectMedia(ctx) }, "vm-1 MediaEjected"},
		{func() error { return vm1.InsertMedia(ctx, "https://images.example/other.iso") }, "vm-1 MediaInserted https://images.example/other.iso"},
	} {
		must(t, step.change())
		if got := kinds(t, s, 1); got[0] != step.want {
			t.Errorf("got %v, want %s", got, step.want)
		}
	}
}

// TestWatcherWakesWhenTheBackendTells: a backend that notifies changes
// (machine.ChangeNotifier) has them reported at once, not at the next
// poll.
func TestWatcherWakesWhenTheBackendTells(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := memory.New(memory.Options{})
	f := events.NewFeed(events.Options{})
	watched, firstRead := readsOf(b)
	w := events.NewWatcher(watched, f, events.WatcherOptions{Interval: time.Hour})
	s, _ := f.Subscribe(0)
	defer s.Close()
	go func() { _ = w.Run(ctx) }()
	waitForRead(t, firstRead) // the first read: no event
	must(t, b.Get("vm-0").Reset(ctx, machine.ResetOn))
	select {
	case e := <-s.C:
		if describe(e) != "vm-0 PowerChanged On" {
			t.Errorf("got %s", describe(e))
		}
	case <-time.After(2 * time.Second):
		t.Fatal("not told within 2 s with an hour between polls")
	}
}

// TestWatcherSurvivesFailingReads: while the backend fails, nothing is
// reported and nothing is forgotten; once it answers again, the change
// made meanwhile is reported once.
func TestWatcherSurvivesFailingReads(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := memory.New(memory.Options{})
	f := events.NewFeed(events.Options{})
	watched, firstRead := readsOf(b)
	w := events.NewWatcher(watched, f, events.WatcherOptions{Interval: 10 * time.Millisecond})
	s, _ := f.Subscribe(0)
	defer s.Close()
	go func() { _ = w.Run(ctx) }()
	waitForRead(t, firstRead) // the first read: no event
	m := b.Get("vm-0")
	must(t, m.Reset(ctx, machine.ResetOn))
	m.SetFault(machine.Errorf(machine.ErrUnavailable, "API server down"))
	time.Sleep(100 * time.Millisecond)
	if f.Last() > 1 {
		t.Fatalf("%d events while failing", f.Last())
	}
	m.SetFault(nil)
	if got := kinds(t, s, 1); got[0] != "vm-0 PowerChanged On" {
		t.Errorf("got %v", got)
	}
}

// TestWatcherWaitsUntilReady: a backend that says it is not ready
// (machine.Readiness; a KubeVirt backend whose cache has not synced would
// read through to the API server) is not read; once ready, its first read
// is the state changes are told from.
func TestWatcherWaitsUntilReady(t *testing.T) {
	// An hour between polls: readiness is asked again soon all the same,
	// and the change is told by the backend's notification.
	for _, interval := range []time.Duration{10 * time.Millisecond, time.Hour} {
		t.Run("poll every "+interval.String(), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b := &readiness{Backend: memory.New(memory.Options{})}
			b.notReady.Store(true)
			f := events.NewFeed(events.Options{})
			reads, firstRead := readsOf(b)
			w := events.NewWatcher(struct {
				machine.Backend
				machine.Versioned
				machine.ChangeNotifier
				machine.Readiness
			}{reads, b.Backend, b.Backend, b}, f, events.WatcherOptions{Interval: interval, ReadEvery: interval})
			s, _ := f.Subscribe(0)
			defer s.Close()
			go func() { _ = w.Run(ctx) }()
			select {
			case <-firstRead:
				t.Fatal("a backend that is not ready was read")
			case <-time.After(200 * time.Millisecond):
			}
			b.notReady.Store(false) // no change told
			waitForRead(t, firstRead)
			vm0, _ := b.Machine(ctx, "vm-0")
			must(t, vm0.Reset(ctx, machine.ResetOn))
			if got := kinds(t, s, 1); got[0] != "vm-0 PowerChanged On" {
				t.Errorf("got %v", got)
			}
		})
	}
}

// readiness is a memory backend that says whether it is ready when told.
type readiness struct {
	*memory.Backend
	notReady atomic.Bool
}

func (r *readiness) Ready() error {
	if r.notReady.Load() {
		return machine.Errorf(machine.ErrUnavailable, "cache not synced")
	}
	return nil
}

// TestWatcherReportsRemovedMachine: a machine the backend no longer finds
// (its VM deleted) is one MachineRemoved.
func TestWatcherReportsRemovedMachine(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := &vanishing{memory: memory.New(memory.Options{})}
	f := events.NewFeed(events.Options{})
	watched, firstRead := readsOf(b)
	w := events.NewWatcher(watched, f, events.WatcherOptions{Interval: 10 * time.Millisecond, ReadEvery: 10 * time.Millisecond})
	s, _ := f.Subscribe(0)
	defer s.Close()
	go func() { _ = w.Run(ctx) }()
	waitForRead(t, firstRead)
	b.gone.Store(true)
	if got := kinds(t, s, 1); got[0] != "vm-0 MachineRemoved" {
		t.Errorf("got %v", got)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// readsOf is b with a channel closed once a machine has been read whole
// the first time: the watcher's first read, the state it compares every
// change with. Its media comes last (power, boot override, media); closed
// at the first call instead, a test could change the machine, or make it
// fail, while that first read was still under way (4 runs in 600).
func readsOf(b machine.Backend) (machine.Backend, <-chan struct{}) {
	read := make(chan struct{})
	var once sync.Once
	return machine.InterceptBackend(b, func(ctx context.Context, c machine.Call, call func(context.Context) error) error {
		err := call(ctx)
		if c.Op == machine.OpVirtualMedia && err == nil {
			once.Do(func() { close(read) })
		}
		return err
	}), read
}

func waitForRead(t *testing.T, read <-chan struct{}) {
	t.Helper()
	select {
	case <-read:
	case <-time.After(poll.Patience):
		t.Fatal("the watcher never read the machine")
	}
}

// vanishing is a backend that cannot tell versions and loses its machine
// when told.
type vanishing struct {
	memory *memory.Backend
	gone   atomic.Bool
}

func (v *vanishing) Machines(ctx context.Context) ([]string, error) { return v.memory.Machines(ctx) }

func (v *vanishing) Machine(ctx context.Context, id string) (machine.Machine, error) {
	if v.gone.Load() {
		return nil, machine.Errorf(machine.ErrNotFound, "%q", id)
	}
	return v.memory.Machine(ctx, id)
}
