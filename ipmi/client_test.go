package ipmi

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
)

// This file is an in-process IPMI client for unit tests, fuzz seeds and the
// benchmark. It drives Server.handlePacket directly, so every exchange is
// deterministic and a dropped packet shows up as a nil reply.

const (
	testUser     = "admin"
	testPassword = "s3cret-pass"
	testRemote   = "127.0.0.1:40001"
)

var errNoReply = errors.New("no reply")

// fakeClock is a settable clock for session timeouts.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

// testServer returns a server over a fresh in-memory machine vm-0.
func testServer(t testing.TB, edit func(*Config)) (*Server, *memory.Machine, *fakeClock) {
	t.Helper()
	clock := &fakeClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	m := memory.New(memory.Options{}).Get("vm-0")
	// IPMI 1.5 on and throttling off, so tests of other features can run
	// many handshakes; the tests of those two set their own.
	cfg := Config{Machine: m, Username: testUser, Password: testPassword, Now: clock.now, EnableV15: true, Limiter: throttle.Unlimited}
	if edit != nil {
		edit(&cfg)
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	return s, m, clock
}

const bmcSlaveAddress = 0x20

// encodeRequest builds an IPMI request message from a remote console
// (software ID 81h) to the BMC.
func encodeRequest(netFn, cmd, rqSeq byte, data []byte) []byte {
	p := []byte{bmcSlaveAddress, netFn << 2}
	p = append(p, checksum(p))
	p = append(p, 0x81, rqSeq<<2, cmd)
	p = append(p, data...)
	return append(p, checksum(p[3:]))
}

// decodeResponse returns the completion code and data of a response message.
func decodeResponse(raw []byte) (byte, []byte, error) {
	m, err := decodeMessage(raw)
	if err != nil {
		return 0, nil, err
	}
	if len(m.data) < 1 {
		return 0, nil, fmt.Errorf("response without completion code")
	}
	return m.data[0], m.data[1:], nil
}

// lanplusClient is an RMCP+ remote console.
type lanplusClient struct {
	srv                *Server
	remote             string
	suite              cipherSuite
	username, password []byte
	consoleID, bmcID   uint32
	keys               sessionKeys
	seq                uint32
	rqSeq              byte
	guid               [16]byte
	// afterOpen, when set, runs between Open Session and RAKP 1, where a
	// flood would evict an unprotected handshake.
	afterOpen func()
	// unsolicited, when set, receives what the BMC sends besides replies
	// (SOL output); a full channel loses the packet, as UDP would.
	unsolicited chan []byte
}

func newLanplusClient(s *Server, suiteID byte, username, password string) *lanplusClient {
	c := &lanplusClient{srv: s, remote: testRemote, username: []byte(username), password: []byte(password)}
	for _, k := range knownCipherSuites {
		if k.id == suiteID {
			c.suite = k
		}
	}
	return c
}

func (c *lanplusClient) exchange(pkt []byte) ([]byte, error) {
	var reply []byte
	if c.unsolicited == nil {
		reply = c.srv.handlePacket(context.Background(), pkt, c.remote)
	} else {
		var afterReply func()
		reply, afterReply = c.srv.handleFrom(context.Background(), pkt, link{remote: c.remote, send: func(p []byte) {
			select {
			case c.unsolicited <- p:
			default:
			}
		}})
		if afterReply != nil {
			afterReply()
		}
	}
	if reply == nil {
		return nil, errNoReply
	}
	return reply, nil
}

// handshakePayload sends a pre-session payload and returns the reply payload.
func (c *lanplusClient) handshakePayload(payloadType byte, payload []byte, wantType byte) ([]byte, error) {
	reply, err := c.exchange(sessionKeys{}.seal(payloadType, 0, 0, payload))
	if err != nil {
		return nil, err
	}
	_, _, body, err := decodeRMCP(reply)
	if err != nil {
		return nil, err
	}
	h, p, _, err := decodeV20(body)
	if err != nil {
		return nil, err
	}
	if h.payloadType != wantType {
		return nil, fmt.Errorf("reply payload type %#x, want %#x", h.payloadType, wantType)
	}
	return p, nil
}

// rmcpStatusError is a handshake refused with an RMCP+ status code.
type rmcpStatusError struct {
	step   string
	status byte
}

func (e rmcpStatusError) Error() string { return fmt.Sprintf("%s: RMCP+ status %#x", e.step, e.status) }

func openSessionRequest(consoleID uint32, maxPriv byte, suite cipherSuite) []byte {
	p := []byte{0x01, maxPriv, 0, 0}
	p = binary.LittleEndian.AppendUint32(p, consoleID)
	p = append(p, 0x00, 0, 0, 8, suite.auth, 0, 0, 0)
	p = append(p, 0x01, 0, 0, 8, suite.integrity, 0, 0, 0)
	return append(p, 0x02, 0, 0, 8, suite.confidentiality, 0, 0, 0)
}

func rakp1Request(bmcID uint32, rm []byte, role byte, username []byte) []byte {
	p := []byte{0x02, 0, 0, 0}
	p = binary.LittleEndian.AppendUint32(p, bmcID)
	p = append(p, rm...)
	p = append(p, role, 0, 0, byte(len(username)))
	return append(p, username...)
}

// connect runs Open Session and RAKP 1-4 asking for role (a privilege with
// the name-only-lookup bit), checking every reply as a console must.
func (c *lanplusClient) connect(openPriv, role byte) error {
	c.consoleID = randomUint32() | 1
	p, err := c.handshakePayload(payloadOpenSessionRequest, openSessionRequest(c.consoleID, openPriv, c.suite), payloadOpenSessionResponse)
	if err != nil {
		return err
	}
	if p[1] != rmcpStatusOK {
		return rmcpStatusError{"open session", p[1]}
	}
	if len(p) != 36 || binary.LittleEndian.Uint32(p[4:]) != c.consoleID {
		return fmt.Errorf("bad open session response % x", p)
	}
	if p[16] != c.suite.auth || p[24] != c.suite.integrity || p[32] != c.suite.confidentiality {
		return fmt.Errorf("server chose algorithms %d/%d/%d", p[16], p[24], p[32])
	}
	c.bmcID = binary.LittleEndian.Uint32(p[8:])
	if c.afterOpen != nil {
		c.afterOpen()
	}

	rm := make([]byte, 16)
	rand.Read(rm)
	p, err = c.handshakePayload(payloadRAKP1, rakp1Request(c.bmcID, rm, role, c.username), payloadRAKP2)
	if err != nil {
		return err
	}
	if p[1] != rmcpStatusOK {
		return rmcpStatusError{"rakp 2", p[1]}
	}
	rc := p[8:24]
	copy(c.guid[:], p[24:40])
	nameInfo := []byte{role, byte(len(c.username))}
	want := rakpHMAC(c.suite.auth, c.password, le32(c.consoleID), le32(c.bmcID), rm, rc, c.guid[:], nameInfo, c.username)
	if !bytes.Equal(p[40:], want) {
		// Tell the BMC, as ipmitool and freeipmi do.
		_, _ = c.handshakePayload(payloadRAKP3, append([]byte{0x03, rmcpStatusInvalidIntegrity, 0, 0}, le32(c.bmcID)...), payloadRAKP4)
		return errors.New("RAKP 2 HMAC invalid (wrong password)")
	}
	rakp3 := append([]byte{0x03, 0, 0, 0}, le32(c.bmcID)...)
	rakp3 = append(rakp3, rakpHMAC(c.suite.auth, c.password, rc, le32(c.consoleID), nameInfo, c.username)...)
	p, err = c.handshakePayload(payloadRAKP3, rakp3, payloadRAKP4)
	if err != nil {
		return err
	}
	if p[1] != rmcpStatusOK {
		return rmcpStatusError{"rakp 4", p[1]}
	}
	sik, keys := deriveKeys(c.suite, c.password, rm, rc, role, c.username)
	if n := rakp4ICVLength(c.suite.auth); n > 0 {
		if want := rakpHMAC(c.suite.auth, sik, rm, le32(c.bmcID), c.guid[:])[:n]; !bytes.Equal(p[8:], want) {
			return errors.New("RAKP 4 integrity check value invalid")
		}
	}
	c.keys = keys
	return nil
}

// sessionPacket builds the next in-session request packet.
func (c *lanplusClient) sessionPacket(netFn, cmd byte, data []byte) []byte {
	c.seq++
	c.rqSeq = (c.rqSeq + 1) & 0x3f
	return c.keys.seal(payloadIPMI, c.bmcID, c.seq, encodeRequest(netFn, cmd, c.rqSeq, data))
}

// openReply checks and decodes an in-session reply.
func (c *lanplusClient) openReply(reply []byte) (byte, []byte, error) {
	_, _, body, err := decodeRMCP(reply)
	if err != nil {
		return 0, nil, err
	}
	h, payload, trailer, err := decodeV20(body)
	if err != nil {
		return 0, nil, err
	}
	if h.sessionID != c.consoleID {
		return 0, nil, fmt.Errorf("reply for session %#x, want %#x", h.sessionID, c.consoleID)
	}
	if h.authenticated && !c.keys.verifyTrailer(body, trailer) {
		return 0, nil, errors.New("reply integrity check failed")
	}
	plain, err := c.keys.open(payload)
	if err != nil {
		return 0, nil, err
	}
	return decodeResponse(plain)
}

func (c *lanplusClient) command(netFn, cmd byte, data ...byte) (byte, []byte, error) {
	reply, err := c.exchange(c.sessionPacket(netFn, cmd, data))
	if err != nil {
		return 0, nil, err
	}
	return c.openReply(reply)
}

// mustCommand fails the test unless the command completes normally.
func (c *lanplusClient) mustCommand(t testing.TB, netFn, cmd byte, data ...byte) []byte {
	t.Helper()
	cc, out, err := c.command(netFn, cmd, data...)
	if err != nil || cc != ccOK {
		t.Fatalf("command %#x/%#x: cc %#x, err %v", netFn, cmd, cc, err)
	}
	return out
}

// login connects with name-only lookup and raises the session to priv.
func (c *lanplusClient) login(t testing.TB, priv privilege) {
	t.Helper()
	if err := c.connect(0, 0x10|byte(priv)); err != nil {
		t.Fatalf("connect: %v", err)
	}
	c.mustCommand(t, netFnApp, cmdSetSessionPrivilegeLevel, byte(priv))
}

// sessionless sends an IPMI 1.5 packet without a session.
func sessionless(s *Server, remote string, netFn, cmd byte, data ...byte) (byte, []byte, error) {
	reply := s.handlePacket(context.Background(), encodeV15(v15Header{}, encodeRequest(netFn, cmd, 1, data)), remote)
	if reply == nil {
		return 0, nil, errNoReply
	}
	_, _, body, err := decodeRMCP(reply)
	if err != nil {
		return 0, nil, err
	}
	_, raw, err := decodeV15(body)
	if err != nil {
		return 0, nil, err
	}
	return decodeResponse(raw)
}

// v15Client is an IPMI 1.5 remote console.
type v15Client struct {
	srv       *Server
	remote    string
	authType  byte
	username  string
	password  [authCodeLength]byte
	sessionID uint32
	seq       uint32
	rqSeq     byte
	replySeq  uint32 // session sequence number of the last reply
}

func newV15Client(s *Server, authType byte, username, password string) *v15Client {
	c := &v15Client{srv: s, remote: testRemote, authType: authType, username: username}
	copy(c.password[:], password)
	return c
}

func (c *v15Client) packet(seq uint32, netFn, cmd byte, data []byte) []byte {
	c.rqSeq = (c.rqSeq + 1) & 0x3f
	msg := encodeRequest(netFn, cmd, c.rqSeq, data)
	h := v15Header{authType: c.authType, seq: seq, sessionID: c.sessionID}
	h.authCode = authCodeV15(c.authType, c.password, c.sessionID, seq, msg)
	return encodeV15(h, msg)
}

func (c *v15Client) send(pkt []byte) (byte, []byte, error) {
	reply := c.srv.handlePacket(context.Background(), pkt, c.remote)
	if reply == nil {
		return 0, nil, errNoReply
	}
	_, _, body, err := decodeRMCP(reply)
	if err != nil {
		return 0, nil, err
	}
	h, raw, err := decodeV15(body)
	if err != nil {
		return 0, nil, err
	}
	c.replySeq = h.seq
	if want := authCodeV15(c.authType, c.password, h.sessionID, h.seq, raw); h.authCode != want {
		return 0, nil, errors.New("reply auth code invalid")
	}
	return decodeResponse(raw)
}

// connect runs Get Session Challenge and Activate Session; the returned
// completion code is that of the failing step.
func (c *v15Client) connect(maxPriv privilege) (byte, error) {
	name := make([]byte, 16)
	copy(name, c.username)
	cc, out, err := sessionless(c.srv, c.remote, netFnApp, cmdGetSessionChallenge, append([]byte{c.authType}, name...)...)
	if err != nil || cc != ccOK {
		return cc, err
	}
	c.sessionID = binary.LittleEndian.Uint32(out)
	activate := append([]byte{c.authType, byte(maxPriv)}, out[4:20]...)
	const initialOutbound = 0x1000
	activate = binary.LittleEndian.AppendUint32(activate, initialOutbound)
	cc, out, err = c.send(c.packet(0, netFnApp, cmdActivateSession, activate))
	if err != nil || cc != ccOK {
		return cc, err
	}
	// freeipmi starts its window at the activation reply's sequence number.
	if c.replySeq != initialOutbound {
		return cc, fmt.Errorf("activation reply has sequence %#x, want the initial outbound %#x", c.replySeq, initialOutbound)
	}
	c.sessionID = binary.LittleEndian.Uint32(out[1:])
	c.seq = binary.LittleEndian.Uint32(out[5:])
	return ccOK, nil
}

func (c *v15Client) command(netFn, cmd byte, data ...byte) (byte, []byte, error) {
	pkt := c.packet(c.seq, netFn, cmd, data)
	c.seq++
	return c.send(pkt)
}

// limitedMachine narrows a machine's capabilities, as a backend without
// some feature would.
type limitedMachine struct {
	*memory.Machine
	caps machine.Capabilities
}

func (l limitedMachine) Capabilities() machine.Capabilities { return l.caps }
