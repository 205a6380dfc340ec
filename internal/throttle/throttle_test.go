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
	fail := func() { l.Failed("10.0.0.1", "") }
	fail()
	fail()
	if _, ok := l.Allow("10.0.0.1", ""); !ok {
		t.Fatal("refused within the free failures")
	}
	// Failures 3, 4, 5 wait 1 s, 2 s, 4 s.
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		fail()
		wait, ok := l.Allow("10.0.0.1", "")
		if ok || wait != want {
			t.Fatalf("after failure %d: Allow = %v, %v; want refused for %v", i+3, wait, ok, want)
		}
		c.Advance(want - time.Millisecond)
		if _, ok := l.Allow("10.0.0.1", ""); ok {
			t.Fatalf("allowed before the delay of failure %d ended", i+3)
		}
		c.Advance(time.Millisecond)
		if _, ok := l.Allow("10.0.0.1", ""); !ok {
			t.Fatalf("still refused after the delay of failure %d", i+3)
		}
	}
	fail() // the sixth: blocked
	if wait, ok := l.Allow("10.0.0.1", ""); ok || wait != time.Minute {
		t.Fatalf("after BlockAfter failures: %v, %v; want refused for a minute", wait, ok)
	}
	if _, ok := l.Allow("10.0.0.2", ""); !ok {
		t.Fatal("another source is refused")
	}
	c.Advance(time.Minute)
	if _, ok := l.Allow("10.0.0.1", ""); !ok {
		t.Fatal("refused after the block ended")
	}
	l.Succeeded("10.0.0.1")
	fail()
	if _, ok := l.Allow("10.0.0.1", ""); !ok {
		t.Fatal("a success did not reset the source's failures")
	}
}

func TestFailuresAreForgotten(t *testing.T) {
	l, c := newTestLimiter(Policy{FreeFailures: 1, ForgetAfter: time.Minute})
	l.Failed("a", "")
	l.Failed("a", "")
	if _, ok := l.Allow("a", ""); ok {
		t.Fatal("not delayed")
	}
	c.Advance(time.Minute)
	l.Failed("a", "")
	if _, ok := l.Allow("a", ""); !ok {
		t.Fatal("old failures still count after ForgetAfter")
	}
}

// TestUsernameDelaysStrangersOnly: a guess spread over many sources slows
// that username for new sources, never for one that logged in recently.
func TestUsernameDelaysStrangersOnly(t *testing.T) {
	l, _ := newTestLimiter(Policy{FreeFailures: 3, UserFreeFailures: 5})
	l.Succeeded("maas")
	for i := range 6 {
		l.Failed(fmt.Sprintf("10.0.0.%d", i), "admin")
	}
	if _, ok := l.Allow("10.0.1.1", "admin"); ok {
		t.Error("a new source may try the attacked username at once")
	}
	if _, ok := l.Allow("10.0.1.1", "operator"); !ok {
		t.Error("another username is delayed")
	}
	if _, ok := l.Allow("maas", "admin"); !ok {
		t.Error("the source that logged in recently is delayed")
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

func TestMaxEntriesBoundsMemory(t *testing.T) {
	l, c := newTestLimiter(Policy{MaxEntries: 10})
	for i := range 100 {
		c.Advance(time.Millisecond)
		l.Failed(fmt.Sprintf("s%d", i), fmt.Sprintf("u%d", i))
	}
	if len(l.sources) > 10 || len(l.users) > 10 {
		t.Fatalf("%d sources, %d users; want at most 10 each", len(l.sources), len(l.users))
	}
	if _, ok := l.sources["s99"]; !ok {
		t.Fatal("the newest entry was dropped")
	}
}

func TestUnlimited(t *testing.T) {
	for range 100 {
		Unlimited.Failed("a", "b")
	}
	Unlimited.Succeeded("a")
	if _, ok := Unlimited.Allow("a", "b"); !ok || !Unlimited.AllowHandshake("a") {
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
		if _, ok := l.Allow("192.0.2.10", "maas"); !ok {
			b.Fatal("refused")
		}
		l.Succeeded("192.0.2.10")
	}
}

// TestStats counts failures, refusals and refused handshakes, and the
// sources that must wait right now.
func TestStats(t *testing.T) {
	l, c := newTestLimiter(Policy{FreeFailures: 1, BaseDelay: time.Second, MaxDelay: time.Second, HandshakeRate: 1, HandshakeBurst: 1})
	for range 2 {
		l.Failed("10.0.0.1", "")
	}
	l.Failed("10.0.0.2", "")
	if _, ok := l.Allow("10.0.0.1", ""); ok {
		t.Fatal("a source past its free failures was allowed")
	}
	l.AllowHandshake("10.0.0.3")
	l.AllowHandshake("10.0.0.3")
	want := Stats{Failures: 3, Refused: 1, HandshakesRefused: 1, ThrottledSources: 1}
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
