package ipmi

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
)

const attackerIP = "198.51.100.66"

// floodOpenSessions sends n Open Session requests from the attacker's
// address, each from a new port, and a RAKP 1 for each one answered; it
// returns how many RAKP 2 password hashes it collected.
func floodOpenSessions(s *Server, n int, from int) (hashes int) {
	for i := range n {
		c := newLanplusClient(s, 17, testUser, "unknown")
		c.remote = fmt.Sprintf("%s:%d", attackerIP, from+i)
		p, err := c.handshakePayload(payloadOpenSessionRequest, openSessionRequest(uint32(1000+from+i), 0, c.suite), payloadOpenSessionResponse)
		if err != nil || p[1] != rmcpStatusOK {
			continue
		}
		bmcID := uint32(p[8]) | uint32(p[9])<<8 | uint32(p[10])<<16 | uint32(p[11])<<24
		p, err = c.handshakePayload(payloadRAKP1, rakp1Request(bmcID, make([]byte, 16), 0x14, []byte(testUser)), payloadRAKP2)
		if err == nil && p[1] == rmcpStatusOK {
			hashes++
		}
	}
	return hashes
}

// TestHandshakeFloodEvictsOnlyItsOwn: a flood of unauthenticated Open
// Session requests, between every legitimate client's Open Session and its
// RAKP 1, costs the legitimate clients nothing, and yields the attacker at
// most the handshake burst of password hashes.
func TestHandshakeFloodEvictsOnlyItsOwn(t *testing.T) {
	// Without throttling the per-source quota alone protects the
	// handshakes; with it, the flood is also cut short.
	for _, throttled := range []bool{false, true} {
		t.Run(fmt.Sprintf("throttled=%v", throttled), func(t *testing.T) {
			policy := throttle.Policy{HandshakeBurst: 24, HandshakeRate: 4}
			s, _, clock := testServer(t, func(c *Config) {
				if throttled {
					policy.Now = c.Now
					c.Limiter = throttle.New(policy)
				}
			})
			hashes, sent := 0, 0
			for i := range 20 {
				c := newLanplusClient(s, 17, testUser, testPassword)
				c.remote = fmt.Sprintf("127.0.0.1:%d", 41000+i)
				c.afterOpen = func() {
					hashes += floodOpenSessions(s, 50, sent)
					sent += 50
				}
				if err := c.connect(0, 0x14); err != nil {
					t.Fatalf("legitimate session %d during the flood: %v", i+1, err)
				}
				c.mustCommand(t, netFnChassis, cmdGetChassisStatus)
				clock.advance(time.Second) // the legitimate client's own bucket refills
			}
			// 20 s at 4 a second plus the burst, shared by Open Session
			// and RAKP 1.
			if limit := policy.HandshakeBurst + 20*int(policy.HandshakeRate); throttled && hashes > limit/2 {
				t.Errorf("the flood collected %d password hashes, want at most %d", hashes, limit/2)
			}
			pending := 0
			for _, sess := range s.sessions.byID {
				if throttle.Source(sess.remote) == attackerIP && sess.state != stateActive {
					pending++
				}
			}
			if pending > s.sessions.perSource {
				t.Errorf("the attacker holds %d handshakes, quota %d", pending, s.sessions.perSource)
			}
		})
	}
}

// TestFailedLoginsThrottledAcrossProtocols: wrong passwords over RAKP
// throttle that source (the right password from it is refused for a
// while), not the account: another source logs in. Failures recorded by
// another protocol on the shared limiter count too.
func TestFailedLoginsThrottledAcrossProtocols(t *testing.T) {
	var limiter *throttle.Limiter
	s, _, clock := testServer(t, func(c *Config) {
		limiter = throttle.New(throttle.Policy{FreeFailures: 2, BaseDelay: time.Second, BlockAfter: 5, BlockDuration: time.Minute, Now: c.Now})
		c.Limiter = limiter
	})
	from := func(remote, password string) error {
		c := newLanplusClient(s, 17, testUser, password)
		c.remote = remote
		return c.connect(0, 0x14)
	}
	for range 5 {
		if err := from(attackerIP+":1", "guess"); err == nil {
			t.Fatal("wrong password accepted")
		}
	}
	var se rmcpStatusError
	if err := from(attackerIP+":2", testPassword); !errors.As(err, &se) || se.status != rmcpStatusNoResources {
		t.Fatalf("right password from the blocked source: %v, want RMCP+ status %#x", err, rmcpStatusNoResources)
	}
	if err := from("192.0.2.10:623", testPassword); err != nil {
		t.Fatalf("the owner from another source: %v", err)
	}
	// A source that failed over Redfish is refused over IPMI.
	for range 5 {
		limiter.Failed("203.0.113.9", throttle.Named(testUser))
	}
	if err := from("203.0.113.9:5000", testPassword); err == nil {
		t.Fatal("a source blocked by Redfish failures logged in over IPMI")
	}
	clock.advance(time.Minute)
	if err := from(attackerIP+":3", testPassword); err != nil {
		t.Fatalf("after the block: %v", err)
	}
	// IPMI 1.5 logins count too.
	s15, _, _ := testServer(t, func(c *Config) {
		c.Limiter = throttle.New(throttle.Policy{FreeFailures: 1, BaseDelay: time.Minute, Now: c.Now})
	})
	for range 2 {
		c := newV15Client(s15, authTypeMD5, testUser, "guess")
		c.remote = attackerIP + ":9"
		if _, err := c.connect(privAdmin); err == nil {
			t.Fatal("IPMI 1.5 wrong password accepted")
		}
	}
	c := newV15Client(s15, authTypeMD5, testUser, testPassword)
	c.remote = attackerIP + ":10"
	if cc, _ := c.connect(privAdmin); cc != ccNodeBusy {
		t.Fatalf("IPMI 1.5 right password from a throttled source: cc %#x, want node busy", cc)
	}
}

