package ipmi

import (
	"cmp"
	"context"
	"encoding/binary"

	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/machine"
)

// The payload commands (spec chapter 24) and the SOL configuration
// parameters (spec 26.2, 26.3).

const (
	netFnTransport = 0x0c

	cmdActivatePayload            = 0x48
	cmdDeactivatePayload          = 0x49
	cmdGetPayloadActivationStatus = 0x4a
	cmdGetPayloadInstanceInfo     = 0x4b
	cmdGetChannelPayloadSupport   = 0x4e
	cmdGetChannelPayloadVersion   = 0x4f

	cmdSetSOLConfigParameters = 0x21
	cmdGetSOLConfigParameters = 0x22

	// Activate Payload's codes (spec table 24-2); Deactivate Payload's 80h
	// is "already deactivated", Get Channel Payload Version's "payload
	// type not available".
	ccPayloadActive               = 0x80
	ccPayloadDisabled             = 0x81
	ccPayloadWithEncryption       = 0x83
	ccPayloadWithoutEncryption    = 0x84
	ccPayloadDeactivated          = 0x80
	ccPayloadTypeNotAvailable     = 0x80
	ccSOLParamUnsupported         = 0x80
	ccSOLSetInProgress            = 0x81
	ccSOLParamReadOnly            = 0x82
	activateEncryption            = 0x80
	payloadInstanceMask           = 0x0f
	solParameterRevision          = 0x11
	solGetRevisionOnly            = 0x80
	vlanNotUsed                   = 0xffff
	rmcpPort                      = 623
	solPortPrimary                = 0x01
	payloadActivationInstanceBits = 0x01
)

// solPort is the UDP port SOL runs on: the session's own.
func (l link) solPort() uint16 { return cmp.Or(l.port, rmcpPort) }

// payloadRequestOK checks the payload type and instance bytes of the
// payload commands: SOL, instance 1.
func payloadRequestOK(d []byte) bool {
	return d[0]&payloadTypeMask == payloadSOL && d[1]&payloadInstanceMask == solInstance
}

// Activate Payload (spec 24.1) opens the machine's serial console for the
// requesting session. SOL packets are sealed as the session's IPMI
// messages are, so the console must ask for encryption exactly when its
// cipher suite has it.
func (s *Server) activatePayload(ctx context.Context, r *request) (byte, []byte) {
	d := r.msg.data
	if len(d) != 6 {
		return ccRequestLength, nil
	}
	if !r.sess.v2 {
		return ccInvalidCommand, nil // payloads exist in RMCP+ sessions only
	}
	if !payloadRequestOK(d) {
		return ccInvalidField, nil
	}
	if !s.solConfig.enabled {
		return ccPayloadDisabled, nil
	}
	if r.sess.priv < s.solConfig.privilege {
		return ccInsufficientPrivilege, nil
	}
	encrypts := r.sess.keys.suite.confidentiality != confidentialityNone
	switch wants := d[2]&activateEncryption != 0; {
	case wants && !encrypts:
		return ccPayloadWithEncryption, nil
	case !wants && encrypts:
		return ccPayloadWithoutEncryption, nil
	}
	if s.sol != nil {
		return ccPayloadActive, nil
	}
	if r.link.send == nil {
		return ccNodeBusy, nil // no way to send the console's output
	}
	actor := actorOf(r)
	// The audit log names who opened the console.
	stream, err := s.consoles.Open(auditlog.WithActor(ctx, actor), s.machine, machine.ConsoleSerial)
	if err != nil {
		return s.machineFailure(err, "OpenConsole")
	}
	// The lock was released during the open: the session may have ended,
	// or another activation won.
	if s.sessions.byID[r.sess.id] != r.sess || s.sol != nil {
		_ = stream.Close()
		s.audit.ConsoleClosed(auditlog.WithActor(ctx, actor), s.machineID, machine.ConsoleSerial, "its session ended")
		if s.sol != nil {
			return ccPayloadActive, nil
		}
		return ccInvalidState, nil
	}
	sol := s.startSOL(r.sess, stream, r.link.send, actor)
	r.afterReply = func() { s.solOutputStarts(sol) }
	s.log.Info("SOL activated", "sessionID", r.sess.id, "remote", r.remote)
	out := make([]byte, 4) // no auxiliary data for SOL
	out = binary.LittleEndian.AppendUint16(out, solPayloadSize)
	out = binary.LittleEndian.AppendUint16(out, solPayloadSize)
	out = binary.LittleEndian.AppendUint16(out, r.link.solPort())
	return ccOK, binary.LittleEndian.AppendUint16(out, vlanNotUsed)
}

