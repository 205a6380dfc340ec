package ipmi

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
)

func TestNewServerValidatesConfig(t *testing.T) {
	m := memory.New(memory.Options{}).Get("vm-0")
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"defaults", Config{Machine: m, Username: "u", Password: "p"}, ""},
		{"no machine", Config{Username: "u"}, "Machine is required"},
		{"long username", Config{Machine: m, Username: strings.Repeat("u", 17)}, "username"},
		{"NUL in username", Config{Machine: m, Username: "a\x00b"}, "username"},
		{"long password", Config{Machine: m, Password: strings.Repeat("p", 21)}, "password"},
		{"unknown cipher suite", Config{Machine: m, CipherSuites: []uint8{8}}, "cipher suite 8"},
		{"too many sessions", Config{Machine: m, MaxSessions: 64}, "MaxSessions"},
		{"negative sessions", Config{Machine: m, MaxSessions: -1}, "MaxSessions"},
		{"negative timeout", Config{Machine: m, SessionTimeout: -time.Second}, "SessionTimeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewServer(tt.cfg)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("NewServer: %v", err)
				}
				if got := []byte{s.suites[0].id, s.suites[1].id}; len(s.suites) != 2 || !bytes.Equal(got, []byte{3, 17}) {
					t.Errorf("default suites %v, want 3 and 17", s.suites)
				}
				if s.timeout != defaultSessionTimeout || s.sessions.max != defaultMaxSessions {
					t.Errorf("timeout %v, max sessions %d", s.timeout, s.sessions.max)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("NewServer error %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func TestPresencePing(t *testing.T) {
	s, _, _ := testServer(t, nil)
	ping := []byte{0x06, 0, 0xff, 0x06, 0, 0, 0x11, 0xbe, 0x80, 0x2a, 0, 0}
	got := s.handlePacket(context.Background(), ping, testRemote)
	want := []byte{0x06, 0, 0xff, 0x06, 0, 0, 0x11, 0xbe, 0x40, 0x2a, 0, 0x10,
		0, 0, 0x11, 0xbe, 0, 0, 0, 0, 0x81, 0, 0, 0, 0, 0, 0, 0}
	if !bytes.Equal(got, want) {
		t.Fatalf("pong\n got % x\nwant % x", got, want)
	}
}

func TestLanplusSession(t *testing.T) {
	for _, suite := range []byte{3, 17} {
		t.Run(fmt.Sprintf("suite %d", suite), func(t *testing.T) {
			s, m, _ := testServer(t, nil)
			c := newLanplusClient(s, suite, testUser, testPassword)
			c.login(t, privOperator)
			if active, handshakes := s.Sessions(); active != 1 || handshakes != 0 {
				t.Fatalf("Sessions() = %d active, %d handshakes; want 1, 0", active, handshakes)
			}
			if got := c.mustCommand(t, netFnChassis, cmdGetChassisStatus); got[0]&1 != 0 {
				t.Fatalf("chassis status % x: machine should be off", got)
			}
			c.mustCommand(t, netFnChassis, cmdChassisControl, 0x01)
			if st, _ := m.PowerState(context.Background()); st != machine.PowerOn {
				t.Fatalf("power state %s after power up", st)
			}
			c.mustCommand(t, netFnApp, cmdCloseSession, le32(c.bmcID)...)
			if n := len(s.sessions.byID); n != 0 {
				t.Fatalf("%d sessions left after Close Session", n)
			}
			if active, handshakes := s.Sessions(); active != 0 || handshakes != 0 {
				t.Fatalf("Sessions() = %d, %d after Close Session", active, handshakes)
			}
			if _, _, err := c.command(netFnChassis, cmdGetChassisStatus); !errors.Is(err, errNoReply) {
				t.Fatalf("command after close: %v, want no reply", err)
			}
		})
	}
}

func TestCipherSuiteNegotiation(t *testing.T) {
	tests := []struct {
		name       string
		offered    []uint8
		asked      byte
		wantStatus byte
	}{
		{"default offers 3", nil, 3, rmcpStatusOK},
		{"default offers 17", nil, 17, rmcpStatusOK},
		{"default refuses 0", nil, 0, rmcpStatusNoCipherSuiteMatch},
		{"default refuses 1", nil, 1, rmcpStatusNoCipherSuiteMatch},
		{"default refuses 16", nil, 16, rmcpStatusNoCipherSuiteMatch},
		{"0 when enabled", []uint8{0, 3}, 0, rmcpStatusOK},
		{"only 17 refuses 3", []uint8{17}, 3, rmcpStatusNoCipherSuiteMatch},
		{"2 when enabled", []uint8{2}, 2, rmcpStatusOK},
		{"15 when enabled", []uint8{15}, 15, rmcpStatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := testServer(t, func(c *Config) { c.CipherSuites = tt.offered })
			c := newLanplusClient(s, tt.asked, testUser, testPassword)
			err := c.connect(0, 0x14)
			if tt.wantStatus == rmcpStatusOK {
				if err != nil {
					t.Fatalf("connect: %v", err)
				}
				c.mustCommand(t, netFnApp, cmdGetDeviceID)
				return
			}
			var se rmcpStatusError
			if !errors.As(err, &se) || se.status != tt.wantStatus {
				t.Fatalf("connect error %v, want status %#x", err, tt.wantStatus)
			}
			if n := len(s.sessions.byID); n != 0 {
				t.Fatalf("refused open session left %d sessions", n)
			}
		})
	}
}

func TestLanplusCredentials(t *testing.T) {
	tests := []struct {
		name, user, password string
		wantStatus           byte
		wantErr              string
	}{
		{"wrong user", "root", testPassword, rmcpStatusUnauthorizedName, ""},
		{"wrong password", testUser, "guess", 0, "wrong password"},
		{"null user", "", testPassword, rmcpStatusUnauthorizedName, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := testServer(t, nil)
			c := newLanplusClient(s, 17, tt.user, tt.password)
			err := c.connect(0, 0x14)
			var se rmcpStatusError
			switch {
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("connect error %v, want %q", err, tt.wantErr)
			case tt.wantErr == "" && (!errors.As(err, &se) || se.status != tt.wantStatus):
				t.Fatalf("connect error %v, want status %#x", err, tt.wantStatus)
			}
			if n := len(s.sessions.byID); n != 0 {
				t.Fatalf("failed login left %d sessions", n)
			}
		})
	}
}

