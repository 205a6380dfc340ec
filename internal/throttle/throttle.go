// Package throttle slows down password guessing without locking anyone
// out. It is shared by every protocol of one BMC (Redfish and IPMI), so a
// failure over one counts against the same source over the other.
//
// A source (client IP address) that fails to authenticate gets a few free
// attempts, then must wait a growing delay before its next attempt is even
// checked, and after many failures is refused for a while. Throttling is per
// source, not per account, so an attacker cannot lock the account's owner
// out: the right password from another source still works. Failures against
// one username from many sources are counted too, and delay that username's
// logins from sources that have not authenticated recently, which slows a
// distributed guess without refusing the clients that use the account.
//
// The handshakes of IPMI 2.0 hand out a password-keyed hash to anyone who
// knows the username, so they are also rate limited per source
// (AllowHandshake), failures or not.
package throttle

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// Policy sets the limits. Zero fields take the defaults.
type Policy struct {
	// FreeFailures is how many failures a source makes before it is delayed
	// (default 3).
	FreeFailures int
	// BaseDelay is the wait after the first failure beyond the free ones;
	// each further failure doubles it, up to MaxDelay (defaults 1 s, 30 s).
	BaseDelay, MaxDelay time.Duration
	// BlockAfter failures refuse the source for BlockDuration (defaults 10
	// and 5 minutes).
	BlockAfter    int
	BlockDuration time.Duration
	// UserFreeFailures is how many failures against one username, from any
	// sources, pass before that username is delayed for sources without a
	// recent success (default 20).
	UserFreeFailures int
	// ForgetAfter is the quiet time after which failures and successes are
	// forgotten (default 15 minutes).
	ForgetAfter time.Duration
	// HandshakeRate and HandshakeBurst bound the handshake messages a
	// source may send (defaults 4 per second, burst 24: a dozen IPMI
	// sessions at once, as a provisioning sequence opens, then two a
	// second).
	HandshakeRate  float64
	HandshakeBurst int
	// MaxEntries bounds the memory spent on sources and usernames (default
	// 4096 of each); when full, the least recently seen entry is dropped.
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
	def(&p.UserFreeFailures, 20)
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

// record is what the limiter remembers of one source or username.
type record struct {
	failures    int
	lastFailure time.Time
	lastSuccess time.Time
	// tokens and filled are the handshake bucket (sources only).
	tokens float64
	filled time.Time
	seen   time.Time
}

// Limiter is safe for concurrent use.
type Limiter struct {
	off     bool
	p       Policy
	mu      sync.Mutex
	sources map[string]*record
	users   map[string]*record
	counts  Stats
}

// Stats are what a limiter has counted since it was made, for metrics.
type Stats struct {
	// Failures are the failed attempts recorded (Failed), refused ones
	// included.
	Failures uint64
	// Refused are the attempts Allow refused without a check.
	Refused uint64
	// HandshakesRefused are the handshakes AllowHandshake refused.
	HandshakesRefused uint64
	// ThrottledSources are the sources that must wait now (a point-in-time
	// count, not a total).
	ThrottledSources int
}

// Stats returns the counts so far; the unlimited limiter counts nothing.
func (l *Limiter) Stats() Stats {
	if l.off {
		return Stats{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.counts
	now := l.p.Now()
	for _, r := range l.sources {
		if l.wait(r, now, l.p.FreeFailures, true) > 0 {
			st.ThrottledSources++
		}
	}
	return st
}

// New returns a limiter with policy p.
func New(p Policy) *Limiter {
	return &Limiter{p: p.withDefaults(), sources: map[string]*record{}, users: map[string]*record{}}
}

// Unlimited is the limiter that never refuses: for a deployment that
// throttles in front of the BMC, and as the benchmarks' reference.
var Unlimited = &Limiter{off: true}

// Allow reports whether an authentication attempt from source for username
// may be checked now; if not, retryAfter is how long the source must wait.
// username is the account the attempt names, or "" when it names none.
func (l *Limiter) Allow(source, username string) (retryAfter time.Duration, ok bool) {
	if l.off {
		return 0, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.p.Now()
	src := l.sources[source]
	if wait := l.wait(src, now, l.p.FreeFailures, true); wait > 0 {
		l.counts.Refused++
		return wait, false
	}
	if username == "" {
		return 0, true
	}
	if src != nil && now.Sub(src.lastSuccess) < l.p.ForgetAfter {
		return 0, true // a source that logged in recently is not a guesser
	}
	if wait := l.wait(l.users[username], now, l.p.UserFreeFailures, false); wait > 0 {
		l.counts.Refused++
		return wait, false
	}
	return 0, true
}

// wait is how long r must still wait, given its free failures; block says
// whether many failures refuse it for BlockDuration.
func (l *Limiter) wait(r *record, now time.Time, free int, block bool) time.Duration {
	if r == nil || r.failures <= free || now.Sub(r.lastFailure) >= l.p.ForgetAfter {
		return 0
	}
	delay := l.p.MaxDelay
	if block && r.failures >= l.p.BlockAfter {
		delay = l.p.BlockDuration
	} else if n := r.failures - free - 1; n < 30 {
		delay = min(l.p.BaseDelay<<n, l.p.MaxDelay)
	}
	return max(r.lastFailure.Add(delay).Sub(now), 0)
}

// Failed records a failed attempt from source naming username ("" for an
// unknown name, which is counted against the source only).
func (l *Limiter) Failed(source, username string) {
	if l.off {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.p.Now()
	l.counts.Failures++
	l.fail(l.entry(l.sources, source, now), now)
	if username != "" {
		l.fail(l.entry(l.users, username, now), now)
	}
}

func (l *Limiter) fail(r *record, now time.Time) {
	if now.Sub(r.lastFailure) >= l.p.ForgetAfter {
		r.failures = 0
	}
	r.failures++
	r.lastFailure = now
}

// Succeeded records a successful login from source: its failures are
// forgotten, and it is trusted past a username's delay for a while. The
// username's own count is kept, so a distributed guess stays slowed.
func (l *Limiter) Succeeded(source string) {
	if l.off {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.p.Now()
	r := l.entry(l.sources, source, now)
	r.failures = 0
	r.lastSuccess = now
}

// AllowHandshake takes one token of source's handshake bucket.
func (l *Limiter) AllowHandshake(source string) bool {
	if l.off {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.p.Now()
	r := l.entry(l.sources, source, now)
	if r.filled.IsZero() {
		r.tokens = float64(l.p.HandshakeBurst)
	} else {
		r.tokens = min(r.tokens+now.Sub(r.filled).Seconds()*l.p.HandshakeRate, float64(l.p.HandshakeBurst))
	}
	r.filled = now
	if r.tokens < 1 {
		l.counts.HandshakesRefused++
		return false
	}
	r.tokens--
	return true
}

// entry returns the record for key, making room when the table is full.
func (l *Limiter) entry(table map[string]*record, key string, now time.Time) *record {
	r := table[key]
	if r == nil {
		if len(table) >= l.p.MaxEntries {
			l.evict(table, now)
		}
		r = &record{}
		table[key] = r
	}
	r.seen = now
	return r
}

// evict drops the forgotten entries, or else the least recently seen one.
func (l *Limiter) evict(table map[string]*record, now time.Time) {
	var oldestKey string
	var oldest *record
	for k, r := range table {
		if now.Sub(r.seen) >= l.p.ForgetAfter {
			delete(table, k)
			continue
		}
		if oldest == nil || r.seen.Before(oldest.seen) {
			oldestKey, oldest = k, r
		}
	}
	if len(table) >= l.p.MaxEntries && oldest != nil {
		delete(table, oldestKey)
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
