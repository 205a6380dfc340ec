package machine

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
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

// ErrConsoleInUse is a console that another client holds. It is a
// conflict, and one that the protocols tell apart from a machine that is
// not running (IPMI's "payload already active").
var ErrConsoleInUse = fmt.Errorf("console in use: %w", ErrConflict)

// ConsoleSessions admits one stream per machine and console kind at a
// time, across every protocol that shares it: a server's console is one
// line, and KubeVirt's ends the older stream when a newer one opens, so a
// second client would silently take the first one's console. The zero
// value is ready; a process shares one between its protocols.
type ConsoleSessions struct {
	mu   sync.Mutex
	open map[consoleKey]bool
}

type consoleKey struct {
	machine string
	kind    ConsoleKind
}

// Open opens m's console of kind k unless a stream of it is open already
// (ErrConsoleInUse); the console is free again once the returned stream
// is closed.
func (s *ConsoleSessions) Open(ctx context.Context, m Machine, k ConsoleKind) (io.ReadWriteCloser, error) {
	key := consoleKey{m.ID(), k}
	s.mu.Lock()
	if s.open[key] {
		s.mu.Unlock()
		return nil, Errorf(ErrConsoleInUse, "%s console of %s", k, key.machine)
	}
	if s.open == nil {
		s.open = map[consoleKey]bool{}
	}
	s.open[key] = true
	s.mu.Unlock()
	stream, err := m.OpenConsole(ctx, k)
	if err != nil {
		s.release(key)
		return nil, err
	}
	return OnClose(stream, func() { s.release(key) }), nil
}

// InUse reports whether a stream of m's console of kind k is open.
func (s *ConsoleSessions) InUse(machineID string, k ConsoleKind) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open[consoleKey{machineID, k}]
}

func (s *ConsoleSessions) release(key consoleKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.open, key)
}

// OnClose is stream calling f, once, after its first Close.
func OnClose(stream io.ReadWriteCloser, f func()) io.ReadWriteCloser {
	return &closeHook{ReadWriteCloser: stream, f: f}
}

type closeHook struct {
	io.ReadWriteCloser
	f    func()
	once sync.Once
}

func (h *closeHook) Close() error {
	err := h.ReadWriteCloser.Close()
	h.once.Do(h.f)
	return err
}
