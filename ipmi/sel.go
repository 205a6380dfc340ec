package ipmi

import (
	"context"
	"encoding/binary"
	"strings"
	"time"

	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/machine"
)

// The System Event Log (spec chapter 31) is a read-only view of the BMC's
// audit log (auditlog), the one Redfish serves as its LogService: each
// entry becomes one 16-byte record, in the sensor types of table 42-3 where
// one fits (ACPI power state, system restart, PXE boot, session audit), and
// an OEM record otherwise. Clear SEL clears the audit log.

const (
	netFnStorage = 0x0a

	cmdGetSELInfo  = 0x40
	cmdReserveSEL  = 0x42
	cmdGetSELEntry = 0x43
	cmdClearSEL    = 0x47
	cmdGetSELTime  = 0x48

	ccReservationInvalid = 0xc5

	selVersion         = 0x51 // IPMI 2.0
	selSupportsReserve = 0x02
	selRecordSize      = 16
	selFirstRecord     = 0x0000
	selLastRecord      = 0xffff

	recordTypeSystemEvent    = 0x02
	recordTypeOEMTimestamped = 0xc0

	// Sensor types (table 42-3) and their offsets.
	sensorCriticalInterrupt = 0x13
	sensorSystemRestart     = 0x1d
	sensorACPIPowerState    = 0x22
	sensorSessionAudit      = 0x2a

	eventTypeSensorSpecific = 0x6f
	bmcGeneratorID          = 0x0020
	selSensorNumber         = 0x01
)

// recordID is an entry's SEL record ID: 1 to 0xfffe, as 0 and 0xffff mean
// first and last.
func recordID(e auditlog.Entry) uint16 { return uint16((e.ID-1)%0xfffe + 1) }

// selRecord encodes an entry.
func selRecord(e auditlog.Entry) [selRecordSize]byte {
	var r [selRecordSize]byte
	binary.LittleEndian.PutUint16(r[0:], recordID(e))
	binary.LittleEndian.PutUint32(r[3:], uint32(e.Created.Unix()))
	sensor, offset, ok := selEvent(e)
	if !ok {
		// OEM timestamped: manufacturer ID 0, then the operation's first
		// letters, for a human reading raw records.
		r[2] = recordTypeOEMTimestamped
		copy(r[10:], strings.ToUpper(string(e.Op)))
		return r
	}
	r[2] = recordTypeSystemEvent
	binary.LittleEndian.PutUint16(r[7:], bmcGeneratorID)
	r[9] = 0x04 // event message format revision of IPMI 2.0
	r[10], r[11] = sensor, selSensorNumber
	r[12] = eventTypeSensorSpecific // assertion
	r[13] = offset                  // event data 2 and 3 unspecified
	r[14], r[15] = 0xff, 0xff
	return r
}

// selEvent is the sensor type and offset that say what an entry records.
func selEvent(e auditlog.Entry) (sensor, offset byte, ok bool) {
	if e.Kind == auditlog.KindLoginFailure {
		return sensorSessionAudit, 0x02, true // invalid username or password
	}
	switch e.Op {
	case machine.OpReset:
		switch machine.ResetType(e.Arg) {
		case machine.ResetOn, machine.ResetForceOn:
			return sensorACPIPowerState, 0x00, true // S0/G0 working
		case machine.ResetGracefulShutdown:
			return sensorACPIPowerState, 0x05, true // S5/G2 soft-off
		case machine.ResetForceOff:
			return sensorACPIPowerState, 0x0a, true // S5 entered by override
		case machine.ResetForceRestart:
			return sensorSystemRestart, 0x01, true // initiated by hard reset
		case machine.ResetGracefulRestart:
			return sensorSystemRestart, 0x02, true // initiated by warm reset
		case machine.ResetPowerCycle:
			return sensorSystemRestart, 0x07, true // system restart
		case machine.ResetNmi:
			return sensorCriticalInterrupt, 0x00, true // front panel NMI
		}
	case machine.OpSetBootOverride:
		if strings.HasPrefix(e.Arg, string(machine.BootPxe)+" ") {
			return sensorSystemRestart, 0x03, true // user requested PXE boot
		}
	}
	return 0, 0, false
}

