package ipmi

import (
	"context"

	"github.com/virtmetal/virtmetal/machine"
)

// Get Chassis Status (spec 28.2). A machine counts as powered while it
// runs, is paused or is still shutting down; one that is only starting
// reads as off, so a client retrying "power on if off" repeats the
// harmless On rather than escalating to a power cycle.
func (s *Server) getChassisStatus(ctx context.Context, r *request) (byte, []byte) {
	if len(r.msg.data) != 0 {
		return ccRequestLength, nil
	}
	state, err := s.machine.PowerState(ctx)
	if err != nil {
		return s.machineFailure(err, "PowerState")
	}
	const (
		powerOn              = 0x01
		restorePolicyUnknown = 0x60
	)
	current := byte(restorePolicyUnknown)
	switch state {
	case machine.PowerOn, machine.Paused, machine.PoweringOff:
		current |= powerOn
	}
	return ccOK, []byte{current, 0, 0}
}

// chassisControlActions maps Chassis Control (spec 28.3) to power actions.
var chassisControlActions = map[byte]machine.ResetType{
	0x00: machine.ResetForceOff,
	0x01: machine.ResetOn,
	0x02: machine.ResetPowerCycle,
	0x03: machine.ResetForceRestart,
	0x04: machine.ResetNmi,
	0x05: machine.ResetGracefulShutdown,
}

func (s *Server) chassisControl(ctx context.Context, r *request) (byte, []byte) {
	if len(r.msg.data) != 1 {
		return ccRequestLength, nil
	}
	action, ok := chassisControlActions[r.msg.data[0]&0x0f]
	if !ok {
		return ccInvalidField, nil
	}
	if err := s.machine.Capabilities().CheckReset(action); err != nil {
		return s.machineFailure(err, "Reset")
	}
	if err := s.machine.Reset(ctx, action); err != nil {
		return s.machineFailure(err, "Reset")
	}
	s.log.Info("chassis control", "sessionID", r.sess.id, "action", string(action))
	return ccOK, nil
}

// System boot option parameters (spec 28.12, table 28-14).
const (
	bootParamSetInProgress        = 0
	bootParamServicePartition     = 1
	bootParamServicePartitionScan = 2
	bootParamValidBitClearing     = 3
	bootParamBootInfoAck          = 4
	bootParamBootFlags            = 5

	bootParamVersion       = 0x01
	bootParamSelectorMask  = 0x7f
	bootParamInvalidBit    = 0x80
	ccBootParamUnsupported = 0x80
	ccSetInProgressActive  = 0x81

	setComplete   = 0
	setInProgress = 1
	commitWrite   = 2

	bootFlagsValid      = 0x80
	bootFlagsPersistent = 0x40
	bootFlagsEFI        = 0x20
	bootDeviceShift     = 2
	bootDeviceMask      = 0x0f
)

var bootParamLengths = map[byte]int{
	bootParamSetInProgress:        1,
	bootParamServicePartition:     1,
	bootParamServicePartitionScan: 1,
	bootParamValidBitClearing:     1,
	bootParamBootInfoAck:          2,
	bootParamBootFlags:            5,
}

// bootDevices are the boot device selectors (boot flags byte 2, bits 5:2)
// with a machine equivalent.
var bootDevices = map[byte]machine.BootTarget{
	0x01: machine.BootPxe,
	0x02: machine.BootHdd,
	0x05: machine.BootCd,
}

// bootDeviceOf is the selector reported for a target. UEFI HTTP boot has no
// IPMI selector; it reads as network boot (PXE), its nearest relative.
func bootDeviceOf(t machine.BootTarget) byte {
	switch t {
	case machine.BootPxe, machine.BootUefiHttp:
		return 0x01
	case machine.BootHdd:
		return 0x02
	case machine.BootCd:
		return 0x05
	}
	return 0
}

// bootParameters holds the boot option parameters that are not boot flags.
// They are stored and reported; the BMC never acts on them. "Set in
// progress" belongs to the session that set it and is released when that
// session ends, so a crashed client cannot block the others.
type bootParameters struct {
	setInProgress    bool
	owner            uint32
	servicePartition byte
	partitionScan    byte
	validBitClearing byte
	bootInfoAck      byte
}

