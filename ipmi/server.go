package ipmi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/virtmetal/virtmetal/machine"
)

// Config configures a Server.
type Config struct {
	// Machine is the machine behind this BMC.
	Machine machine.Machine
	// Username and Password are the one account; its maximum privilege is
	// ADMINISTRATOR. An empty Username is the null user. Passwords longer
	// than 16 bytes work with RMCP+ only (IPMI 1.5 has 16-byte passwords).
	Username, Password string
	Logger             logr.Logger

	// CipherSuites are the RMCP+ cipher suite IDs offered, from 0, 1, 2, 3,
	// 15, 16, 17. Empty means 3 and 17; suite 0 (no authentication at
	// all) is offered only when listed here.
	CipherSuites []uint8
	// AllowStraightPassword offers the IPMI 1.5 "straight password"
	// authentication type, which sends the password in clear text.
	AllowStraightPassword bool
	// SessionTimeout ends sessions idle for this long (default 60s).
	SessionTimeout time.Duration
	// MaxSessions bounds the session table, handshakes included
	// (default 32, at most 63).
	MaxSessions int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

const (
	defaultSessionTimeout = 60 * time.Second
	defaultMaxSessions    = 32
	// maxSessionsLimit: Get Session Info reports counts in six bits.
	maxSessionsLimit     = 63
	maxUsernameLength    = 16
	maxPasswordLength    = 20
	maxV15PasswordLength = 16
	// maxHandshakeTime bounds how long an unfinished handshake holds a slot.
	maxHandshakeTime = 10 * time.Second
	// maxPacketSize is well above the largest IPMI LAN packet.
	maxPacketSize = 1024
)

var defaultCipherSuites = []uint8{3, 17}

// Server is the BMC of one machine. It is safe for concurrent use.
type Server struct {
	machine   machine.Machine
	username  []byte
	password  []byte
	log       logr.Logger
	suites    []cipherSuite
	v15Auth   []byte // IPMI 1.5 auth types offered
	timeout   time.Duration
	handshake time.Duration
	now       func() time.Time

	// mu serialises packets: sessions, boot parameters and the cached GUID
	// change only under it.
	mu       sync.Mutex
	sessions *sessionTable
	boot     bootParameters
	guid     *[16]byte
}

// NewServer validates cfg and returns a server with no sessions.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Machine == nil {
		return nil, errors.New("ipmi: Config.Machine is required")
	}
	if len(cfg.Username) > maxUsernameLength || slices.Contains([]byte(cfg.Username), 0) {
		return nil, fmt.Errorf("ipmi: username must be at most %d bytes without NUL", maxUsernameLength)
	}
	if len(cfg.Password) > maxPasswordLength {
		return nil, fmt.Errorf("ipmi: password must be at most %d bytes", maxPasswordLength)
	}
	s := &Server{
		machine:  cfg.Machine,
		username: []byte(cfg.Username),
		password: []byte(cfg.Password),
		log:      cfg.Logger,
		timeout:  cfg.SessionTimeout,
		now:      cfg.Now,
	}
	ids := cfg.CipherSuites
	if len(ids) == 0 {
		ids = defaultCipherSuites
	}
	for _, id := range ids {
		i := slices.IndexFunc(knownCipherSuites, func(c cipherSuite) bool { return c.id == id })
		if i < 0 {
			return nil, fmt.Errorf("ipmi: cipher suite %d is not supported", id)
		}
		if !slices.Contains(s.suites, knownCipherSuites[i]) {
			s.suites = append(s.suites, knownCipherSuites[i])
		}
	}
	if len(cfg.Password) <= maxV15PasswordLength {
		s.v15Auth = append(s.v15Auth, authTypeMD5)
		if cfg.AllowStraightPassword {
			s.v15Auth = append(s.v15Auth, authTypePassword)
		}
	}
	if s.timeout == 0 {
		s.timeout = defaultSessionTimeout
	}
	if s.timeout < 0 {
		return nil, errors.New("ipmi: SessionTimeout must be positive")
	}
	s.handshake = min(s.timeout, maxHandshakeTime)
	maxSessions := cfg.MaxSessions
	if maxSessions == 0 {
		maxSessions = defaultMaxSessions
	}
	if maxSessions < 1 || maxSessions > maxSessionsLimit {
		return nil, fmt.Errorf("ipmi: MaxSessions must be between 1 and %d", maxSessionsLimit)
	}
	s.sessions = newSessionTable(maxSessions)
	if s.now == nil {
		s.now = time.Now
	}
	return s, nil
}

