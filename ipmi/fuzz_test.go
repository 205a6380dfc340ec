package ipmi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"os"
	"strings"
	"testing"

	"github.com/virtmetal/virtmetal/machine"
)

// capturedPackets returns the datagrams real clients sent (see the header
// of testdata/captured-packets.txt).
func capturedPackets(f *testing.F) [][]byte {
	f.Helper()
	file, err := os.Open("testdata/captured-packets.txt")
	if err != nil {
		f.Fatal(err)
	}
	defer file.Close()
	var out [][]byte
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		p, err := hex.DecodeString(line)
		if err != nil {
			f.Fatalf("bad seed %q: %v", line, err)
		}
		out = append(out, p)
	}
	if err := sc.Err(); err != nil || len(out) == 0 {
		f.Fatalf("no seeds (%v)", err)
	}
	return out
}

// generatedPackets are packets of the in-process client: a full RMCP+
// session, a 1.5 session and a presence ping.
func generatedPackets(f *testing.F) [][]byte {
	f.Helper()
	s, _, _ := testServer(f, nil)
	var out [][]byte
	record := func(pkt []byte) []byte {
		out = append(out, bytes.Clone(pkt))
		return s.handlePacket(context.Background(), pkt, testRemote)
	}
	c := newLanplusClient(s, 17, testUser, testPassword)
	c.consoleID = 0x0a0b0c0d
	open := record(sessionKeys{}.seal(payloadOpenSessionRequest, 0, 0, openSessionRequest(c.consoleID, 0, c.suite)))
	c.bmcID = binary.LittleEndian.Uint32(open[rmcpHeaderLength+v20HeaderLength+8:])
	record(sessionKeys{}.seal(payloadRAKP1, 0, 0, rakp1Request(c.bmcID, make([]byte, 16), 0x14, []byte(testUser))))
	record(sessionKeys{}.seal(payloadRAKP3, 0, 0, append([]byte{3, 0, 0, 0}, le32(c.bmcID)...)))
	out = append(out, encodeV15(v15Header{}, encodeRequest(netFnApp, cmdGetChannelAuthCaps, 1, []byte{0x8e, 4})))
	out = append(out, encodeASFPong(0xff, 1))
	return out
}

func addSeeds(f *testing.F) {
	for _, p := range append(capturedPackets(f), generatedPackets(f)...) {
		f.Add(p)
	}
}

// FuzzDecodeRMCP: RMCP and ASF presence ping decoding.
func FuzzDecodeRMCP(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, p []byte) {
		class, seq, body, err := decodeRMCP(p)
		if err != nil {
			return
		}
		if len(body) != len(p)-rmcpHeaderLength {
			t.Fatalf("body of %d bytes from a %d-byte packet", len(body), len(p))
		}
		if class != rmcpClassASF {
			return
		}
		tag, err := decodeASFPing(body)
		if err != nil {
			return
		}
		pong := encodeASFPong(seq, tag)
		if len(pong) != 28 || pong[9] != tag {
			t.Fatalf("pong % x for tag %#x", pong, tag)
		}
	})
}

// FuzzDecodeV15: the IPMI 1.5 session header; a decoded packet re-encodes
// to the same header and message.
func FuzzDecodeV15(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, p []byte) {
		_, _, body, err := decodeRMCP(p)
		if err != nil {
			return
		}
		h, msg, err := decodeV15(body)
		if err != nil {
			return
		}
		h2, msg2, err := decodeV15(encodeV15(h, msg)[rmcpHeaderLength:])
		if err != nil || h2 != h || !bytes.Equal(msg2, msg) {
			t.Fatalf("round trip: %+v % x (%v), want %+v % x", h2, msg2, err, h, msg)
		}
	})
}

// FuzzDecodeV20: the RMCP+ session header, trailer check and AES-CBC
// decryption with suite 17 keys.
func FuzzDecodeV20(f *testing.F) {
	addSeeds(f)
	_, keys := deriveKeys(knownCipherSuites[6], []byte(testPassword), make([]byte, 16), make([]byte, 16), 0x14, []byte(testUser))
	f.Fuzz(func(t *testing.T, p []byte) {
		_, _, body, err := decodeRMCP(p)
		if err != nil {
			return
		}
		h, payload, trailer, err := decodeV20(body)
		if err != nil {
			return
		}
		if len(payload)+len(trailer)+v20HeaderLength != len(body) {
			t.Fatalf("payload %d + trailer %d from %d bytes", len(payload), len(trailer), len(body))
		}
		keys.verifyTrailer(body, trailer)
		if plain, err := keys.open(payload); err == nil && len(plain) > len(payload) {
			t.Fatalf("decrypted %d bytes from %d", len(plain), len(payload))
		}
		sealed := sessionKeys{}.seal(h.payloadType, h.sessionID, h.seq, payload)
		h2, payload2, _, err := decodeV20(sealed[rmcpHeaderLength:])
		if err != nil || h2.sessionID != h.sessionID || h2.seq != h.seq || !bytes.Equal(payload2, payload) {
			t.Fatalf("round trip: %+v (%v)", h2, err)
		}
	})
}