// TestUnknownNamesHoldBackNoAccount: RAKP attempts with names that are
// no account, past the limiter's block, hold back only more unknown names
// from their source: the account's right password from that same source
// still opens a session, over lanplus and IPMI 1.5.
func TestUnknownNamesHoldBackNoAccount(t *testing.T) {
	s, _, _ := testServer(t, func(c *Config) {
		c.Limiter = throttle.New(throttle.Policy{FreeFailures: 2, BaseDelay: time.Minute, BlockAfter: 5, BlockDuration: time.Hour, Now: c.Now})
	})
	for i := range 8 {
		c := newLanplusClient(s, 17, fmt.Sprintf("nobody%d", i), "guess")
		c.remote = attackerIP + ":1"
		if err := c.connect(0, 0x14); err == nil {
			t.Fatal("an unknown name opened a session")
		}
	}
	c := newLanplusClient(s, 17, "nobody-else", testPassword)
	c.remote = attackerIP + ":1"
	var se rmcpStatusError
	if err := c.connect(0, 0x14); !errors.As(err, &se) || se.status != rmcpStatusNoResources {
		t.Errorf("another unknown name from that source: %v, want refused unchecked (RMCP+ status %#x)", err, rmcpStatusNoResources)
	}
	owner := newLanplusClient(s, 17, testUser, testPassword)
	owner.remote = attackerIP + ":2"
	if err := owner.connect(0, 0x14); err != nil {
		t.Fatalf("the account's right password from the source of the unknown names: %v", err)
	}
	v15 := newV15Client(s, authTypeMD5, testUser, testPassword)
	v15.remote = attackerIP + ":3"
	if cc, err := v15.connect(privAdmin); cc != ccOK || err != nil {
		t.Fatalf("IPMI 1.5 with the right password from that source: cc %#x, %v", cc, err)
	}
}

// TestIPMI15OffByDefault: without EnableV15 the BMC offers no IPMI 1.5
// authentication at all.
func TestIPMI15OffByDefault(t *testing.T) {
	s, _, _ := testServer(t, func(c *Config) { c.EnableV15 = false })
	cc, data, err := sessionless(s, testRemote, netFnApp, cmdGetChannelAuthCaps, 0x8e, byte(privAdmin))
	if err != nil || cc != ccOK {
		t.Fatalf("auth caps: %#x %v", cc, err)
	}
	if data[1]&0x3f != 0 || data[3]&0x01 != 0 {
		t.Errorf("auth caps % x advertise IPMI 1.5", data)
	}
	if cc, _, _ := sessionless(s, testRemote, netFnApp, cmdGetSessionChallenge, append([]byte{authTypeMD5}, pad16(testUser)...)...); cc != ccInvalidField {
		t.Errorf("Get Session Challenge: cc %#x, want %#x", cc, ccInvalidField)
	}
	if err := newLanplusClient(s, 17, testUser, testPassword).connect(0, 0x14); err != nil {
		t.Errorf("lanplus: %v", err)
	}
}

// blockingMachine's power reads wait for their context, as a call to an
// API server that silently drops traffic would; its inventory panics when
// told to.
type blockingMachine struct {
	limitedMachine
	calls   atomic.Int32
	explode atomic.Bool
	ready   atomic.Pointer[error]
}

func (m *blockingMachine) PowerState(ctx context.Context) (machine.PowerState, error) {
	m.calls.Add(1)
	<-ctx.Done()
	return "", ctx.Err()
}

func (m *blockingMachine) Reset(context.Context, machine.ResetType) error {
	if m.explode.Load() {
		panic("backend bug")
	}
	return nil
}

func (m *blockingMachine) Ready() error {
	if err := m.ready.Load(); err != nil {
		return *err
	}
	return nil
}

// withBlockingMachine serves a blockingMachine over the test machine.
func withBlockingMachine(bm *blockingMachine) func(*Config) {
	return func(c *Config) {
		mem := c.Machine.(*memory.Machine)
		bm.limitedMachine = limitedMachine{Machine: mem, caps: mem.Capabilities()}
		c.Machine = bm
	}
}

