package ipmi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
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
	host, port, m = udpServerOn(t, lowPortConn(t), func(c *Config) { c.AuditLog = log; c.ConsoleSessions = consoles })
	if err := m.Reset(context.Background(), machine.ResetOn); err != nil {
		t.Fatal(err)
	}
	return host, port, m, log, consoles
}

// lowPortConn listens on a loopback port below 32768: ipmiconsole (freeipmi
// 1.6.10) keeps the port in a signed 16-bit integer, and calls the host
// invalid for ephemeral ports above it.
func lowPortConn(t *testing.T) net.PacketConn {
	t.Helper()
	for range 100 {
		conn, err := net.ListenPacket("udp4", fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12000)))
		if err == nil {
			return conn
		}
	}
	t.Fatal("no free UDP port below 32768")
	return nil
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
			host, port, m, log, consoles := solServer(t)
			args := []string{"-I", "lanplus", "-C", suite, "-H", host, "-p", port, "-U", testUser, "-P", testPassword}
			tm := startTerminal(t, ipmitool, append(args, "sol", "activate")...)
			at := tm.waitFor(0, "[SOL Session operational.")
			for _, l := range console.BootLines("vm-0") {
				at = tm.waitFor(at, l)
			}
			at = tm.waitFor(at, console.Prompt("vm-0"))
			tm.typeKeys("root\r")
			at = tm.waitFor(at, "root\r\n"+console.Prompt("vm-0"))
			// A break is acknowledged (the console contract cannot carry
			// it), and the session goes on.
			tm.typeKeys("~B")
			at = tm.waitFor(at, "[send break]")
			tm.typeKeys("x\r")
			at = tm.waitFor(at, "x\r\n"+console.Prompt("vm-0"))

			out, err := runTool(t, ipmitool, append(args, "sol", "activate")...)
			if err == nil || !strings.Contains(out, "SOL payload already active on another session") {
				t.Fatalf("second sol activate: %v\n%s", err, out)
			}
			if info := mustRun(t, ipmitool, append(args, "sol", "info")...); !strings.Contains(info, "Enabled                         : true") ||
				!strings.Contains(info, "Payload Port                    : "+port) {
				t.Errorf("sol info:\n%s", info)
			}
			mustRun(t, ipmitool, append(args, "sol", "set", "retry-count", "5")...)
			if info := mustRun(t, ipmitool, append(args, "sol", "info")...); !strings.Contains(info, "Retry Count                     : 5") {
				t.Errorf("sol info after sol set retry-count 5:\n%s", info)
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

			// Again, ended by a restart of the machine; then a new
			// activation shows the new boot.
			tm = startTerminal(t, ipmitool, append(args, "sol", "activate")...)
			tm.waitFor(0, console.Prompt("vm-0"))
			if err := m.Reset(context.Background(), machine.ResetForceRestart); err != nil {
				t.Fatal(err)
			}
			waitConsoleFree(t, consoles)
			tm.typeKeys("x")
			if err := tm.exited(); !errors.As(err, &exit) || !strings.Contains(tm.output(), "SOL session closed by BMC") {
				t.Fatalf("ipmitool after the restart: %v\n%s", err, tm.output())
			}
			tm = startTerminal(t, ipmitool, append(args, "sol", "activate")...)
			tm.waitFor(tm.waitFor(0, console.BootLines("vm-0")[0]), console.Prompt("vm-0"))
			tm.typeKeys("~.")
			if err := tm.exited(); err != nil {
				t.Fatalf("ipmitool after ~.: %v\n%s", err, tm.output())
			}
			waitConsoleFree(t, consoles)

			// A machine that is off has no console to activate.
			mustRun(t, ipmitool, append(args, "power", "off")...)
			if out, err := runTool(t, ipmitool, append(args, "sol", "activate")...); err == nil ||
				!strings.Contains(out, "Error activating SOL payload: Command not supported in present state") {
				t.Fatalf("sol activate on a machine that is off: %v\n%s", err, out)
			}

			// Newest first.
			want := []string{"OpenConsole Serial conflicts with machine state", "CloseConsole Serial ", "OpenConsole Serial ", "CloseConsole Serial (the console ended) ", "OpenConsole Serial ",
				"CloseConsole Serial (deactivated by another session) ", "OpenConsole Serial ", "CloseConsole Serial ", "OpenConsole Serial "}
			if got := consoleEntries(log); strings.Join(got, "|") != strings.Join(want, "|") {
				t.Errorf("audit entries %q, want %q", got, want)
			}
			for _, e := range log.Entries("vm-0") {
				if e.Op == machine.OpReset && e.Arg == string(machine.ResetForceRestart) {
					continue // the test's own
				}
				if e.Actor.Protocol != auditlog.IPMI || e.Actor.Account != testUser || e.Actor.Source != "127.0.0.1" {
					t.Errorf("entry %+v: actor", e)
				}
			}
		})
	}
}

