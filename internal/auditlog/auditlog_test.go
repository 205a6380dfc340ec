package auditlog_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/machine"
)

type clock struct{ now time.Time }

func (c *clock) Now() time.Time          { return c.now }
func (c *clock) advance(d time.Duration) { c.now = c.now.Add(d) }

func newLog(capacity int) (*auditlog.Log, *clock) {
	c := &clock{now: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	return auditlog.New(auditlog.Options{Capacity: capacity, BurstWindow: time.Minute, Now: c.Now}), c
}

var admin = auditlog.Actor{Protocol: auditlog.Redfish, Account: "admin", Source: "10.0.0.5"}

func write(l *auditlog.Log, ctx context.Context, c machine.Call, err error) error {
	return l.Intercept(ctx, c, func(context.Context) error { return err })
}

// TestInterceptRecordsWritesOfActors: writes made for an actor are logged
// with their outcome in the contract's words; reads and the backend's own
// calls are not.
func TestInterceptRecordsWritesOfActors(t *testing.T) {
	secret := errors.New("virtualmachines.kubevirt.io \"vm\" is forbidden: User system:serviceaccount:ns:bmc")
	tests := []struct {
		name    string
		actor   bool
		call    machine.Call
		err     error
		want    string // the message; "" for no entry
		wantSev auditlog.Severity
	}{
		{"reset", true, machine.Call{Machine: "vm-0", Op: machine.OpReset, Arg: "ForceOff"}, nil,
			"Reset ForceOff by admin from 10.0.0.5 via Redfish: done", auditlog.SeverityOK},
		{"boot override", true, machine.Call{Machine: "vm-0", Op: machine.OpSetBootOverride, Arg: "Pxe Once UEFI"}, nil,
			"SetBootOverride Pxe Once UEFI by admin from 10.0.0.5 via Redfish: done", auditlog.SeverityOK},
		{"eject", true, machine.Call{Machine: "vm-0", Op: machine.OpEjectMedia}, nil,
			"EjectMedia by admin from 10.0.0.5 via Redfish: done", auditlog.SeverityOK},
		{"refused insert", true, machine.Call{Machine: "vm-0", Op: machine.OpInsertMedia, Arg: "http://x/y.iso"}, fmt.Errorf("drive full: %w", machine.ErrConflict),
			"InsertMedia http://x/y.iso by admin from 10.0.0.5 via Redfish: failed: conflicts with machine state", auditlog.SeverityWarning},
		{"backend detail stays out", true, machine.Call{Machine: "vm-0", Op: machine.OpReset, Arg: "On"}, secret,
			"Reset On by admin from 10.0.0.5 via Redfish: failed: internal error", auditlog.SeverityWarning},
		{"a read", true, machine.Call{Machine: "vm-0", Op: machine.OpPowerState}, nil, "", ""},
		{"nobody's write", false, machine.Call{Machine: "vm-0", Op: machine.OpReset, Arg: "On"}, nil, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, _ := newLog(10)
			ctx := context.Background()
			if tt.actor {
				ctx = auditlog.WithActor(ctx, admin)
			}
			if err := write(l, ctx, tt.call, tt.err); !errors.Is(err, tt.err) {
				t.Fatalf("the call's error was not passed on: %v", err)
			}
			entries := l.Entries("vm-0")
			if tt.want == "" {
				if len(entries) != 0 {
					t.Fatalf("entries %+v, want none", entries)
				}
				return
			}
			if len(entries) != 1 || entries[0].Message() != tt.want || entries[0].Severity() != tt.wantSev {
				t.Fatalf("entries %+v (%q), want one: %q, %s", entries, entries[0].Message(), tt.want, tt.wantSev)
			}
		})
	}
}