// selEntries are the log's entries of this BMC's machine, oldest first.
func (s *Server) selEntries() []auditlog.Entry {
	entries := s.audit.Entries(s.machineID)
	for i, j := 0, len(entries)-1; i < j; i, j = i+1, j-1 {
		entries[i], entries[j] = entries[j], entries[i]
	}
	return entries
}

func selTimestamp(t time.Time) []byte {
	if t.IsZero() {
		return le32(0xffffffff) // "unspecified"
	}
	return le32(uint32(t.Unix()))
}

func (s *Server) getSELInfo(_ context.Context, r *request) (byte, []byte) {
	entries := s.selEntries()
	free := (s.audit.Capacity() - len(entries)) * selRecordSize
	data := []byte{selVersion}
	data = binary.LittleEndian.AppendUint16(data, uint16(len(entries)))
	data = binary.LittleEndian.AppendUint16(data, uint16(min(free, 0xfffe)))
	data = append(data, selTimestamp(s.audit.LastChange(s.machineID))...)
	data = append(data, selTimestamp(s.selErased)...)
	return ccOK, append(data, selSupportsReserve)
}

// reserveSEL hands out a reservation: Clear SEL needs the newest one, so
// two clients cannot clear what the other has not read.
func (s *Server) reserveSEL(_ context.Context, r *request) (byte, []byte) {
	s.selReservation++
	if s.selReservation == 0 {
		s.selReservation = 1
	}
	return ccOK, le16(s.selReservation)
}

func (s *Server) getSELEntry(_ context.Context, r *request) (byte, []byte) {
	if len(r.msg.data) != 6 {
		return ccRequestLength, nil
	}
	want := binary.LittleEndian.Uint16(r.msg.data[2:])
	offset, length := int(r.msg.data[4]), int(r.msg.data[5])
	reservation := binary.LittleEndian.Uint16(r.msg.data[0:])
	// A partial read needs the current reservation (spec 31.4.1).
	if (offset != 0 || length != 0xff) && reservation != s.selReservation {
		return ccReservationInvalid, nil
	}
	entries := s.selEntries()
	i := -1
	switch {
	case len(entries) == 0:
	case want == selFirstRecord:
		i = 0
	case want == selLastRecord:
		i = len(entries) - 1
	default:
		for j, e := range entries {
			if recordID(e) == want {
				i = j
			}
		}
	}
	if i < 0 {
		return ccNotPresent, nil
	}
	next := uint16(selLastRecord)
	if i+1 < len(entries) {
		next = recordID(entries[i+1])
	}
	record := selRecord(entries[i])
	if length == 0xff {
		length = selRecordSize
	}
	if offset > selRecordSize || offset+length > selRecordSize {
		return ccInvalidField, nil
	}
	return ccOK, append(le16(next), record[offset:offset+length]...)
}

func (s *Server) clearSEL(_ context.Context, r *request) (byte, []byte) {
	d := r.msg.data
	if len(d) != 6 {
		return ccRequestLength, nil
	}
	if string(d[2:5]) != "CLR" {
		return ccInvalidField, nil
	}
	if binary.LittleEndian.Uint16(d[0:]) != s.selReservation {
		return ccReservationInvalid, nil
	}
	switch d[5] {
	case 0xaa: // initiate erase
		s.audit.Clear(s.machineID)
		s.selErased = s.now()
		s.log.Info("SEL cleared", "user", string(r.sess.username), "remote", r.remote)
	case 0x00: // get erasure status
	default:
		return ccInvalidField, nil
	}
	return ccOK, []byte{0x01} // erasure completed
}

func (s *Server) getSELTime(_ context.Context, r *request) (byte, []byte) {
	return ccOK, le32(uint32(s.now().Unix()))
}
