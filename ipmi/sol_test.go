package ipmi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
)

// solPacket is a decoded SOL payload.
type solPkt struct {
	seq, ack, count, status byte
	data                    []byte
}

func (p solPkt) String() string {
	return fmt.Sprintf("seq %d ack %d count %d status %#x data %q", p.seq, p.ack, p.count, p.status, p.data)
}

// newSOLClient logs in a lanplus client that receives SOL output.
func newSOLClient(t testing.TB, s *Server, suite byte, priv privilege) *lanplusClient {
	t.Helper()
	c := newLanplusClient(s, suite, testUser, testPassword)
	c.unsolicited = make(chan []byte, 64)
	c.login(t, priv)
	return c
}

// decodeSOL opens a SOL packet from the BMC.
func (c *lanplusClient) decodeSOL(pkt []byte) (solPkt, error) {
	_, _, body, err := decodeRMCP(pkt)
	if err != nil {
		return solPkt{}, err
	}
	h, payload, trailer, err := decodeV20(body)
	if err != nil {
		return solPkt{}, err
	}
	if h.payloadType != payloadSOL || h.sessionID != c.consoleID {
		return solPkt{}, fmt.Errorf("payload type %#x for session %#x", h.payloadType, h.sessionID)
	}
	if !h.authenticated || !h.encrypted || !c.keys.verifyTrailer(body, trailer) {
		return solPkt{}, errors.New("SOL packet not sealed with the session's keys")
	}
	p, err := c.keys.open(payload)
	if err != nil {
		return solPkt{}, err
	}
	if len(p) < solHeaderLength {
		return solPkt{}, fmt.Errorf("SOL payload of %d bytes", len(p))
	}
	return solPkt{p[0], p[1], p[2], p[3], p[4:]}, nil
}

// sendSOL sends a SOL packet and returns the BMC's answer, if any.
func (c *lanplusClient) sendSOL(seq, ack, count, op byte, data []byte) (*solPkt, error) {
	return c.sendSOLRaw(append([]byte{seq, ack, count, op}, data...))
}

func (c *lanplusClient) sendSOLRaw(payload []byte) (*solPkt, error) {
	c.seq++
	reply, err := c.exchange(c.keys.seal(payloadSOL, c.bmcID, c.seq, payload))
	if errors.Is(err, errNoReply) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	p, err := c.decodeSOL(reply)
	return &p, err
}

// nextSOL waits for the BMC's next SOL packet.
func (c *lanplusClient) nextSOL(t testing.TB) solPkt {
	t.Helper()
	select {
	case pkt := <-c.unsolicited:
		p, err := c.decodeSOL(pkt)
		if err != nil {
			t.Fatal(err)
		}
		return p
	case <-time.After(5 * time.Second):
		t.Fatal("no SOL packet from the BMC")
		return solPkt{}
	}
}

// noSOL checks that the BMC sends nothing for d.
func (c *lanplusClient) noSOL(t testing.TB, d time.Duration) {
	t.Helper()
	select {
	case pkt := <-c.unsolicited:
		p, err := c.decodeSOL(pkt)
		t.Fatalf("unexpected SOL packet %v (%v)", p, err)
	case <-time.After(d):
	}
}

var activateSOL = []byte{payloadSOL, solInstance, 0xc6, 0, 0, 0}

// pipeMachine hands the machine's side of every console stream to the
// test. net.Pipe has no buffer, so the test decides when the machine reads
// and writes.
type pipeMachine struct {
	*memory.Machine
	guest chan net.Conn
}

func (p pipeMachine) OpenConsole(ctx context.Context, k machine.ConsoleKind) (io.ReadWriteCloser, error) {
	if st, _ := p.PowerState(ctx); st != machine.PowerOn {
		return nil, machine.Errorf(machine.ErrConflict, "machine is %s", st)
	}
	bmc, guest := net.Pipe()
	p.guest <- guest
	return bmc, nil
}

// solTestServer serves a running machine whose console the test plays.
func solTestServer(t *testing.T, edit func(*Config)) (*Server, pipeMachine, *auditlog.Log) {
	t.Helper()
	log := auditlog.New(auditlog.Options{})
	m := pipeMachine{Machine: memory.New(memory.Options{}).Get("vm-0"), guest: make(chan net.Conn, 4)}
	if err := m.Reset(context.Background(), machine.ResetOn); err != nil {
		t.Fatal(err)
	}
	s, _, _ := testServer(t, func(c *Config) {
		c.Machine, c.AuditLog = m, log
		if edit != nil {
			edit(c)
		}
	})
	t.Cleanup(func() { s.endSOL("test over") })
	return s, m, log
}