// TestLoginFailureBursts: failures of one source and protocol within the
// window count in one entry; another source, another protocol or a pause
// start a new one.
func TestLoginFailureBursts(t *testing.T) {
	l, c := newLog(10)
	var recorded []string
	l.OnRecord(func(e auditlog.Entry) { recorded = append(recorded, e.Message()) })
	guess := auditlog.Actor{Protocol: auditlog.Redfish, Account: "root", Source: "192.0.2.9"}
	for range 3 {
		l.LoginFailed(guess)
		c.advance(30 * time.Second)
	}
	other := guess
	other.Account = "admin"
	l.LoginFailed(other)
	viaIPMI := guess
	viaIPMI.Protocol = auditlog.IPMI
	l.LoginFailed(viaIPMI)
	c.advance(2 * time.Minute)
	l.LoginFailed(guess)

	var got []string
	for _, e := range l.Entries("vm-0") {
		got = append(got, e.Message())
	}
	want := []string{
		"1 failed login as root from 192.0.2.9 via Redfish",
		"1 failed login as root from 192.0.2.9 via IPMI",
		"4 failed logins as several accounts from 192.0.2.9 via Redfish",
	}
	if !slices.Equal(got, want) {
		t.Errorf("entries\n%q\nwant\n%q", got, want)
	}
	if len(recorded) != 3 {
		t.Errorf("OnRecord saw %q, want each new entry once", recorded)
	}
}

// TestBoundedPerMachineAndClear: the log keeps its capacity, newest first,
// a machine sees its own entries and the BMC's, and a clear keeps IDs
// growing.
func TestBoundedPerMachineAndClear(t *testing.T) {
	l, _ := newLog(3)
	ctx := auditlog.WithActor(context.Background(), admin)
	for i, id := range []string{"vm-0", "vm-1", "vm-0", "vm-0"} {
		_ = write(l, ctx, machine.Call{Machine: id, Op: machine.OpReset, Arg: fmt.Sprint(i)}, nil)
	}
	l.LoginFailed(admin) // the BMC's own: every machine shows it
	ids := func(machineID string) []uint64 {
		var out []uint64
		for _, e := range l.Entries(machineID) {
			out = append(out, e.ID)
		}
		return out
	}
	if got := ids("vm-0"); !slices.Equal(got, []uint64{5, 4, 3}) {
		t.Errorf("vm-0 ids %v, want [5 4 3] (capacity 3, newest first)", got)
	}
	if got := ids("vm-1"); !slices.Equal(got, []uint64{5}) {
		t.Errorf("vm-1 ids %v, want [5] (its entry was the oldest and went)", got)
	}
	if e, ok := l.Entry("vm-0", 4); !ok || e.Arg != "3" {
		t.Errorf("Entry(vm-0, 4) = %+v, %v", e, ok)
	}
	if _, ok := l.Entry("vm-1", 4); ok {
		t.Error("vm-1 reads vm-0's entry")
	}
	l.Clear("vm-0")
	if got := ids("vm-0"); len(got) != 0 {
		t.Errorf("after Clear: %v", got)
	}
	_ = write(l, ctx, machine.Call{Machine: "vm-0", Op: machine.OpEjectMedia}, nil)
	if got := ids("vm-0"); !slices.Equal(got, []uint64{6}) {
		t.Errorf("after Clear, a new entry has id %v, want 6", got)
	}
	if l.LastChange("vm-0").IsZero() {
		t.Error("LastChange is zero with an entry")
	}
}

