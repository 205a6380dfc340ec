package ipmi

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/machine"
)

// RMCP+ status codes (spec table 13-15).
const (
	rmcpStatusOK                 = 0x00
	rmcpStatusNoResources        = 0x01
	rmcpStatusInvalidSessionID   = 0x02
	rmcpStatusInvalidRole        = 0x09
	rmcpStatusUnauthorizedRole   = 0x0a
	rmcpStatusInvalidNameLength  = 0x0c
	rmcpStatusUnauthorizedName   = 0x0d
	rmcpStatusInvalidIntegrity   = 0x0f
	rmcpStatusNoCipherSuiteMatch = 0x11
	rmcpStatusIllegalParameter   = 0x12
)

// Handshake message layout (spec 13.17 to 13.23).
const (
	openSessionRequestLength  = 32
	rakp1MinLength            = 28
	rakp3MinLength            = 8
	algorithmPayloadLength    = 8
	algorithmMask             = 0x3f
	payloadTagAuthentication  = 0x00
	payloadTagIntegrity       = 0x01
	payloadTagConfidentiality = 0x02
)

func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

func le16(v uint16) []byte { return binary.LittleEndian.AppendUint16(nil, v) }

// handshakeReply builds an Open Session Response, RAKP 2 or RAKP 4: tag,
// status, maximum privilege (Open Session only, else reserved), reserved,
// remote console session ID, then rest. Error replies stop after the ID.
func handshakeReply(payloadType, tag, status, maxPriv byte, consoleID uint32, rest ...[]byte) []byte {
	p := append([]byte{tag, status, maxPriv, 0}, le32(consoleID)...)
	for _, r := range rest {
		p = append(p, r...)
	}
	return sessionKeys{}.seal(payloadType, 0, 0, p)
}

// openSession answers an RMCP+ Open Session Request (spec 13.17). The
// proposed algorithms must form exactly one offered cipher suite; anything
// else is refused with a status code, never answered with another suite.
func (s *Server) openSession(p []byte, remote string, now time.Time) ([]byte, error) {
	if len(p) < openSessionRequestLength {
		return nil, malformed("Open Session Request needs %d bytes, got %d", openSessionRequestLength, len(p))
	}
	tag := p[0]
	consoleID := binary.LittleEndian.Uint32(p[4:])
	refuse := func(status byte) ([]byte, error) {
		s.log.V(1).Info("open session refused", "remote", remote, "status", status)
		return handshakeReply(payloadOpenSessionResponse, tag, status, 0, consoleID), nil
	}
	if !s.limiter.AllowHandshake(throttle.Source(remote)) {
		return refuse(rmcpStatusNoResources)
	}
	for i, tagWant := range []byte{payloadTagAuthentication, payloadTagIntegrity, payloadTagConfidentiality} {
		rec := p[8+8*i : 16+8*i]
		if rec[0] != tagWant || rec[3] != algorithmPayloadLength {
			return refuse(rmcpStatusIllegalParameter)
		}
	}
	proposed := cipherSuite{auth: p[12] & algorithmMask, integrity: p[20] & algorithmMask, confidentiality: p[28] & algorithmMask}
	i := slices.IndexFunc(s.suites, func(c cipherSuite) bool {
		return c.auth == proposed.auth && c.integrity == proposed.integrity && c.confidentiality == proposed.confidentiality
	})
	if i < 0 {
		return refuse(rmcpStatusNoCipherSuiteMatch)
	}
	// Zero asks for the highest level the account allows.
	maxPriv := privilege(p[1] & privMask)
	if maxPriv == 0 {
		maxPriv = privAdmin
	}
	if !maxPriv.valid() {
		return refuse(rmcpStatusInvalidRole)
	}
	if consoleID == 0 {
		return refuse(rmcpStatusInvalidSessionID)
	}
	sess := &session{
		consoleID: consoleID,
		remote:    remote,
		v2:        true,
		state:     stateOpened,
		suite:     s.suites[i],
		maxPriv:   maxPriv,
		created:   now,
		lastSeen:  now,
	}
	if !s.addSession(sess) {
		return refuse(rmcpStatusNoResources)
	}
	c := sess.suite
	algorithms := []byte{
		payloadTagAuthentication, 0, 0, algorithmPayloadLength, c.auth, 0, 0, 0,
		payloadTagIntegrity, 0, 0, algorithmPayloadLength, c.integrity, 0, 0, 0,
		payloadTagConfidentiality, 0, 0, algorithmPayloadLength, c.confidentiality, 0, 0, 0,
	}
	return handshakeReply(payloadOpenSessionResponse, tag, rmcpStatusOK, byte(maxPriv), consoleID, le32(sess.id), algorithms), nil
}