func (p pipeMachine) opened(t testing.TB) net.Conn {
	t.Helper()
	select {
	case g := <-p.guest:
		t.Cleanup(func() { g.Close() })
		return g
	case <-time.After(5 * time.Second):
		t.Fatal("no console opened")
		return nil
	}
}

// setSOL sets SOL configuration parameters for the test.
func setSOL(t testing.TB, c *lanplusClient, param byte, v ...byte) {
	t.Helper()
	c.mustCommand(t, netFnTransport, cmdSetSOLConfigParameters, append([]byte{lanChannel, param}, v...)...)
}

// TestSOLRefusals: malformed and out-of-place payload and SOL
// configuration requests get their standard completion codes.
func TestSOLRefusals(t *testing.T) {
	s, _, _ := solTestServer(t, nil)
	c := newSOLClient(t, s, 17, privAdmin)
	tests := []struct {
		name       string
		netFn, cmd byte
		data       []byte
		want       byte
	}{
		{"activate short", netFnApp, cmdActivatePayload, activateSOL[:5], ccRequestLength},
		{"activate IPMI payload", netFnApp, cmdActivatePayload, []byte{payloadIPMI, 1, 0xc6, 0, 0, 0}, ccInvalidField},
		{"activate unknown payload type", netFnApp, cmdActivatePayload, []byte{0x05, 1, 0xc6, 0, 0, 0}, ccInvalidField},
		{"activate instance 2", netFnApp, cmdActivatePayload, []byte{payloadSOL, 2, 0xc6, 0, 0, 0}, ccInvalidField},
		{"activate unencrypted on suite 17", netFnApp, cmdActivatePayload, []byte{payloadSOL, 1, 0x46, 0, 0, 0}, ccPayloadWithoutEncryption},
		{"deactivate inactive", netFnApp, cmdDeactivatePayload, activateSOL, ccPayloadDeactivated},
		{"deactivate instance 3", netFnApp, cmdDeactivatePayload, []byte{payloadSOL, 3, 0, 0, 0, 0}, ccInvalidField},
		{"instance info instance 2", netFnApp, cmdGetPayloadInstanceInfo, []byte{payloadSOL, 2}, ccInvalidField},
		{"activation status unknown type", netFnApp, cmdGetPayloadActivationStatus, []byte{0x05}, ccInvalidField},
		{"payload support bad channel", netFnApp, cmdGetChannelPayloadSupport, []byte{0x05}, ccInvalidField},
		{"payload version unknown type", netFnApp, cmdGetChannelPayloadVersion, []byte{currentChannel, 0x05}, ccPayloadTypeNotAvailable},
		{"get unknown SOL parameter", netFnTransport, cmdGetSOLConfigParameters, []byte{lanChannel, 9, 0, 0}, ccSOLParamUnsupported},
		{"get SOL parameter short", netFnTransport, cmdGetSOLConfigParameters, []byte{lanChannel, 1}, ccRequestLength},
		{"set SOL channel", netFnTransport, cmdSetSOLConfigParameters, []byte{lanChannel, solParamChannel, 1}, ccSOLParamReadOnly},
		{"set SOL port", netFnTransport, cmdSetSOLConfigParameters, []byte{lanChannel, solParamPort, 0x6f, 0x02}, ccSOLParamReadOnly},
		{"set zero accumulate interval", netFnTransport, cmdSetSOLConfigParameters, []byte{lanChannel, solParamAccumulate, 0, 5}, ccInvalidField},
		{"set eight retries", netFnTransport, cmdSetSOLConfigParameters, []byte{lanChannel, solParamRetry, 8, 1}, ccInvalidField},
		{"set unknown bit rate", netFnTransport, cmdSetSOLConfigParameters, []byte{lanChannel, solParamBitRate, 3}, ccInvalidField},
		{"set unforced SOL auth", netFnTransport, cmdSetSOLConfigParameters, []byte{lanChannel, solParamAuth, byte(privUser)}, ccInvalidField},
		{"set SOL enable long", netFnTransport, cmdSetSOLConfigParameters, []byte{lanChannel, solParamEnable, 1, 0}, ccRequestLength},
		{"set unknown SOL parameter", netFnTransport, cmdSetSOLConfigParameters, []byte{lanChannel, 0x40, 1}, ccSOLParamUnsupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if cc, _, err := c.command(tt.netFn, tt.cmd, tt.data...); err != nil || cc != tt.want {
				t.Fatalf("cc %#x, %v; want %#x", cc, err, tt.want)
			}
		})
	}
	t.Run("set in progress twice", func(t *testing.T) {
		setSOL(t, c, solParamSetInProgress, setInProgress)
		if cc, _, _ := c.command(netFnTransport, cmdSetSOLConfigParameters, lanChannel, solParamSetInProgress, setInProgress); cc != ccSOLSetInProgress {
			t.Fatalf("cc %#x, want %#x", cc, ccSOLSetInProgress)
		}
		setSOL(t, c, solParamSetInProgress, setComplete)
	})
	t.Run("SOL packets without the payload", func(t *testing.T) {
		for _, p := range [][]byte{{1, 0, 0, 0, 'x'}, {0, 1, 1, 0}, {1}, {}} {
			if reply, err := c.sendSOLRaw(p); reply != nil || err != nil {
				t.Fatalf("answer %v, %v", reply, err)
			}
		}
		c.mustCommand(t, netFnApp, cmdGetDeviceID)
	})
	t.Run("IPMI 1.5 session", func(t *testing.T) {
		v := newV15Client(s, authTypeMD5, testUser, testPassword)
		if cc, err := v.connect(privAdmin); cc != ccOK || err != nil {
			t.Fatalf("connect: %#x %v", cc, err)
		}
		if cc, _, err := v.command(netFnApp, cmdActivatePayload, activateSOL...); cc != ccInvalidCommand || err != nil {
			t.Fatalf("activate: cc %#x, %v", cc, err)
		}
	})
}