// Serve answers packets on conn until ctx is done, then returns nil. It
// does not close conn. A read error other than the shutdown is returned.
func (s *Server) Serve(ctx context.Context, conn net.PacketConn) error {
	// Unblock the read below when ctx ends.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	buf := make([]byte, maxPacketSize)
	for {
		n, addr, err := conn.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("ipmi: read: %w", err)
		}
		reply := s.handlePacket(ctx, buf[:n], addr.String())
		if reply == nil {
			continue
		}
		if _, err := conn.WriteTo(reply, addr); err != nil {
			s.log.Error(err, "cannot send reply", "remote", addr.String())
		}
	}
}

// handlePacket answers one datagram from remote; nil means no answer.
func (s *Server) handlePacket(ctx context.Context, pkt []byte, remote string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for _, sess := range s.sessions.expired(now, s.timeout, s.handshake) {
		s.endSession(sess, "timed out")
	}
	reply, err := s.route(ctx, pkt, remote, now)
	if err != nil {
		s.log.V(1).Info("dropped packet", "remote", remote, "reason", err.Error())
		return nil
	}
	return reply
}

func (s *Server) route(ctx context.Context, pkt []byte, remote string, now time.Time) ([]byte, error) {
	class, seq, body, err := decodeRMCP(pkt)
	if err != nil {
		return nil, err
	}
	switch class {
	case rmcpClassASF:
		tag, err := decodeASFPing(body)
		if err != nil {
			return nil, err
		}
		return encodeASFPong(seq, tag), nil
	case rmcpClassIPMI:
		if len(body) > 0 && body[0] == authTypeRMCPPlus {
			return s.handleV20(ctx, body, remote, now)
		}
		return s.handleV15(ctx, body, remote, now)
	}
	return nil, malformed("RMCP class %#x", class)
}

// handleV15 answers an IPMI 1.5 packet: sessionless, the Activate Session
// of a challenged session, or a message inside an active 1.5 session.
func (s *Server) handleV15(ctx context.Context, body []byte, remote string, now time.Time) ([]byte, error) {
	h, raw, err := decodeV15(body)
	if err != nil {
		return nil, err
	}
	msg, err := decodeMessage(raw)
	if err != nil {
		return nil, err
	}
	if h.sessionID == 0 {
		if h.authType != authTypeNone {
			return nil, errors.New("authenticated IPMI 1.5 packet without a session")
		}
		reply, _ := s.dispatch(ctx, &request{msg: msg, remote: remote, now: now})
		return encodeV15(v15Header{}, reply), nil
	}
	sess := s.sessions.byID[h.sessionID]
	if sess == nil || sess.v2 || sess.remote != remote {
		return nil, fmt.Errorf("no IPMI 1.5 session %#x for this remote", h.sessionID)
	}
	if h.authType != sess.authType {
		return nil, fmt.Errorf("auth type %#x, session uses %#x", h.authType, sess.authType)
	}
	want := authCodeV15(sess.authType, s.password16(), h.sessionID, h.seq, raw)
	if !equalConstantTime(want[:], h.authCode[:]) {
		if sess.state == stateChallenged {
			s.endSession(sess, "wrong password")
		}
		return nil, errors.New("IPMI 1.5 auth code mismatch")
	}
	if sess.state == stateChallenged {
		if h.seq != 0 || msg.netFn != netFnApp || msg.cmd != cmdActivateSession {
			return nil, errors.New("challenged session expects Activate Session with sequence 0")
		}
		cc, data := s.activateSession(sess, msg)
		if cc != ccOK {
			reply := s.sealV15(sess, 0, msg.encodeResponse(cc, data))
			s.endSession(sess, "activation refused")
			return reply, nil
		}
		// The reply is the first packet of the session: freeipmi takes
		// its sequence number as the start of the BMC's sequence.
		return s.sealV15(sess, sess.nextOutSeq(), msg.encodeResponse(cc, data)), nil
	}
	if !sess.in.accept(h.seq) {
		return nil, fmt.Errorf("sequence number %d replayed or outside the window", h.seq)
	}
	sess.lastSeen = now
	r := &request{sess: sess, msg: msg, remote: remote, now: now}
	reply, end := s.dispatch(ctx, r)
	out := s.sealV15(sess, sess.nextOutSeq(), reply)
	if end {
		s.endSession(sess, "closed")
	}
	return out, nil
}

