package machinetest

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/sim/console"
)

// consolePatience bounds each wait on a console stream.
const consolePatience = 30 * time.Second

// testConsoles: a machine's guest is sim/console's (as both backends' test
// guests are), named after the machine. An off machine has no console; a
// running one prints its boot lines and echoes what is typed, and its
// screen speaks RFB; stopping the machine ends both streams, and the next
// boot has a console again.
func testConsoles(t *testing.T, s Subject) {
	ctx := t.Context()
	id := s.Machine.ID()
	caps := s.Machine.Capabilities()
	if !caps.SupportsConsole(machine.ConsoleSerial) || !caps.SupportsConsole(machine.ConsoleGraphical) {
		t.Fatalf("a fresh machine offers the consoles %v, want Serial and Graphical", caps.Consoles)
	}
	if _, err := s.Machine.OpenConsole(ctx, "Teletype"); !errors.Is(err, machine.ErrInvalidArgument) {
		t.Errorf("OpenConsole(Teletype) = %v, want ErrInvalidArgument", err)
	}
	waitPower(t, s, machine.PowerOff)
	for _, k := range machine.AllConsoleKinds {
		if stream, err := s.Machine.OpenConsole(ctx, k); !errors.Is(err, machine.ErrConflict) {
			if stream != nil {
				stream.Close()
			}
			t.Errorf("OpenConsole(%s) of an off machine = %v, want ErrConflict", k, err)
		}
	}

	mustReset(t, s, machine.ResetOn)
	waitPower(t, s, machine.PowerOn)
	serial := openConsole(t, s, machine.ConsoleSerial)
	out := ReadConsole(serial)
	booted := out.Until(t, console.Prompt(id))
	for _, line := range console.BootLines(id) {
		if !strings.Contains(booted, line) {
			t.Errorf("the serial console printed %q, without the boot line %q", booted, line)
		}
	}
	if _, err := io.WriteString(serial, "hello\r"); err != nil {
		t.Fatalf("typing: %v", err)
	}
	out.Until(t, "hello\r\n"+console.Prompt(id))

	screen := openConsole(t, s, machine.ConsoleGraphical)
	got := make(chan error, 1)
	var rfb console.Screen
	go func() {
		var err error
		rfb, err = console.Handshake(screen)
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("RFB handshake: %v", err)
		}
	case <-time.After(consolePatience):
		screen.Close()
		t.Fatal("no RFB handshake")
	}
	if rfb.Name != id || rfb.Width == 0 || rfb.Height == 0 {
		t.Errorf("the screen is %+v, want one named %q", rfb, id)
	}

	// The machine stops: both streams end.
	mustReset(t, s, machine.ResetForceOff)
	out.End(t, "the console")
	ReadConsole(screen).End(t, "the console")
	serial.Close()
	screen.Close()
	waitPower(t, s, machine.PowerOff)
	if stream, err := s.Machine.OpenConsole(ctx, machine.ConsoleSerial); !errors.Is(err, machine.ErrConflict) {
		if stream != nil {
			stream.Close()
		}
		t.Errorf("OpenConsole(Serial) once off = %v, want ErrConflict", err)
	}

	// A new boot, a new console.
	mustReset(t, s, machine.ResetOn)
	waitPower(t, s, machine.PowerOn)
	again := openConsole(t, s, machine.ConsoleSerial)
	ReadConsole(again).Until(t, console.Prompt(id))
	if err := again.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

func openConsole(t *testing.T, s Subject, k machine.ConsoleKind) io.ReadWriteCloser {
	t.Helper()
	stream, err := s.Machine.OpenConsole(t.Context(), k)
	if err != nil {
		t.Fatalf("OpenConsole(%s): %v", k, err)
	}
	t.Cleanup(func() { stream.Close() })
	return stream
}

// ConsoleOutput reads a stream on a goroutine of its own, so a test can
// wait for it with patience: Chunks are what was read, Err how the stream
// ended.
type ConsoleOutput struct {
	Chunks chan []byte
	Err    chan error
	seen   bytes.Buffer
}

