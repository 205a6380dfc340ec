package ipmi

import (
	"crypto/rand"
	"encoding/binary"
	"slices"
	"time"

	"github.com/virtmetal/virtmetal/internal/throttle"
)

// privilege is an IPMI privilege level (spec table 6-1).
type privilege byte

const (
	privCallback privilege = 1
	privUser     privilege = 2
	privOperator privilege = 3
	privAdmin    privilege = 4
	// privMask: privilege fields use the low nibble; RAKP 1 puts the
	// name-only-lookup flag above it.
	privMask = 0x0f
)

func (p privilege) valid() bool { return p >= privCallback && p <= privAdmin }

func (p privilege) String() string {
	switch p {
	case privCallback:
		return "CALLBACK"
	case privUser:
		return "USER"
	case privOperator:
		return "OPERATOR"
	case privAdmin:
		return "ADMINISTRATOR"
	}
	return "INVALID"
}

// seqWindow rejects replayed and far-off session sequence numbers. It
// accepts numbers up to seqAhead above the highest seen and, once each, up
// to seqBehind below it (the sliding window of spec 6.12.13).
type seqWindow struct {
	started bool
	highest uint32
	seen    uint32 // bit i: highest-i has been received
}

const (
	seqAhead  = 16
	seqBehind = 15
)

// startAt makes first the lowest acceptable number (the one below it
// counts as seen).
func (w *seqWindow) startAt(first uint32) {
	*w = seqWindow{started: true, highest: first - 1, seen: 1}
}

// accept records seq and reports whether it is fresh. Zero is never valid
// inside a session.
func (w *seqWindow) accept(seq uint32) bool {
	if seq == 0 {
		return false
	}
	if !w.started {
		*w = seqWindow{started: true, highest: seq, seen: 1}
		return true
	}
	d := int32(seq - w.highest)
	switch {
	case d > 0 && d <= seqAhead:
		w.seen = w.seen<<uint(d) | 1
		w.highest = seq
		return true
	case d <= 0 && -d <= seqBehind:
		bit := uint32(1) << uint(-d)
		if w.seen&bit != 0 {
			return false
		}
		w.seen |= bit
		return true
	}
	return false
}

type sessionState int

const (
	// stateChallenged: IPMI 1.5, challenge sent, Activate Session expected.
	stateChallenged sessionState = iota
	// stateOpened: RMCP+, Open Session answered, RAKP 1 expected.
	stateOpened
	// stateRAKP2Sent: RMCP+, RAKP 2 sent, RAKP 3 expected.
	stateRAKP2Sent
	stateActive
)

// session is one entry of the session table, from the first handshake
// message until Close Session or timeout.
type session struct {
	id        uint32 // the BMC's session ID (SIDc for RMCP+)
	consoleID uint32 // RMCP+: the remote console's session ID (SIDm)
	handle    byte
	remote    string
	v2        bool
	state     sessionState

	// IPMI 1.5
	authType  byte
	challenge [16]byte

	// RMCP+
	suite    cipherSuite
	rm, rc   [16]byte
	role     byte // RAKP 1 role byte, as hashed
	username []byte
	guid     [16]byte // as sent in RAKP 2
	keys     sessionKeys

	// password is the one this session authenticated with; previous
	// marks the rotated-out one, whose sessions end with its grace window.
	password []byte
	previous bool

	maxPriv privilege
	priv    privilege
	in      seqWindow
	outSeq  uint32

	created  time.Time
	lastSeen time.Time
}

// nextOutSeq returns the sequence number for the next packet to the
// console, skipping zero.
func (s *session) nextOutSeq() uint32 {
	seq := s.outSeq
	s.outSeq++
	if s.outSeq == 0 {
		s.outSeq = 1
	}
	return seq
}

// sessionTable holds at most max sessions of any state, so unauthenticated
// handshakes cannot grow memory. A source holds at most perSource
// unfinished handshakes, so a flood from one address only ever evicts its
// own; a full table gives up a handshake of the source holding the most
// (one that never got past Open Session first: a spoofed source never
// does) before refusing a new one.
type sessionTable struct {
	max       int
	perSource int
	byID      map[uint32]*session
}

func newSessionTable(max, perSource int) *sessionTable {
	return &sessionTable{max: max, perSource: perSource, byID: make(map[uint32]*session, max)}
}

// add assigns s a fresh ID and handle and stores it. It reports the
// evicted handshake, if any, and false when no handshake may give way.
func (t *sessionTable) add(s *session) (evicted *session, ok bool) {
	source := throttle.Source(s.remote)
	pending := map[string][]*session{}
	for _, c := range t.byID {
		if c.state != stateActive {
			src := throttle.Source(c.remote)
			pending[src] = append(pending[src], c)
		}
	}
	switch {
	case len(pending[source]) >= t.perSource:
		evicted = oldestHandshake(pending[source])
	case len(t.byID) >= t.max:
		most := 0
		for _, list := range pending {
			most = max(most, len(list))
		}
		var busiest []*session
		for _, list := range pending {
			if len(list) == most {
				busiest = append(busiest, list...)
			}
		}
		if len(busiest) == 0 {
			return nil, false
		}
		evicted = oldestHandshake(busiest)
	}
	if evicted != nil {
		delete(t.byID, evicted.id)
	}
	for s.id == 0 || t.byID[s.id] != nil {
		s.id = randomUint32()
	}
	used := make(map[byte]bool, len(t.byID))
	for _, c := range t.byID {
		used[c.handle] = true
	}
	for h := byte(1); ; h++ {
		if !used[h] {
			s.handle = h
			break
		}
	}
	t.byID[s.id] = s
	return evicted, true
}

// oldestHandshake prefers handshakes still waiting for RAKP 1: a console
// that received the Open Session answer sends it at once.
func oldestHandshake(list []*session) *session {
	var best *session
	for _, c := range list {
		opened, bestOpened := c.state == stateOpened, best != nil && best.state == stateOpened
		if best == nil || opened && !bestOpened || opened == bestOpened && c.created.Before(best.created) {
			best = c
		}
	}
	return best
}

// expired returns the sessions idle for longer than their limit.
func (t *sessionTable) expired(now time.Time, idle, handshake time.Duration) []*session {
	var out []*session
	for _, s := range t.byID {
		limit := idle
		if s.state != stateActive {
			limit = handshake
		}
		if now.Sub(s.lastSeen) > limit {
			out = append(out, s)
		}
	}
	return out
}

// active lists the active sessions by handle.
func (t *sessionTable) active() []*session {
	var out []*session
	for _, s := range t.byID {
		if s.state == stateActive {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b *session) int { return int(a.handle) - int(b.handle) })
	return out
}

func randomUint32() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint32(b[:])
}