// TestSOLActivation: one payload per machine, across sessions and
// protocols; a machine that is off and a session below the SOL privilege
// are refused.
func TestSOLActivation(t *testing.T) {
	consoles := &machine.ConsoleSessions{}
	s, m, log := solTestServer(t, func(c *Config) { c.ConsoleSessions = consoles })
	first := newSOLClient(t, s, 17, privAdmin)
	second := newSOLClient(t, s, 3, privAdmin)
	out := first.mustCommand(t, netFnApp, cmdActivatePayload, activateSOL...)
	if want := []byte{0, 0, 0, 0, 0x00, 0x01, 0x00, 0x01, 0x6f, 0x02, 0xff, 0xff}; !bytes.Equal(out, want) {
		t.Fatalf("activate payload answer % x, want % x", out, want)
	}
	m.opened(t)
	if cc, _, _ := second.command(netFnApp, cmdActivatePayload, activateSOL...); cc != ccPayloadActive {
		t.Fatalf("second activation: cc %#x", cc)
	}
	if out := second.mustCommand(t, netFnApp, cmdGetPayloadActivationStatus, payloadSOL); !bytes.Equal(out, []byte{1, 1, 0}) {
		t.Fatalf("activation status % x", out)
	}
	if out := second.mustCommand(t, netFnApp, cmdGetPayloadInstanceInfo, payloadSOL, 1); !bytes.Equal(out[:5], append(le32(first.bmcID), 1)) {
		t.Fatalf("instance info % x, want session %#x", out, first.bmcID)
	}
	first.mustCommand(t, netFnApp, cmdDeactivatePayload, activateSOL...)
	if consoles.InUse("vm-0", machine.ConsoleSerial) {
		t.Fatal("console still held after deactivation")
	}

	// Held over another protocol: "already active", yet no IPMI payload.
	held, err := consoles.Open(context.Background(), m, machine.ConsoleSerial)
	if err != nil {
		t.Fatal(err)
	}
	m.opened(t)
	if cc, _, _ := second.command(netFnApp, cmdActivatePayload, activateSOL...); cc != ccPayloadActive {
		t.Fatalf("activation while Redfish holds the console: cc %#x", cc)
	}
	if out := second.mustCommand(t, netFnApp, cmdGetPayloadActivationStatus, payloadSOL); !bytes.Equal(out, []byte{1, 0, 0}) {
		t.Fatalf("activation status % x", out)
	}
	held.Close()

	// The SOL privilege level.
	setSOL(t, first, solParamAuth, solAuthForced|byte(privAdmin))
	user := newSOLClient(t, s, 17, privUser)
	if cc, _, _ := user.command(netFnApp, cmdActivatePayload, activateSOL...); cc != ccInsufficientPrivilege {
		t.Fatalf("USER activation with ADMINISTRATOR required: cc %#x", cc)
	}
	// Disabled.
	setSOL(t, first, solParamEnable, 0)
	if cc, _, _ := second.command(netFnApp, cmdActivatePayload, activateSOL...); cc != ccPayloadDisabled {
		t.Fatalf("activation of disabled SOL: cc %#x", cc)
	}
	setSOL(t, first, solParamEnable, 1)
	// Off.
	if err := m.Reset(context.Background(), machine.ResetForceOff); err != nil {
		t.Fatal(err)
	}
	if cc, _, _ := second.command(netFnApp, cmdActivatePayload, activateSOL...); cc != ccInvalidState {
		t.Fatalf("activation on a machine that is off: cc %#x", cc)
	}
	var ops []string
	for _, e := range log.Entries("vm-0") {
		ops = append(ops, string(e.Op)+"/"+e.Actor.Account+"/"+e.Err)
	}
	if want := "OpenConsole/admin/conflicts with machine state,CloseConsole/admin/,OpenConsole/admin/"; strings.Join(ops, ",") != want {
		t.Errorf("audit entries %v, want %s", ops, want)
	}
}