// rakp1 answers RAKP Message 1 with RAKP Message 2 (spec 13.20, 13.21).
func (s *Server) rakp1(ctx context.Context, p []byte, remote string, now time.Time) ([]byte, error) {
	if len(p) < rakp1MinLength {
		return nil, malformed("RAKP 1 needs %d bytes, got %d", rakp1MinLength, len(p))
	}
	tag := p[0]
	sess := s.sessions.byID[binary.LittleEndian.Uint32(p[4:])]
	if sess == nil || !sess.v2 || sess.remote != remote || (sess.state != stateOpened && sess.state != stateRAKP2Sent) {
		return handshakeReply(payloadRAKP2, tag, rmcpStatusInvalidSessionID, 0, 0), nil
	}
	refuse := func(status byte, reason string) ([]byte, error) {
		s.endSession(sess, reason)
		return handshakeReply(payloadRAKP2, tag, status, 0, sess.consoleID), nil
	}
	// RAKP 2 carries a hash keyed by the password, which anyone who knows
	// the username can take away and attack offline: a source gets few.
	source := throttle.Source(remote)
	if !s.limiter.AllowHandshake(source) {
		return refuse(rmcpStatusNoResources, "handshake rate exceeded")
	}
	role := p[24]
	nameLength := int(p[27])
	if nameLength > maxUsernameLength || len(p) < rakp1MinLength+nameLength {
		return refuse(rmcpStatusInvalidNameLength, "bad user name length")
	}
	username := p[rakp1MinLength : rakp1MinLength+nameLength]
	priv := privilege(role & privMask)
	s.abandonedHandshakes(sess, source, now)
	password, known := s.creds.choose(username, source, now)
	named := throttle.UnknownAccount
	if known {
		named = throttle.Named(string(username))
	}
	if _, ok := s.limiter.Allow(source, named); !ok {
		s.loginFailed(source, named, username)
		return refuse(rmcpStatusNoResources, "throttled after failed logins")
	}
	switch {
	case !priv.valid():
		return refuse(rmcpStatusInvalidRole, "invalid role")
	case priv > sess.maxPriv:
		return refuse(rmcpStatusUnauthorizedRole, "role above the requested maximum")
	case !known:
		s.loginFailed(source, throttle.UnknownAccount, username)
		return refuse(rmcpStatusUnauthorizedName, "unknown user name")
	}
	guid, err := s.systemGUID(ctx)
	if s.sessions.byID[sess.id] != sess || sess.state != stateOpened && sess.state != stateRAKP2Sent {
		return nil, errors.New("handshake ended while the machine was asked for its GUID")
	}
	switch {
	case errors.Is(err, machine.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		// The session can still open, and its commands answer "node
		// busy" until the machine is back: a client is told to retry
		// rather than that the BMC is gone. The GUID is then unknown,
		// which the spec writes as zeros.
		s.log.V(1).Info("machine unavailable, RAKP 2 carries a zero GUID", "reason", err.Error())
		guid = [16]byte{}
	case err != nil:
		s.log.Error(err, "cannot read the system GUID for RAKP 2")
		return refuse(rmcpStatusNoResources, "no system GUID")
	}
	sess.guid = guid
	copy(sess.rm[:], p[8:24])
	rand.Read(sess.rc[:])
	sess.role = role
	sess.username = slices.Clone(username)
	sess.maxPriv = priv
	sess.password, sess.previous = password.password, password.previous
	sess.state = stateRAKP2Sent
	sess.lastSeen = now
	mac := rakpHMAC(sess.suite.auth, sess.password,
		le32(sess.consoleID), le32(sess.id), sess.rm[:], sess.rc[:], guid[:],
		[]byte{role, byte(nameLength)}, username)
	return handshakeReply(payloadRAKP2, tag, rmcpStatusOK, 0, sess.consoleID, sess.rc[:], guid[:], mac), nil
}

// abandonedHandshakes treats a console that got RAKP 2 and started over
// instead of answering RAKP 3 as one that rejected RAKP 2 (ipmitool does
// not always send the RAKP 3 that says so): during a grace window, its
// source switches password like an explicit abort.
func (s *Server) abandonedHandshakes(current *session, source string, now time.Time) {
	if !now.Before(s.creds.prevUntil) {
		return
	}
	for _, other := range s.sessions.byID {
		if other != current && other.state == stateRAKP2Sent && throttle.Source(other.remote) == source {
			s.handshakeAbandoned(other)
			s.creds.aborted(source, candidate{password: other.password, previous: other.previous}, now)
			s.endSession(other, "abandoned after RAKP 2")
		}
	}
}

// handshakeAbandoned logs a handshake the console left after RAKP 2: what
// ipmitool and freeipmi do when RAKP 2's HMAC, keyed with the right
// password, does not match theirs, so the BMC's only sign of a wrong
// password. It is not counted by the limiter: a client that lost the
// network looks the same.
func (s *Server) handshakeAbandoned(sess *session) {
	s.audit.LoginFailed(auditlog.Actor{Protocol: auditlog.IPMI, Account: printableName(sess.username), Source: throttle.Source(sess.remote)})
}

// rakp3 checks RAKP Message 3, activates the session and answers with RAKP
// Message 4 (spec 13.22, 13.23).
func (s *Server) rakp3(p []byte, remote string, now time.Time) ([]byte, error) {
	if len(p) < rakp3MinLength {
		return nil, malformed("RAKP 3 needs %d bytes, got %d", rakp3MinLength, len(p))
	}
	tag, status := p[0], p[1]
	sess := s.sessions.byID[binary.LittleEndian.Uint32(p[4:])]
	if sess == nil || !sess.v2 || sess.remote != remote || sess.state != stateRAKP2Sent {
		return handshakeReply(payloadRAKP4, tag, rmcpStatusInvalidSessionID, 0, 0), nil
	}
	source := throttle.Source(remote)
	if status != rmcpStatusOK {
		// The console rejected RAKP 2: it holds another password than
		// the one RAKP 2 was keyed with. It expects no answer.
		s.loginFailed(source, throttle.Named(string(sess.username)), sess.username)
		s.creds.aborted(source, candidate{password: sess.password, previous: sess.previous}, now)
		s.endSession(sess, fmt.Sprintf("console aborted with RAKP 3 status %#x", status))
		return nil, nil
	}
	suite := sess.suite
	nameInfo := []byte{sess.role, byte(len(sess.username))}
	want := rakpHMAC(suite.auth, sess.password, sess.rc[:], le32(sess.consoleID), nameInfo, sess.username)
	if !equalConstantTime(p[rakp3MinLength:], want) {
		s.loginFailed(source, throttle.Named(string(sess.username)), sess.username)
		s.endSession(sess, "wrong password")
		return handshakeReply(payloadRAKP4, tag, rmcpStatusInvalidIntegrity, 0, sess.consoleID), nil
	}
	s.limiter.Succeeded(source, throttle.Named(string(sess.username)))
	guid := sess.guid
	sik, keys := deriveKeys(suite, sess.password, sess.rm[:], sess.rc[:], sess.role, sess.username)
	sess.keys = keys
	sess.state = stateActive
	sess.priv = min(privUser, sess.maxPriv)
	sess.outSeq = 1
	sess.lastSeen = now
	var icv []byte
	if sik != nil {
		icv = rakpHMAC(suite.auth, sik, sess.rm[:], le32(sess.id), guid[:])[:rakp4ICVLength(suite.auth)]
	}
	s.log.Info("session opened", "sessionID", sess.id, "remote", remote, "cipherSuite", suite.id, "maxPrivilege", sess.maxPriv.String())
	return handshakeReply(payloadRAKP4, tag, rmcpStatusOK, 0, sess.consoleID, icv), nil
}
