package throttle

import (
	"fmt"
	"testing"
	"time"
)

type clock struct{ now time.Time }

func (c *clock) Now() time.Time          { return c.now }
func (c *clock) Advance(d time.Duration) { c.now = c.now.Add(d) }

func newTestLimiter(p Policy) (*Limiter, *clock) {
	c := &clock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	p.Now = c.Now
	return New(p), c
}

func TestSourceDelayGrowsThenBlocks(t *testing.T) {
	l, c := newTestLimiter(Policy{FreeFailures: 2, BaseDelay: time.Second, MaxDelay: 8 * time.Second, BlockAfter: 6, BlockDuration: time.Minute})
	fail := func() { l.Failed("10.0.0.1", Named("maas")) }
	fail()
	fail()
	if _, ok := l.Allow("10.0.0.1", Named("maas")); !ok {
		t.Fatal("refused within the free failures")
	}
	// Failures 3, 4, 5 wait 1 s, 2 s, 4 s.
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		fail()
		wait, ok := l.Allow("10.0.0.1", Named("maas"))
		if ok || wait != want {
			t.Fatalf("after failure %d: Allow = %v, %v; want refused for %v", i+3, wait, ok, want)
		}
		c.Advance(want - time.Millisecond)
		if _, ok := l.Allow("10.0.0.1", Named("maas")); ok {
			t.Fatalf("allowed before the delay of failure %d ended", i+3)
		}
		c.Advance(time.Millisecond)
		if _, ok := l.Allow("10.0.0.1", Named("maas")); !ok {
			t.Fatalf("still refused after the delay of failure %d", i+3)
		}
	}
	fail() // the sixth: blocked
	if wait, ok := l.Allow("10.0.0.1", Named("maas")); ok || wait != time.Minute {
		t.Fatalf("after BlockAfter failures: %v, %v; want refused for a minute", wait, ok)
	}
	if _, ok := l.Allow("10.0.0.2", Named("maas")); !ok {
		t.Fatal("another source is refused")
	}
	c.Advance(time.Minute)
	if _, ok := l.Allow("10.0.0.1", Named("maas")); !ok {
		t.Fatal("refused after the block ended")
	}
	l.Succeeded("10.0.0.1", Named("maas"))
	fail()
	if _, ok := l.Allow("10.0.0.1", Named("maas")); !ok {
		t.Fatal("a success did not reset the source's failures")
	}
}

func TestFailuresAreForgotten(t *testing.T) {
	l, c := newTestLimiter(Policy{FreeFailures: 1, ForgetAfter: time.Minute})
	l.Failed("a", Named("maas"))
	l.Failed("a", Named("maas"))
	if _, ok := l.Allow("a", Named("maas")); ok {
		t.Fatal("not delayed")
	}
	c.Advance(time.Minute)
	l.Failed("a", Named("maas"))
	if _, ok := l.Allow("a", Named("maas")); !ok {
		t.Fatal("old failures still count after ForgetAfter")
	}
}

// TestKeys: failures count per scope, source and account; a name that is
// no account counts in the source's bucket of unknown names, which holds
// back no real account; a success clears its own key and no other.
func TestKeys(t *testing.T) {
	l, _ := newTestLimiter(Policy{FreeFailures: 1, BlockAfter: 3})
	web1, web2 := l.Scoped("web1"), l.Scoped("web2")
	const ingress, other = "10.0.0.5", "10.0.0.6"
	for range 3 {
		web1.Failed(ingress, UnknownAccount)
		web1.Failed(ingress, Named(""))
		web1.Failed(other, Named("maas"))
		web2.Failed(ingress, Named("maas"))
	}
	refused := func(l *Limiter, source string, account Account) bool {
		_, ok := l.Allow(source, account)
		return !ok
	}
	for _, tt := range []struct {
		name    string
		limiter *Limiter
		source  string
		account Account
		want    bool
	}{
		{"unknown names after unknown-name failures", web1, ingress, UnknownAccount, true},
		{"the null user after its own failures", web1, ingress, Named(""), true},
		{"a real account after unknown-name failures", web1, ingress, Named("maas"), false},
		{"the account failed at from another source", web1, other, Named("maas"), true},
		{"another account from the failing source", web1, other, Named("operator"), false},
		{"unknown names from a source that failed at an account", web1, other, UnknownAccount, false},
		{"the same account and source on another VM", web2, other, Named("maas"), false},
		{"the VM whose failures they are", web2, ingress, Named("maas"), true},
		{"the unscoped limiter", l, ingress, Named("maas"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := refused(tt.limiter, tt.source, tt.account); got != tt.want {
				t.Errorf("refused = %v, want %v", got, tt.want)
			}
		})
	}
	// A success clears its own scope, source and account only.
	web1.Succeeded(ingress, Named("maas"))
	if !refused(web2, ingress, Named("maas")) {
		t.Error("a success on web1 cleared web2's failures")
	}
	if !refused(web1, ingress, UnknownAccount) || !refused(web1, ingress, Named("")) {
		t.Error("a success at maas cleared another account's failures from the same source")
	}
	web2.Succeeded(ingress, Named("maas"))
	if refused(web2, ingress, Named("maas")) {
		t.Error("a success did not clear its own failures")
	}
	if Unlimited.Scoped("web1") != Unlimited {
		t.Error("a scope of Unlimited limits")
	}
}