// A console that knows the user but not the password and sends a RAKP 3
// anyway is refused by the BMC itself.
func TestRAKP3WithWrongKeyRefused(t *testing.T) {
	s, _, _ := testServer(t, nil)
	c := newLanplusClient(s, 3, testUser, testPassword)
	c.consoleID = 7
	p, err := c.handshakePayload(payloadOpenSessionRequest, openSessionRequest(7, 0, c.suite), payloadOpenSessionResponse)
	if err != nil {
		t.Fatal(err)
	}
	c.bmcID = binary.LittleEndian.Uint32(p[8:])
	if _, err := c.handshakePayload(payloadRAKP1, rakp1Request(c.bmcID, make([]byte, 16), 0x14, c.username), payloadRAKP2); err != nil {
		t.Fatal(err)
	}
	rakp3 := append([]byte{0x03, 0, 0, 0}, le32(c.bmcID)...)
	rakp3 = append(rakp3, bytes.Repeat([]byte{0xaa}, 20)...)
	p, err = c.handshakePayload(payloadRAKP3, rakp3, payloadRAKP4)
	if err != nil {
		t.Fatal(err)
	}
	if p[1] != rmcpStatusInvalidIntegrity {
		t.Fatalf("RAKP 4 status %#x, want %#x", p[1], rmcpStatusInvalidIntegrity)
	}
	if n := len(s.sessions.byID); n != 0 {
		t.Fatalf("%d sessions left", n)
	}
}

func TestHandshakeErrors(t *testing.T) {
	s, _, _ := testServer(t, nil)
	c := newLanplusClient(s, 17, testUser, testPassword)
	tests := []struct {
		name        string
		payloadType byte
		payload     []byte
		replyType   byte
		wantStatus  byte
	}{
		{"open session with OEM role", payloadOpenSessionRequest, openSessionRequest(9, 5, c.suite), payloadOpenSessionResponse, rmcpStatusInvalidRole},
		{"open session with console ID 0", payloadOpenSessionRequest, openSessionRequest(0, 0, c.suite), payloadOpenSessionResponse, rmcpStatusInvalidSessionID},
		{"open session with swapped records", payloadOpenSessionRequest, func() []byte {
			p := openSessionRequest(9, 0, c.suite)
			p[8], p[16] = 0x01, 0x00
			return p
		}(), payloadOpenSessionResponse, rmcpStatusIllegalParameter},
		{"RAKP 1 for unknown session", payloadRAKP1, rakp1Request(0x1234, make([]byte, 16), 0x14, c.username), payloadRAKP2, rmcpStatusInvalidSessionID},
		{"RAKP 3 for unknown session", payloadRAKP3, append([]byte{3, 0, 0, 0}, le32(0x1234)...), payloadRAKP4, rmcpStatusInvalidSessionID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := c.handshakePayload(tt.payloadType, tt.payload, tt.replyType)
			if err != nil {
				t.Fatal(err)
			}
			if p[1] != tt.wantStatus || len(p) != 8 {
				t.Fatalf("reply % x, want status %#x in an 8-byte error reply", p, tt.wantStatus)
			}
		})
	}
	if n := len(s.sessions.byID); n != 0 {
		t.Fatalf("%d sessions left", n)
	}
}

func TestRAKP1Refusals(t *testing.T) {
	tests := []struct {
		name       string
		openPriv   byte
		role       byte
		username   []byte
		wantStatus byte
	}{
		{"role above open session maximum", 0x02, 0x14, []byte(testUser), rmcpStatusUnauthorizedRole},
		{"invalid role", 0, 0x10, []byte(testUser), rmcpStatusInvalidRole},
		{"name too long", 0, 0x14, bytes.Repeat([]byte("x"), 17), rmcpStatusInvalidNameLength},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := testServer(t, nil)
			c := newLanplusClient(s, 17, testUser, testPassword)
			p, err := c.handshakePayload(payloadOpenSessionRequest, openSessionRequest(5, tt.openPriv, c.suite), payloadOpenSessionResponse)
			if err != nil {
				t.Fatal(err)
			}
			p, err = c.handshakePayload(payloadRAKP1, rakp1Request(binary.LittleEndian.Uint32(p[8:]), make([]byte, 16), tt.role, tt.username), payloadRAKP2)
			if err != nil {
				t.Fatal(err)
			}
			if p[1] != tt.wantStatus {
				t.Fatalf("RAKP 2 status %#x, want %#x", p[1], tt.wantStatus)
			}
			if n := len(s.sessions.byID); n != 0 {
				t.Fatalf("%d sessions left", n)
			}
		})
	}
}

func TestPrivilegeEnforced(t *testing.T) {
	tests := []struct {
		name     string
		role     privilege // RAKP 1 maximum
		setPriv  byte      // Set Session Privilege Level request, 0 = none
		wantSet  byte      // its completion code
		netFn    byte
		cmd      byte
		data     []byte
		wantCode byte
	}{
		{"user cannot power on", privAdmin, 0, 0, netFnChassis, cmdChassisControl, []byte{1}, ccInsufficientPrivilege},
		{"user reads chassis status", privAdmin, 0, 0, netFnChassis, cmdGetChassisStatus, nil, ccOK},
		{"user cannot read boot options", privUser, 0, 0, netFnChassis, cmdGetSystemBootOptions, []byte{5, 0, 0}, ccInsufficientPrivilege},
		{"operator powers on", privAdmin, byte(privOperator), ccOK, netFnChassis, cmdChassisControl, []byte{1}, ccOK},
		{"operator sets boot flags", privOperator, byte(privOperator), ccOK, netFnChassis, cmdSetSystemBootOptions, []byte{5, 0x80, 0x04, 0, 0, 0}, ccOK},
		{"user-limited session cannot rise", privUser, byte(privOperator), 0x81, netFnChassis, cmdChassisControl, []byte{1}, ccInsufficientPrivilege},
		{"OEM level refused", privAdmin, 5, 0x80, netFnApp, cmdGetDeviceID, nil, ccOK},
		{"callback level refused", privAdmin, 1, ccInvalidField, netFnApp, cmdGetDeviceID, nil, ccOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := testServer(t, nil)
			c := newLanplusClient(s, 17, testUser, testPassword)
			if err := c.connect(0, 0x10|byte(tt.role)); err != nil {
				t.Fatal(err)
			}
			if tt.setPriv != 0 {
				if cc, _, err := c.command(netFnApp, cmdSetSessionPrivilegeLevel, tt.setPriv); err != nil || cc != tt.wantSet {
					t.Fatalf("Set Session Privilege Level: cc %#x, err %v, want %#x", cc, err, tt.wantSet)
				}
			}
			if cc, _, err := c.command(tt.netFn, tt.cmd, tt.data...); err != nil || cc != tt.wantCode {
				t.Fatalf("cc %#x, err %v, want %#x", cc, err, tt.wantCode)
			}
		})
	}
}

