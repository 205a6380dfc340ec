package ipmi

import (
	"cmp"
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/machine"
)

// Serial over LAN (spec chapter 15): the machine's serial console as
// payload type 1 of an RMCP+ session, sealed with the session's keys like
// its IPMI messages. Each side numbers its character packets 1 to 15 and
// sends the next only once the other has acknowledged the last one, with
// the count of characters it took; unacknowledged output is resent, at most
// the configured retry count, and then again whenever the console shows
// life. A console that never acknowledges therefore holds one packet and
// one read of the machine's output: the reader stops, and the console
// stream's back-pressure holds the machine's output back.

const (
	payloadSOL = 0x01
	// solInstance is the only payload instance: the machine has one
	// serial console.
	solInstance     = 1
	solHeaderLength = 4
	// solMaxChars is the character data of one packet. The accepted
	// character count is one byte, and freeipmi checks that payload sizes
	// stay within 255 characters plus the header.
	solMaxChars    = 252
	solPayloadSize = solHeaderLength + solMaxChars
	// solInputLimit bounds the typed characters accepted but not yet
	// written to the console.
	solInputLimit = 1024
	solMaxSeq     = 15

	// Operation bits, console to BMC (spec table 15-2).
	solOpNACK          = 0x40
	solOpBreak         = 0x10
	solOpFlushInbound  = 0x02
	solOpFlushOutbound = 0x01
	// Status bits, BMC to console.
	solStatusNACK         = 0x40
	solStatusUnavailable  = 0x20
	solStatusDeactivating = 0x10
)

// solSession is the active SOL payload: the console stream and the state
// of both directions. Everything but console is guarded by Server.mu.
type solSession struct {
	owner   *session
	console io.ReadWriteCloser
	send    func([]byte)
	// actor opened the console; the audit log's close entry names it.
	actor auditlog.Actor
	// cond (on Server.mu) wakes the reader when output was taken and the
	// writer when input arrived or the payload ended.
	cond    *sync.Cond
	started bool // the activation's answer is out: output may flow
	closed  bool
	eof     bool // the console ended; what was read still goes out

	// Output: read from the console, not yet in a packet; the packet
	// sent and not acknowledged, its sequence number and retries left.
	out         []byte
	inflight    []byte
	outSeq      byte
	retriesLeft int
	stalled     bool
	timer       *time.Timer // accumulate interval or retry interval
	watchdog    *time.Timer // ends the owner's session once idle too long

	// Input: accepted, not yet written to the console; how much of it
	// the console is being given now (it counts towards solInputLimit
	// until the console took it); the last packet taken, so that its
	// retransmission is acknowledged again, not taken twice.
	in             []byte
	writing        int
	lastInSeq      byte
	lastInAccepted byte
}

// startSOL holds the console stream of a payload the owner activated.
func (s *Server) startSOL(owner *session, console io.ReadWriteCloser, send func([]byte), actor auditlog.Actor) *solSession {
	sol := &solSession{owner: owner, console: console, send: send, actor: actor, cond: sync.NewCond(&s.mu)}
	s.sol = sol
	go s.solRead(sol)
	go s.solWrite(sol)
	s.armWatchdog(sol)
	return sol
}

// armWatchdog ends the owner's session when it goes idle, even if no other
// packet arrives to sweep the session table: the console is held for
// everyone else until then.
func (s *Server) armWatchdog(sol *solSession) {
	sol.watchdog = time.AfterFunc(s.timeout, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if sol.closed {
			return
		}
		s.expireSessions(s.now())
		if !sol.closed {
			s.armWatchdog(sol)
		}
	})
}

// solOutputStarts lets the payload's output flow, once the activation's
// answer has been sent.
func (s *Server) solOutputStarts(sol *solSession) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sol.started = true
	s.solKick(sol)
}

