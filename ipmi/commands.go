package ipmi

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/machine"
)

// Network functions and commands served (spec appendix G).
const (
	netFnChassis = 0x00
	netFnApp     = 0x06

	cmdGetDeviceID              = 0x01
	cmdGetSelfTestResults       = 0x04
	cmdGetSystemGUID            = 0x37
	cmdGetChannelAuthCaps       = 0x38
	cmdGetSessionChallenge      = 0x39
	cmdActivateSession          = 0x3a
	cmdSetSessionPrivilegeLevel = 0x3b
	cmdCloseSession             = 0x3c
	cmdGetSessionInfo           = 0x3d
	cmdGetChannelCipherSuites   = 0x54

	cmdGetChassisStatus     = 0x01
	cmdChassisControl       = 0x02
	cmdSetSystemBootOptions = 0x08
	cmdGetSystemBootOptions = 0x09
)

// Generic completion codes (spec table 5-2).
const (
	ccOK                    = 0x00
	ccNodeBusy              = 0xc0
	ccInvalidCommand        = 0xc1
	ccInvalidLUN            = 0xc2
	ccRequestLength         = 0xc7
	ccNotPresent            = 0xcb
	ccInvalidField          = 0xcc
	ccInsufficientPrivilege = 0xd4
	ccInvalidState          = 0xd5
	ccUnspecified           = 0xff
)

// completionCode maps a machine error to a completion code. It is the
// only place where machine errors become IPMI codes.
func completionCode(err error) byte {
	switch {
	case err == nil:
		return ccOK
	case errors.Is(err, machine.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return ccNodeBusy
	case errors.Is(err, machine.ErrConsoleInUse):
		// Only console opens return it, and Activate Payload's 80h is
		// "payload already active".
		return ccPayloadActive
	case errors.Is(err, machine.ErrNotSupported), errors.Is(err, machine.ErrInvalidArgument):
		return ccInvalidField
	case errors.Is(err, machine.ErrConflict):
		return ccInvalidState
	case errors.Is(err, machine.ErrNotFound):
		return ccNotPresent
	}
	return ccUnspecified
}

// loginFailed counts a failed login against source and the account it
// named, and logs it with the name tried.
func (s *Server) loginFailed(source string, named throttle.Account, tried []byte) {
	s.limiter.Failed(source, named)
	s.audit.LoginFailed(auditlog.Actor{Protocol: auditlog.IPMI, Account: printableName(tried), Source: source})
}

// printableName is a user name as a client sent it, fit for a log line:
// IPMI names are up to 16 bytes of anything.
func printableName(name []byte) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '?'
		}
		return r
	}, string(name))
}

// actorOf is who makes a request, for the audit log.
func actorOf(r *request) auditlog.Actor {
	return auditlog.Actor{Protocol: auditlog.IPMI, Account: printableName(r.sess.username), Source: throttle.Source(r.remote)}
}

// machineFailure logs a failed machine call and returns its completion code.
func (s *Server) machineFailure(err error, operation string) (byte, []byte) {
	cc := completionCode(err)
	s.log.Error(err, "machine call failed", "operation", operation, "completionCode", cc)
	return cc, nil
}

// request is one IPMI request being served.
type request struct {
	sess   *session // nil outside a session
	msg    message
	remote string
	now    time.Time
	// endSession is set by Close Session for the requesting session, which
	// must still sign the reply.
	endSession bool
	// link is how to reach the requester; afterReply, when set, runs once
	// the reply is sent.
	link       link
	afterReply func()
}

type command struct {
	// minPriv is the session privilege needed; zero means the command also
	// runs outside a session.
	minPriv privilege
	// usesMachine: the command calls the machine, so it answers "node
	// busy" while the machine is not ready.
	usesMachine bool
	run         func(s *Server, ctx context.Context, r *request) (cc byte, data []byte)
}

func commandKey(netFn, cmd byte) uint16 { return uint16(netFn)<<8 | uint16(cmd) }