// FuzzDecodeMessage: IPMI message checksums; every decoded request gets a
// response that decodes too.
func FuzzDecodeMessage(f *testing.F) {
	for _, p := range append(capturedPackets(f), generatedPackets(f)...) {
		if _, _, body, err := decodeRMCP(p); err == nil {
			if _, msg, err := decodeV15(body); err == nil {
				f.Add(msg)
			}
		}
	}
	f.Add(encodeRequest(netFnChassis, cmdSetSystemBootOptions, 9, []byte{5, 0xa0, 4, 0, 0, 0}))
	f.Fuzz(func(t *testing.T, p []byte) {
		m, err := decodeMessage(p)
		if err != nil {
			return
		}
		resp, err := decodeMessage(m.encodeResponse(ccOK, m.data))
		if err != nil || resp.cmd != m.cmd || resp.netFn != m.netFn|1 {
			t.Fatalf("response %+v (%v) to %+v", resp, err, m)
		}
	})
}

// FuzzServerPacket feeds datagrams to a server holding an active RMCP+
// session and a pending handshake. Whatever arrives, the server must not
// panic, the table must stay bounded and the active session must keep
// working. RAKP payloads get the pending session's real ID patched in, so
// the fuzzer reaches the key exchange.
func FuzzServerPacket(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, p []byte) {
		s, _, _ := testServer(t, func(c *Config) { c.MaxSessions = 3; c.CipherSuites = []uint8{0, 3, 17} })
		c := newLanplusClient(s, 17, testUser, testPassword)
		c.login(t, privAdmin)
		pending := newLanplusClient(s, 3, testUser, testPassword)
		open, err := pending.handshakePayload(payloadOpenSessionRequest, openSessionRequest(99, 0, pending.suite), payloadOpenSessionResponse)
		if err != nil {
			t.Fatal(err)
		}
		if len(p) >= rmcpHeaderLength+v20HeaderLength+8 && p[rmcpHeaderLength] == authTypeRMCPPlus {
			switch p[rmcpHeaderLength+1] & payloadTypeMask {
			case payloadRAKP1, payloadRAKP3:
				p = bytes.Clone(p)
				copy(p[rmcpHeaderLength+v20HeaderLength+4:], open[8:12])
			}
		}
		for _, remote := range []string{testRemote, "127.0.0.1:40009"} {
			s.handlePacket(context.Background(), p, remote)
			s.handlePacket(context.Background(), p, remote) // and its replay
		}
		if n := len(s.sessions.byID); n > 3 {
			t.Fatalf("%d sessions in a table of 3", n)
		}
		if cc, _, err := c.command(netFnApp, cmdGetDeviceID); err != nil || cc != ccOK {
			t.Fatalf("session broken by % x: cc %#x, %v", p, cc, err)
		}
	})
}

// FuzzSOLPacket feeds SOL payloads, sealed with the session's keys, to a
// server whose SOL payload that session holds: whatever they say, the
// server must not panic, the payload's buffers stay bounded, and the
// session keeps answering.
func FuzzSOLPacket(f *testing.F) {
	for _, p := range [][]byte{{1, 0, 0, 0, 'a'}, {0, 1, 3, 0}, {2, 1, 3, solOpNACK, 'b'}, {3, 0, 0, solOpBreak | solOpFlushInbound | solOpFlushOutbound}, {1}} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		s, m, _ := testServer(t, nil)
		if err := m.Reset(context.Background(), machine.ResetOn); err != nil {
			t.Fatal(err)
		}
		c := newSOLClient(t, s, 17, privAdmin)
		c.mustCommand(t, netFnApp, cmdActivatePayload, activateSOL...)
		defer s.endSOL("fuzz case over")
		for range 2 { // and its replay under a new session sequence number
			if _, err := c.sendSOLRaw(p); err != nil {
				t.Fatalf("answer to % x: %v", p, err)
			}
		}
		s.mu.Lock()
		if sol := s.sol; sol != nil && (len(sol.in) > solInputLimit || len(sol.out) > 2*solMaxChars || len(sol.inflight) > solMaxChars) {
			t.Errorf("buffers in %d out %d in flight %d", len(sol.in), len(sol.out), len(sol.inflight))
		}
		s.mu.Unlock()
		c.mustCommand(t, netFnApp, cmdGetDeviceID)
	})
}