// Deactivate Payload (spec 24.2). Any session may end the payload (that is
// how a console takes over a forgotten one); the owner's console is told
// with "SOL deactivating", so freeipmi ends its session.
func (s *Server) deactivatePayload(_ context.Context, r *request) (byte, []byte) {
	d := r.msg.data
	if len(d) != 6 {
		return ccRequestLength, nil
	}
	if !payloadRequestOK(d) {
		return ccInvalidField, nil
	}
	if s.sol == nil {
		return ccPayloadDeactivated, nil
	}
	if r.sess.priv < s.solConfig.privilege {
		return ccInsufficientPrivilege, nil
	}
	if s.sol.owner == r.sess {
		s.solEnd("", false)
	} else {
		s.solEnd("deactivated by another session", true)
	}
	return ccOK, nil
}

// Get Payload Activation Status (spec 24.4): one SOL instance. A console
// held through another protocol (Redfish) is not an active payload: its
// activation answers "payload already active" instead, which freeipmi
// reports as "SOL in use" rather than trying to deactivate it.
func (s *Server) getPayloadActivationStatus(_ context.Context, r *request) (byte, []byte) {
	d := r.msg.data
	if len(d) != 1 {
		return ccRequestLength, nil
	}
	if d[0]&payloadTypeMask != payloadSOL {
		return ccInvalidField, nil
	}
	var active byte
	if s.sol != nil {
		active = payloadActivationInstanceBits
	}
	return ccOK, []byte{solInstance, active, 0}
}

// Get Payload Instance Info (spec 24.5): the session holding the instance.
func (s *Server) getPayloadInstanceInfo(_ context.Context, r *request) (byte, []byte) {
	d := r.msg.data
	if len(d) != 2 {
		return ccRequestLength, nil
	}
	if !payloadRequestOK(d) {
		return ccInvalidField, nil
	}
	out := make([]byte, 12)
	if s.sol != nil {
		binary.LittleEndian.PutUint32(out, s.sol.owner.id)
		out[4] = solPortPrimary
	}
	return ccOK, out
}

// Get Channel Payload Support (spec 24.8): IPMI and SOL, and the session
// setup payloads.
func (s *Server) getChannelPayloadSupport(_ context.Context, r *request) (byte, []byte) {
	d := r.msg.data
	if len(d) != 1 {
		return ccRequestLength, nil
	}
	if !validChannel(d[0]) {
		return ccInvalidField, nil
	}
	const (
		standardIPMIAndSOL = 1<<payloadIPMI | 1<<payloadSOL
		sessionSetupAll    = 0x3f // 10h to 15h
	)
	return ccOK, []byte{standardIPMIAndSOL, 0, sessionSetupAll, 0, 0, 0, 0, 0}
}

// Get Channel Payload Version (spec 24.9): version 1.0 of IPMI and SOL.
// freeipmi sends it as its keepalive during SOL.
func (s *Server) getChannelPayloadVersion(_ context.Context, r *request) (byte, []byte) {
	d := r.msg.data
	if len(d) != 2 {
		return ccRequestLength, nil
	}
	if !validChannel(d[0]) {
		return ccInvalidField, nil
	}
	if t := d[1]; t != payloadIPMI && t != payloadSOL {
		return ccPayloadTypeNotAvailable, nil
	}
	const version10 = 0x10
	return ccOK, []byte{version10}
}

// solConfig holds the SOL configuration parameters (spec table 26-5).
type solConfig struct {
	setInProgress bool
	owner         uint32 // the session that set "set in progress"
	enabled       bool
	privilege     privilege
	// accumulate is in 5 ms units, retryInterval in 10 ms units.
	accumulate, threshold   byte
	retries, retryInterval  byte
	bitRateNV, bitRateInUse byte
}

// SOL configuration parameter selectors.
const (
	solParamSetInProgress = 0
	solParamEnable        = 1
	solParamAuth          = 2
	solParamAccumulate    = 3
	solParamRetry         = 4
	solParamBitRateNV     = 5
	solParamBitRate       = 6
	solParamChannel       = 7
	solParamPort          = 8

	// solAuthForced: SOL is always encrypted and authenticated as its
	// session is (the force-encryption and force-authentication bits).
	solAuthForced  = 0xc0
	solRetryMask   = 0x07
	bitRate115200  = 0x0a
	setStateMask   = 0x03
	retriesDefault = 7
)