// Set System Boot Options (spec 28.12).
func (s *Server) setSystemBootOptions(ctx context.Context, r *request) (byte, []byte) {
	d := r.msg.data
	if len(d) < 1 {
		return ccRequestLength, nil
	}
	param, invalidate := d[0]&bootParamSelectorMask, d[0]&bootParamInvalidBit != 0
	want, known := bootParamLengths[param]
	if !known {
		return ccBootParamUnsupported, nil
	}
	v := d[1:]
	if len(v) != want {
		return ccRequestLength, nil
	}
	if invalidate && param != bootParamBootFlags {
		return ccInvalidField, nil
	}
	switch param {
	case bootParamSetInProgress:
		switch v[0] & 0x03 {
		case setComplete:
			s.boot.setInProgress = false
		case setInProgress:
			if s.boot.setInProgress {
				return ccSetInProgressActive, nil
			}
			s.boot.setInProgress, s.boot.owner = true, r.sess.id
		case commitWrite:
			// Writes take effect immediately; there is nothing to commit.
		default:
			return ccInvalidField, nil
		}
	case bootParamServicePartition:
		s.boot.servicePartition = v[0]
	case bootParamServicePartitionScan:
		s.boot.partitionScan = v[0] & 0x03
	case bootParamValidBitClearing:
		s.boot.validBitClearing = v[0] & 0x1f
	case bootParamBootInfoAck:
		mask := v[0]
		s.boot.bootInfoAck = s.boot.bootInfoAck&^mask | v[1]&mask
	case bootParamBootFlags:
		return s.setBootFlags(ctx, v, invalidate)
	}
	return ccOK, nil
}

// setBootFlags applies boot flags (parameter 5) to the machine. Flags the
// machine cannot honour (CMOS clear, console redirection, button lockouts,
// ...) are refused rather than silently dropped.
func (s *Server) setBootFlags(ctx context.Context, v []byte, invalidate bool) (byte, []byte) {
	const unsupportedByte2 = 0xc3 // CMOS clear, lock keyboard, screen blank, lock reset
	if v[1]&unsupportedByte2 != 0 || v[2] != 0 || v[3]&0x0f != 0 || v[4]&0x1f != 0 {
		return ccInvalidField, nil
	}
	current, err := s.machine.BootOverride(ctx)
	if err != nil {
		return s.machineFailure(err, "BootOverride")
	}
	caps := s.machine.Capabilities()
	// The BIOS boot type bit is in every request, with no "unchanged":
	// ipmitool's and MaaS's plain bootdev send PC-compatible. Taken as an
	// order it would turn a UEFI machine's firmware to BIOS, so the
	// firmware stays (Redfish's BootSourceOverrideMode changes it) and the
	// next read tells the truth.
	o := machine.BootOverride{Target: machine.BootNone, Enabled: machine.BootDisabled, Mode: current.Mode}
	if device := v[1] >> bootDeviceShift & bootDeviceMask; v[0]&bootFlagsValid != 0 && !invalidate && device != 0 {
		target, ok := bootDevices[device]
		if !ok {
			return ccInvalidField, nil
		}
		o.Target, o.Enabled = target, machine.BootOnce
		if v[0]&bootFlagsPersistent != 0 {
			o.Enabled = machine.BootContinuous
		}
	}
	if err := caps.CheckBootOverride(o); err != nil {
		return s.machineFailure(err, "SetBootOverride")
	}
	if err := s.machine.SetBootOverride(ctx, o); err != nil {
		return s.machineFailure(err, "SetBootOverride")
	}
	s.log.Info("boot override set", "target", string(o.Target), "enabled", string(o.Enabled), "mode", string(o.Mode))
	return ccOK, nil
}

// Get System Boot Options (spec 28.13).
func (s *Server) getSystemBootOptions(ctx context.Context, r *request) (byte, []byte) {
	d := r.msg.data
	if len(d) != 3 {
		return ccRequestLength, nil
	}
	param := d[0] & bootParamSelectorMask
	out := []byte{bootParamVersion, param}
	switch param {
	case bootParamSetInProgress:
		state := byte(setComplete)
		if s.boot.setInProgress {
			state = setInProgress
		}
		return ccOK, append(out, state)
	case bootParamServicePartition:
		return ccOK, append(out, s.boot.servicePartition)
	case bootParamServicePartitionScan:
		return ccOK, append(out, s.boot.partitionScan)
	case bootParamValidBitClearing:
		return ccOK, append(out, s.boot.validBitClearing)
	case bootParamBootInfoAck:
		return ccOK, append(out, 0, s.boot.bootInfoAck)
	case bootParamBootFlags:
		o, err := s.machine.BootOverride(ctx)
		if err != nil {
			return s.machineFailure(err, "BootOverride")
		}
		var flags, device byte
		if o.Mode == machine.BootModeUEFI {
			flags |= bootFlagsEFI
		}
		if o = o.Normalize(); o.Enabled != machine.BootDisabled {
			flags |= bootFlagsValid
			if o.Enabled == machine.BootContinuous {
				flags |= bootFlagsPersistent
			}
			device = bootDeviceOf(o.Target)
		}
		return ccOK, append(out, flags, device<<bootDeviceShift, 0, 0, 0)
	}
	return ccBootParamUnsupported, nil
}
