package ipmi

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/machinetest"
	"github.com/virtmetal/virtmetal/sim/console"
)

// BenchmarkLanplusSession measures the server side of a whole lanplus
// exchange as ipmitool runs it: Get Channel Authentication Capabilities,
// Open Session, RAKP 1-4, Set Session Privilege Level, Get Chassis Status
// and Close Session. The in-process client calls the packet handler
// directly, so the figure excludes the network.
func BenchmarkLanplusSession(b *testing.B) {
	for _, suite := range []byte{3, 17} {
		b.Run(fmt.Sprintf("suite %d", suite), func(b *testing.B) {
			s, _, _ := testServer(b, nil)
			for b.Loop() {
				if cc, _, err := sessionless(s, testRemote, netFnApp, cmdGetChannelAuthCaps, 0x8e, byte(privAdmin)); err != nil || cc != ccOK {
					b.Fatalf("auth caps: cc %#x, %v", cc, err)
				}
				c := newLanplusClient(s, suite, testUser, testPassword)
				c.login(b, privAdmin)
				c.mustCommand(b, netFnChassis, cmdGetChassisStatus)
				c.mustCommand(b, netFnApp, cmdCloseSession, le32(c.bmcID)...)
			}
			if n := len(s.sessions.byID); n != 0 {
				b.Fatalf("%d sessions left", n)
			}
		})
	}
}

// BenchmarkSOLEcho measures the serial console's echo round trip, in bytes
// typed and echoed per second: through a SOL session of the in-process
// client (suite 17: every packet encrypted and signed, each side's packets
// acknowledged one at a time), beside the console stream read and written
// directly. "defaults" keeps the 50 ms accumulate interval and 96-character
// threshold, so a tail of output shorter than that waits; "5 ms" shortens
// the interval.
func BenchmarkSOLEcho(b *testing.B) {
	const size = 16 << 10
	typed := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	b.Run("console stream", func(b *testing.B) {
		_, m, _ := testServer(b, nil)
		stream := machinetest.AtPrompt(b, m, "vm-0")
		got := make([]byte, size)
		b.SetBytes(size)
		for b.Loop() {
			go stream.Write(typed)
			if _, err := io.ReadFull(stream, got); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, cfg := range []struct {
		name                  string
		accumulate, threshold byte
	}{{"SOL defaults", 10, 96}, {"SOL 5 ms", 1, 96}} {
		b.Run(cfg.name, func(b *testing.B) {
			s, m, _ := testServer(b, nil)
			if err := m.Reset(context.Background(), machine.ResetOn); err != nil {
				b.Fatal(err)
			}
			c := newSOLClient(b, s, 17, privAdmin)
			c.unsolicited = make(chan []byte, 1024)
			setSOL(b, c, solParamAccumulate, cfg.accumulate, cfg.threshold)
			c.mustCommand(b, netFnApp, cmdActivatePayload, activateSOL...)
			defer c.mustCommand(b, netFnApp, cmdDeactivatePayload, activateSOL...)
			sol := &solDriver{c: c}
			for !strings.HasSuffix(string(sol.received), console.Prompt("vm-0")) {
				sol.receive(b)
			}
			b.SetBytes(size)
			for b.Loop() {
				sol.received = sol.received[:0]
				for rest := typed; len(rest) > 0; {
					chunk := rest[:min(len(rest), solMaxChars)]
					n := sol.send(b, chunk)
					rest = rest[n:]
					if n < len(chunk) {
						// The console is busy: let its echo drain first,
						// then type the rest again, as ipmitool does. The
						// echo may all be in already, so wait briefly, not
						// for a packet.
						sol.takeWithin(b, solResendPause)
					}
					sol.drain(b)
				}
				for len(sol.received) < size {
					sol.receive(b)
				}
				if !bytes.Equal(sol.received, typed) {
					b.Fatalf("echo %d bytes differs", len(sol.received))
				}
			}
		})
	}
}

// solDriver is a remote console's SOL loop: it types, and acknowledges
// every output packet at once, as ipmitool and ipmiconsole do.
type solDriver struct {
	c        *lanplusClient
	seq      byte
	received []byte
}

// send types p and returns how much the BMC accepted.
func (d *solDriver) send(b *testing.B, p []byte) int {
	d.seq = d.seq%solMaxSeq + 1
	reply, err := d.c.sendSOL(d.seq, 0, 0, 0, p)
	if err != nil || reply == nil || reply.ack != d.seq {
		b.Fatalf("input answer %v, %v", reply, err)
	}
	return int(reply.count)
}

func (d *solDriver) take(b *testing.B, pkt []byte) {
	p, err := d.c.decodeSOL(pkt)
	if err != nil {
		b.Fatal(err)
	}
	if p.seq == 0 {
		return
	}
	d.received = append(d.received, p.data...)
	if _, err := d.c.sendSOL(0, p.seq, byte(len(p.data)), 0, nil); err != nil {
		b.Fatal(err)
	}
}

func (d *solDriver) receive(b *testing.B) {
	if !d.takeWithin(b, 5*time.Second) {
		b.Fatalf("no SOL output after %d bytes", len(d.received))
	}
}

// solResendPause is how long the driver waits before typing again what a
// busy BMC did not take; ipmitool sleeps 5 ms between its sends.
const solResendPause = 5 * time.Millisecond

// takeWithin takes the next output packet if one arrives within wait, and
// says whether one did.
func (d *solDriver) takeWithin(b *testing.B, wait time.Duration) bool {
	select {
	case pkt := <-d.c.unsolicited:
		d.take(b, pkt)
		return true
	case <-time.After(wait):
		return false
	}
}

func (d *solDriver) drain(b *testing.B) {
	for {
		select {
		case pkt := <-d.c.unsolicited:
			d.take(b, pkt)
		default:
			return
		}
	}
}