// ReadConsole starts reading r.
func ReadConsole(r io.Reader) *ConsoleOutput {
	o := &ConsoleOutput{Chunks: make(chan []byte), Err: make(chan error, 1)}
	go func() {
		buf := make([]byte, 16<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				o.Chunks <- bytes.Clone(buf[:n])
			}
			if err != nil {
				o.Err <- err
				return
			}
		}
	}()
	return o
}

// Until waits for want in the output and returns everything up to it.
func (o *ConsoleOutput) Until(tb testing.TB, want string) string {
	tb.Helper()
	deadline := time.After(consolePatience)
	for {
		if i := strings.Index(o.seen.String(), want); i >= 0 {
			got := o.seen.String()[:i+len(want)]
			o.seen.Next(i + len(want))
			return got
		}
		select {
		case chunk := <-o.Chunks:
			o.seen.Write(chunk)
		case err := <-o.Err:
			tb.Fatalf("the console ended (%v) before %q; it printed %q", err, want, o.seen.String())
		case <-deadline:
			tb.Fatalf("no %q on the console in %v; it printed %q", want, consolePatience, o.seen.String())
		}
	}
}

// Take waits for n more bytes of output, whatever they are.
func (o *ConsoleOutput) Take(tb testing.TB, n int) {
	for got := 0; got < n; {
		select {
		case c := <-o.Chunks:
			got += len(c)
		case err := <-o.Err:
			tb.Fatalf("the console ended: %v", err)
		}
	}
}

// End waits for the stream to end with io.EOF; what names it.
func (o *ConsoleOutput) End(tb testing.TB, what string) {
	tb.Helper()
	deadline := time.After(consolePatience)
	for {
		select {
		case <-o.Chunks:
		case err := <-o.Err:
			if !errors.Is(err, io.EOF) {
				tb.Errorf("%s: the stream ended with %v, want io.EOF", what, err)
			}
			return
		case <-deadline:
			tb.Fatalf("%s: the stream did not end in %v", what, consolePatience)
		}
	}
}

// AtPrompt powers m on, opens its serial console and reads it up to the
// login prompt of the guest named hostname, for a benchmark to type into.
// Unlike ReadConsole it reads on the caller's goroutine, so the caller then
// has the stream to itself; the stream is closed when tb ends.
func AtPrompt(tb testing.TB, m machine.Machine, hostname string) io.ReadWriteCloser {
	tb.Helper()
	if err := m.Reset(tb.Context(), machine.ResetOn); err != nil {
		tb.Fatalf("Reset On: %v", err)
	}
	stream, err := m.OpenConsole(tb.Context(), machine.ConsoleSerial)
	if err != nil {
		tb.Fatalf("OpenConsole: %v", err)
	}
	tb.Cleanup(func() { stream.Close() })
	ReadPast(tb, stream, console.Prompt(hostname))
	return stream
}

// ReadPast reads r up to and including want, a byte at a time on the
// caller's goroutine, so that nothing after want is consumed.
func ReadPast(tb testing.TB, r io.Reader, want string) {
	tb.Helper()
	var got []byte
	one := make([]byte, 1)
	for !bytes.HasSuffix(got, []byte(want)) {
		if _, err := io.ReadFull(r, one); err != nil {
			tb.Fatalf("read %q, waiting for %q: %v", got, want, err)
		}
		got = append(got, one[0])
	}
}

// BenchEcho times, an op each, typing size bytes into stream and reading
// their echo, once the guest named hostname has shown its login prompt:
// a keystroke's latency at size 1, a paste's throughput at larger sizes.
func BenchEcho(b *testing.B, stream io.ReadWriter, hostname string, size int) {
	b.Helper()
	out := ReadConsole(stream)
	out.Until(b, console.Prompt(hostname))
	line := bytes.Repeat([]byte{'x'}, size)
	b.SetBytes(int64(size))
	b.ResetTimer()
	for b.Loop() {
		if _, err := stream.Write(line); err != nil {
			b.Fatal(err)
		}
		out.Take(b, size)
	}
}
