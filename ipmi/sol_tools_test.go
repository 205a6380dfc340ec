package ipmi

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/internal/termtest"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/sim/console"
)

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
			tm := termtest.Start(t, ipmitool, append(args, "sol", "activate")...)
			at := tm.WaitFor(0, "[SOL Session operational.")
			for _, l := range console.BootLines("vm-0") {
				at = tm.WaitFor(at, l)
			}
			at = tm.WaitFor(at, console.Prompt("vm-0"))
			tm.Type("root\r")
			at = tm.WaitFor(at, "root\r\n"+console.Prompt("vm-0"))
			// A break is acknowledged (the console contract cannot carry
			// it), and the session goes on.
			tm.Type("~B")
			at = tm.WaitFor(at, "[send break]")
			tm.Type("x\r")
			at = tm.WaitFor(at, "x\r\n"+console.Prompt("vm-0"))

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

			tm.Type("~.")
			if err := tm.Exited(); err != nil {
				t.Fatalf("ipmitool after ~.: %v\n%s", err, tm.Output())
			}
			waitConsoleFree(t, consoles)

			// Again, ended by sol deactivate from another session.
			tm = termtest.Start(t, ipmitool, append(args, "sol", "activate")...)
			tm.WaitFor(0, console.Prompt("vm-0"))
			mustRun(t, ipmitool, append(args, "sol", "deactivate")...)
			waitConsoleFree(t, consoles)
			// ipmitool does not watch the "SOL deactivating" bit: it learns
			// when its next keystroke goes unacknowledged.
			tm.Type("x")
			var exit *exec.ExitError
			if err := tm.Exited(); !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(tm.Output(), "SOL session closed by BMC") {
				t.Fatalf("ipmitool after another session's deactivate: %v\n%s", err, tm.Output())
			}

			// Again, ended by a restart of the machine; then a new
			// activation shows the new boot.
			tm = termtest.Start(t, ipmitool, append(args, "sol", "activate")...)
			tm.WaitFor(0, console.Prompt("vm-0"))
			if err := m.Reset(context.Background(), machine.ResetForceRestart); err != nil {
				t.Fatal(err)
			}
			waitConsoleFree(t, consoles)
			tm.Type("x")
			if err := tm.Exited(); !errors.As(err, &exit) || !strings.Contains(tm.Output(), "SOL session closed by BMC") {
				t.Fatalf("ipmitool after the restart: %v\n%s", err, tm.Output())
			}
			tm = termtest.Start(t, ipmitool, append(args, "sol", "activate")...)
			tm.WaitFor(tm.WaitFor(0, console.BootLines("vm-0")[0]), console.Prompt("vm-0"))
			tm.Type("~.")
			if err := tm.Exited(); err != nil {
				t.Fatalf("ipmitool after ~.: %v\n%s", err, tm.Output())
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
			tm := termtest.Start(t, ipmiconsole, args...)
			at := tm.WaitFor(0, "[SOL established]")
			for _, l := range console.BootLines("vm-0") {
				at = tm.WaitFor(at, l)
			}
			at = tm.WaitFor(at, console.Prompt("vm-0"))
			tm.Type("root\r")
			tm.WaitFor(at, "root\r\n"+console.Prompt("vm-0"))
			tm.Type("&.")
			if err := tm.Exited(); err != nil {
				t.Fatalf("ipmiconsole after &.: %v\n%s", err, tm.Output())
			}
			waitConsoleFree(t, consoles)

			tm = termtest.Start(t, ipmiconsole, args...)
			tm.WaitFor(0, console.Prompt("vm-0"))
			if err := m.Reset(context.Background(), machine.ResetForceRestart); err != nil {
				t.Fatal(err)
			}
			tm.Exited() // ipmiconsole ends on "SOL deactivating", as it would on a stolen session
			waitConsoleFree(t, consoles)
			tm = termtest.Start(t, ipmiconsole, args...)
			tm.WaitFor(tm.WaitFor(0, console.BootLines("vm-0")[0]), console.Prompt("vm-0"))
			tm.Type("&.")
			if err := tm.Exited(); err != nil {
				t.Fatalf("ipmiconsole after &.: %v\n%s", err, tm.Output())
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
	holder := termtest.Start(t, ipmitool, "-I", "lanplus", "-C", "17", "-H", host, "-p", port, "-U", testUser, "-P", testPassword, "sol", "activate")
	holder.WaitFor(0, console.Prompt("vm-0"))
	args := []string{"-h", host + ":" + port, "-u", testUser, "-p", testPassword, "-I", "17"}
	// ipmiconsole exits 0 after reporting the error.
	if out, _ := runTool(t, ipmiconsole, append(args, "--dont-steal")...); !strings.Contains(out, "[error received]: SOL in use") {
		t.Fatalf("ipmiconsole --dont-steal:\n%s", out)
	}
	tm := termtest.Start(t, ipmiconsole, args...)
	tm.WaitFor(tm.WaitFor(0, "[SOL established]"), console.Prompt("vm-0"))
	holder.Type("x")
	if err := holder.Exited(); err == nil || !strings.Contains(holder.Output(), "SOL session closed by BMC") {
		t.Fatalf("ipmitool after the takeover: %v\n%s", err, holder.Output())
	}
	tm.Type("&.")
	if err := tm.Exited(); err != nil {
		t.Fatalf("ipmiconsole after &.: %v\n%s", err, tm.Output())
	}
}