// solRead moves the machine's output into sol.out, waiting while a packet's
// worth is there already.
func (s *Server) solRead(sol *solSession) {
	buf := make([]byte, solMaxChars)
	for {
		n, err := sol.console.Read(buf)
		s.mu.Lock()
		for n > 0 && len(sol.out) >= solMaxChars && !sol.closed {
			sol.cond.Wait()
		}
		if sol.closed {
			s.mu.Unlock()
			return
		}
		sol.out = append(sol.out, buf[:n]...)
		if err != nil {
			sol.eof = true
			if !errors.Is(err, io.EOF) {
				s.log.Error(err, "SOL console read failed")
			}
		}
		s.solKick(sol)
		s.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// solWrite writes the accepted input to the console. A console that does
// not take it blocks here only: the packets keep being answered, with
// "character transfer unavailable" once solInputLimit is reached.
func (s *Server) solWrite(sol *solSession) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		for len(sol.in) == 0 && !sol.closed {
			sol.cond.Wait()
		}
		if sol.closed {
			return
		}
		chunk := sol.in
		sol.in, sol.writing = nil, len(chunk)
		s.mu.Unlock()
		_, err := sol.console.Write(chunk)
		s.mu.Lock()
		sol.writing = 0
		if err != nil && !sol.closed {
			s.log.Error(err, "SOL console write failed")
			sol.eof = true
			s.solKick(sol)
			return
		}
	}
}

// solKick sends the next output packet when one is due: nothing is in
// flight and the send threshold is reached (or the console ended); below
// the threshold, the accumulate interval starts. A console that ended and
// whose output all went out ends the payload. Callers hold mu.
func (s *Server) solKick(sol *solSession) {
	if sol.closed || !sol.started || sol.inflight != nil {
		return
	}
	if len(sol.out) == 0 {
		if sol.eof {
			s.solEnd("the console ended", true)
		}
		return
	}
	if len(sol.out) >= int(s.solConfig.threshold) || sol.eof {
		s.solSendNext(sol)
		return
	}
	if sol.timer == nil {
		s.solFlushLater(sol)
	}
}

// solFlushLater sends the output there is once the accumulate interval is
// over. Callers hold mu.
func (s *Server) solFlushLater(sol *solSession) {
	sol.timer = time.AfterFunc(time.Duration(s.solConfig.accumulate)*5*time.Millisecond, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		sol.timer = nil
		if !sol.closed && sol.inflight == nil && len(sol.out) > 0 {
			s.solSendNext(sol)
		}
	})
}

// solSendNext puts the next packet's worth of output in flight. Callers
// hold mu.
func (s *Server) solSendNext(sol *solSession) {
	if sol.timer != nil {
		sol.timer.Stop()
		sol.timer = nil
	}
	n := min(len(sol.out), solMaxChars)
	sol.inflight = sol.out[:n:n]
	sol.out = append([]byte(nil), sol.out[n:]...)
	sol.cond.Broadcast()
	sol.outSeq = sol.outSeq%solMaxSeq + 1
	sol.retriesLeft = int(s.solConfig.retries)
	sol.stalled = false
	s.solTransmit(sol)
}

// solTransmit sends the packet in flight, and arms its retry.
func (s *Server) solTransmit(sol *solSession) {
	s.solSend(sol, sol.outSeq, 0, 0, 0, sol.inflight)
	seq := sol.outSeq
	sol.timer = time.AfterFunc(time.Duration(s.solConfig.retryInterval)*10*time.Millisecond, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if sol.closed || sol.inflight == nil || sol.outSeq != seq {
			return
		}
		sol.timer = nil
		if sol.retriesLeft == 0 {
			sol.stalled = true
			return
		}
		sol.retriesLeft--
		s.solTransmit(sol)
	})
}

// solResendStalled resends output whose retries ran out, when its console
// sends anything. Callers hold mu.
func (s *Server) solResendStalled(sess *session) {
	if sol := s.sol; sol != nil && sol.owner == sess && sol.stalled && sol.inflight != nil {
		sol.stalled = false
		sol.retriesLeft = int(s.solConfig.retries)
		s.solTransmit(sol)
	}
}

// solSend seals one SOL packet for the owner's session and sends it.
func (s *Server) solSend(sol *solSession, seq, ack, accepted, status byte, data []byte) {
	payload := append([]byte{seq, ack, accepted, status}, data...)
	sess := sol.owner
	sol.send(sess.keys.seal(payloadSOL, sess.consoleID, sess.nextOutSeq(), payload))
}

