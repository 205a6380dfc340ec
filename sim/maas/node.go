package maas

import (
	"fmt"
	"maps"
	"net/http"
	"slices"

	maasclient "github.com/virtmetal/virtmetal/maas"
)

// What a machine's node token lets its holder do, through MaaS's metadata
// API (POST metadata/latest/ op=signal). MaaS hands that token to anyone
// who asks with a system_id, without a key (docs/maas-region.md, "The
// node's token is anonymous"), so Signal is what the machine's own
// enlistment runner does and, as well, what any stranger who learnt the
// system_id can do.

// The statuses a node signals.
const (
	// SignalCommissioning from a New machine starts a commissioning: a new
	// current set, status Commissioning, no admin involved.
	SignalCommissioning = "COMMISSIONING"
	// SignalWorking posts results while commissioning.
	SignalWorking = "WORKING"
	// SignalOK ends a commissioning: Ready, or New for an enlistment.
	SignalOK = "OK"
	// SignalFailed ends it as Failed commissioning.
	SignalFailed = "FAILED"
)

// NodeSignal is one signal a node sends.
type NodeSignal struct {
	Status string // one of the Signal statuses
	// Results are stored by name into the current commissioning set, a
	// missing row made for them: each result once (a second post for a
	// row no longer pending is the region's 500, and nothing of the
	// signal is stored).
	Results []ScriptResult
	// PowerType and PowerParameters, when set, are stored as the runner
	// sends a bmc-config script's YAML: without the API's validation.
	PowerType       string
	PowerParameters map[string]string
	// HardwareUUID is what MaaS's built-in inventory script reports; a
	// UUID another machine has is cleared on both, as MaaS keeps it unique.
	HardwareUUID string
}

// SignalError is the region's error answer to a signal.
type SignalError struct {
	StatusCode int
	Message    string
}

func (e *SignalError) Error() string {
	return fmt.Sprintf("maas metadata signal: HTTP %d: %s", e.StatusCode, e.Message)
}

// Signal is a node's signal for the machine, as the region takes it
// (docs/maas-region.md, 1 and 2): from a New machine, only
// SignalCommissioning acts, anything else is accepted and dropped; from a
// Commissioning one, results and power settings are stored and
// SignalOK/SignalFailed end the commissioning. Signals from machines in
// other statuses are not modelled (an error).
func (s *Server) Signal(systemID string, sig NodeSignal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.machines[systemID]
	if !ok {
		return &SignalError{StatusCode: http.StatusUnauthorized, Message: "Invalid access token"}
	}
	switch m.Status {
	case StatusNew:
		if sig.Status != SignalCommissioning {
			return nil
		}
		m.PreviousStatus, m.Status, m.Commissioning, m.enlisting = m.Status, StatusCommissioning, []ScriptResult{}, false
	case StatusCommissioning:
	default:
		return fmt.Errorf("maassim: signals from a machine in status %s are not modelled", statusName(m.Status))
	}
	for _, posted := range sig.Results {
		if i := slices.IndexFunc(m.Commissioning, func(r ScriptResult) bool { return r.Name == posted.Name }); i >= 0 && m.Commissioning[i].Status != ScriptPending {
			return &SignalError{StatusCode: http.StatusInternalServerError,
				Message: fmt.Sprintf("Status for scriptresult %d is not running or pending (%d)", i+1, scriptStatusCodes[m.Commissioning[i].Status])}
		}
	}
	for _, posted := range sig.Results {
		if i := slices.IndexFunc(m.Commissioning, func(r ScriptResult) bool { return r.Name == posted.Name }); i >= 0 {
			m.Commissioning[i] = posted
		} else {
			m.Commissioning = append(m.Commissioning, posted)
		}
	}
	if sig.HardwareUUID != "" {
		s.reportHardwareUUID(m, sig.HardwareUUID)
	}
	if sig.PowerType != "" {
		s.setPower(m, sig.PowerType, maps.Clone(sig.PowerParameters))
	}
	switch sig.Status {
	case SignalOK:
		s.endCommissioning(m)
	case SignalFailed:
		m.Status, m.enlisting = StatusFailedCommissioning, false
	}
	return nil
}

// endCommissioning ends a machine's commissioning well: Ready, or New when
// it was its enlistment (the set stays current either way). s.mu is held.
func (s *Server) endCommissioning(m *machineState) {
	m.Status = StatusReady
	if m.enlisting {
		m.Status, m.enlisting = StatusNew, false
	}
}

// reportHardwareUUID gives m the UUID, unless another machine has it: then
// neither keeps it. s.mu is held.
func (s *Server) reportHardwareUUID(m *machineState, uuid string) {
	uuid = maasclient.NormalizeUUID(uuid)
	m.HardwareUUID = uuid
	for _, other := range s.machines {
		if other != m && maasclient.NormalizeUUID(other.HardwareUUID) == uuid {
			other.HardwareUUID, m.HardwareUUID = "", ""
		}
	}
}
