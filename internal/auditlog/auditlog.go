// Package auditlog is the BMC's log of what was done to its machines and
// by whom: every power, boot and media action and every burst of failed
// logins, with the account, the client address and the protocol. Redfish's
// LogService and IPMI's SEL read the same log; it is bounded (the oldest
// entries go first) and lives in the process, so the wiring also copies
// each action to a Kubernetes Event on the VM, where it outlives the pod.
package auditlog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/virtmetal/virtmetal/machine"
)

// Protocols an Actor comes through.
const (
	Redfish = "Redfish"
	IPMI    = "IPMI"
)

// Actor is who asked: the protocol, the account and the client address.
type Actor struct {
	Protocol string
	Account  string // as given; for a failed login, the name tried
	Source   string // the client address (behind a trusted proxy, the client's)
}

type actorKey struct{}

// WithActor is ctx carrying who makes the calls done with it.
func WithActor(ctx context.Context, a Actor) context.Context {
	return context.WithValue(ctx, actorKey{}, a)
}

// ActorFrom is who ctx says makes its calls.
func ActorFrom(ctx context.Context) (Actor, bool) {
	a, ok := ctx.Value(actorKey{}).(Actor)
	return a, ok
}

// Severity is how much an entry matters, as Redfish names it.
type Severity string

const (
	SeverityOK      Severity = "OK"
	SeverityWarning Severity = "Warning"
)

// Kind is what an entry records.
type Kind string

const (
	// KindAction is a write to a machine (Op and Arg say which).
	KindAction Kind = "Action"
	// KindLoginFailure is one or more failed logins from one source
	// through one protocol, within BurstWindow of each other.
	KindLoginFailure Kind = "LoginFailure"
)

// Entry is one record of the log.
type Entry struct {
	// ID grows with each entry and is never reused, so a client that
	// cleared the log cannot confuse an old entry with a new one.
	ID      uint64
	Created time.Time
	// Updated is when a burst entry last counted a failure.
	Updated time.Time
	// Machine is the machine acted on; "" for the BMC itself.
	Machine string
	Actor   Actor
	Kind    Kind
	Op      machine.Operation // for an action
	Arg     string            // for an action: its argument in words
	// Err is why the action failed; "" when it succeeded.
	Err string
	// Count is the failed logins a burst entry holds (1 for an action).
	Count int
}

// Severity is OK for an action that succeeded, else Warning.
func (e Entry) Severity() Severity {
	if e.Kind == KindAction && e.Err == "" {
		return SeverityOK
	}
	return SeverityWarning
}

