package machine_test

import (
	"context"
	"errors"
	"testing"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
)

func TestConsoleSessionsAdmitOneStreamPerConsole(t *testing.T) {
	ctx := context.Background()
	b := memory.New(memory.Options{Machines: 2})
	for _, id := range []string{"vm-0", "vm-1"} {
		if err := b.Get(id).Reset(ctx, machine.ResetOn); err != nil {
			t.Fatal(err)
		}
	}
	var sessions machine.ConsoleSessions
	first, err := sessions.Open(ctx, b.Get("vm-0"), machine.ConsoleSerial)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sessions.Open(ctx, b.Get("vm-0"), machine.ConsoleSerial); !errors.Is(err, machine.ErrConsoleInUse) || !errors.Is(err, machine.ErrConflict) {
		t.Errorf("second serial stream: %v, want ErrConsoleInUse, a conflict", err)
	}
	for name, open := range map[string]func() error{
		"another machine's serial console": func() error { _, err := sessions.Open(ctx, b.Get("vm-1"), machine.ConsoleSerial); return err },
		"the same machine's screen":        func() error { _, err := sessions.Open(ctx, b.Get("vm-0"), machine.ConsoleGraphical); return err },
	} {
		if err := open(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	first.Close()
	first.Close()
	if sessions.InUse("vm-0", machine.ConsoleSerial) {
		t.Error("still in use after its stream closed")
	}
	if err := b.Get("vm-0").Reset(ctx, machine.ResetForceOff); err != nil {
		t.Fatal(err)
	}
	if _, err := sessions.Open(ctx, b.Get("vm-0"), machine.ConsoleSerial); !errors.Is(err, machine.ErrConflict) || errors.Is(err, machine.ErrConsoleInUse) {
		t.Errorf("console of a stopped machine: %v, want a conflict that is not ErrConsoleInUse", err)
	}
	if sessions.InUse("vm-0", machine.ConsoleSerial) {
		t.Error("a failed open holds the console")
	}
}
