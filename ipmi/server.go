package ipmi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/internal/throttle"
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
	// MaxHandshakesPerSource bounds the unfinished handshakes one source
	// address holds in the table, so a flood cannot evict other clients'
	// handshakes (default 4).
	MaxHandshakesPerSource int
	// EnableV15 serves IPMI 1.5 sessions. They are off by default: their
	// MD5 auth codes are keyed by the bare password, so one captured packet
	// allows an offline guess, and the password must fit 16 bytes. Only
	// clients that cannot speak lanplus need them.
	EnableV15 bool
	// Limiter throttles failed logins and handshakes per source address.
	// Share the Redfish server's, so failures over either protocol count
	// against the same source. nil means a limiter of this server's own.
	Limiter *throttle.Limiter
	// CallTimeout bounds every call of the machine (default 5 s); a call
	// that takes longer answers "node busy".
	CallTimeout time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// AuditLog records the power and boot actions made over IPMI, and
	// failed logins; the SEL commands read and clear it. Share the Redfish
	// server's, so each protocol shows the other's actions too. nil means
	// a log of this server's own.
	AuditLog *auditlog.Log
	// ConsoleSessions admits one serial console stream per machine: SOL
	// takes the console through it. Share the Redfish server's, so that a
	// console held over one protocol reads as "payload already active"
	// over the other. nil means a table of this server's own.
	ConsoleSessions *machine.ConsoleSessions
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
	// defaultMaxHandshakesPerSource leaves room for a client's retries.
	defaultMaxHandshakesPerSource = 4
	defaultCallTimeout            = 5 * time.Second
	// maxConcurrentPackets bounds the packets served at once; others wait
	// in the socket buffer.
	maxConcurrentPackets = 16
)

var defaultCipherSuites = []uint8{3, 17}

// Server is the BMC of one machine. It is safe for concurrent use.
type Server struct {
	// machine is Config.Machine as handlers call it: every call runs
	// with a deadline and without mu (callUnlocked).
	machine   machine.Machine
	ready     func() error
	log       logr.Logger
	suites    []cipherSuite
	v15Auth   []byte // IPMI 1.5 auth types offered
	timeout   time.Duration
	handshake time.Duration
	callLimit time.Duration
	limiter   *throttle.Limiter
	now       func() time.Time

	// mu guards the state of packets being served: sessions, credentials,
	// boot parameters and the cached GUID change only under it. It is
	// released while the machine is called.
	mu       sync.Mutex
	creds    credentials
	sessions *sessionTable
	boot     bootParameters
	guid     *[16]byte
	// The SEL's reservation and last erase; audit and machineID are set
	// once.
	selReservation uint16
	selErased      time.Time
	audit          *auditlog.Log
	machineID      string

	consoles *machine.ConsoleSessions
	// solConfig holds the SOL configuration parameters; sol is the active
	// SOL payload, if any (one serial port, one instance).
	solConfig solConfig
	sol       *solSession
}

// NewServer validates cfg and returns a server with no sessions.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Machine == nil {
		return nil, errors.New("ipmi: Config.Machine is required")
	}
	if err := checkCredentials(cfg.Username, cfg.Password); err != nil {
		return nil, err
	}
	s := &Server{
		creds:     credentials{username: []byte(cfg.Username), password: []byte(cfg.Password)},
		log:       cfg.Logger,
		timeout:   cfg.SessionTimeout,
		callLimit: cmp.Or(cfg.CallTimeout, defaultCallTimeout),
		limiter:   cfg.Limiter,
		now:       cfg.Now,
	}
	s.audit = cfg.AuditLog
	if s.audit == nil {
		s.audit = auditlog.New(auditlog.Options{Now: cfg.Now})
	}
	s.machineID = cfg.Machine.ID()
	s.consoles = cfg.ConsoleSessions
	if s.consoles == nil {
		s.consoles = &machine.ConsoleSessions{}
	}
	s.solConfig = defaultSOLConfig
	// Unlocked outermost, so that the audit log's work runs without mu too.
	s.machine = machine.Intercept(cfg.Machine, machine.Chain(s.callUnlocked, s.audit.Intercept))
	s.ready = func() error { return nil }
	if r, ok := cfg.Machine.(machine.Readiness); ok {
		s.ready = r.Ready
	}
	if s.limiter == nil {
		s.limiter = throttle.New(throttle.Policy{Now: cfg.Now})
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
	if cfg.EnableV15 && len(cfg.Password) <= maxV15PasswordLength {
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
	perSource := cmp.Or(cfg.MaxHandshakesPerSource, defaultMaxHandshakesPerSource)
	if perSource < 1 {
		return nil, errors.New("ipmi: MaxHandshakesPerSource must be positive")
	}
	s.sessions = newSessionTable(maxSessions, perSource)
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
	var port uint16
	if a, ok := conn.LocalAddr().(*net.UDPAddr); ok {
		port = uint16(a.Port)
	}
	// A SOL payload sends through conn: it ends with Serve.
	defer s.endSOL("the BMC stopped")
	// Packets are served concurrently, so one slow machine call does not
	// stall every other client.
	slots := make(chan struct{}, maxConcurrentPackets)
	var inFlight sync.WaitGroup
	defer inFlight.Wait()
	for {
		buf := make([]byte, maxPacketSize)
		n, addr, err := conn.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("ipmi: read: %w", err)
		}
		slots <- struct{}{}
		inFlight.Go(func() {
			defer func() { <-slots }()
			l := link{remote: addr.String(), port: port, send: func(p []byte) {
				if _, err := conn.WriteTo(p, addr); err != nil {
					s.log.Error(err, "cannot send", "remote", addr.String())
				}
			}}
			reply, afterReply := s.handleFrom(ctx, buf[:n], l)
			if reply != nil {
				l.send(reply)
			}
			if afterReply != nil {
				afterReply()
			}
		})
	}
}