// TestSOLPackets plays both ends: the console's packets as a remote
// console, the machine's side of the console stream as the guest.
func TestSOLPackets(t *testing.T) {
	s, m, log := solTestServer(t, nil)
	c := newSOLClient(t, s, 17, privAdmin)
	setSOL(t, c, solParamAccumulate, 1, 200) // 5 ms
	setSOL(t, c, solParamRetry, 2, 1)        // two retries 10 ms apart
	c.mustCommand(t, netFnApp, cmdActivatePayload, activateSOL...)
	guest := m.opened(t)

	// Output below the threshold goes out after the accumulate interval,
	// is resent twice, then waits for a sign of life.
	if _, err := guest.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if p := c.nextSOL(t); p.seq != 1 || string(p.data) != "hello" {
			t.Fatalf("output %v", p)
		}
	}
	c.noSOL(t, 100*time.Millisecond)
	c.mustCommand(t, netFnApp, cmdGetDeviceID)
	if p := c.nextSOL(t); p.seq != 1 || string(p.data) != "hello" {
		t.Fatalf("output after the stall %v", p)
	}
	// A partial acknowledgement: the rest comes as the next packet.
	if reply, err := c.sendSOL(0, 1, 2, 0, nil); reply != nil || err != nil {
		t.Fatalf("acknowledgement answered %v, %v", reply, err)
	}
	if p := c.nextSOL(t); p.seq != 2 || string(p.data) != "llo" {
		t.Fatalf("rest of the output %v", p)
	}
	if reply, _ := c.sendSOL(0, 2, 3, 0, nil); reply != nil {
		t.Fatalf("acknowledgement answered %v", reply)
	}
	c.noSOL(t, 50*time.Millisecond)

	// Input: acknowledged with its count, written once even when resent.
	for range 2 {
		reply, err := c.sendSOL(1, 0, 0, 0, []byte("abc"))
		if err != nil || reply == nil || reply.seq != 0 || reply.ack != 1 || reply.count != 3 || reply.status != 0 {
			t.Fatalf("input answer %v, %v", reply, err)
		}
	}
	// A break is acknowledged; the console contract has no way to send it.
	if reply, err := c.sendSOL(2, 0, 0, solOpBreak, nil); err != nil || reply == nil || reply.ack != 2 || reply.count != 0 {
		t.Fatalf("break answer %v, %v", reply, err)
	}
	// Piggybacked: an acknowledgement of nothing in flight and new input.
	if reply, err := c.sendSOL(3, 9, 1, 0, []byte("d")); err != nil || reply == nil || reply.ack != 3 || reply.count != 1 {
		t.Fatalf("input answer %v, %v", reply, err)
	}
	got := make([]byte, 4)
	_ = guest.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(guest, got); err != nil || string(got) != "abcd" {
		t.Fatalf("guest read %q, %v", got, err)
	}
	_ = guest.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, _ := guest.Read(got); n != 0 {
		t.Fatalf("guest read %q more: a retransmission was written twice", got[:n])
	}

	// Garbage: ignored, and the session and payload go on.
	for _, p := range [][]byte{{1}, {4, 0, 0}, append([]byte{5, 0, 0, 0}, bytes.Repeat([]byte("x"), 300)...)} {
		if reply, err := c.sendSOLRaw(p); reply != nil || err != nil {
			t.Fatalf("garbage %d bytes answered %v, %v", len(p), reply, err)
		}
	}

	// The machine's side ends: what it wrote still goes out, then "SOL
	// deactivating", and the console is released.
	if _, err := guest.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	guest.Close()
	p := c.nextSOL(t)
	if p.seq != 3 || string(p.data) != "bye" {
		t.Fatalf("last output %v", p)
	}
	c.sendSOL(0, p.seq, byte(len(p.data)), 0, nil)
	if p := c.nextSOL(t); p.status != solStatusDeactivating || p.seq != 0 {
		t.Fatalf("after the console ended: %v", p)
	}
	if cc, _, _ := c.command(netFnApp, cmdDeactivatePayload, activateSOL...); cc != ccPayloadDeactivated {
		t.Fatalf("deactivate after the end: cc %#x", cc)
	}
	if e := log.Entries("vm-0")[0]; e.Op != auditlog.OpCloseConsole || e.Arg != "Serial (the console ended)" {
		t.Fatalf("audit entry %+v", e)
	}
}