// Message says the entry in one line, for Redfish, Events and logs:
// "Reset ForceOff by admin from 10.0.0.5 via Redfish: done".
func (e Entry) Message() string {
	who := fmt.Sprintf("%s from %s via %s", orUnknown(e.Actor.Account), orUnknown(e.Actor.Source), orUnknown(e.Actor.Protocol))
	if e.Kind == KindLoginFailure {
		if e.Count == 1 {
			return "1 failed login as " + who
		}
		return fmt.Sprintf("%d failed logins as %s", e.Count, who)
	}
	what := string(e.Op)
	if e.Arg != "" {
		what += " " + e.Arg
	}
	outcome := "done"
	if e.Err != "" {
		outcome = "failed: " + e.Err
	}
	return what + " by " + who + ": " + outcome
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// maxAccountLength bounds the account name a failed login is logged with.
const maxAccountLength = 64

// Options configure a Log; zero fields take the defaults.
type Options struct {
	// Capacity bounds the entries kept (default 256); the oldest go first.
	Capacity int
	// BurstWindow is how close failed logins of one source and protocol
	// must follow each other to count in one entry (default 1 minute).
	BurstWindow time.Duration
	Now         func() time.Time
}

// Log is safe for concurrent use.
type Log struct {
	capacity int
	burst    time.Duration
	now      func() time.Time

	mu        sync.Mutex
	entries   []Entry // oldest first
	nextID    uint64
	listeners []func(Entry)
}

// New returns an empty log.
func New(opts Options) *Log {
	l := &Log{capacity: opts.Capacity, burst: opts.BurstWindow, now: opts.Now, nextID: 1}
	if l.capacity <= 0 {
		l.capacity = 256
	}
	if l.burst <= 0 {
		l.burst = time.Minute
	}
	if l.now == nil {
		l.now = time.Now
	}
	return l
}

// Capacity is how many entries the log keeps.
func (l *Log) Capacity() int { return l.capacity }

// OnRecord calls f with every new entry (not with a burst's later counts),
// after the log has it and outside its lock. f must not block for long.
func (l *Log) OnRecord(f func(Entry)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.listeners = append(l.listeners, f)
}

// OpCloseConsole is the entry of a console stream's end (the machine's
// OpenConsole is that of its start): no machine call, but the protocol that
// held the stream tells it through ConsoleClosed.
const OpCloseConsole machine.Operation = "CloseConsole"

// Intercept is a machine.Interceptor that records every write and every
// console opened with a context carrying an Actor (see WithActor), with its
// outcome. Reads, and calls of nobody's (the backend's own), are not
// recorded.
func (l *Log) Intercept(ctx context.Context, c machine.Call, call func(context.Context) error) error {
	err := call(ctx)
	actor, ok := ActorFrom(ctx)
	if !ok || !(c.IsWrite() || c.Op == machine.OpOpenConsole) {
		return err
	}
	e := Entry{Machine: c.Machine, Actor: actor, Kind: KindAction, Op: c.Op, Arg: c.Arg, Count: 1}
	if err != nil {
		e.Err = describe(err)
	}
	l.record(e)
	return err
}

// describe is an error in the contract's words: the backend's detail may
// name objects a BMC user has no business seeing.
func describe(err error) string {
	for _, sentinel := range []error{machine.ErrNotFound, machine.ErrNotSupported, machine.ErrInvalidArgument, machine.ErrConflict, machine.ErrUnavailable} {
		if errors.Is(err, sentinel) {
			return sentinel.Error()
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return "timed out"
	}
	return "internal error"
}

// ConsoleClosed records the end of a console stream that the Actor of ctx
// opened on machineID, for why ("" when its client ended it).
func (l *Log) ConsoleClosed(ctx context.Context, machineID string, k machine.ConsoleKind, why string) {
	actor, ok := ActorFrom(ctx)
	if !ok {
		return
	}
	arg := string(k)
	if why != "" {
		arg += " (" + why + ")"
	}
	l.record(Entry{Machine: machineID, Actor: actor, Kind: KindAction, Op: OpCloseConsole, Arg: arg, Count: 1})
}

// LoginFailed records a failed login: a new entry, or one more in the
// entry of the same source and protocol's burst.
func (l *Log) LoginFailed(a Actor) {
	// The name tried is the client's to choose, up to a header's size: a
	// guesser must not fill the BMC's memory through its log.
	if len(a.Account) > maxAccountLength {
		a.Account = strings.ToValidUTF8(a.Account[:maxAccountLength], "") + "…"
	}
	l.mu.Lock()
	now := l.now()
	for i := len(l.entries) - 1; i >= 0; i-- {
		e := &l.entries[i]
		if e.Kind == KindLoginFailure && e.Actor.Source == a.Source && e.Actor.Protocol == a.Protocol && now.Sub(e.Updated) < l.burst {
			e.Count++
			e.Updated = now
			if e.Actor.Account != a.Account {
				e.Actor.Account = "several accounts"
			}
			l.mu.Unlock()
			return
		}
	}
	l.mu.Unlock()
	l.record(Entry{Actor: a, Kind: KindLoginFailure, Count: 1})
}

func (l *Log) record(e Entry) {
	l.mu.Lock()
	e.ID = l.nextID
	l.nextID++
	e.Created = l.now()
	e.Updated = e.Created
	if len(l.entries) >= l.capacity {
		l.entries = slices.Delete(l.entries, 0, len(l.entries)-l.capacity+1)
	}
	l.entries = append(l.entries, e)
	listeners := slices.Clone(l.listeners)
	l.mu.Unlock()
	for _, f := range listeners {
		f(e)
	}
}

// Entries are the entries of machine and of the BMC itself, newest first.
func (l *Log) Entries(machineID string) []Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Entry
	for _, e := range slices.Backward(l.entries) {
		if e.Machine == machineID || e.Machine == "" {
			out = append(out, e)
		}
	}
	return out
}

// Entry is one entry of machine's (or of the BMC's), by ID.
func (l *Log) Entry(machineID string, id uint64) (Entry, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.entries {
		if e.ID == id && (e.Machine == machineID || e.Machine == "") {
			return e, true
		}
	}
	return Entry{}, false
}

// Clear drops the entries of machine and of the BMC itself, as Redfish's
// ClearLog and IPMI's Clear SEL do; IDs go on from where they were.
func (l *Log) Clear(machineID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = slices.DeleteFunc(l.entries, func(e Entry) bool { return e.Machine == machineID || e.Machine == "" })
}

// LastChange is when machine's entries last changed (a new entry, a
// burst's count, a clear is not one): for IPMI's SEL "last add" time.
func (l *Log) LastChange(machineID string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var last time.Time
	for _, e := range l.entries {
		if (e.Machine == machineID || e.Machine == "") && e.Updated.After(last) {
			last = e.Updated
		}
	}
	return last
}

// Eventful selects the entries worth an Event on the VM: power and boot
// actions, and consoles opened and closed.
func Eventful(e Entry) bool {
	if e.Kind != KindAction {
		return false
	}
	switch e.Op {
	case machine.OpReset, machine.OpSetBootOverride, machine.OpOpenConsole, OpCloseConsole:
		return true
	}
	return false
}

// Forward hands each new entry that want selects to send, in order, from a
// goroutine of its own until ctx ends, so a slow API server never holds a
// protocol's request. At most queue entries wait; past that, entries are
// dropped from the forwarding (the log keeps them) and onError is told, as
// it is of every failed send.
func (l *Log) Forward(ctx context.Context, queue int, want func(Entry) bool, send func(context.Context, Entry) error, onError func(Entry, error)) {
	f := &forwarder{max: queue, send: send, onError: onError}
	l.OnRecord(func(e Entry) {
		if !want(e) || ctx.Err() != nil {
			return
		}
		f.enqueue(ctx, e)
	})
}

// forwarder is Forward's queue. Its goroutine runs only while entries
// wait: a shared bmc-server has a log per VM, and an idle goroutine per log
// would cost a stack each.
type forwarder struct {
	max     int
	send    func(context.Context, Entry) error
	onError func(Entry, error)

	mu      sync.Mutex
	waiting []Entry
	sending bool // drain runs
}

func (f *forwarder) enqueue(ctx context.Context, e Entry) {
	f.mu.Lock()
	if len(f.waiting) >= f.max {
		f.mu.Unlock()
		f.onError(e, ErrForwardQueueFull)
		return
	}
	f.waiting = append(f.waiting, e)
	start := !f.sending
	f.sending = true
	f.mu.Unlock()
	if start {
		go f.drain(ctx)
	}
}

// drain sends the waiting entries in order and returns when none is left
// or ctx ends.
func (f *forwarder) drain(ctx context.Context) {
	for {
		f.mu.Lock()
		if len(f.waiting) == 0 || ctx.Err() != nil {
			f.waiting, f.sending = nil, false
			f.mu.Unlock()
			return
		}
		e := f.waiting[0]
		f.waiting = f.waiting[1:]
		f.mu.Unlock()
		if err := f.send(ctx, e); err != nil {
			f.onError(e, err)
		}
	}
}

// ErrForwardQueueFull is Forward's error for an entry dropped because the
// sender fell behind.
var ErrForwardQueueFull = errors.New("forwarding queue full")

// forwardQueue bounds the actions waiting for their Event.
const forwardQueue = 64

// ForwardActions copies each Eventful entry to recorder (for
// KubeVirt, an Event on the VM), as Forward does.
func (l *Log) ForwardActions(ctx context.Context, recorder machine.ActionRecorder, onError func(Entry, error)) {
	l.Forward(ctx, forwardQueue, Eventful, func(ctx context.Context, e Entry) error {
		return recorder.RecordAction(ctx, e.Machine, string(e.Op), e.Err != "", e.Message())
	}, onError)
}