// TestIpmiconsoleSOL: freeipmi's ipmiconsole shows the guest's console,
// echoes, and ends with &.; a machine restart ends its SOL (the
// "SOL deactivating" bit, which ipmiconsole obeys), after which a new
// activation shows the new boot.
func TestIpmiconsoleSOL(t *testing.T) {
	ipmiconsole := requireTool(t, "ipmiconsole")
	for _, suite := range []string{"3", "17"} {
		t.Run("suite "+suite, func(t *testing.T) {
			host, port, m, log, consoles := solServer(t)
			args := []string{"-h", host + ":" + port, "-u", testUser, "-p", testPassword, "-I", suite}
			tm := startTerminal(t, ipmiconsole, args...)
			at := tm.waitFor(0, "[SOL established]")
			for _, l := range console.BootLines("vm-0") {
				at = tm.waitFor(at, l)
			}
			at = tm.waitFor(at, console.Prompt("vm-0"))
			tm.typeKeys("root\r")
			tm.waitFor(at, "root\r\n"+console.Prompt("vm-0"))
			tm.typeKeys("&.")
			if err := tm.exited(); err != nil {
				t.Fatalf("ipmiconsole after &.: %v\n%s", err, tm.output())
			}
			waitConsoleFree(t, consoles)

			tm = startTerminal(t, ipmiconsole, args...)
			tm.waitFor(0, console.Prompt("vm-0"))
			if err := m.Reset(context.Background(), machine.ResetForceRestart); err != nil {
				t.Fatal(err)
			}
			tm.exited() // ipmiconsole ends on "SOL deactivating", as it would on a stolen session
			waitConsoleFree(t, consoles)
			tm = startTerminal(t, ipmiconsole, args...)
			tm.waitFor(tm.waitFor(0, console.BootLines("vm-0")[0]), console.Prompt("vm-0"))
			tm.typeKeys("&.")
			if err := tm.exited(); err != nil {
				t.Fatalf("ipmiconsole after &.: %v\n%s", err, tm.output())
			}
			waitConsoleFree(t, consoles)
			want := []string{"CloseConsole Serial ", "OpenConsole Serial ", "CloseConsole Serial (the console ended) ", "OpenConsole Serial ", "CloseConsole Serial ", "OpenConsole Serial "}
			if got := consoleEntries(log); strings.Join(got, "|") != strings.Join(want, "|") {
				t.Errorf("audit entries %q, want %q", got, want)
			}
		})
	}
}

// TestSOLTakeover: ipmiconsole takes the console from an ipmitool holding
// it (it deactivates the payload first, as it does by default), and with
// --dont-steal reports it in use instead.
func TestSOLTakeover(t *testing.T) {
	ipmitool := requireTool(t, "ipmitool")
	ipmiconsole := requireTool(t, "ipmiconsole")
	host, port, _, _, _ := solServer(t)
	holder := startTerminal(t, ipmitool, "-I", "lanplus", "-C", "17", "-H", host, "-p", port, "-U", testUser, "-P", testPassword, "sol", "activate")
	holder.waitFor(0, console.Prompt("vm-0"))
	args := []string{"-h", host + ":" + port, "-u", testUser, "-p", testPassword, "-I", "17"}
	// ipmiconsole exits 0 after reporting the error.
	if out, _ := runTool(t, ipmiconsole, append(args, "--dont-steal")...); !strings.Contains(out, "[error received]: SOL in use") {
		t.Fatalf("ipmiconsole --dont-steal:\n%s", out)
	}
	tm := startTerminal(t, ipmiconsole, args...)
	tm.waitFor(tm.waitFor(0, "[SOL established]"), console.Prompt("vm-0"))
	holder.typeKeys("x")
	if err := holder.exited(); err == nil || !strings.Contains(holder.output(), "SOL session closed by BMC") {
		t.Fatalf("ipmitool after the takeover: %v\n%s", err, holder.output())
	}
	tm.typeKeys("&.")
	if err := tm.exited(); err != nil {
		t.Fatalf("ipmiconsole after &.: %v\n%s", err, tm.output())
	}
}
