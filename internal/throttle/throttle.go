// Package throttle slows down password guessing without letting anyone
// lock an account's owner out. It is shared by every protocol of one BMC
// (Redfish and IPMI), so a failure over one counts over the other too.
//
// Failures are counted per source (client IP address) and account: a
// source that fails to log in to an account gets a few free attempts,
// then must wait a growing delay before its next attempt at that account
// is even checked, and after many failures is refused that account for a
// while. Nothing else is held back: the same account from another source,
// and another account from the same source, are checked as usual. Names
// that are no account share one count per source (UnknownAccount), which
// holds back only attempts with unknown names, so a guesser who does not
// know a username cannot touch a real account, and spraying names cannot
// grow the limiter's memory.
//
// No count spans sources: one would let whoever knows a username slow or
// refuse that account for everybody. A guess spread over many sources is
// slowed at each of them, and is hopeless against the generated passwords
// anyway.
//
// A Limiter scoped to a VM (Scoped) counts in tables shared with its
// parent but apart from every other scope's, so that a shared bmc-server's
// VMs neither lock each other out nor clear each other's failures.
//
// The handshakes of IPMI 2.0 hand out a password-keyed hash to anyone who
// knows the username, so they are also rate limited per source
// (AllowHandshake), failures or not.
package throttle

import (
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// Policy sets the limits. Zero fields take the defaults.
type Policy struct {
	// FreeFailures is how many failures a source makes at an account
	// before it is delayed (default 3).
	FreeFailures int
	// BaseDelay is the wait after the first failure beyond the free ones;
	// each further failure doubles it, up to MaxDelay (defaults 1 s, 30 s).
	BaseDelay, MaxDelay time.Duration
	// BlockAfter failures refuse the source that account for
	// BlockDuration (defaults 10 and 5 minutes).
	BlockAfter    int
	BlockDuration time.Duration
	// ForgetAfter is the quiet time after which failures are forgotten
	// (default 15 minutes).
	ForgetAfter time.Duration
	// HandshakeRate and HandshakeBurst bound the handshake messages a
	// source may send (defaults 4 per second, burst 24: a dozen IPMI
	// sessions at once, as a provisioning sequence opens, then two a
	// second).
	HandshakeRate  float64
	HandshakeBurst int
	// MaxEntries bounds the memory spent on failure counts and on
	// handshake buckets (default 4096 of each, over every scope); when
	// full, the least recently seen entry is dropped.
	MaxEntries int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (p Policy) withDefaults() Policy {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&p.FreeFailures, 3)
	defDur(&p.BaseDelay, time.Second)
	defDur(&p.MaxDelay, 30*time.Second)
	def(&p.BlockAfter, 10)
	defDur(&p.BlockDuration, 5*time.Minute)
	defDur(&p.ForgetAfter, 15*time.Minute)
	if p.HandshakeRate == 0 {
		p.HandshakeRate = 4
	}
	def(&p.HandshakeBurst, 24)
	def(&p.MaxEntries, 4096)
	if p.Now == nil {
		p.Now = time.Now
	}
	return p
}

// Account is the account a login names: Named for an account that exists,
// UnknownAccount for any name that does not. An account named "" (IPMI's
// null user) is Named(""), apart from the unknown names.
type Account struct {
	name  string
	known bool
}

// Named is the existing account called name.
func Named(name string) Account { return Account{name: name, known: true} }

// UnknownAccount stands for every name that is no account.
var UnknownAccount = Account{}

// failureKey is what failures are counted under: a source's attempts at
// an account, within a scope.
type failureKey struct {
	scope, source string
	account       Account
}

// sourceKey is a source within a scope: whose handshake bucket it is.
type sourceKey struct{ scope, source string }

// failures is what the limiter remembers of one failureKey.
type failures struct {
	seen
	count int
	last  time.Time
}

// bucket is one source's handshake tokens.
type bucket struct {
	seen
	tokens float64
	filled time.Time
}

// tables are a limiter's memory, shared by its scopes.
type tables struct {
	p          Policy
	mu         sync.Mutex
	failures   map[failureKey]*failures
	handshakes map[sourceKey]*bucket
	counts     Stats
}

// Limiter is safe for concurrent use.
type Limiter struct {
	off   bool
	scope string
	t     *tables
}

// Stats are what a limiter has counted since it was made, for metrics.
// They are the whole limiter's, over every scope.
type Stats struct {
	// Failures are the failed attempts recorded (Failed), refused ones
	// included.
	Failures uint64
	// Refused are the attempts Allow refused without a check.
	Refused uint64
	// HandshakesRefused are the handshakes AllowHandshake refused.
	HandshakesRefused uint64
	// ThrottledSources are the sources that must wait now before their
	// next attempt at some account (a point-in-time count, not a total;
	// a source held back at two VMs of a shared server counts twice).
	ThrottledSources int
}

// Stats returns the counts so far; the unlimited limiter counts nothing.
func (l *Limiter) Stats() Stats {
	if l.off {
		return Stats{}
	}
	t := l.t
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.counts
	now := t.p.Now()
	throttled := map[sourceKey]bool{}
	for k, f := range t.failures {
		if t.wait(f, now) > 0 {
			throttled[sourceKey{k.scope, k.source}] = true
		}
	}
	st.ThrottledSources = len(throttled)
	return st
}

// New returns a limiter with policy p.
func New(p Policy) *Limiter {
	return &Limiter{t: &tables{
		p:          p.withDefaults(),
		failures:   map[failureKey]*failures{},
		handshakes: map[sourceKey]*bucket{},
	}}
}

// Unlimited is the limiter that never refuses: for a deployment that
// throttles in front of the BMC, and as the benchmarks' reference.
var Unlimited = &Limiter{off: true}

// Scoped returns a limiter that counts in l's memory, bounded with it, but
// apart from l and from every other scope: one VM's of a shared server.
func (l *Limiter) Scoped(scope string) *Limiter {
	if l.off {
		return l
	}
	return &Limiter{scope: l.scope + "/" + scope, t: l.t}
}

// Allow reports whether an attempt from source at account may be checked
// now; if not, retryAfter is how long the source must wait.
func (l *Limiter) Allow(source string, account Account) (retryAfter time.Duration, ok bool) {
	if l.off {
		return 0, true
	}
	t := l.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if wait := t.wait(t.failures[failureKey{l.scope, source, account}], t.p.Now()); wait > 0 {
		t.counts.Refused++
		return wait, false
	}
	return 0, true
}

// wait is how long the source of f must still wait.
func (t *tables) wait(f *failures, now time.Time) time.Duration {
	p := t.p
	if f == nil || f.count <= p.FreeFailures || now.Sub(f.last) >= p.ForgetAfter {
		return 0
	}
	delay := p.MaxDelay
	if f.count >= p.BlockAfter {
		delay = p.BlockDuration
	} else if n := f.count - p.FreeFailures - 1; n < 30 {
		delay = min(p.BaseDelay<<n, p.MaxDelay)
	}
	return max(f.last.Add(delay).Sub(now), 0)
}

// Failed records a failed attempt from source at account.
func (l *Limiter) Failed(source string, account Account) {
	if l.off {
		return
	}
	t := l.t
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.p.Now()
	t.counts.Failures++
	f := entry(t, t.failures, failureKey{l.scope, source, account}, now, func() *failures { return &failures{} })
	if now.Sub(f.last) >= t.p.ForgetAfter {
		f.count = 0
	}
	f.count++
	f.last = now
}

// Succeeded records a successful login from source at account: that
// source's failures at that account are forgotten, and no other's.
func (l *Limiter) Succeeded(source string, account Account) {
	if l.off {
		return
	}
	t := l.t
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.failures, failureKey{l.scope, source, account})
}