// defaultSOLConfig: 50 ms accumulate interval, a 96-character threshold,
// seven retries 500 ms apart, 115200 bit/s.
var defaultSOLConfig = solConfig{
	enabled:       true,
	privilege:     privUser,
	accumulate:    10,
	threshold:     96,
	retries:       retriesDefault,
	retryInterval: 50,
	bitRateNV:     bitRate115200,
	bitRateInUse:  bitRate115200,
}

func validBitRate(b byte) bool {
	switch b {
	case 0, 0x06, 0x07, 0x08, 0x09, 0x0a:
		return true
	}
	return false
}

// Get SOL Configuration Parameters (spec 26.3).
func (s *Server) getSOLConfig(_ context.Context, r *request) (byte, []byte) {
	d := r.msg.data
	if len(d) != 4 {
		return ccRequestLength, nil
	}
	if !validChannel(d[0]) {
		return ccInvalidField, nil
	}
	c := s.solConfig
	var v []byte
	switch d[1] {
	case solParamSetInProgress:
		if c.setInProgress {
			v = []byte{setInProgress}
		} else {
			v = []byte{setComplete}
		}
	case solParamEnable:
		if c.enabled {
			v = []byte{1}
		} else {
			v = []byte{0}
		}
	case solParamAuth:
		v = []byte{solAuthForced | byte(c.privilege)}
	case solParamAccumulate:
		v = []byte{c.accumulate, c.threshold}
	case solParamRetry:
		v = []byte{c.retries, c.retryInterval}
	case solParamBitRateNV:
		v = []byte{c.bitRateNV}
	case solParamBitRate:
		v = []byte{c.bitRateInUse}
	case solParamChannel:
		v = []byte{lanChannel}
	case solParamPort:
		v = binary.LittleEndian.AppendUint16(nil, r.link.solPort())
	default:
		return ccSOLParamUnsupported, nil
	}
	if d[0]&solGetRevisionOnly != 0 {
		return ccOK, []byte{solParameterRevision}
	}
	return ccOK, append([]byte{solParameterRevision}, v...)
}

// Set SOL Configuration Parameters (spec 26.2). The channel and port are
// read-only: SOL runs on the session's own channel and port.
func (s *Server) setSOLConfig(_ context.Context, r *request) (byte, []byte) {
	d := r.msg.data
	if len(d) < 2 {
		return ccRequestLength, nil
	}
	if !validChannel(d[0]) {
		return ccInvalidField, nil
	}
	c := &s.solConfig
	v := d[2:]
	want := map[byte]int{solParamSetInProgress: 1, solParamEnable: 1, solParamAuth: 1, solParamAccumulate: 2,
		solParamRetry: 2, solParamBitRateNV: 1, solParamBitRate: 1}
	switch n, known := want[d[1]]; {
	case d[1] == solParamChannel || d[1] == solParamPort:
		return ccSOLParamReadOnly, nil
	case !known:
		return ccSOLParamUnsupported, nil
	case len(v) != n:
		return ccRequestLength, nil
	}
	switch d[1] {
	case solParamSetInProgress:
		switch v[0] & setStateMask {
		case setComplete:
			c.setInProgress = false
		case setInProgress:
			if c.setInProgress {
				return ccSOLSetInProgress, nil
			}
			c.setInProgress, c.owner = true, r.sess.id
		case commitWrite:
			// Parameters take effect when set: nothing to commit.
		default:
			return ccInvalidField, nil
		}
	case solParamEnable:
		if v[0]&^1 != 0 {
			return ccInvalidField, nil
		}
		c.enabled = v[0] == 1
	case solParamAuth:
		p := privilege(v[0] & privMask)
		if v[0]&solAuthForced != solAuthForced || p < privUser || p > privAdmin {
			return ccInvalidField, nil
		}
		c.privilege = p
	case solParamAccumulate:
		if v[0] == 0 || v[1] == 0 {
			return ccInvalidField, nil
		}
		c.accumulate, c.threshold = v[0], v[1]
	case solParamRetry:
		if v[0]&^solRetryMask != 0 {
			return ccInvalidField, nil
		}
		c.retries, c.retryInterval = v[0], v[1]
	case solParamBitRateNV, solParamBitRate:
		if !validBitRate(v[0]) {
			return ccInvalidField, nil
		}
		if d[1] == solParamBitRateNV {
			c.bitRateNV = v[0]
		} else {
			c.bitRateInUse = v[0]
		}
	}
	return ccOK, nil
}