func TestReplayAndTamperingDropped(t *testing.T) {
	s, m, _ := testServer(t, nil)
	c := newLanplusClient(s, 17, testUser, testPassword)
	c.login(t, privOperator)
	cycle := c.sessionPacket(netFnChassis, cmdChassisControl, []byte{0x02})
	if _, err := c.exchange(cycle); err != nil {
		t.Fatalf("first power cycle: %v", err)
	}
	if _, err := c.exchange(cycle); !errors.Is(err, errNoReply) {
		t.Fatalf("replayed packet answered: %v", err)
	}
	if boots := m.Boots(); len(boots) != 1 {
		t.Fatalf("boots %v: the replay must not power-cycle again", boots)
	}

	tests := []struct {
		name   string
		mangle func(p []byte) []byte
	}{
		{"flipped payload bit", func(p []byte) []byte { p[20] ^= 1; return p }},
		{"flipped auth code bit", func(p []byte) []byte { p[len(p)-1] ^= 1; return p }},
		{"truncated trailer", func(p []byte) []byte { return p[:len(p)-3] }},
		{"unencrypted in an encrypted session", func(p []byte) []byte { p[5] &^= payloadEncrypted; return p }},
		{"sequence far ahead", func(p []byte) []byte {
			c.seq += 100
			return c.sessionPacket(netFnChassis, cmdChassisControl, []byte{0x02})
		}},
		{"sequence zero", func(p []byte) []byte {
			c.seq = 0xffffffff
			return c.sessionPacket(netFnChassis, cmdChassisControl, []byte{0x02})
		}},
		{"other remote", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			saved := c.seq
			pkt := c.sessionPacket(netFnChassis, cmdChassisControl, []byte{0x02})
			var reply []byte
			if tt.mangle == nil {
				reply = s.handlePacket(context.Background(), pkt, "127.0.0.1:40002")
			} else {
				reply = s.handlePacket(context.Background(), tt.mangle(pkt), testRemote)
			}
			if reply != nil {
				t.Fatalf("mangled packet answered")
			}
			c.seq = saved + 1
		})
	}
	if boots := m.Boots(); len(boots) != 1 {
		t.Fatalf("boots %v after dropped packets", boots)
	}
	// The session survives the garbage and still accepts fresh packets,
	// including one slightly out of order.
	late := c.sessionPacket(netFnApp, cmdGetDeviceID, nil)
	c.mustCommand(t, netFnApp, cmdGetDeviceID)
	if _, err := c.exchange(late); err != nil {
		t.Fatalf("late packet inside the window: %v", err)
	}
}

func TestSeqWindow(t *testing.T) {
	var w seqWindow
	w.startAt(100)
	steps := []struct {
		seq  uint32
		want bool
	}{
		{99, false}, {100, true}, {100, false}, {102, true}, {101, true}, {101, false},
		{118, true}, {135, false}, {103, true}, {102, false}, {118 - 16, false}, {0, false},
	}
	for i, st := range steps {
		if got := w.accept(st.seq); got != st.want {
			t.Fatalf("step %d: accept(%d) = %v, want %v", i, st.seq, got, st.want)
		}
	}
	var wrap seqWindow
	wrap.startAt(0xfffffffe)
	for _, seq := range []uint32{0xfffffffe, 0xffffffff, 1, 2} {
		if !wrap.accept(seq) {
			t.Fatalf("window refused %#x across the wrap", seq)
		}
	}
}

func TestSessionTimeout(t *testing.T) {
	s, _, clock := testServer(t, func(c *Config) { c.SessionTimeout = 30 * time.Second })
	c := newLanplusClient(s, 17, testUser, testPassword)
	c.login(t, privUser)
	clock.advance(29 * time.Second)
	c.mustCommand(t, netFnApp, cmdGetDeviceID) // activity restarts the timer
	clock.advance(29 * time.Second)
	c.mustCommand(t, netFnApp, cmdGetDeviceID)
	clock.advance(31 * time.Second)
	if _, _, err := c.command(netFnApp, cmdGetDeviceID); !errors.Is(err, errNoReply) {
		t.Fatalf("expired session answered: %v", err)
	}
	if n := len(s.sessions.byID); n != 0 {
		t.Fatalf("%d sessions after timeout", n)
	}

	// An unfinished handshake holds its slot for at most maxHandshakeTime.
	p, err := c.handshakePayload(payloadOpenSessionRequest, openSessionRequest(3, 0, c.suite), payloadOpenSessionResponse)
	if err != nil || p[1] != rmcpStatusOK {
		t.Fatalf("open session: % x, %v", p, err)
	}
	clock.advance(maxHandshakeTime + time.Second)
	sessionless(s, testRemote, netFnApp, cmdGetChannelAuthCaps, 0x8e, 4)
	if n := len(s.sessions.byID); n != 0 {
		t.Fatalf("%d sessions after the handshake timed out", n)
	}
}

