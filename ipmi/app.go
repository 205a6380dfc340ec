package ipmi

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/virtmetal/virtmetal/internal/throttle"
)

const (
	lanChannel     = 0x01
	currentChannel = 0x0e
	channelMask    = 0x0f
	// userIDNamed and userIDNull: the account's user ID, as Get Session
	// Info reports it; user 1 is the null user by convention.
	userIDNamed = 2
	userIDNull  = 1
)

// Get Device ID (spec 20.1): a chassis device, IPMI 2.0, firmware 1.0, no
// manufacturer (IANA 0).
func (s *Server) getDeviceID(_ context.Context, r *request) (byte, []byte) {
	if len(r.msg.data) != 0 {
		return ccRequestLength, nil
	}
	const (
		deviceID       = 0x20
		deviceRevision = 0x01
		firmwareMajor  = 0x01
		firmwareMinor  = 0x00
		ipmiVersion20  = 0x02
		chassisDevice  = 0x80
	)
	return ccOK, []byte{deviceID, deviceRevision, firmwareMajor, firmwareMinor, ipmiVersion20, chassisDevice, 0, 0, 0, 0, 0}
}

// Get Self Test Results (spec 20.4): 55h means no error.
func (s *Server) getSelfTestResults(_ context.Context, r *request) (byte, []byte) {
	if len(r.msg.data) != 0 {
		return ccRequestLength, nil
	}
	return ccOK, []byte{0x55, 0x00}
}

// Get System GUID (spec 22.14): the machine's SMBIOS UUID.
func (s *Server) getSystemGUID(ctx context.Context, r *request) (byte, []byte) {
	if len(r.msg.data) != 0 {
		return ccRequestLength, nil
	}
	guid, err := s.systemGUID(ctx)
	if err != nil {
		return s.machineFailure(err, "Inventory")
	}
	return ccOK, guid[:]
}

// systemGUID returns the machine's UUID in IPMI byte order: the RFC 4122
// byte sequence reversed, every field least significant byte first (spec
// 20.8). The UUID never changes for a machine, so it is fetched once.
func (s *Server) systemGUID(ctx context.Context) ([16]byte, error) {
	if s.guid != nil {
		return *s.guid, nil
	}
	inv, err := s.machine.Inventory(ctx)
	if err != nil {
		return [16]byte{}, err
	}
	guid, err := guidFromUUID(inv.UUID)
	if err != nil {
		return [16]byte{}, err
	}
	s.guid = &guid
	return guid, nil
}

func guidFromUUID(uuid string) ([16]byte, error) {
	var guid [16]byte
	raw, err := hex.DecodeString(strings.ReplaceAll(uuid, "-", ""))
	if err != nil || len(raw) != len(guid) {
		return guid, fmt.Errorf("machine UUID %q is not a UUID", uuid)
	}
	slices.Reverse(raw)
	copy(guid[:], raw)
	return guid, nil
}

// validChannel accepts the LAN channel and "this channel".
func validChannel(b byte) bool {
	ch := b & channelMask
	return ch == lanChannel || ch == currentChannel
}

// Get Channel Authentication Capabilities (spec 22.13).
func (s *Server) getChannelAuthCaps(_ context.Context, r *request) (byte, []byte) {
	d := r.msg.data
	if len(d) != 2 {
		return ccRequestLength, nil
	}
	if !validChannel(d[0]) || !privilege(d[1]&privMask).valid() {
		return ccInvalidField, nil
	}
	const (
		extendedRequested = 0x80
		extendedAvailable = 0x80
		nonNullUsers      = 0x04
		nullUser          = 0x02
		supportsV20       = 0x02
		supportsV15       = 0x01
	)
	var authTypes, status, extended byte
	for _, t := range s.v15Auth {
		authTypes |= 1 << t
	}
	if len(s.creds.username) > 0 {
		status |= nonNullUsers
	} else {
		status |= nullUser
	}
	if d[0]&extendedRequested != 0 {
		authTypes |= extendedAvailable
		extended = supportsV20
		if len(s.v15Auth) > 0 {
			extended |= supportsV15
		}
	}
	return ccOK, []byte{lanChannel, authTypes, status, extended, 0, 0, 0, 0}
}

