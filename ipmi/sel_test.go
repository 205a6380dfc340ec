package ipmi

import (
	"encoding/hex"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/machine"
)

// TestSELRecord pins each kind of entry's 16 bytes: record ID, type,
// timestamp, generator, sensor type and number, event type and offset.
func TestSELRecord(t *testing.T) {
	at := time.Unix(0x67000000, 0)
	action := func(op machine.Operation, arg string) auditlog.Entry {
		return auditlog.Entry{ID: 3, Created: at, Kind: auditlog.KindAction, Op: op, Arg: arg}
	}
	tests := []struct {
		name  string
		entry auditlog.Entry
		want  string
	}{
		{"power on", action(machine.OpReset, "On"), "0300" + "02" + "00000067" + "2000" + "04" + "22" + "01" + "6f" + "00" + "ffff"},
		{"graceful shutdown", action(machine.OpReset, "GracefulShutdown"), "0300020000006720000422016f05ffff"},
		{"force off", action(machine.OpReset, "ForceOff"), "0300020000006720000422016f0affff"},
		{"hard reset", action(machine.OpReset, "ForceRestart"), "03000200000067200004" + "1d016f01ffff"},
		{"warm reset", action(machine.OpReset, "GracefulRestart"), "030002000000672000041d016f02ffff"},
		{"power cycle", action(machine.OpReset, "PowerCycle"), "030002000000672000041d016f07ffff"},
		{"NMI", action(machine.OpReset, "Nmi"), "0300020000006720000413016f00ffff"},
		{"PXE boot", action(machine.OpSetBootOverride, "Pxe Once UEFI"), "030002000000672000041d016f03ffff"},
		{"failed logins", auditlog.Entry{ID: 3, Created: at, Kind: auditlog.KindLoginFailure, Count: 4}, "030002000000672000042a016f02ffff"},
		{"disk boot: OEM", action(machine.OpSetBootOverride, "Hdd Continuous UEFI"), "0300c000000067000000" + hex.EncodeToString([]byte("SETBOO"))},
		{"media: OEM", action(machine.OpInsertMedia, "http://x/y.iso"), "0300c000000067000000" + hex.EncodeToString([]byte("INSERT"))},
		{"record IDs skip 0 and 0xffff", auditlog.Entry{ID: 0xffff, Created: at, Kind: auditlog.KindLoginFailure}, "010002000000672000042a016f02ffff"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			record := selRecord(tt.entry)
			if got := hex.EncodeToString(record[:]); got != tt.want {
				t.Errorf("record %s, want %s", got, tt.want)
			}
		})
	}
}