func TestSessionTableBounded(t *testing.T) {
	s, _, _ := testServer(t, func(c *Config) { c.MaxSessions = 2 })
	a := newLanplusClient(s, 17, testUser, testPassword)
	a.login(t, privAdmin)

	// Handshakes never crowd out active sessions: the oldest one gives
	// way to the newest.
	for i := range 5 {
		p, err := a.handshakePayload(payloadOpenSessionRequest, openSessionRequest(uint32(100+i), 0, a.suite), payloadOpenSessionResponse)
		if err != nil || p[1] != rmcpStatusOK {
			t.Fatalf("handshake %d: % x, %v", i, p, err)
		}
	}
	if n := len(s.sessions.byID); n != 2 {
		t.Fatalf("%d sessions in a table of 2", n)
	}
	b := newLanplusClient(s, 17, testUser, testPassword)
	b.remote = "127.0.0.1:40003"
	b.login(t, privUser)

	c := newLanplusClient(s, 17, testUser, testPassword)
	var se rmcpStatusError
	if err := c.connect(0, 0x14); !errors.As(err, &se) || se.status != rmcpStatusNoResources {
		t.Fatalf("third session: %v, want status %#x", err, rmcpStatusNoResources)
	}
	if cc, _, _ := sessionless(s, "127.0.0.1:40004", netFnApp, cmdGetSessionChallenge, append([]byte{authTypeMD5}, pad16(testUser)...)...); cc != ccNodeBusy {
		t.Fatalf("challenge with a full table: cc %#x, want %#x", cc, ccNodeBusy)
	}

	// Get Session Info sees both; a USER session cannot close another
	// one, an ADMINISTRATOR can.
	info := a.mustCommand(t, netFnApp, cmdGetSessionInfo, 0)
	if info[1] != 2 || info[2] != 2 || info[4] != byte(privAdmin) || info[5] != 0x11 {
		t.Fatalf("session info % x", info)
	}
	if cc, _, _ := b.command(netFnApp, cmdCloseSession, le32(a.bmcID)...); cc != ccInsufficientPrivilege {
		t.Fatalf("USER closing another session: cc %#x", cc)
	}
	handle := b.mustCommand(t, netFnApp, cmdGetSessionInfo, 0)[0]
	a.mustCommand(t, netFnApp, cmdCloseSession, append(le32(0), handle)...)
	if _, _, err := b.command(netFnApp, cmdGetDeviceID); !errors.Is(err, errNoReply) {
		t.Fatalf("closed session answered: %v", err)
	}
	if cc, _, _ := a.command(netFnApp, cmdCloseSession, le32(12345)...); cc != 0x87 {
		t.Fatalf("closing an unknown session: cc %#x", cc)
	}
}

func pad16(s string) []byte {
	b := make([]byte, 16)
	copy(b, s)
	return b
}

func TestOutOfSessionPackets(t *testing.T) {
	s, m, _ := testServer(t, nil)
	tests := []struct {
		name   string
		pkt    []byte
		wantCC int // -1: dropped
	}{
		{"sessionless chassis control", encodeV15(v15Header{}, encodeRequest(netFnChassis, cmdChassisControl, 1, []byte{1})), ccInsufficientPrivilege},
		{"sessionless RMCP+ chassis control", sessionKeys{}.seal(payloadIPMI, 0, 0, encodeRequest(netFnChassis, cmdChassisControl, 1, []byte{1})), ccInsufficientPrivilege},
		{"sessionless activate session", encodeV15(v15Header{}, encodeRequest(netFnApp, cmdActivateSession, 1, make([]byte, 22))), ccInvalidState},
		{"unknown 1.5 session", encodeV15(v15Header{authType: authTypeMD5, sessionID: 77, seq: 1}, encodeRequest(netFnApp, cmdGetDeviceID, 1, nil)), -1},
		{"unknown RMCP+ session", sessionKeys{}.seal(payloadIPMI, 77, 1, encodeRequest(netFnApp, cmdGetDeviceID, 1, nil)), -1},
		{"authenticated packet without session", encodeV15(v15Header{authType: authTypeMD5}, encodeRequest(netFnApp, cmdGetDeviceID, 1, nil)), -1},
		{"RMCP+ SOL payload without session", sessionKeys{}.seal(0x01, 0, 0, []byte{1, 2, 3, 4}), -1},
		{"bad checksum", func() []byte {
			msg := encodeRequest(netFnApp, cmdGetDeviceID, 1, nil)
			msg[2]++
			return encodeV15(v15Header{}, msg)
		}(), -1},
		{"RMCP ACK class", []byte{6, 0, 0xff, 0x87}, -1},
		{"RMCP version 1.0", []byte{4, 0, 0xff, 0x07, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, -1},
		{"ASF non-ping", []byte{6, 0, 0xff, 6, 0, 0, 0x11, 0xbe, 0x40, 0, 0, 0}, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reply := s.handlePacket(context.Background(), tt.pkt, testRemote)
			if tt.wantCC < 0 {
				if reply != nil {
					t.Fatalf("answered % x", reply)
				}
				return
			}
			if reply == nil {
				t.Fatal("no reply")
			}
			raw := reply[len(reply)-8:]
			if reply[4] == authTypeRMCPPlus {
				raw = reply[16:]
			}
			cc, _, err := decodeResponse(raw)
			if err != nil || int(cc) != tt.wantCC {
				t.Fatalf("cc %#x, err %v, want %#x", cc, err, tt.wantCC)
			}
		})
	}
	if st, _ := m.PowerState(context.Background()); st != machine.PowerOff {
		t.Fatalf("power state %s: out-of-session packets changed the machine", st)
	}
	if n := len(s.sessions.byID); n != 0 {
		t.Fatalf("%d sessions", n)
	}
}

