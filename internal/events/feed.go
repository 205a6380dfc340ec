// Package events tells what happens to a BMC's machines, whoever made it
// happen: a Watcher compares each machine's state with what it saw last
// (at once after a write through the BMC, and whenever the backend's
// StateVersion moves, which follows the backend's own watch) and publishes
// each difference once to a Feed, which numbers the events, keeps a bounded
// history for clients that come back, and fans them out to subscribers.
// It speaks the machine contract only; protocols translate its events
// (Redfish: the EventService).
package events

import (
	"cmp"
	"sync"
	"time"

	"github.com/virtmetal/virtmetal/machine"
)

// Kind is what happened.
type Kind string

// The kinds of event.
const (
	// PowerChanged: the machine's power state is Event.Power now.
	PowerChanged Kind = "PowerChanged"
	// BootOverrideChanged: the boot override is Event.Boot now (set,
	// cleared, or used up by a boot).
	BootOverrideChanged Kind = "BootOverrideChanged"
	// MediaInserted: the virtual CD holds Event.Image now.
	MediaInserted Kind = "MediaInserted"
	// MediaEjected: the virtual CD is empty now.
	MediaEjected Kind = "MediaEjected"
	// MachineAdded and MachineRemoved: the backend finds the machine again,
	// or no longer (its VM was deleted).
	MachineAdded   Kind = "MachineAdded"
	MachineRemoved Kind = "MachineRemoved"
	// AccountsChanged: the BMC's accounts were replaced (credentials
	// rotated). Machine is "".
	AccountsChanged Kind = "AccountsChanged"
	// Test: a client asked for an event to check that events reach it.
	// Machine is ""; Detail holds what the protocol was given.
	Test Kind = "Test"
)

// Event is one change.
type Event struct {
	// ID numbers the feed's events from 1, in the order they happened.
	ID      uint64
	Time    time.Time
	Kind    Kind
	Machine string // the machine's ID; "" for the BMC itself
	Power   machine.PowerState
	Boot    machine.BootOverride
	Image   string
	// Detail is a Test event's content, as its protocol defines it.
	Detail any
}

// Options configure a Feed. Zero fields take the defaults.
type Options struct {
	// History is how many past events are kept for subscribers that
	// resume (default 256).
	History int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

const (
	defaultHistory = 256
	// subscriberBuffer is how many events a subscriber may fall behind
	// before it is dropped; a dropped client resumes from the history.
	subscriberBuffer = 64
)

// Feed numbers events and hands them to its subscribers. It is safe for
// concurrent use; its memory is bounded by History plus subscriberBuffer
// per subscriber.
type Feed struct {
	now      func() time.Time
	capacity int

	mu      sync.Mutex
	last    uint64  // the last ID given
	history []Event // the last capacity events, oldest first
	subs    map[*Subscription]struct{}
}

// NewFeed returns an empty feed.
func NewFeed(opts Options) *Feed {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Feed{now: now, capacity: cmp.Or(opts.History, defaultHistory), subs: map[*Subscription]struct{}{}}
}

// Publish numbers e, stamps its time, keeps it and hands it to every
// subscriber; one that has fallen subscriberBuffer events behind is dropped
// rather than waited for.
func (f *Feed) Publish(e Event) Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.last++
	e.ID, e.Time = f.last, f.now()
	if len(f.history) == f.capacity {
		copy(f.history, f.history[1:])
		f.history = f.history[:len(f.history)-1]
	}
	f.history = append(f.history, e)
	for s := range f.subs {
		select {
		case s.c <- e:
		default:
			f.dropLocked(s, true)
		}
	}
	return e
}

// Last is the ID of the latest event, 0 before the first.
func (f *Feed) Last() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

// Subscription receives a feed's events on C, in order, until it is closed
// or dropped for falling behind; C is then closed.
type Subscription struct {
	C    <-chan Event
	c    chan Event
	feed *Feed
	// lagged is set before C closes when the subscriber fell behind.
	lagged bool
}

// Subscribe starts a subscription. With after > 0 the events after that ID
// that the history still holds come first; complete is false when some
// were already gone (or after is not an ID the feed gave), so the
// subscriber knows it missed events.
func (f *Feed) Subscribe(after uint64) (s *Subscription, complete bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var replay []Event
	complete = true
	if after > 0 {
		switch {
		case after > f.last:
			complete = false
		case len(f.history) > 0 && after+1 < f.history[0].ID:
			complete = false
			replay = f.history
		default:
			for i, e := range f.history {
				if e.ID > after {
					replay = f.history[i:]
					break
				}
			}
		}
	}
	return f.subscribeLocked(replay), complete
}

// SubscribeSince starts a subscription whose first events are the kept
// ones of time t or later, for a subscriber that wants what happened since
// t. (Subscribe cannot start before the feed's first event: its 0 means
// from now.)
func (f *Feed) SubscribeSince(t time.Time) *Subscription {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := len(f.history)
	for i > 0 && !f.history[i-1].Time.Before(t) {
		i--
	}
	return f.subscribeLocked(f.history[i:])
}

func (f *Feed) subscribeLocked(replay []Event) *Subscription {
	c := make(chan Event, subscriberBuffer+len(replay))
	for _, e := range replay {
		c <- e
	}
	s := &Subscription{C: c, c: c, feed: f}
	f.subs[s] = struct{}{}
	return s
}

// Close ends the subscription; it is safe to call more than once.
func (s *Subscription) Close() {
	s.feed.mu.Lock()
	defer s.feed.mu.Unlock()
	s.feed.dropLocked(s, false)
}

// Lagged tells, once C is closed, whether the subscription was dropped for
// falling behind rather than closed.
func (s *Subscription) Lagged() bool {
	s.feed.mu.Lock()
	defer s.feed.mu.Unlock()
	return s.lagged
}

// Subscribers is how many subscriptions are open.
func (f *Feed) Subscribers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.subs)
}

func (f *Feed) dropLocked(s *Subscription, lagged bool) {
	if _, ok := f.subs[s]; !ok {
		return
	}
	delete(f.subs, s)
	s.lagged = lagged
	close(s.c)
}