// link is where a datagram came from, and the way to send that peer more
// than the answer (SOL output).
type link struct {
	remote string
	// port is the BMC's UDP port the datagram came to (0: the standard
	// port), which SOL runs on.
	port uint16
	// send is nil where no more can be sent (in-process tests).
	send func(pkt []byte)
}

// handlePacket answers one datagram from remote; nil means no answer.
func (s *Server) handlePacket(ctx context.Context, pkt []byte, remote string) []byte {
	reply, _ := s.handleFrom(ctx, pkt, link{remote: remote})
	return reply
}

// handleFrom answers one datagram; afterReply, when set, is to run once the
// answer is sent (an activated SOL payload starts its output then, so its
// first packet cannot overtake the activation's answer).
func (s *Server) handleFrom(ctx context.Context, pkt []byte, l link) (reply []byte, afterReply func()) {
	remote := l.remote
	s.mu.Lock()
	defer s.mu.Unlock()
	// A bug in one handler costs its packet, not the BMC.
	defer func() {
		if p := recover(); p != nil {
			s.log.Error(fmt.Errorf("panic: %v", p), "packet handler panicked", "remote", remote)
			reply, afterReply = nil, nil
		}
	}()
	now := s.now()
	s.expireSessions(now)
	reply, afterReply, err := s.route(ctx, pkt, l, now)
	if err != nil {
		s.log.V(1).Info("dropped packet", "remote", remote, "reason", err.Error())
		return nil, nil
	}
	return reply, afterReply
}

// expireSessions ends the sessions idle for too long, and those of a
// rotated-out password past its grace window.
func (s *Server) expireSessions(now time.Time) {
	for _, sess := range s.sessions.expired(now, s.timeout, s.handshake) {
		if sess.state == stateRAKP2Sent {
			s.handshakeAbandoned(sess)
		}
		s.endSession(sess, "timed out")
	}
	s.endRotatedOut(now)
}

