// Package termtest runs interactive command-line clients under a
// pseudo-terminal for tests, the way a person at a terminal runs them:
// ipmitool's and freeipmi's Serial-over-LAN clients refuse to work, or
// leave the terminal in a state nobody can type into, without one.
// script (util-linux) makes the terminal; the test types into it and reads
// what the client prints.
package termtest

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// Wait is how long WaitFor and Exited wait.
const Wait = 20 * time.Second

// RequireTool is the path of the program name; without it the test fails
// under CI=true (hack/test.sh installs it) and is skipped elsewhere. hint
// says how to install it.
func RequireTool(t testing.TB, name, hint string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	msg := fmt.Sprintf("%s not found (%s): %v", name, hint, err)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// Terminal is a client running under a pseudo-terminal.
type Terminal struct {
	t     testing.TB
	cmd   *exec.Cmd
	stdin io.WriteCloser
	mu    sync.Mutex
	out   bytes.Buffer
	done  chan struct{}
	err   error
}

// Write collects what the client prints.
func (tm *Terminal) Write(p []byte) (int, error) {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.out.Write(p)
}

// Start runs path with args under a pseudo-terminal; the test's cleanup
// ends it.
func Start(t testing.TB, path string, args ...string) *Terminal {
	t.Helper()
	script := RequireTool(t, "script", "apt-get install bsdutils")
	line := path
	for _, a := range args {
		line += " '" + a + "'"
	}
	tm := &Terminal{t: t, done: make(chan struct{})}
	tm.cmd = exec.Command(script, "-qfec", line, "/dev/null")
	tm.cmd.Stdout, tm.cmd.Stderr = tm, tm
	var err error
	if tm.stdin, err = tm.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := tm.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		tm.err = tm.cmd.Wait()
		close(tm.done)
	}()
	t.Cleanup(func() {
		tm.stdin.Close()
		select {
		case <-tm.done:
		case <-time.After(5 * time.Second):
			_ = tm.cmd.Process.Kill()
			<-tm.done
		}
	})
	return tm
}

// Output is everything the client printed so far.
func (tm *Terminal) Output() string {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.out.String()
}

// WaitFor waits until the output holds want after offset from, and returns
// the offset just past it.
func (tm *Terminal) WaitFor(from int, want string) int {
	tm.t.Helper()
	deadline := time.Now().Add(Wait)
	for {
		// Whether the client has ended is read before its output, so that
		// what it printed last is looked at before giving up on it.
		ended := false
		select {
		case <-tm.done:
			ended = true
		default:
		}
		out := tm.Output()
		if i := strings.Index(out[min(from, len(out)):], want); i >= 0 {
			return min(from, len(out)) + i + len(want)
		}
		switch {
		case ended:
			tm.t.Fatalf("the client ended (%v) without printing %q:\n%s", tm.err, want, out)
		case time.Now().After(deadline):
			tm.t.Fatalf("no %q in the output after %d:\n%s", want, from, out)
		}
		select {
		case <-tm.done:
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Type sends keys as typed.
func (tm *Terminal) Type(keys string) {
	tm.t.Helper()
	if _, err := io.WriteString(tm.stdin, keys); err != nil {
		tm.t.Fatalf("typing %q: %v", keys, err)
	}
}

// Exited waits for the client to end and returns its error.
func (tm *Terminal) Exited() error {
	tm.t.Helper()
	select {
	case <-tm.done:
		return tm.err
	case <-time.After(Wait):
		tm.t.Fatalf("the client did not end:\n%s", tm.Output())
		return nil
	}
}