// Get Channel Cipher Suites (spec 22.15): the offered suites as standard
// cipher suite records, 16 bytes per list index.
func (s *Server) getChannelCipherSuites(_ context.Context, r *request) (byte, []byte) {
	d := r.msg.data
	if len(d) != 3 {
		return ccRequestLength, nil
	}
	const (
		listBySuite        = 0x80
		indexMask          = 0x3f
		recordStandard     = 0xc0
		tagIntegrity       = 0x40
		tagConfidentiality = 0x80
		bytesPerIndex      = 16
	)
	if !validChannel(d[0]) || d[1] != payloadIPMI {
		return ccInvalidField, nil
	}
	var records []byte
	if d[2]&listBySuite != 0 {
		for _, c := range s.suites {
			records = append(records, recordStandard, c.id, c.auth, tagIntegrity|c.integrity, tagConfidentiality|c.confidentiality)
		}
	} else {
		// Every algorithm offered, each once, without suite records.
		for _, c := range s.suites {
			for _, a := range []byte{c.auth, tagIntegrity | c.integrity, tagConfidentiality | c.confidentiality} {
				if !slices.Contains(records, a) {
					records = append(records, a)
				}
			}
		}
	}
	start := min(int(d[2]&indexMask)*bytesPerIndex, len(records))
	end := min(start+bytesPerIndex, len(records))
	return ccOK, append([]byte{lanChannel}, records[start:end]...)
}

// Get Session Challenge (spec 22.16) starts an IPMI 1.5 handshake.
func (s *Server) getSessionChallenge(_ context.Context, r *request) (byte, []byte) {
	d := r.msg.data
	if len(d) != 1+maxUsernameLength {
		return ccRequestLength, nil
	}
	const (
		invalidUsername  = 0x81
		nullUserDisabled = 0x82
	)
	authType := d[0] & authTypeMask
	if !slices.Contains(s.v15Auth, authType) {
		return ccInvalidField, nil
	}
	name, _, _ := bytes.Cut(d[1:], []byte{0})
	if len(name) == 0 && len(s.creds.username) > 0 {
		return nullUserDisabled, nil
	}
	source := throttle.Source(r.remote)
	if !s.limiter.AllowHandshake(source) {
		return ccNodeBusy, nil
	}
	known := len(s.creds.candidates(name, r.now)) > 0
	named := throttle.UnknownAccount
	if known {
		named = throttle.Named(string(name))
	}
	if _, ok := s.limiter.Allow(source, named); !ok {
		s.loginFailed(source, named, name)
		return ccNodeBusy, nil
	}
	if !known {
		s.loginFailed(source, throttle.UnknownAccount, name)
		return invalidUsername, nil
	}
	sess := &session{
		remote:   r.remote,
		state:    stateChallenged,
		authType: authType,
		username: slices.Clone(name),
		created:  r.now,
		lastSeen: r.now,
	}
	rand.Read(sess.challenge[:])
	if !s.addSession(sess) {
		return ccNodeBusy, nil
	}
	return ccOK, append(binary.LittleEndian.AppendUint32(nil, sess.id), sess.challenge[:]...)
}

// addSession stores a new handshake, evicting the oldest unfinished one
// when the table is full; false means every slot holds an active session.
func (s *Server) addSession(sess *session) bool {
	evicted, ok := s.sessions.add(sess)
	if evicted != nil {
		s.endSession(evicted, "evicted by a newer handshake")
	}
	return ok
}

// activateSession answers Activate Session (spec 22.17) for a challenged
// IPMI 1.5 session whose auth code has been verified.
func (s *Server) activateSession(sess *session, msg message) (byte, []byte) {
	d := msg.data
	if len(d) != 22 {
		return ccRequestLength, nil
	}
	const privilegeAboveLimit = 0x86
	maxPriv := privilege(d[1] & privMask)
	switch {
	case d[0]&authTypeMask != sess.authType:
		return ccInvalidField, nil
	case maxPriv > privAdmin:
		return privilegeAboveLimit, nil
	case !maxPriv.valid():
		return ccInvalidField, nil
	case !equalConstantTime(d[2:18], sess.challenge[:]):
		return ccInvalidField, nil
	}
	inbound := randomUint32() | 1 // never zero
	sess.state = stateActive
	sess.maxPriv = maxPriv
	sess.priv = min(privUser, maxPriv)
	sess.outSeq = max(binary.LittleEndian.Uint32(d[18:]), 1)
	sess.in.startAt(inbound)
	s.log.Info("session opened", "sessionID", sess.id, "remote", sess.remote, "authType", sess.authType, "maxPrivilege", maxPriv.String())
	out := []byte{sess.authType}
	out = binary.LittleEndian.AppendUint32(out, sess.id)
	out = binary.LittleEndian.AppendUint32(out, inbound)
	return ccOK, append(out, byte(maxPriv))
}

