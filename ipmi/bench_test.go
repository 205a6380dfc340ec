package ipmi

import (
	"fmt"
	"testing"
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
