package machine

import (
	"context"
	"io"
	"slices"
)

// ConsoleKind names one of a machine's consoles.
type ConsoleKind string

const (
	// ConsoleSerial is the machine's first serial port: the bytes the guest
	// writes to it, and the keys typed into it.
	ConsoleSerial ConsoleKind = "Serial"
	// ConsoleGraphical is the machine's screen, keyboard and mouse as an
	// RFB (VNC) stream, the machine's side of it speaking first.
	ConsoleGraphical ConsoleKind = "Graphical"
)

// AllConsoleKinds lists every ConsoleKind in a stable order.
var AllConsoleKinds = []ConsoleKind{ConsoleSerial, ConsoleGraphical}

// SupportsConsole reports whether k is among c.Consoles.
func (c Capabilities) SupportsConsole(k ConsoleKind) bool { return slices.Contains(c.Consoles, k) }

// CheckConsole validates k against the known kinds and against c.
func (c Capabilities) CheckConsole(k ConsoleKind) error {
	if !slices.Contains(AllConsoleKinds, k) {
		return Errorf(ErrInvalidArgument, "unknown console %q", k)
	}
	if !c.SupportsConsole(k) {
		return Errorf(ErrNotSupported, "console %q", k)
	}
	return nil
}

// ConsoleController connects to the machine's consoles.
type ConsoleController interface {
	// OpenConsole connects to the console of kind k of the running
	// machine. ctx bounds the connecting only; the stream lives until it
	// is closed or the machine's side ends it. Read returns the machine's
	// output and io.EOF once the machine stops (or restarts: a new boot
	// is a new console); Write sends input. A stream applies back-pressure
	// rather than buffering without bound: a reader that stops reading
	// holds the machine's output back. A machine that is not running
	// returns ErrConflict, a kind outside Capabilities ErrNotSupported, an
	// unknown kind ErrInvalidArgument, a source that cannot be reached
	// ErrUnavailable. How many streams may be open at once is the
	// protocol's to decide, not the backend's: a backend may end an older
	// stream of the same kind when a new one opens (KubeVirt does).
	OpenConsole(ctx context.Context, k ConsoleKind) (io.ReadWriteCloser, error)
}