func TestAppCommands(t *testing.T) {
	s, m, _ := testServer(t, func(c *Config) { c.CipherSuites = []uint8{17, 3} })
	c := newLanplusClient(s, 17, testUser, testPassword)
	c.login(t, privAdmin)
	inv, _ := m.Inventory(context.Background())
	uuid, _ := guidFromUUID(inv.UUID)
	tests := []struct {
		name   string
		netFn  byte
		cmd    byte
		data   []byte
		wantCC byte
		want   []byte
	}{
		{"device ID", netFnApp, cmdGetDeviceID, nil, ccOK, []byte{0x20, 1, 1, 0, 2, 0x80, 0, 0, 0, 0, 0}},
		{"self test", netFnApp, cmdGetSelfTestResults, nil, ccOK, []byte{0x55, 0}},
		{"system GUID", netFnApp, cmdGetSystemGUID, nil, ccOK, uuid[:]},
		{"auth caps v2", netFnApp, cmdGetChannelAuthCaps, []byte{0x8e, 4}, ccOK, []byte{1, 0x84, 0x04, 0x03, 0, 0, 0, 0}},
		{"auth caps v1.5", netFnApp, cmdGetChannelAuthCaps, []byte{0x01, 2}, ccOK, []byte{1, 0x04, 0x04, 0, 0, 0, 0, 0}},
		{"auth caps other channel", netFnApp, cmdGetChannelAuthCaps, []byte{0x02, 2}, ccInvalidField, nil},
		{"cipher suites by suite", netFnApp, cmdGetChannelCipherSuites, []byte{0x0e, 0, 0x80}, ccOK, []byte{1, 0xc0, 17, 3, 0x44, 0x81, 0xc0, 3, 1, 0x41, 0x81}},
		{"cipher suites index 1", netFnApp, cmdGetChannelCipherSuites, []byte{0x0e, 0, 0x81}, ccOK, []byte{1}},
		{"algorithms", netFnApp, cmdGetChannelCipherSuites, []byte{0x0e, 0, 0}, ccOK, []byte{1, 3, 0x44, 0x81, 1, 0x41}},
		{"cipher suites of SOL", netFnApp, cmdGetChannelCipherSuites, []byte{0x0e, 1, 0x80}, ccInvalidField, nil},
		{"current privilege", netFnApp, cmdSetSessionPrivilegeLevel, []byte{0}, ccOK, []byte{4}},
		{"session info by index", netFnApp, cmdGetSessionInfo, []byte{1}, ccOK, []byte{1, 32, 1, 2, 4, 0x11, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x41, 0x9c}},
		{"session info by ID", netFnApp, cmdGetSessionInfo, append([]byte{0xfe}, le32(c.bmcID)...), ccOK, []byte{1, 32, 1, 2, 4, 0x11, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x41, 0x9c}},
		{"session info of absent session", netFnApp, cmdGetSessionInfo, []byte{0xff, 9}, ccOK, []byte{0, 32, 1}},
		{"unknown command", netFnApp, 0x99, nil, ccInvalidCommand, nil},
		{"unknown network function", 0x0a, 0x10, nil, ccInvalidCommand, nil},
		{"extra data", netFnApp, cmdGetDeviceID, []byte{1}, ccRequestLength, nil},
		{"short auth caps", netFnApp, cmdGetChannelAuthCaps, []byte{0x8e}, ccRequestLength, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cc, got, err := c.command(tt.netFn, tt.cmd, tt.data...)
			if err != nil || cc != tt.wantCC || !bytes.Equal(got, tt.want) {
				t.Fatalf("cc %#x data % x (err %v), want cc %#x data % x", cc, got, err, tt.wantCC, tt.want)
			}
		})
	}
	t.Run("wrong LUN", func(t *testing.T) {
		msg := encodeRequest(netFnApp, cmdGetDeviceID, 1, nil)
		msg[1] |= 1
		msg[2] = checksum(msg[:2])
		c.seq++
		cc, _, err := c.openReply(s.handlePacket(context.Background(), c.keys.seal(payloadIPMI, c.bmcID, c.seq, msg), testRemote))
		if err != nil || cc != ccInvalidLUN {
			t.Fatalf("cc %#x, err %v", cc, err)
		}
	})
}

func TestGUIDByteOrder(t *testing.T) {
	got, err := guidFromUUID("01234567-89ab-cdef-0011-223344556677")
	want := [16]byte{0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x00, 0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01}
	if err != nil || got != want {
		t.Fatalf("guid % x (%v), want % x", got, err, want)
	}
	if _, err := guidFromUUID("not-a-uuid"); err == nil {
		t.Fatal("accepted a malformed UUID")
	}
}

func TestChassisControl(t *testing.T) {
	tests := []struct {
		name      string
		startOn   bool
		control   byte
		wantCC    byte
		wantState machine.PowerState
		wantBoots int
	}{
		{"power down", true, 0x00, ccOK, machine.PowerOff, 1},
		{"power up", false, 0x01, ccOK, machine.PowerOn, 1},
		{"power cycle", true, 0x02, ccOK, machine.PowerOn, 2},
		{"hard reset", true, 0x03, ccOK, machine.PowerOn, 2},
		{"NMI while on", true, 0x04, ccOK, machine.PowerOn, 1},
		{"NMI while off", false, 0x04, ccInvalidState, machine.PowerOff, 0},
		{"soft shutdown", true, 0x05, ccOK, machine.PowerOff, 1},
		{"unknown control", true, 0x06, ccInvalidField, machine.PowerOn, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, m, _ := testServer(t, nil)
			if tt.startOn {
				m.Reset(context.Background(), machine.ResetOn)
			}
			c := newLanplusClient(s, 3, testUser, testPassword)
			c.login(t, privOperator)
			if cc, _, err := c.command(netFnChassis, cmdChassisControl, tt.control); err != nil || cc != tt.wantCC {
				t.Fatalf("cc %#x, err %v, want %#x", cc, err, tt.wantCC)
			}
			if st, _ := m.PowerState(context.Background()); st != tt.wantState {
				t.Fatalf("state %s, want %s", st, tt.wantState)
			}
			if n := len(m.Boots()); n != tt.wantBoots {
				t.Fatalf("%d boots, want %d", n, tt.wantBoots)
			}
			wantBit := byte(0)
			if tt.wantState == machine.PowerOn {
				wantBit = 1
			}
			if got := c.mustCommand(t, netFnChassis, cmdGetChassisStatus); got[0]&1 != wantBit {
				t.Fatalf("chassis status % x for %s", got, tt.wantState)
			}
		})
	}
}

func TestChassisControlNotSupported(t *testing.T) {
	s, m, _ := testServer(t, nil)
	caps := m.Capabilities()
	caps.ResetTypes = slices.DeleteFunc(caps.ResetTypes, func(r machine.ResetType) bool { return r == machine.ResetNmi })
	s.machine = limitedMachine{m, caps}
	m.Reset(context.Background(), machine.ResetOn)
	c := newLanplusClient(s, 3, testUser, testPassword)
	c.login(t, privOperator)
	if cc, _, _ := c.command(netFnChassis, cmdChassisControl, 0x04); cc != ccInvalidField {
		t.Fatalf("NMI without capability: cc %#x, want %#x", cc, ccInvalidField)
	}
}