func (s *Server) route(ctx context.Context, pkt []byte, l link, now time.Time) ([]byte, func(), error) {
	remote := l.remote
	class, seq, body, err := decodeRMCP(pkt)
	if err != nil {
		return nil, nil, err
	}
	switch class {
	case rmcpClassASF:
		tag, err := decodeASFPing(body)
		if err != nil {
			return nil, nil, err
		}
		return encodeASFPong(seq, tag), nil, nil
	case rmcpClassIPMI:
		if len(body) > 0 && body[0] == authTypeRMCPPlus {
			return s.handleV20(ctx, body, l, now)
		}
		reply, err := s.handleV15(ctx, body, remote, now)
		return reply, nil, err
	}
	return nil, nil, malformed("RMCP class %#x", class)
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
	if sess.state == stateChallenged {
		// The console's first auth code tells which password it holds.
		sess.password = nil
		for _, c := range s.creds.candidates(sess.username, now) {
			want := authCodeV15(sess.authType, password16(c.password), h.sessionID, h.seq, raw)
			if equalConstantTime(want[:], h.authCode[:]) {
				sess.password, sess.previous = c.password, c.previous
				break
			}
		}
		if sess.password == nil {
			s.loginFailed(throttle.Source(remote), throttle.Named(string(sess.username)), sess.username)
			s.endSession(sess, "wrong password")
			return nil, errors.New("IPMI 1.5 auth code mismatch")
		}
	}
	want := authCodeV15(sess.authType, password16(sess.password), h.sessionID, h.seq, raw)
	if !equalConstantTime(want[:], h.authCode[:]) {
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
		s.limiter.Succeeded(throttle.Source(remote), throttle.Named(string(sess.username)))
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
	h.authCode = authCodeV15(sess.authType, password16(sess.password), sess.id, seq, msg)
	return encodeV15(h, msg)
}

func password16(password []byte) [authCodeLength]byte {
	var p [authCodeLength]byte
	copy(p[:], password)
	return p
}

// handleV20 answers an RMCP+ packet: a handshake message, a sessionless
// IPMI message, or an IPMI message or SOL packet inside an active RMCP+
// session.
func (s *Server) handleV20(ctx context.Context, body []byte, l link, now time.Time) ([]byte, func(), error) {
	remote := l.remote
	h, payload, trailer, err := decodeV20(body)
	if err != nil {
		return nil, nil, err
	}
	if h.sessionID == 0 {
		if h.encrypted || h.authenticated {
			return nil, nil, errors.New("protected RMCP+ payload without a session")
		}
		var reply []byte
		switch h.payloadType {
		case payloadOpenSessionRequest:
			reply, err = s.openSession(payload, remote, now)
		case payloadRAKP1:
			reply, err = s.rakp1(ctx, payload, remote, now)
		case payloadRAKP3:
			reply, err = s.rakp3(payload, remote, now)
		case payloadIPMI:
			var msg message
			if msg, err = decodeMessage(payload); err == nil {
				out, _ := s.dispatch(ctx, &request{msg: msg, remote: remote, now: now})
				reply = sessionKeys{}.seal(payloadIPMI, 0, 0, out)
			}
		default:
			err = fmt.Errorf("payload type %#x without a session", h.payloadType)
		}
		return reply, nil, err
	}
	sess := s.sessions.byID[h.sessionID]
	if sess == nil || !sess.v2 || sess.state != stateActive || sess.remote != remote {
		return nil, nil, fmt.Errorf("no active RMCP+ session %#x for this remote", h.sessionID)
	}
	if h.payloadType != payloadIPMI && h.payloadType != payloadSOL {
		return nil, nil, fmt.Errorf("payload type %#x is not supported", h.payloadType)
	}
	suite := sess.keys.suite
	if h.authenticated != (suite.integrity != integrityNone) || h.encrypted != (suite.confidentiality != confidentialityNone) {
		return nil, nil, fmt.Errorf("packet protection does not match cipher suite %d", suite.id)
	}
	if h.authenticated && !sess.keys.verifyTrailer(body, trailer) {
		return nil, nil, errors.New("integrity check failed")
	}
	if !sess.in.accept(h.seq) {
		return nil, nil, fmt.Errorf("sequence number %d replayed or outside the window", h.seq)
	}
	plain, err := sess.keys.open(payload)
	if err != nil {
		return nil, nil, err
	}
	sess.lastSeen = now
	// Any sign of life from the console resends SOL output whose retries
	// ran out.
	defer s.solResendStalled(sess)
	if h.payloadType == payloadSOL {
		reply, err := s.solPacket(sess, plain)
		return reply, nil, err
	}
	msg, err := decodeMessage(plain)
	if err != nil {
		return nil, nil, err
	}
	r := &request{sess: sess, msg: msg, remote: remote, now: now, link: l}
	reply, end := s.dispatch(ctx, r)
	out := sess.keys.seal(payloadIPMI, sess.consoleID, sess.nextOutSeq(), reply)
	if end {
		s.endSession(sess, "closed")
	}
	return out, r.afterReply, nil
}

// endSession removes sess and releases what it held.
func (s *Server) endSession(sess *session, reason string) {
	delete(s.sessions.byID, sess.id)
	if s.sol != nil && s.sol.owner == sess {
		why := "session " + reason
		if reason == "closed" {
			why = "" // the client's own Close Session
		}
		s.solEnd(why, false)
	}
	if s.boot.setInProgress && s.boot.owner == sess.id {
		s.boot.setInProgress = false
	}
	if s.solConfig.setInProgress && s.solConfig.owner == sess.id {
		s.solConfig.setInProgress = false
	}
	log := s.log.V(1)
	if sess.state == stateActive {
		log = s.log
	}
	log.Info("session ended", "sessionID", sess.id, "remote", sess.remote, "reason", reason)
}

// Sessions counts the session table's entries now: active sessions and
// handshakes under way, for metrics.
func (s *Server) Sessions() (active, handshakes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sess := range s.sessions.byID {
		if sess.state == stateActive {
			active++
		} else {
			handshakes++
		}
	}
	return active, handshakes
}
