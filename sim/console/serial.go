// Package console simulates a guest's consoles, which cannot run here (no
// QEMU, no guest OS): a serial console that prints boot lines and a login
// prompt and echoes what is typed, as a terminal in canonical mode does,
// and a screen that speaks the server side of RFB (VNC) with a framebuffer
// of one colour. The memory backend serves them as its machines' consoles,
// and realkubevirt's node stand-in answers virt-handler's console and VNC
// streams with them. Nothing else is modelled: no login, no shell, no
// drawing, no RFB encodings but Raw.
package console

import (
	"io"
	"sync"
)

// MaxPending is how much output a serial console holds for a reader that
// does not read: past it, typing blocks, as a real UART's flow control
// holds the sender back. It bounds the simulator's memory whatever its
// peer does.
const MaxPending = 64 << 10

// Serial is one connection to a guest's serial console. It is safe for one
// reader and one writer at a time.
type Serial struct {
	hostname string

	mu      sync.Mutex
	cond    *sync.Cond
	pending []byte // output not read yet
	closed  bool
}

// BootLines is what the guest prints on its serial console when it boots,
// before its login prompt.
func BootLines(hostname string) []string {
	return []string{
		"virtmetal simulated firmware",
		"Booting from the first boot device...",
		"[    0.000000] Linux version 6.1.0-simulated (virtmetal sim/console)",
		"[    0.104211] console [ttyS0] enabled",
		"[    2.318442] systemd[1]: Reached target Multi-User System.",
		"",
		"Debian GNU/Linux 12 " + hostname + " ttyS0",
		"",
	}
}

// Prompt is the guest's login prompt.
func Prompt(hostname string) string { return hostname + " login: " }

// NewSerial connects to the serial console of a guest named hostname,
// which has just booted: its boot lines and login prompt are the first
// thing read.
func NewSerial(hostname string) *Serial {
	s := &Serial{hostname: hostname}
	s.cond = sync.NewCond(&s.mu)
	for _, l := range BootLines(hostname) {
		s.pending = append(s.pending, l+"\r\n"...)
	}
	s.pending = append(s.pending, Prompt(hostname)...)
	return s
}

// Read returns the guest's output, waiting for some; io.EOF once closed
// and drained.
func (s *Serial) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.pending) == 0 && !s.closed {
		s.cond.Wait()
	}
	if len(s.pending) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	s.cond.Broadcast()
	return n, nil
}

// Write types p: each byte is echoed, a carriage return or line feed ends
// the line with CR LF and a new prompt. It blocks while MaxPending bytes
// wait to be read, and fails with io.ErrClosedPipe once closed.
func (s *Serial) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// The reader is woken once a write, or when the writer must wait for
	// it, not once a byte.
	defer s.cond.Broadcast()
	for i, b := range p {
		for len(s.pending) >= MaxPending && !s.closed {
			s.cond.Broadcast()
			s.cond.Wait()
		}
		if s.closed {
			return i, io.ErrClosedPipe
		}
		switch b {
		case '\r', '\n':
			s.pending = append(s.pending, "\r\n"+Prompt(s.hostname)...)
		default:
			s.pending = append(s.pending, b)
		}
	}
	return len(p), nil
}

// Close ends the connection: the guest stopped, or the peer hung up.
func (s *Serial) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.cond.Broadcast()
	return nil
}