func TestMachineErrorsMapped(t *testing.T) {
	tests := []struct {
		fault error
		want  byte
	}{
		{machine.Errorf(machine.ErrUnavailable, "apiserver down"), ccNodeBusy},
		{machine.Errorf(machine.ErrNotSupported, "x"), ccInvalidField},
		{machine.Errorf(machine.ErrInvalidArgument, "x"), ccInvalidField},
		{machine.Errorf(machine.ErrConflict, "x"), ccInvalidState},
		{machine.Errorf(machine.ErrNotFound, "vm gone"), ccNotPresent},
		{errors.New("surprise"), ccUnspecified},
	}
	for _, tt := range tests {
		t.Run(tt.fault.Error(), func(t *testing.T) {
			if got := completionCode(tt.fault); got != tt.want {
				t.Fatalf("completionCode = %#x, want %#x", got, tt.want)
			}
			s, m, _ := testServer(t, nil)
			c := newLanplusClient(s, 17, testUser, testPassword)
			c.login(t, privOperator)
			m.SetFault(tt.fault)
			for _, req := range [][]byte{
				{netFnChassis, cmdGetChassisStatus},
				{netFnChassis, cmdChassisControl, 1},
				{netFnChassis, cmdGetSystemBootOptions, 5, 0, 0},
				{netFnChassis, cmdSetSystemBootOptions, 5, 0x80, 0x04, 0, 0, 0},
			} {
				if cc, _, err := c.command(req[0], req[1], req[2:]...); err != nil || cc != tt.want {
					t.Fatalf("command % x: cc %#x, err %v, want %#x", req[:2], cc, err, tt.want)
				}
			}
			m.SetFault(nil)
			c.mustCommand(t, netFnChassis, cmdGetChassisStatus)
		})
	}
	if completionCode(nil) != ccOK {
		t.Fatal("nil error must complete normally")
	}
}

func TestBootFlags(t *testing.T) {
	pxeOnce := machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce, Mode: machine.BootModeUEFI}
	tests := []struct {
		name     string
		flags    []byte // parameter 5 data
		uefiOnly bool   // the machine cannot boot Legacy
		wantCC   byte
		want     machine.BootOverride
		readOut  []byte // parameter 5 read back
	}{
		{"PXE once EFI", []byte{0xa0, 0x04, 0, 0, 0}, false, ccOK, pxeOnce, []byte{0xa0, 0x04, 0, 0, 0}},
		{"disk persistent, PC-compatible keeps the firmware", []byte{0xc0, 0x08, 0, 0, 0}, false, ccOK,
			machine.BootOverride{Target: machine.BootHdd, Enabled: machine.BootContinuous, Mode: machine.BootModeUEFI}, []byte{0xe0, 0x08, 0, 0, 0}},
		{"CD once", []byte{0xa0, 0x14, 0, 0, 0}, false, ccOK,
			machine.BootOverride{Target: machine.BootCd, Enabled: machine.BootOnce, Mode: machine.BootModeUEFI}, []byte{0xa0, 0x14, 0, 0, 0}},
		{"no override", []byte{0xa0, 0x00, 0, 0, 0}, false, ccOK,
			machine.BootOverride{Target: machine.BootNone, Enabled: machine.BootDisabled, Mode: machine.BootModeUEFI}, []byte{0x20, 0, 0, 0, 0}},
		{"flags not valid", []byte{0x20, 0x04, 0, 0, 0}, false, ccOK,
			machine.BootOverride{Target: machine.BootNone, Enabled: machine.BootDisabled, Mode: machine.BootModeUEFI}, []byte{0x20, 0, 0, 0, 0}},
		{"legacy asked of a UEFI-only machine", []byte{0x80, 0x04, 0, 0, 0}, true, ccOK,
			machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce, Mode: machine.BootModeUEFI}, []byte{0xa0, 0x04, 0, 0, 0}},
		{"BIOS setup", []byte{0x80, 0x18, 0, 0, 0}, false, ccInvalidField, machine.BootOverride{}, nil},
		{"safe mode disk", []byte{0x80, 0x0c, 0, 0, 0}, false, ccInvalidField, machine.BootOverride{}, nil},
		{"CMOS clear", []byte{0x80, 0x84, 0, 0, 0}, false, ccInvalidField, machine.BootOverride{}, nil},
		{"console redirection", []byte{0x80, 0x04, 0x01, 0, 0}, false, ccInvalidField, machine.BootOverride{}, nil},
		{"short", []byte{0x80, 0x04}, false, ccRequestLength, machine.BootOverride{}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, m, _ := testServer(t, nil)
			if tt.uefiOnly {
				caps := m.Capabilities()
				caps.BootModes = []machine.BootMode{machine.BootModeUEFI}
				s.machine = limitedMachine{m, caps}
			}
			before, _ := m.BootOverride(context.Background())
			c := newLanplusClient(s, 17, testUser, testPassword)
			c.login(t, privOperator)
			cc, _, err := c.command(netFnChassis, cmdSetSystemBootOptions, append([]byte{5}, tt.flags...)...)
			if err != nil || cc != tt.wantCC {
				t.Fatalf("set: cc %#x, err %v, want %#x", cc, err, tt.wantCC)
			}
			got, _ := m.BootOverride(context.Background())
			if tt.wantCC != ccOK {
				if got != before {
					t.Fatalf("refused write changed the override to %+v", got)
				}
				return
			}
			if got != tt.want {
				t.Fatalf("override %+v, want %+v", got, tt.want)
			}
			read := c.mustCommand(t, netFnChassis, cmdGetSystemBootOptions, 5, 0, 0)
			if !bytes.Equal(read, append([]byte{1, 5}, tt.readOut...)) {
				t.Fatalf("read back % x, want 01 05 % x", read, tt.readOut)
			}
		})
	}
}

// A Once override lasts one boot, and the boot flags read invalid after it.
func TestBootFlagsConsumedByBoot(t *testing.T) {
	s, m, _ := testServer(t, nil)
	c := newLanplusClient(s, 17, testUser, testPassword)
	c.login(t, privOperator)
	c.mustCommand(t, netFnChassis, cmdSetSystemBootOptions, 5, 0xa0, 0x04, 0, 0, 0)
	c.mustCommand(t, netFnChassis, cmdChassisControl, 0x01)
	if boots := m.Boots(); !slices.Equal(boots, []machine.BootTarget{machine.BootPxe}) {
		t.Fatalf("boots %v, want [Pxe]", boots)
	}
	if read := c.mustCommand(t, netFnChassis, cmdGetSystemBootOptions, 5, 0, 0); read[2]&bootFlagsValid != 0 {
		t.Fatalf("boot flags still valid after the boot: % x", read)
	}
}