func (s *Server) sealV15(sess *session, seq uint32, msg []byte) []byte {
	h := v15Header{authType: sess.authType, seq: seq, sessionID: sess.id}
	h.authCode = authCodeV15(sess.authType, s.password16(), sess.id, seq, msg)
	return encodeV15(h, msg)
}

func (s *Server) password16() [authCodeLength]byte {
	var p [authCodeLength]byte
	copy(p[:], s.password)
	return p
}

// handleV20 answers an RMCP+ packet: a handshake message, a sessionless
// IPMI message, or a message inside an active RMCP+ session.
func (s *Server) handleV20(ctx context.Context, body []byte, remote string, now time.Time) ([]byte, error) {
	h, payload, trailer, err := decodeV20(body)
	if err != nil {
		return nil, err
	}
	if h.sessionID == 0 {
		if h.encrypted || h.authenticated {
			return nil, errors.New("protected RMCP+ payload without a session")
		}
		switch h.payloadType {
		case payloadOpenSessionRequest:
			return s.openSession(payload, remote, now)
		case payloadRAKP1:
			return s.rakp1(ctx, payload, remote, now)
		case payloadRAKP3:
			return s.rakp3(payload, remote, now)
		case payloadIPMI:
			msg, err := decodeMessage(payload)
			if err != nil {
				return nil, err
			}
			reply, _ := s.dispatch(ctx, &request{msg: msg, remote: remote, now: now})
			return sessionKeys{}.seal(payloadIPMI, 0, 0, reply), nil
		}
		return nil, fmt.Errorf("payload type %#x without a session", h.payloadType)
	}
	sess := s.sessions.byID[h.sessionID]
	if sess == nil || !sess.v2 || sess.state != stateActive || sess.remote != remote {
		return nil, fmt.Errorf("no active RMCP+ session %#x for this remote", h.sessionID)
	}
	if h.payloadType != payloadIPMI {
		return nil, fmt.Errorf("payload type %#x is not supported", h.payloadType)
	}
	suite := sess.keys.suite
	if h.authenticated != (suite.integrity != integrityNone) || h.encrypted != (suite.confidentiality != confidentialityNone) {
		return nil, fmt.Errorf("packet protection does not match cipher suite %d", suite.id)
	}
	if h.authenticated && !sess.keys.verifyTrailer(body, trailer) {
		return nil, errors.New("integrity check failed")
	}
	if !sess.in.accept(h.seq) {
		return nil, fmt.Errorf("sequence number %d replayed or outside the window", h.seq)
	}
	plain, err := sess.keys.open(payload)
	if err != nil {
		return nil, err
	}
	msg, err := decodeMessage(plain)
	if err != nil {
		return nil, err
	}
	sess.lastSeen = now
	r := &request{sess: sess, msg: msg, remote: remote, now: now}
	reply, end := s.dispatch(ctx, r)
	out := sess.keys.seal(payloadIPMI, sess.consoleID, sess.nextOutSeq(), reply)
	if end {
		s.endSession(sess, "closed")
	}
	return out, nil
}

// endSession removes sess and releases what it held.
func (s *Server) endSession(sess *session, reason string) {
	delete(s.sessions.byID, sess.id)
	if s.boot.setInProgress && s.boot.owner == sess.id {
		s.boot.setInProgress = false
	}
	log := s.log.V(1)
	if sess.state == stateActive {
		log = s.log
	}
	log.Info("session ended", "sessionID", sess.id, "remote", sess.remote, "reason", reason)
}