func TestHandshakeBucket(t *testing.T) {
	l, c := newTestLimiter(Policy{HandshakeRate: 2, HandshakeBurst: 3})
	for i := range 3 {
		if !l.AllowHandshake("a") {
			t.Fatalf("handshake %d of the burst refused", i+1)
		}
	}
	if l.AllowHandshake("a") {
		t.Fatal("handshake beyond the burst allowed")
	}
	if !l.AllowHandshake("b") {
		t.Fatal("another source shares the bucket")
	}
	c.Advance(500 * time.Millisecond)
	if !l.AllowHandshake("a") || l.AllowHandshake("a") {
		t.Fatal("want exactly one token after half a second at 2/s")
	}
}

// TestMaxEntriesBoundsMemory: a spray of names costs one entry a source,
// and a spray of sources and accounts, over scopes, stays within
// MaxEntries of failures and of handshake buckets.
func TestMaxEntriesBoundsMemory(t *testing.T) {
	l, c := newTestLimiter(Policy{MaxEntries: 10})
	for range 1000 {
		l.Failed("10.0.0.1", UnknownAccount) // what a spray of names records
	}
	if len(l.t.failures) != 1 {
		t.Fatalf("%d entries after 1000 unknown names from one source; want 1", len(l.t.failures))
	}
	for i := range 1000 {
		c.Advance(time.Millisecond)
		scoped := l.Scoped(fmt.Sprintf("vm%d", i%3))
		scoped.Failed(fmt.Sprintf("s%d", i), Named(fmt.Sprintf("u%d", i)))
		scoped.AllowHandshake(fmt.Sprintf("s%d", i))
	}
	if len(l.t.failures) > 10 || len(l.t.handshakes) > 10 {
		t.Fatalf("%d failure entries, %d handshake buckets; want at most 10 each", len(l.t.failures), len(l.t.handshakes))
	}
	if _, ok := l.t.failures[failureKey{"/vm0", "s999", Named("u999")}]; !ok {
		t.Fatal("the newest entry was dropped")
	}
}

func TestUnlimited(t *testing.T) {
	for range 100 {
		Unlimited.Failed("a", Named("b"))
	}
	Unlimited.Succeeded("a", Named("b"))
	if _, ok := Unlimited.Allow("a", Named("b")); !ok || !Unlimited.AllowHandshake("a") {
		t.Fatal("Unlimited refused")
	}
}

func TestSource(t *testing.T) {
	tests := map[string]string{
		"192.0.2.1:623":                  "192.0.2.1",
		"192.0.2.1":                      "192.0.2.1",
		"[::ffff:192.0.2.1]:80":          "192.0.2.1",
		"[2001:db8:1:2:3:4:5:6]:443":     "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1%eth0]:44": "2001:db8:1:2::/64",
		"not an address":                 "not an address",
	}
	for in, want := range tests {
		t.Run(in, func(t *testing.T) {
			if got := Source(in); got != want {
				t.Errorf("Source(%q) = %q, want %q", in, got, want)
			}
		})
	}
}

// BenchmarkSuccessfulLogin is the limiter's whole cost on the success
// path: one Allow and one Succeeded, for a known source and username.
func BenchmarkSuccessfulLogin(b *testing.B) {
	l := New(Policy{})
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := l.Allow("192.0.2.10", Named("maas")); !ok {
			b.Fatal("refused")
		}
		l.Succeeded("192.0.2.10", Named("maas"))
	}
}

// BenchmarkSpraySources is a failed login from a source never seen
// before, the table full: what a spray of new sources costs each time.
func BenchmarkSpraySources(b *testing.B) {
	l := New(Policy{})
	sources := make([]string, 1<<16)
	for i := range sources {
		sources[i] = fmt.Sprintf("2001:db8:%x::/64", i)
	}
	for i := range l.t.p.MaxEntries {
		l.Failed(fmt.Sprintf("10.0.%d.%d", i/256, i%256), UnknownAccount)
	}
	i := 0
	for b.Loop() {
		l.Failed(sources[i%len(sources)], UnknownAccount)
		i++
	}
}

// TestStats counts failures, refusals and refused handshakes, and the
// sources that must wait right now.
func TestStats(t *testing.T) {
	l, c := newTestLimiter(Policy{FreeFailures: 1, BaseDelay: time.Second, MaxDelay: time.Second, HandshakeRate: 1, HandshakeBurst: 1})
	for range 2 {
		l.Failed("10.0.0.1", UnknownAccount)
		l.Failed("10.0.0.1", Named("maas")) // the same source twice over: counted once
	}
	l.Failed("10.0.0.2", UnknownAccount)
	if _, ok := l.Allow("10.0.0.1", Named("maas")); ok {
		t.Fatal("a source past its free failures was allowed")
	}
	l.AllowHandshake("10.0.0.3")
	l.AllowHandshake("10.0.0.3")
	want := Stats{Failures: 5, Refused: 1, HandshakesRefused: 1, ThrottledSources: 1}
	if got := l.Stats(); got != want {
		t.Errorf("Stats = %+v, want %+v", got, want)
	}
	c.Advance(time.Second)
	want.ThrottledSources = 0
	if got := l.Stats(); got != want {
		t.Errorf("after the wait: Stats = %+v, want %+v", got, want)
	}
	if got := Unlimited.Stats(); got != (Stats{}) {
		t.Errorf("Unlimited.Stats = %+v", got)
	}
}