// activateOutOfHandshake refuses Activate Session anywhere but in reply to
// a challenge (the handshake path handles that case before dispatch).
func (s *Server) activateOutOfHandshake(context.Context, *request) (byte, []byte) {
	return ccInvalidState, nil
}

// Set Session Privilege Level (spec 22.18).
func (s *Server) setSessionPrivilege(_ context.Context, r *request) (byte, []byte) {
	if len(r.msg.data) != 1 {
		return ccRequestLength, nil
	}
	const (
		levelNotAvailable = 0x80
		levelAboveLimit   = 0x81
	)
	p := privilege(r.msg.data[0] & privMask)
	switch {
	case p == 0:
		return ccOK, []byte{byte(r.sess.priv)}
	case p > privAdmin:
		return levelNotAvailable, nil
	case p < privUser:
		return ccInvalidField, nil
	case p > r.sess.maxPriv:
		return levelAboveLimit, nil
	}
	r.sess.priv = p
	return ccOK, []byte{byte(p)}
}

// Close Session (spec 22.19). Closing another session needs ADMINISTRATOR.
func (s *Server) closeSession(_ context.Context, r *request) (byte, []byte) {
	d := r.msg.data
	if len(d) != 4 && len(d) != 5 {
		return ccRequestLength, nil
	}
	const (
		invalidSessionID     = 0x87
		invalidSessionHandle = 0x88
	)
	var target *session
	if id := binary.LittleEndian.Uint32(d); id != 0 {
		if target = s.sessions.byID[id]; target == nil || target.state != stateActive {
			return invalidSessionID, nil
		}
	} else {
		if len(d) != 5 {
			return ccRequestLength, nil
		}
		i := slices.IndexFunc(s.sessions.active(), func(c *session) bool { return c.handle == d[4] })
		if i < 0 {
			return invalidSessionHandle, nil
		}
		target = s.sessions.active()[i]
	}
	if target == r.sess {
		r.endSession = true
		return ccOK, nil
	}
	if r.sess.priv < privAdmin {
		return ccInsufficientPrivilege, nil
	}
	s.endSession(target, "closed by session "+fmt.Sprint(r.sess.id))
	return ccOK, nil
}

// Get Session Info (spec 22.20).
func (s *Server) getSessionInfo(_ context.Context, r *request) (byte, []byte) {
	d := r.msg.data
	if len(d) < 1 {
		return ccRequestLength, nil
	}
	const (
		byHandle    = 0xff
		byID        = 0xfe
		maxIndex    = 0x3f
		protocolV20 = 0x10
	)
	active := s.sessions.active()
	var target *session
	switch idx := d[0]; {
	case idx == 0:
		target = r.sess
	case idx == byHandle:
		if len(d) != 2 {
			return ccRequestLength, nil
		}
		if i := slices.IndexFunc(active, func(c *session) bool { return c.handle == d[1] }); i >= 0 {
			target = active[i]
		}
	case idx == byID:
		if len(d) != 5 {
			return ccRequestLength, nil
		}
		if c := s.sessions.byID[binary.LittleEndian.Uint32(d[1:])]; c != nil && c.state == stateActive {
			target = c
		}
	case idx <= maxIndex:
		if int(idx) <= len(active) {
			target = active[idx-1]
		}
	default:
		return ccInvalidField, nil
	}
	out := []byte{0, byte(s.sessions.max), byte(len(active))}
	if target == nil {
		return ccOK, out
	}
	out[0] = target.handle
	userID := byte(userIDNamed)
	if len(s.creds.username) == 0 {
		userID = userIDNull
	}
	channel := byte(lanChannel)
	if target.v2 {
		channel |= protocolV20
	}
	out = append(out, userID, byte(target.priv), channel)
	// The LAN details exist for IPv4 consoles only.
	if ap, err := netip.ParseAddrPort(target.remote); err == nil && ap.Addr().Unmap().Is4() {
		ip := ap.Addr().Unmap().As4()
		out = append(out, ip[:]...)
		out = append(out, make([]byte, 6)...) // console MAC: not known to a UDP server
		out = binary.LittleEndian.AppendUint16(out, ap.Port())
	}
	return ccOK, out
}