// AllowHandshake takes one token of source's handshake bucket.
func (l *Limiter) AllowHandshake(source string) bool {
	if l.off {
		return true
	}
	t := l.t
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.p.Now()
	b := entry(t, t.handshakes, sourceKey{l.scope, source}, now, func() *bucket {
		return &bucket{tokens: float64(t.p.HandshakeBurst), filled: now}
	})
	b.tokens = min(b.tokens+now.Sub(b.filled).Seconds()*t.p.HandshakeRate, float64(t.p.HandshakeBurst))
	b.filled = now
	if b.tokens < 1 {
		t.counts.HandshakesRefused++
		return false
	}
	b.tokens--
	return true
}

// seen dates an entry of the limiter's tables, for eviction.
type seen struct{ at time.Time }

func (s *seen) lastSeen() time.Time { return s.at }
func (s *seen) see(now time.Time)   { s.at = now }

type dated interface {
	lastSeen() time.Time
	see(now time.Time)
}

// entry returns table's entry for key, made by fresh when there is none
// (making room when the table is full), and marks it seen now.
func entry[K comparable, V dated](t *tables, table map[K]V, key K, now time.Time, fresh func() V) V {
	v, ok := table[key]
	if !ok {
		if len(table) >= t.p.MaxEntries {
			evict(table, now, t.p.ForgetAfter, t.p.MaxEntries)
		}
		v = fresh()
		table[key] = v
	}
	v.see(now)
	return v
}

// evict drops the forgotten entries and, if that leaves the table over
// seven eighths full, the least recently seen down to that. Making room
// for many new entries at once keeps a spray of new sources from costing
// a walk of the whole table, under the lock every login takes, at each
// one of them.
func evict[K comparable, V dated](table map[K]V, now time.Time, forgetAfter time.Duration, maxEntries int) {
	type aged struct {
		key K
		at  time.Time
	}
	live := make([]aged, 0, len(table))
	for k, v := range table {
		if at := v.lastSeen(); now.Sub(at) < forgetAfter {
			live = append(live, aged{k, at})
		} else {
			delete(table, k)
		}
	}
	keep := maxEntries - maxEntries/8 - 1
	if len(live) <= keep {
		return
	}
	slices.SortFunc(live, func(a, b aged) int { return a.at.Compare(b.at) })
	for _, e := range live[:len(live)-keep] {
		delete(table, e.key)
	}
}

// Source is the throttling key of a network address ("host:port" or a bare
// IP): the IP address, and for IPv6 its /64, which one client usually owns
// whole. An unparsable address is its own key.
func Source(addr string) string {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap()
	if ip.Is6() {
		prefix, _ := ip.WithZone("").Prefix(64)
		return prefix.String()
	}
	return ip.String()
}