// solPacket takes a SOL packet from sess: an acknowledgement of output,
// characters typed, or both. The answer acknowledges the characters. A
// session without the payload gets no answer. Callers hold mu.
func (s *Server) solPacket(sess *session, p []byte) ([]byte, error) {
	sol := s.sol
	if sol == nil || sol.owner != sess || sol.closed {
		return nil, errors.New("SOL packet on a session without the SOL payload")
	}
	if len(p) < solHeaderLength || len(p) > solHeaderLength+255 {
		return nil, malformed("SOL packet of %d bytes", len(p))
	}
	seq, ack, accepted, op, data := p[0]&0x0f, p[1]&0x0f, p[2], p[3], p[4:]
	if op&solOpFlushInbound != 0 {
		sol.in = nil
	}
	if op&solOpFlushOutbound != 0 {
		sol.out = nil
		sol.cond.Broadcast()
	}
	if ack != 0 && sol.inflight != nil && ack == sol.outSeq {
		taken := min(int(accepted), len(sol.inflight))
		// What the console did not take goes out again first.
		sol.out = append(sol.inflight[taken:len(sol.inflight):len(sol.inflight)], sol.out...)
		sol.inflight = nil
		if sol.timer != nil {
			sol.timer.Stop()
			sol.timer = nil
		}
		if op&solOpNACK == 0 {
			s.solKick(sol)
		} else if len(sol.out) > 0 {
			s.solFlushLater(sol) // a NACK asks for a pause
		}
	}
	if seq == 0 {
		return nil, nil // an acknowledgement only: characters in it are not numbered, so not taken
	}
	if seq == sol.lastInSeq {
		// A retransmission of the packet taken last: acknowledge it again.
		return s.solAck(sol, seq, sol.lastInAccepted, 0), nil
	}
	if op&solOpBreak != 0 {
		// The console contract carries bytes only: a break cannot reach
		// the machine. It is acknowledged, as the characters with it.
		s.log.V(1).Info("SOL break requested: not supported by the console", "sessionID", sess.id)
	}
	taken := min(len(data), solInputLimit-len(sol.in)-sol.writing)
	sol.in = append(sol.in, data[:taken]...)
	sol.lastInSeq, sol.lastInAccepted = seq, byte(taken)
	if taken > 0 {
		sol.cond.Broadcast()
	}
	var status byte
	if taken == 0 && len(data) > 0 {
		status = solStatusNACK | solStatusUnavailable
	}
	return s.solAck(sol, seq, byte(taken), status), nil
}

// solAck is the packet acknowledging the console's packet seq.
func (s *Server) solAck(sol *solSession, seq, accepted, status byte) []byte {
	sess := sol.owner
	return sess.keys.seal(payloadSOL, sess.consoleID, sess.nextOutSeq(), []byte{0, seq, accepted, status})
}

// solEnd deactivates the payload: it closes the console stream (so the
// console is free again when this returns), records the close, and, when
// notify, tells the owner's console with "SOL deactivating". why is ""
// when the owner ended it. Callers hold mu.
func (s *Server) solEnd(why string, notify bool) {
	sol := s.sol
	if sol == nil {
		return
	}
	s.sol = nil
	sol.closed = true
	sol.cond.Broadcast()
	for _, t := range []*time.Timer{sol.timer, sol.watchdog} {
		if t != nil {
			t.Stop()
		}
	}
	if notify && s.sessions.byID[sol.owner.id] == sol.owner {
		s.solSend(sol, 0, 0, 0, solStatusDeactivating, nil)
	}
	// Closing is quick for the backends (it ends a pipe or a websocket),
	// and a new activation must find the console free right away.
	if err := sol.console.Close(); err != nil {
		s.log.Error(err, "closing the SOL console failed")
	}
	s.audit.ConsoleClosed(auditlog.WithActor(context.Background(), sol.actor), s.machineID, machine.ConsoleSerial, why)
	s.log.Info("SOL deactivated", "sessionID", sol.owner.id, "remote", sol.owner.remote, "reason", cmp.Or(why, "deactivated by its console"))
}

// endSOL ends the payload, if any, when the server stops.
func (s *Server) endSOL(why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.solEnd(why, true)
}