// TestForward: the power and boot actions reach the sender in order, from
// its own goroutine; a full queue and a failed send are reported, never
// block the caller, and cost the log nothing.
func TestForward(t *testing.T) {
	l, _ := newLog(10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	release := make(chan struct{})
	taken := make(chan struct{}, 10)
	sent := make(chan auditlog.Entry, 10)
	failures := make(chan error, 10)
	l.Forward(ctx, 1, auditlog.Eventful, func(_ context.Context, e auditlog.Entry) error {
		taken <- struct{}{}
		<-release // a slow API server
		sent <- e
		if e.Arg == "bad" {
			return errors.New("forbidden")
		}
		return nil
	}, func(_ auditlog.Entry, err error) { failures <- err })

	actions := auditlog.WithActor(context.Background(), admin)
	_ = write(l, actions, machine.Call{Machine: "vm-0", Op: machine.OpReset, Arg: "On"}, nil)             // taken by the sender, which waits
	_ = write(l, actions, machine.Call{Machine: "vm-0", Op: machine.OpInsertMedia, Arg: "http://x"}, nil) // not selected
	l.LoginFailed(admin)                                                                                  // not selected
	select {
	case <-taken: // the first entry has left the queue for the sender
	case <-time.After(5 * time.Second):
		t.Fatal("the sender never took the first entry")
	}
	// The second fills the queue, the third does not fit.
	_ = write(l, actions, machine.Call{Machine: "vm-0", Op: machine.OpSetBootOverride, Arg: "bad"}, nil)
	_ = write(l, actions, machine.Call{Machine: "vm-0", Op: machine.OpSetBootOverride, Arg: "dropped"}, nil)
	select {
	case err := <-failures:
		if !errors.Is(err, auditlog.ErrForwardQueueFull) {
			t.Fatalf("failure %v, want a full queue", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the full queue was not reported")
	}
	close(release)
	first := <-sent
	second := <-sent
	if first.Op != machine.OpReset || second.Op != machine.OpSetBootOverride {
		t.Errorf("sent %s then %s, want Reset then SetBootOverride", first.Op, second.Op)
	}
	if err := <-failures; err == nil || err.Error() != "forbidden" {
		t.Errorf("the failed send was reported as %v", err)
	}
	if n := len(l.Entries("vm-0")); n != 5 {
		t.Errorf("the log kept %d entries; dropping from the forwarding must not drop from the log", n)
	}
}

// TestLoginFailureNameIsBounded: the name a guesser tries is cut, so a
// megabyte of Basic credentials costs the log 64 bytes.
func TestLoginFailureNameIsBounded(t *testing.T) {
	l, _ := newLog(10)
	l.LoginFailed(auditlog.Actor{Protocol: auditlog.Redfish, Account: strings.Repeat("x", 1<<20), Source: "192.0.2.9"})
	e := l.Entries("vm-0")[0]
	if len(e.Actor.Account) > 70 || !strings.HasPrefix(e.Actor.Account, "xxxx") {
		t.Errorf("account kept as %d bytes", len(e.Actor.Account))
	}
}

// TestConsoleSessions: opening and closing a console are entries (who,
// from where, which console) and both are worth an Event; a console read
// by nobody's context is not recorded.
func TestConsoleSessions(t *testing.T) {
	l, _ := newLog(10)
	ctx := auditlog.WithActor(context.Background(), admin)
	_ = write(l, ctx, machine.Call{Machine: "vm-0", Op: machine.OpOpenConsole, Arg: string(machine.ConsoleSerial)}, nil)
	l.ConsoleClosed(ctx, "vm-0", machine.ConsoleSerial, "the machine stopped")
	l.ConsoleClosed(context.Background(), "vm-0", machine.ConsoleSerial, "")
	entries := l.Entries("vm-0")
	if len(entries) != 2 {
		t.Fatalf("%d entries, want the open and the close: %+v", len(entries), entries)
	}
	closed, opened := entries[0], entries[1]
	if opened.Message() != "OpenConsole Serial by "+admin.Account+" from "+admin.Source+" via "+admin.Protocol+": done" {
		t.Errorf("open: %q", opened.Message())
	}
	if closed.Op != auditlog.OpCloseConsole || closed.Arg != "Serial (the machine stopped)" || closed.Severity() != auditlog.SeverityOK || closed.Actor != admin {
		t.Errorf("close: %+v", closed)
	}
	for _, e := range entries {
		if !auditlog.Eventful(e) {
			t.Errorf("%s is not forwarded as an Event", e.Message())
		}
	}
}
