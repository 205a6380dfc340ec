package memory

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/virtmetal/virtmetal/machine"
)

func TestConsolesEndWithTheBoot(t *testing.T) {
	ctx := context.Background()
	for _, kind := range machine.AllConsoleKinds {
		t.Run(string(kind), func(t *testing.T) {
			m := New(Options{}).Get("vm-0")
			if _, err := m.OpenConsole(ctx, kind); !errors.Is(err, machine.ErrConflict) {
				t.Fatalf("console of a machine that is off: %v, want ErrConflict", err)
			}
			if err := m.Reset(ctx, machine.ResetOn); err != nil {
				t.Fatal(err)
			}
			stream, err := m.OpenConsole(ctx, kind)
			if err != nil {
				t.Fatal(err)
			}
			greeting := make([]byte, 8)
			if _, err := io.ReadFull(stream, greeting); err != nil {
				t.Fatal(err)
			}
			if err := m.Reset(ctx, machine.ResetForceRestart); err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(io.Discard, stream); err != nil {
				t.Errorf("after the restart the stream ended with %v, want EOF", err)
			}
			stream.Close()
			m.mu.Lock()
			open := len(m.consoles)
			m.mu.Unlock()
			if open != 0 {
				t.Errorf("%d console streams still tracked", open)
			}
		})
	}
	m := New(Options{}).Get("vm-0")
	if _, err := m.OpenConsole(ctx, "Teletype"); !errors.Is(err, machine.ErrInvalidArgument) {
		t.Errorf("unknown console: %v, want ErrInvalidArgument", err)
	}
}