// TestMachineCallsOutsideTheLock: a hung machine call ends at its deadline
// with "node busy", and other clients are served meanwhile.
func TestMachineCallsOutsideTheLock(t *testing.T) {
	bm := &blockingMachine{}
	s, _, _ := testServer(t, func(c *Config) {
		withBlockingMachine(bm)(c)
		c.CallTimeout = 300 * time.Millisecond
	})
	a := newLanplusClient(s, 17, testUser, testPassword)
	a.login(t, privAdmin)
	done := make(chan byte)
	go func() {
		cc, _, _ := a.command(netFnChassis, cmdGetChassisStatus)
		done <- cc
	}()
	poll.True(t, "the call hung in the backend", func() bool { return bm.calls.Load() > 0 })
	b := newLanplusClient(s, 17, testUser, testPassword)
	b.remote = "127.0.0.1:40002"
	b.login(t, privUser) // would wait for the hung call if it held the lock
	select {
	case cc := <-done:
		t.Fatalf("the hung call answered (cc %#x) before another client was served", cc)
	default:
	}
	if cc := <-done; cc != ccNodeBusy {
		t.Fatalf("hung call: cc %#x, want node busy %#x", cc, ccNodeBusy)
	}
}

// TestHandlerPanicRecovered: a panicking backend costs one packet; the
// server goes on serving, the same session included.
func TestHandlerPanicRecovered(t *testing.T) {
	bm := &blockingMachine{}
	s, _, _ := testServer(t, withBlockingMachine(bm))
	a := newLanplusClient(s, 17, testUser, testPassword)
	a.login(t, privAdmin)
	bm.explode.Store(true)
	if _, _, err := a.command(netFnChassis, cmdChassisControl, 0x01); !errors.Is(err, errNoReply) {
		t.Fatalf("panicking command: %v, want no reply", err)
	}
	bm.explode.Store(false)
	a.mustCommand(t, netFnChassis, cmdChassisControl, 0x01)
}

// TestNodeBusyUntilReady: while the machine is not ready, its commands
// answer "node busy"; sessions and the other commands work.
func TestNodeBusyUntilReady(t *testing.T) {
	bm := &blockingMachine{}
	notReady := machine.Errorf(machine.ErrUnavailable, "cache not synced")
	bm.ready.Store(&notReady)
	s, _, _ := testServer(t, withBlockingMachine(bm))
	a := newLanplusClient(s, 17, testUser, testPassword)
	a.login(t, privAdmin)
	if cc, _, _ := a.command(netFnChassis, cmdChassisControl, 0x01); cc != ccNodeBusy {
		t.Fatalf("chassis control before ready: cc %#x, want %#x", cc, ccNodeBusy)
	}
	a.mustCommand(t, netFnApp, cmdGetDeviceID)
	bm.ready.Store(nil)
	a.mustCommand(t, netFnChassis, cmdChassisControl, 0x01)
}

// TestCredentialRotation: during the grace window both passwords log in (a
// console holding the new one after one aborted handshake, as RAKP 2 must
// be keyed before the console shows which it holds); afterwards the old
// one is refused and its sessions end.
func TestCredentialRotation(t *testing.T) {
	s, _, clock := testServer(t, nil)
	old := newLanplusClient(s, 17, testUser, testPassword)
	old.login(t, privAdmin)
	if err := s.SetCredentials(testUser, "new-pass", time.Minute); err != nil {
		t.Fatal(err)
	}
	old.mustCommand(t, netFnApp, cmdGetDeviceID)
	during := newLanplusClient(s, 17, testUser, testPassword)
	during.remote = "127.0.0.1:40002"
	during.login(t, privAdmin)
	fresh := newLanplusClient(s, 17, testUser, "new-pass")
	fresh.remote = "192.0.2.10:623"
	if err := fresh.connect(0, 0x14); err == nil {
		t.Fatal("first handshake with the new password during the window: want one abort")
	}
	fresh.login(t, privAdmin)
	clock.advance(time.Minute)
	for name, c := range map[string]*lanplusClient{"pre-rotation": old, "old password in the window": during} {
		if _, _, err := c.command(netFnApp, cmdGetDeviceID); !errors.Is(err, errNoReply) {
			t.Errorf("%s session after the window: %v, want ended", name, err)
		}
	}
	fresh.mustCommand(t, netFnApp, cmdGetDeviceID)
	if err := newLanplusClient(s, 17, testUser, testPassword).connect(0, 0x14); err == nil {
		t.Error("old password accepted after the window")
	}
	if err := newLanplusClient(s, 17, testUser, "new-pass").connect(0, 0x14); err != nil {
		t.Errorf("new password after the window: %v", err)
	}
	if err := s.SetCredentials(testUser, "this-password-is-too-long", 0); err == nil {
		t.Error("a 25-byte password was accepted")
	}
}
