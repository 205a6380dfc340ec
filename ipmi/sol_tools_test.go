package ipmi

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/sim/console"
)

// The SOL clients want a terminal: script (util-linux) runs them under a
// pseudo-terminal, forwarding the test's writes as keystrokes and the
// client's output back.

// terminal is a client running under script.
type terminal struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	mu    sync.Mutex
	out   bytes.Buffer
	done  chan struct{}
	err   error
}

func (tm *terminal) Write(p []byte) (int, error) {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.out.Write(p)
}

// startTerminal runs path with args under a pseudo-terminal.
func startTerminal(t *testing.T, path string, args ...string) *terminal {
	t.Helper()
	script := requireTool(t, "script")
	line := path
	for _, a := range args {
		line += " '" + a + "'"
	}
	tm := &terminal{t: t, done: make(chan struct{})}
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

func (tm *terminal) output() string {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.out.String()
}

// waitFor waits until the output holds want, counted from offset from.
func (tm *terminal) waitFor(from int, want string) int {
	tm.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out := tm.output()
		if i := strings.Index(out[min(from, len(out)):], want); i >= 0 {
			return min(from, len(out)) + i + len(want)
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("no %q in the output after %d:\n%s", want, from, out)
		}
		select {
		case <-tm.done:
			tm.t.Fatalf("the client ended (%v) without printing %q:\n%s", tm.err, want, out)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (tm *terminal) typeKeys(keys string) {
	tm.t.Helper()
	if _, err := io.WriteString(tm.stdin, keys); err != nil {
		tm.t.Fatalf("typing %q: %v", keys, err)
	}
}

// exited waits for the client to end and returns its error.
func (tm *terminal) exited() error {
	tm.t.Helper()
	select {
	case <-tm.done:
		return tm.err
	case <-time.After(20 * time.Second):
		tm.t.Fatalf("the client did not end:\n%s", tm.output())
		return nil
	}
}

// solServer serves a running in-memory machine with a shared audit log and
// console table.
func solServer(t *testing.T) (host, port string, m *memory.Machine, log *auditlog.Log, consoles *machine.ConsoleSessions) {
	t.Helper()
	log = auditlog.New(auditlog.Options{})
	consoles = &machine.ConsoleSessions{}
	host, port, m = udpServer(t, func(c *Config) { c.AuditLog = log; c.ConsoleSessions = consoles })
	if err := m.Reset(context.Background(), machine.ResetOn); err != nil {
		t.Fatal(err)
	}
	return host, port, m, log, consoles
}

// waitConsoleFree waits until no stream of the machine's serial console is
// open: the BMC ends the payload on its own after some events.
func waitConsoleFree(t *testing.T, consoles *machine.ConsoleSessions) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for consoles.InUse("vm-0", machine.ConsoleSerial) {
		if time.Now().After(deadline) {
			t.Fatal("the serial console is still held")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// consoleEntries lists the audit log's console entries as "Op Arg".
func consoleEntries(log *auditlog.Log) []string {
	var out []string
	for _, e := range log.Entries("vm-0") {
		if e.Op == machine.OpOpenConsole || e.Op == auditlog.OpCloseConsole {
			out = append(out, string(e.Op)+" "+e.Arg+" "+e.Err)
		}
	}
	return out
}

// TestIpmitoolSOL: ipmitool's sol activate shows the guest's boot lines and
// login prompt, echoes a typed line, and ends with ~.; a second activate
// is refused while the first holds the console; sol deactivate from
// another ipmitool ends it.
func TestIpmitoolSOL(t *testing.T) {
	ipmitool := requireTool(t, "ipmitool")
	for _, suite := range []string{"3", "17"} {
		t.Run("suite "+suite, func(t *testing.T) {
			host, port, _, log, consoles := solServer(t)
			args := []string{"-I", "lanplus", "-C", suite, "-H", host, "-p", port, "-U", testUser, "-P", testPassword}
			tm := startTerminal(t, ipmitool, append(args, "sol", "activate")...)
			at := tm.waitFor(0, "[SOL Session operational.")
			for _, l := range console.BootLines("vm-0") {
				at = tm.waitFor(at, l)
			}
			at = tm.waitFor(at, console.Prompt("vm-0"))
			tm.typeKeys("root\r")
			at = tm.waitFor(at, "root\r\n"+console.Prompt("vm-0"))

			out, err := runTool(t, ipmitool, append(args, "sol", "activate")...)
			if err == nil || !strings.Contains(out, "SOL payload already active on another session") {
				t.Fatalf("second sol activate: %v\n%s", err, out)
			}
			if info := mustRun(t, ipmitool, append(args, "sol", "info")...); !strings.Contains(info, "Enabled                         : true") ||
				!strings.Contains(info, "Payload Port                    : "+port) {
				t.Errorf("sol info:\n%s", info)
			}

			tm.typeKeys("~.")
			if err := tm.exited(); err != nil {
				t.Fatalf("ipmitool after ~.: %v\n%s", err, tm.output())
			}
			waitConsoleFree(t, consoles)

			// Again, ended by sol deactivate from another session.
			tm = startTerminal(t, ipmitool, append(args, "sol", "activate")...)
			tm.waitFor(0, console.Prompt("vm-0"))
			mustRun(t, ipmitool, append(args, "sol", "deactivate")...)
			waitConsoleFree(t, consoles)
			// ipmitool does not watch the "SOL deactivating" bit: it learns
			// when its next keystroke goes unacknowledged.
			tm.typeKeys("x")
			var exit *exec.ExitError
			if err := tm.exited(); !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(tm.output(), "SOL session closed by BMC") {
				t.Fatalf("ipmitool after another session's deactivate: %v\n%s", err, tm.output())
			}

			// Newest first.
			want := []string{"CloseConsole Serial (deactivated by another session) ", "OpenConsole Serial ", "CloseConsole Serial ", "OpenConsole Serial "}
			if got := consoleEntries(log); strings.Join(got, "|") != strings.Join(want, "|") {
				t.Errorf("audit entries %q, want %q", got, want)
			}
			for _, e := range log.Entries("vm-0") {
				if e.Actor.Protocol != auditlog.IPMI || e.Actor.Account != testUser || e.Actor.Source != "127.0.0.1" {
					t.Errorf("entry %+v: actor", e)
				}
			}
		})
	}
}