// TestSOLBoundedMemory: a console that never acknowledges holds a bounded
// part of the machine's output; the rest waits in the machine. A guest
// that never reads gets input up to solInputLimit, then "character
// transfer unavailable".
func TestSOLBoundedMemory(t *testing.T) {
	s, m, _ := solTestServer(t, nil)
	c := newSOLClient(t, s, 17, privAdmin)
	setSOL(t, c, solParamRetry, 0, 1)
	c.mustCommand(t, netFnApp, cmdActivatePayload, activateSOL...)
	guest := m.opened(t)
	written := make(chan int, 1)
	go func() {
		total := 0
		chunk := bytes.Repeat([]byte("y"), 16)
		_ = guest.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
		for {
			n, err := guest.Write(chunk)
			total += n
			if err != nil {
				written <- total
				return
			}
		}
	}()
	if total := <-written; total > 4*solMaxChars {
		t.Fatalf("the BMC took %d bytes of output from the machine without acknowledgements", total)
	}

	seq := byte(0)
	var last *solPkt
	for accepted := 0; accepted <= solInputLimit+solMaxChars; {
		seq = seq%solMaxSeq + 1
		reply, err := c.sendSOL(seq, 0, 0, 0, bytes.Repeat([]byte("z"), solMaxChars))
		if err != nil || reply == nil {
			t.Fatalf("input answer %v, %v", reply, err)
		}
		last = reply
		if reply.count == 0 {
			break
		}
		accepted += int(reply.count)
	}
	if last.count != 0 || last.status != solStatusNACK|solStatusUnavailable {
		t.Fatalf("input to a guest that does not read: last answer %v", last)
	}
}

// TestSOLEnds: Close Session and an idle timeout end the payload and
// release the console, with an audit entry each.
func TestSOLEnds(t *testing.T) {
	consoles := &machine.ConsoleSessions{}
	s, m, log := solTestServer(t, func(c *Config) {
		c.ConsoleSessions, c.SessionTimeout, c.Now = consoles, 200*time.Millisecond, nil
	})
	c := newSOLClient(t, s, 17, privAdmin)
	c.mustCommand(t, netFnApp, cmdActivatePayload, activateSOL...)
	m.opened(t)
	c.mustCommand(t, netFnApp, cmdCloseSession, le32(c.bmcID)...)
	if consoles.InUse("vm-0", machine.ConsoleSerial) {
		t.Fatal("console held after Close Session")
	}
	if e := log.Entries("vm-0")[0]; e.Op != auditlog.OpCloseConsole || e.Arg != "Serial" {
		t.Fatalf("audit entry %+v", e)
	}

	c = newSOLClient(t, s, 17, privAdmin)
	c.mustCommand(t, netFnApp, cmdActivatePayload, activateSOL...)
	m.opened(t)
	deadline := time.Now().Add(5 * time.Second)
	for consoles.InUse("vm-0", machine.ConsoleSerial) {
		if time.Now().After(deadline) {
			t.Fatal("console held by an idle session")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if e := log.Entries("vm-0")[0]; e.Op != auditlog.OpCloseConsole || e.Arg != "Serial (session timed out)" {
		t.Fatalf("audit entry %+v", e)
	}
}