// TestSELCommands: reading needs a session, clearing the operator's
// privilege and the newest reservation; bad requests get their completion
// codes and change nothing.
func TestSELCommands(t *testing.T) {
	reserve := func(c *lanplusClient) []byte { return c.mustCommand(t, netFnStorage, cmdReserveSEL) }
	tests := []struct {
		name   string
		priv   privilege
		cmd    byte
		data   func(c *lanplusClient) []byte
		wantCC byte
	}{
		{"user reads the first record", privUser, cmdGetSELEntry, func(*lanplusClient) []byte { return []byte{0, 0, 0, 0, 0, 0xff} }, ccOK},
		{"the last record", privUser, cmdGetSELEntry, func(*lanplusClient) []byte { return []byte{0, 0, 0xff, 0xff, 0, 0xff} }, ccOK},
		{"no such record", privUser, cmdGetSELEntry, func(*lanplusClient) []byte { return []byte{0, 0, 0x99, 0, 0, 0xff} }, ccNotPresent},
		{"a partial read needs the reservation", privUser, cmdGetSELEntry, func(*lanplusClient) []byte { return []byte{0x77, 0, 0, 0, 2, 4} }, ccReservationInvalid},
		{"a partial read with it", privUser, cmdGetSELEntry, func(c *lanplusClient) []byte { return append(reserve(c), 0, 0, 2, 4) }, ccOK},
		{"past the record's end", privUser, cmdGetSELEntry, func(c *lanplusClient) []byte { return append(reserve(c), 0, 0, 14, 4) }, ccInvalidField},
		{"short request", privUser, cmdGetSELEntry, func(*lanplusClient) []byte { return []byte{0, 0} }, ccRequestLength},
		{"a user cannot clear", privUser, cmdClearSEL, func(c *lanplusClient) []byte { return append(reserve(c), 'C', 'L', 'R', 0xaa) }, ccInsufficientPrivilege},
		{"clear without the reservation", privOperator, cmdClearSEL, func(*lanplusClient) []byte { return []byte{9, 9, 'C', 'L', 'R', 0xaa} }, ccReservationInvalid},
		{"clear with an old reservation", privOperator, cmdClearSEL, func(c *lanplusClient) []byte { old := reserve(c); reserve(c); return append(old, 'C', 'L', 'R', 0xaa) }, ccReservationInvalid},
		{"clear without CLR", privOperator, cmdClearSEL, func(c *lanplusClient) []byte { return append(reserve(c), 'C', 'L', 'X', 0xaa) }, ccInvalidField},
		{"clear with an unknown action", privOperator, cmdClearSEL, func(c *lanplusClient) []byte { return append(reserve(c), 'C', 'L', 'R', 0x55) }, ccInvalidField},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, m, _ := testServer(t, nil)
			c := newLanplusClient(s, 17, testUser, testPassword)
			c.login(t, privOperator)
			c.mustCommand(t, netFnChassis, cmdChassisControl, 0x01) // one entry: power up
			if tt.priv != privOperator {
				c.mustCommand(t, netFnApp, cmdCloseSession, le32(c.bmcID)...)
				c = newLanplusClient(s, 17, testUser, testPassword)
				c.login(t, tt.priv)
			}
			cc, _, err := c.command(netFnStorage, tt.cmd, tt.data(c)...)
			if err != nil {
				t.Fatal(err)
			}
			if cc != tt.wantCC {
				t.Errorf("completion code %#x, want %#x", cc, tt.wantCC)
			}
			if got := s.audit.Entries(m.ID()); len(got) != 1 {
				t.Errorf("%d entries after the request, want the one", len(got))
			}
		})
	}

	t.Run("info, entry and clear", func(t *testing.T) {
		s, _, clock := testServer(t, nil)
		c := newLanplusClient(s, 17, testUser, testPassword)
		c.login(t, privOperator)
		c.mustCommand(t, netFnChassis, cmdChassisControl, 0x01)
		c.mustCommand(t, netFnChassis, cmdChassisControl, 0x00)
		info := c.mustCommand(t, netFnStorage, cmdGetSELInfo)
		if info[0] != selVersion || info[1] != 2 || info[2] != 0 || info[13] != selSupportsReserve {
			t.Fatalf("SEL info % x", info)
		}
		first := c.mustCommand(t, netFnStorage, cmdGetSELEntry, 0, 0, 0, 0, 0, 0xff)
		if len(first) != 2+selRecordSize || first[0] != 2 || first[2] != 1 || first[2+10] != sensorACPIPowerState || first[2+13] != 0x00 {
			t.Fatalf("first record % x", first)
		}
		second := c.mustCommand(t, netFnStorage, cmdGetSELEntry, 0, 0, 2, 0, 0, 0xff)
		if second[0] != 0xff || second[1] != 0xff || second[2+13] != 0x0a {
			t.Fatalf("second record % x: want the last, ForceOff", second)
		}
		clock.advance(time.Minute)
		done := c.mustCommand(t, netFnStorage, cmdClearSEL, append(reserve(c), 'C', 'L', 'R', 0xaa)...)
		if done[0] != 0x01 {
			t.Fatalf("erase progress % x", done)
		}
		info = c.mustCommand(t, netFnStorage, cmdGetSELInfo)
		if info[1] != 0 || info[2] != 0 || le32(uint32(clock.t.Unix()))[0] != info[9] {
			t.Errorf("SEL info after clear % x", info)
		}
		if cc, _, err := c.command(netFnStorage, cmdGetSELEntry, 0, 0, 0, 0, 0, 0xff); err != nil || cc != ccNotPresent {
			t.Errorf("first record of an empty SEL: %#x, %v", cc, err)
		}
	})
}