var commands = map[uint16]command{
	commandKey(netFnApp, cmdGetDeviceID):              {privUser, false, (*Server).getDeviceID},
	commandKey(netFnApp, cmdGetSelfTestResults):       {privUser, false, (*Server).getSelfTestResults},
	commandKey(netFnApp, cmdGetSystemGUID):            {0, true, (*Server).getSystemGUID},
	commandKey(netFnApp, cmdGetChannelAuthCaps):       {0, false, (*Server).getChannelAuthCaps},
	commandKey(netFnApp, cmdGetSessionChallenge):      {0, false, (*Server).getSessionChallenge},
	commandKey(netFnApp, cmdActivateSession):          {0, false, (*Server).activateOutOfHandshake},
	commandKey(netFnApp, cmdSetSessionPrivilegeLevel): {privCallback, false, (*Server).setSessionPrivilege},
	commandKey(netFnApp, cmdCloseSession):             {privCallback, false, (*Server).closeSession},
	commandKey(netFnApp, cmdGetSessionInfo):           {privUser, false, (*Server).getSessionInfo},
	commandKey(netFnApp, cmdGetChannelCipherSuites):   {0, false, (*Server).getChannelCipherSuites},

	commandKey(netFnApp, cmdActivatePayload):              {privUser, true, (*Server).activatePayload},
	commandKey(netFnApp, cmdDeactivatePayload):            {privUser, false, (*Server).deactivatePayload},
	commandKey(netFnApp, cmdGetPayloadActivationStatus):   {privUser, false, (*Server).getPayloadActivationStatus},
	commandKey(netFnApp, cmdGetPayloadInstanceInfo):       {privUser, false, (*Server).getPayloadInstanceInfo},
	commandKey(netFnApp, cmdGetChannelPayloadSupport):     {privUser, false, (*Server).getChannelPayloadSupport},
	commandKey(netFnApp, cmdGetChannelPayloadVersion):     {privUser, false, (*Server).getChannelPayloadVersion},
	commandKey(netFnTransport, cmdSetSOLConfigParameters): {privAdmin, false, (*Server).setSOLConfig},
	commandKey(netFnTransport, cmdGetSOLConfigParameters): {privUser, false, (*Server).getSOLConfig},

	commandKey(netFnChassis, cmdGetChassisStatus):     {privUser, true, (*Server).getChassisStatus},
	commandKey(netFnChassis, cmdChassisControl):       {privOperator, true, (*Server).chassisControl},
	commandKey(netFnChassis, cmdSetSystemBootOptions): {privOperator, true, (*Server).setSystemBootOptions},
	commandKey(netFnChassis, cmdGetSystemBootOptions): {privOperator, true, (*Server).getSystemBootOptions},

	commandKey(netFnStorage, cmdGetSELInfo):  {privUser, false, (*Server).getSELInfo},
	commandKey(netFnStorage, cmdReserveSEL):  {privUser, false, (*Server).reserveSEL},
	commandKey(netFnStorage, cmdGetSELEntry): {privUser, false, (*Server).getSELEntry},
	commandKey(netFnStorage, cmdClearSEL):    {privOperator, false, (*Server).clearSEL},
	commandKey(netFnStorage, cmdGetSELTime):  {privUser, false, (*Server).getSELTime},
}

// dispatch runs r and returns the encoded response message and whether the
// requesting session ends once the reply is sent.
func (s *Server) dispatch(ctx context.Context, r *request) (reply []byte, endSession bool) {
	cc, data := s.run(ctx, r)
	if cc != ccOK {
		data = nil
		s.log.V(1).Info("request refused", "remote", r.remote, "netFn", r.msg.netFn, "command", r.msg.cmd, "completionCode", cc)
	}
	return r.msg.encodeResponse(cc, data), r.endSession
}

func (s *Server) run(ctx context.Context, r *request) (byte, []byte) {
	if r.msg.rsLUN != 0 {
		return ccInvalidLUN, nil
	}
	cmd, ok := commands[commandKey(r.msg.netFn, r.msg.cmd)]
	if !ok {
		return ccInvalidCommand, nil
	}
	if r.sess == nil && cmd.minPriv != 0 || r.sess != nil && r.sess.priv < cmd.minPriv {
		return ccInsufficientPrivilege, nil
	}
	if cmd.usesMachine {
		if err := s.ready(); err != nil {
			s.log.V(1).Info("machine not ready", "reason", err.Error())
			return ccNodeBusy, nil
		}
		if cmd.minPriv >= privOperator {
			// The audit log says who asked for the writes it makes.
			ctx = auditlog.WithActor(ctx, actorOf(r))
		}
	}
	return cmd.run(s, ctx, r)
}