func TestBootParameters(t *testing.T) {
	s, _, _ := testServer(t, nil)
	a := newLanplusClient(s, 17, testUser, testPassword)
	a.login(t, privOperator)
	b := newLanplusClient(s, 17, testUser, testPassword)
	b.remote = "127.0.0.1:40005"
	b.login(t, privOperator)

	steps := []struct {
		name   string
		c      *lanplusClient
		cmd    byte
		data   []byte
		wantCC byte
		want   []byte
	}{
		{"set in progress", a, cmdSetSystemBootOptions, []byte{0, 1}, ccOK, nil},
		{"read in progress", b, cmdGetSystemBootOptions, []byte{0, 0, 0}, ccOK, []byte{1, 0, 1}},
		{"second set in progress", b, cmdSetSystemBootOptions, []byte{0, 1}, ccSetInProgressActive, nil},
		{"commit write", a, cmdSetSystemBootOptions, []byte{0, 2}, ccOK, nil},
		{"set complete", a, cmdSetSystemBootOptions, []byte{0, 0}, ccOK, nil},
		{"free again", b, cmdSetSystemBootOptions, []byte{0, 1}, ccOK, nil},
		{"reserved progress value", b, cmdSetSystemBootOptions, []byte{0, 3}, ccInvalidField, nil},
		{"valid bit clearing", a, cmdSetSystemBootOptions, []byte{3, 0x1f}, ccOK, nil},
		{"read valid bit clearing", a, cmdGetSystemBootOptions, []byte{3, 0, 0}, ccOK, []byte{1, 3, 0x1f}},
		{"boot info acknowledge", a, cmdSetSystemBootOptions, []byte{4, 0x01, 0x01}, ccOK, nil},
		{"boot info masked", a, cmdSetSystemBootOptions, []byte{4, 0x02, 0xff}, ccOK, nil},
		{"read boot info", a, cmdGetSystemBootOptions, []byte{4, 0, 0}, ccOK, []byte{1, 4, 0, 0x03}},
		{"service partition", a, cmdSetSystemBootOptions, []byte{1, 7}, ccOK, nil},
		{"read service partition", a, cmdGetSystemBootOptions, []byte{1, 0, 0}, ccOK, []byte{1, 1, 7}},
		{"partition scan", a, cmdSetSystemBootOptions, []byte{2, 3}, ccOK, nil},
		{"read partition scan", a, cmdGetSystemBootOptions, []byte{2, 0, 0}, ccOK, []byte{1, 2, 3}},
		{"locking a parameter", a, cmdSetSystemBootOptions, []byte{0x83, 0}, ccInvalidField, nil},
		{"boot initiator info", a, cmdSetSystemBootOptions, append([]byte{6}, make([]byte, 9)...), ccBootParamUnsupported, nil},
		{"read OEM parameter", a, cmdGetSystemBootOptions, []byte{100, 0, 0}, ccBootParamUnsupported, nil},
		{"read short", a, cmdGetSystemBootOptions, []byte{5}, ccRequestLength, nil},
		{"empty set", a, cmdSetSystemBootOptions, nil, ccRequestLength, nil},
	}
	for _, st := range steps {
		cc, got, err := st.c.command(netFnChassis, st.cmd, st.data...)
		if err != nil || cc != st.wantCC || !bytes.Equal(got, st.want) {
			t.Fatalf("%s: cc %#x data % x (err %v), want cc %#x data % x", st.name, cc, got, err, st.wantCC, st.want)
		}
	}
	// b holds "set in progress"; its session ending releases it.
	b.mustCommand(t, netFnApp, cmdCloseSession, le32(b.bmcID)...)
	if got := a.mustCommand(t, netFnChassis, cmdGetSystemBootOptions, 0, 0, 0); got[2] != setComplete {
		t.Fatalf("set in progress survived its session: % x", got)
	}
}

// Locking the boot flags parameter marks them invalid: no override.
func TestBootFlagsInvalidBit(t *testing.T) {
	s, m, _ := testServer(t, nil)
	c := newLanplusClient(s, 17, testUser, testPassword)
	c.login(t, privOperator)
	c.mustCommand(t, netFnChassis, cmdSetSystemBootOptions, 5, 0xa0, 0x04, 0, 0, 0)
	c.mustCommand(t, netFnChassis, cmdSetSystemBootOptions, 0x85, 0xa0, 0x04, 0, 0, 0)
	if o, _ := m.BootOverride(context.Background()); o.Enabled != machine.BootDisabled {
		t.Fatalf("override %+v after marking the flags invalid", o)
	}
}

func TestIPMI15Sessions(t *testing.T) {
	tests := []struct {
		name          string
		allowPassword bool
		authType      byte
		user, pass    string
		wantCC        byte
		wantDrop      bool
	}{
		{"MD5", false, authTypeMD5, testUser, testPassword, ccOK, false},
		{"straight password when enabled", true, authTypePassword, testUser, testPassword, ccOK, false},
		{"straight password when disabled", false, authTypePassword, testUser, testPassword, ccInvalidField, false},
		{"no authentication", false, authTypeNone, testUser, testPassword, ccInvalidField, false},
		{"wrong user", false, authTypeMD5, "root", testPassword, 0x81, false},
		{"null user", false, authTypeMD5, "", testPassword, 0x82, false},
		{"wrong password", false, authTypeMD5, testUser, "guess", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, m, _ := testServer(t, func(c *Config) { c.AllowStraightPassword = tt.allowPassword })
			c := newV15Client(s, tt.authType, tt.user, tt.pass)
			cc, err := c.connect(privAdmin)
			if tt.wantDrop {
				if !errors.Is(err, errNoReply) {
					t.Fatalf("connect: cc %#x, err %v, want the activation dropped", cc, err)
				}
			} else if err != nil || cc != tt.wantCC {
				t.Fatalf("connect: cc %#x, err %v, want %#x", cc, err, tt.wantCC)
			}
			if tt.wantCC != ccOK || tt.wantDrop {
				if n := len(s.sessions.byID); n != 0 {
					t.Fatalf("failed login left %d sessions", n)
				}
				return
			}
			if cc, _, _ := c.command(netFnChassis, cmdChassisControl, 1); cc != ccInsufficientPrivilege {
				t.Fatalf("power up at USER: cc %#x", cc)
			}
			if cc, _, err := c.command(netFnApp, cmdSetSessionPrivilegeLevel, 4); err != nil || cc != ccOK {
				t.Fatalf("set privilege: cc %#x, err %v", cc, err)
			}
			replay := c.packet(c.seq, netFnChassis, cmdChassisControl, []byte{2})
			c.seq++
			if cc, _, err := c.send(replay); err != nil || cc != ccOK {
				t.Fatalf("power cycle: cc %#x, err %v", cc, err)
			}
			if _, _, err := c.send(replay); !errors.Is(err, errNoReply) {
				t.Fatalf("replay answered: %v", err)
			}
			if n := len(m.Boots()); n != 1 {
				t.Fatalf("%d boots, want 1", n)
			}
			if cc, _, err := c.command(netFnApp, cmdCloseSession, le32(c.sessionID)...); err != nil || cc != ccOK {
				t.Fatalf("close: cc %#x, err %v", cc, err)
			}
			if n := len(s.sessions.byID); n != 0 {
				t.Fatalf("%d sessions after close", n)
			}
		})
	}
}

func TestIPMI15ActivationErrors(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(activate []byte)
		wantCC byte
	}{
		{"privilege above limit", func(a []byte) { a[1] = 5 }, 0x86},
		{"no privilege", func(a []byte) { a[1] = 0 }, ccInvalidField},
		{"wrong challenge", func(a []byte) { a[2] ^= 1 }, ccInvalidField},
		{"other auth type", func(a []byte) { a[0] = authTypePassword }, ccInvalidField},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := testServer(t, nil)
			c := newV15Client(s, authTypeMD5, testUser, testPassword)
			_, out, err := sessionless(s, c.remote, netFnApp, cmdGetSessionChallenge, append([]byte{authTypeMD5}, pad16(testUser)...)...)
			if err != nil {
				t.Fatal(err)
			}
			c.sessionID = binary.LittleEndian.Uint32(out)
			activate := append([]byte{authTypeMD5, 4}, out[4:20]...)
			activate = append(activate, 1, 0, 0, 0)
			tt.edit(activate)
			if cc, _, err := c.send(c.packet(0, netFnApp, cmdActivateSession, activate)); err != nil || cc != tt.wantCC {
				t.Fatalf("cc %#x, err %v, want %#x", cc, err, tt.wantCC)
			}
			if n := len(s.sessions.byID); n != 0 {
				t.Fatalf("refused activation left %d sessions", n)
			}
		})
	}
}

// A password over 16 bytes cannot be used by IPMI 1.5, so 1.5 is not
// offered at all.
func TestLongPasswordDisablesIPMI15(t *testing.T) {
	long := strings.Repeat("p", 20)
	s, _, _ := testServer(t, func(c *Config) { c.Password = long })
	cc, caps, err := sessionless(s, testRemote, netFnApp, cmdGetChannelAuthCaps, 0x8e, 4)
	if err != nil || cc != ccOK || caps[1] != 0x80 || caps[3] != 0x02 {
		t.Fatalf("auth caps % x (cc %#x, %v): want RMCP+ only", caps, cc, err)
	}
	c := newLanplusClient(s, 17, testUser, long)
	c.login(t, privAdmin)
}

func TestServeStopsWithContext(t *testing.T) {
	s, _, _ := testServer(t, nil)
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, conn) }()

	client, err := net.Dial("udp4", conn.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	client.Write([]byte{0x06, 0, 0xff, 0x06, 0, 0, 0x11, 0xbe, 0x80, 1, 0, 0})
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	if n, err := client.Read(buf); err != nil || n != 28 || buf[8] != asfTypePong {
		t.Fatalf("pong over UDP: % x, %v", buf[:n], err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
}

// Every strict prefix of a valid packet is dropped without side effects:
// each layer carries a length or an integrity check that a cut violates.
func TestTruncatedPacketsDropped(t *testing.T) {
	s, m, _ := testServer(t, nil)
	c := newLanplusClient(s, 17, testUser, testPassword)
	c.login(t, privOperator)
	v15 := newV15Client(s, authTypeMD5, testUser, testPassword)
	v15.remote = "127.0.0.1:40006"
	if cc, err := v15.connect(privOperator); err != nil || cc != ccOK {
		t.Fatalf("1.5 connect: cc %#x, %v", cc, err)
	}
	if cc, _, err := v15.command(netFnApp, cmdSetSessionPrivilegeLevel, byte(privOperator)); err != nil || cc != ccOK {
		t.Fatalf("1.5 privilege: cc %#x, %v", cc, err)
	}
	packets := map[string][]byte{
		"presence ping":       {0x06, 0, 0xff, 0x06, 0, 0, 0x11, 0xbe, 0x80, 0x2a, 0, 0},
		"sessionless 1.5":     encodeV15(v15Header{}, encodeRequest(netFnApp, cmdGetChannelAuthCaps, 1, []byte{0x8e, 4})),
		"open session":        sessionKeys{}.seal(payloadOpenSessionRequest, 0, 0, openSessionRequest(5, 0, c.suite)),
		"RAKP 1":              sessionKeys{}.seal(payloadRAKP1, 0, 0, rakp1Request(c.bmcID, make([]byte, 16), 0x14, []byte(testUser))),
		"RAKP 3":              sessionKeys{}.seal(payloadRAKP3, 0, 0, append([]byte{3, 0, 0, 0}, le32(c.bmcID)...)),
		"RMCP+ power cycle":   c.sessionPacket(netFnChassis, cmdChassisControl, []byte{2}),
		"IPMI 1.5 power down": v15.packet(v15.seq, netFnChassis, cmdChassisControl, []byte{0}),
	}
	before := len(s.sessions.byID)
	for name, pkt := range packets {
		t.Run(name, func(t *testing.T) {
			for n := range len(pkt) {
				remote := testRemote
				if strings.HasPrefix(name, "IPMI 1.5") {
					remote = v15.remote
				}
				if reply := s.handlePacket(context.Background(), pkt[:n], remote); reply != nil {
					t.Fatalf("%d-byte prefix answered: % x", n, reply)
				}
			}
		})
	}
	if n := len(s.sessions.byID); n != before {
		t.Fatalf("%d sessions, want %d", n, before)
	}
	if len(m.Boots()) != 0 {
		t.Fatalf("boots %v: a truncated packet reached the machine", m.Boots())
	}
	// The untruncated in-session packets still work: no sequence number
	// was spent on the garbage.
	if cc, _, err := c.openReply(s.handlePacket(context.Background(), packets["RMCP+ power cycle"], testRemote)); err != nil || cc != ccOK {
		t.Fatalf("power cycle after the garbage: cc %#x, %v", cc, err)
	}
	if cc, _, err := v15.send(packets["IPMI 1.5 power down"]); err != nil || cc != ccOK {
		t.Fatalf("1.5 power down after the garbage: cc %#x, %v", cc, err)
	}
}
