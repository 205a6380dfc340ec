package maas_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

// TestIdentityProof: a machine claiming an enrolled VM gets nothing until
// the output MaaS stored for it carries the VM's machine proof and its
// hardware fits the VM, and the VM's status says why.
func TestIdentityProof(t *testing.T) {
	otherMAC := "02:ff:ff:ff:ff:01"
	tests := []struct {
		name       string
		machine    func(m *maassim.Machine)
		vm         func(vm *maas.EnrolledVM)
		instances  []string // the running instance's MACs
		wantReason string
		wantWhy    string // in the condition's message
		wantLists  int    // instance lists
	}{
		{name: "proof, MAC and UUID match", wantReason: maas.ReasonBound},
		{name: "proof and MAC, MaaS knows no UUID", machine: func(m *maassim.Machine) { m.HardwareUUID = "" }, wantReason: maas.ReasonBound},
		{name: "proof and MAC, VM sets no UUID", vm: func(vm *maas.EnrolledVM) { vm.FirmwareUUID = "" }, wantReason: maas.ReasonBound},
		{
			name: "MaaS spells MAC and UUID in upper case",
			machine: func(m *maassim.Machine) {
				m.MACs[0], m.HardwareUUID = strings.ToUpper(m.MACs[0]), strings.ToUpper(m.HardwareUUID)
			},
			wantReason: maas.ReasonBound,
		},
		{
			name:       "MAC and UUID match, no stored output (an anonymous enlistment)",
			machine:    func(m *maassim.Machine) { m.Commissioning = nil },
			wantReason: maas.ReasonUnverified, wantWhy: "MaaS stored no commissioning output",
		},
		{
			name:       "MAC and UUID match, another VM's proof",
			machine:    func(m *maassim.Machine) { m.Commissioning = proofReport(proofOf(vmB)) },
			wantReason: maas.ReasonUnverified, wantWhy: "does not carry the VM's machine proof",
		},
		{
			name: "MAC and UUID match, the script's run skipped",
			machine: func(m *maassim.Machine) {
				m.Commissioning = []maassim.ScriptResult{{Name: maas.BMCConfigScript, Status: maassim.ScriptSkipped}}
			},
			wantReason: maas.ReasonUnverified, wantWhy: "does not carry the VM's machine proof",
		},
		{
			name:       "the VM has no proof yet",
			vm:         func(vm *maas.EnrolledVM) { vm.Proof = "" },
			wantReason: maas.ReasonUnverified, wantWhy: "no machine proof yet",
		},
		{
			name:       "proof, and a MAC the VM does not have",
			machine:    func(m *maassim.Machine) { m.MACs = []string{otherMAC, m.MACs[0]} },
			wantReason: maas.ReasonUnverified, wantWhy: "its MAC " + otherMAC + " is not one of the VM's",
		},
		{name: "proof, no MAC matches", machine: func(m *maassim.Machine) { m.MACs = []string{otherMAC} }, wantReason: maas.ReasonUnverified, wantWhy: "is not one of the VM's"},
		{name: "proof, machine has no interfaces", machine: func(m *maassim.Machine) { m.MACs = nil }, wantReason: maas.ReasonUnverified, wantWhy: "MaaS shows no MAC"},
		{
			name:       "proof, UUID differs",
			machine:    func(m *maassim.Machine) { m.HardwareUUID = "00000000-0000-4000-8000-000000000000" },
			wantReason: maas.ReasonUnverified, wantWhy: "is not the VM's firmware UUID",
		},
		{name: "VirtualMachine missing", vm: func(vm *maas.EnrolledVM) { vm.VMFound = false }, wantReason: maas.ReasonUnverified, wantWhy: "does not exist"},
		{
			name: "spec sets no MAC, the running instance's matches",
			vm:   func(vm *maas.EnrolledVM) { vm.MACs = nil }, instances: []string{macOf(vmA)},
			wantReason: maas.ReasonBound, wantLists: 1,
		},
		{
			name: "spec sets no MAC, the running instance's differs",
			vm:   func(vm *maas.EnrolledVM) { vm.MACs = nil }, instances: []string{otherMAC},
			wantReason: maas.ReasonUnverified, wantWhy: "is not one of the VM's", wantLists: 1,
		},
		{
			name:       "spec sets no MAC, no running instance",
			vm:         func(vm *maas.EnrolledVM) { vm.MACs = nil },
			wantReason: maas.ReasonUnverified, wantWhy: "MACs are unknown", wantLists: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := ours("m1", vmA, maassim.StatusNew)
			if tt.machine != nil {
				tt.machine(&m)
			}
			s := maassim.New(t).WithMachine(m)
			cluster := newFakeCluster().withVM(vmA, "pw")
			if tt.vm != nil {
				cluster.edit(vmA, tt.vm)
			}
			if tt.instances != nil {
				cluster.instances[vmA] = tt.instances
			}
			r := newReconciler(t, s, cluster)
			result := reconcile(t, r)

			_, c := cluster.status(vmA)
			if c.Reason != tt.wantReason || !strings.Contains(c.Message, tt.wantWhy) {
				t.Fatalf("condition = %+v, want reason %s and %q", c, tt.wantReason, tt.wantWhy)
			}
			if strings.Contains(c.Message, "vmp1-") {
				t.Errorf("a proof in the condition: %s", c.Message)
			}
			if cluster.instanceCalls != tt.wantLists {
				t.Errorf("instance lists = %d, want %d", cluster.instanceCalls, tt.wantLists)
			}
			got, _ := s.Machine("m1")
			events := cluster.eventsOf(vmA)
			if tt.wantReason == maas.ReasonBound {
				if result.Bound != 1 || got.Status != maassim.StatusCommissioning || c.Status != metav1.ConditionTrue {
					t.Errorf("bound machine not converged: %+v, result %+v", got, result)
				}
				return
			}
			if writes(s) != 0 || result.Bound != 0 || got.PowerParameters[maas.PowerPass] != "placeholder-m1" {
				t.Errorf("unverified machine was written to: %+v", s.Requests())
			}
			if st, _ := cluster.status(vmA); st.SystemID != "" || c.Status != metav1.ConditionFalse {
				t.Errorf("unverified machine reported as the VM's: %+v", st)
			}
			if len(events) != 1 || events[0].eventType != "Warning" || events[0].reason != "MaaSMachineUnverified" {
				t.Errorf("events = %+v", events)
			}
			// Nothing new to say next cycle: no write, no Event.
			reports := cluster.reportCalls
			reconcile(t, r)
			if cluster.reportCalls != reports || len(cluster.eventsOf(vmA)) != 1 {
				t.Errorf("unchanged verdict reported again: %d reports, events %+v", cluster.reportCalls-reports, cluster.eventsOf(vmA))
			}
		})
	}
}

// TestDuplicateClaims: of two machines claiming one VM the one proven by
// its stored output keeps it; the machine bound first keeps it against a
// later proven one; two proven ones with none bound before get nothing.
func TestDuplicateClaims(t *testing.T) {
	withoutOutput := func(m maassim.Machine) maassim.Machine { m.Commissioning = nil; return m }
	tests := []struct {
		name        string
		machines    []maassim.Machine
		reported    string // system ID already in the VM's status
		wantBound   string // "" for none
		wantReason  string
		wantMention string
	}{
		{
			name:      "the proven machine beats one MaaS stored no output for",
			machines:  []maassim.Machine{withoutOutput(ours("a", vmA, maassim.StatusNew)), ours("b", vmA, maassim.StatusNew)},
			wantBound: "b", wantReason: maas.ReasonDuplicateClaim, wantMention: "a (MaaS stored no commissioning output",
		},
		{
			name: "a machine with a MAC the VM lacks is not proven",
			machines: []maassim.Machine{ours("a", vmA, maassim.StatusNew), func() maassim.Machine {
				m := ours("b", vmA, maassim.StatusNew)
				m.MACs = append(m.MACs, "02:ff:00:00:00:01")
				return m
			}()},
			wantBound: "a", wantReason: maas.ReasonDuplicateClaim, wantMention: "b (its MAC 02:ff:00:00:00:01",
		},
		{
			name:       "two proven, none bound before: neither gets credentials",
			machines:   []maassim.Machine{ours("a", vmA, maassim.StatusNew), ours("b", vmA, maassim.StatusNew)},
			wantReason: maas.ReasonDuplicateClaim, wantMention: "more than one carries its machine proof",
		},
		{
			name:      "the machine bound first keeps the VM",
			machines:  []maassim.Machine{ours("a", vmA, maassim.StatusNew), withoutOutput(ours("b", vmA, maassim.StatusNew))},
			reported:  "b",
			wantBound: "b", wantReason: maas.ReasonDuplicateClaim, wantMention: "a (another machine was bound to the VM first)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := maassim.New(t)
			for _, m := range tt.machines {
				s.WithMachine(m)
			}
			cluster := newFakeCluster().withVM(vmA, "pw")
			if tt.reported != "" {
				cluster.statuses[vmA] = maas.MachineStatus{MaaS: &v1beta1.MaaSStatus{SystemID: tt.reported}}
			}
			r := newReconciler(t, s, cluster)
			for range 2 {
				reconcile(t, r)
			}
			for _, m := range tt.machines {
				got, _ := s.Machine(m.SystemID)
				hasPassword := got.PowerParameters[maas.PowerPass] == "pw"
				if hasPassword != (m.SystemID == tt.wantBound) {
					t.Errorf("%s has the password: %v, want %v", m.SystemID, hasPassword, m.SystemID == tt.wantBound)
				}
			}
			st, _ := cluster.status(vmA)
			if st.SystemID != tt.wantBound {
				t.Errorf("status %+v; want machine %q", st, tt.wantBound)
			}
			ev := cluster.eventsOf(vmA)
			if len(ev) == 0 || ev[0].eventType != "Warning" || ev[0].reason != "MaaSMachine"+tt.wantReason || !strings.Contains(ev[0].text, tt.wantMention) {
				t.Errorf("events = %+v; want first a Warning %s mentioning %q", ev, tt.wantReason, tt.wantMention)
			}
		})
	}
}

// TestAttackClaimingAnotherTenantsVM plays the attack of issues 8 and 23:
// tenant A writes B's name into its VM's SMBIOS serial, so its machine
// enlists with B's BMC address, and copies B's MAC onto its VM, in a
// namespace that is not enrolled. MaaS puts both machines on one shared BMC
// row (same redfish address and user), so a credential write on B's machine
// lands on A's too unless A's is detached first. B's password must never
// reach A's machine, whatever order the machines are listed in and whatever
// A's machine's status, and B's machine must still converge.
func TestAttackClaimingAnotherTenantsVM(t *testing.T) {
	attacker := maas.VMRef{Namespace: "tenant-x", Name: "evil"}
	const victimPassword = "b-secret-password"
	type attack struct {
		name         string
		attackerUUID string // the hardware UUID MaaS shows for A's machine
		attackerID   string // system IDs order who is seen first
		status       int
	}
	var tests []attack
	for _, id := range []string{"a-evil", "z-evil"} {
		for _, status := range []int{maassim.StatusNew, maassim.StatusReady, maassim.StatusDeployed, maassim.StatusBroken} {
			for _, uuid := range []string{"", uuidOf(attacker)} {
				tests = append(tests, attack{
					name:         fmt.Sprintf("%s status %d uuid %q", id, status, uuid),
					attackerUUID: uuid, attackerID: id, status: status,
				})
			}
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evil := ours(tt.attackerID, vmB, tt.status) // B's address and MAC
			evil.HardwareUUID = tt.attackerUUID
			evil.Commissioning = proofReport(proofOf(attacker)) // its guest cannot read B's
			s := maassim.New(t).WithMachine(evil).WithMachine(ours("m-b", vmB, maassim.StatusNew))
			if s.BMCID(tt.attackerID) != s.BMCID("m-b") {
				t.Fatal("the simulator does not share the BMC row of one redfish address")
			}
			// Only B is enrolled; A's VM has no VirtualMachineBMC.
			cluster := newFakeCluster().withVM(vmB, victimPassword)
			r := newReconciler(t, s, cluster)
			for range 3 {
				reconcile(t, r)
				s.Step()
			}

			for _, req := range s.Requests() {
				if strings.Contains(req.Path, tt.attackerID) && req.Method != "GET" &&
					!(len(req.Form) == 1 && req.Form["power_type"] == "manual") {
					t.Errorf("attacker's machine was written to other than to detach it: %+v", req)
				}
				for _, v := range req.Form {
					if v == victimPassword && req.Path != "machines/m-b/" {
						t.Errorf("B's password sent in %s %s", req.Method, req.Path)
					}
				}
			}
			// Not even for a moment: the read-back would detach a machine
			// that got the password, but too late.
			if held := s.PasswordsHeld(tt.attackerID); slices.Contains(held, victimPassword) {
				t.Errorf("B's password reached the attacker's machine through the shared BMC row (held %d passwords)", len(held))
			}
			m, _ := s.Machine(tt.attackerID)
			if m.PowerParameters[maas.PowerPass] != "" || m.PowerType != "manual" || m.Status != tt.status || m.Pool != maassim.DefaultPool {
				t.Errorf("attacker's machine = %+v", m)
			}
			if s.BMCID(tt.attackerID) == s.BMCID("m-b") {
				t.Error("attacker's machine still shares B's BMC row")
			}
			b, _ := s.Machine("m-b")
			if b.PowerParameters[maas.PowerPass] != victimPassword || b.Hostname != maas.Hostname(vmB) || b.Pool != vmB.Namespace || b.Status != maassim.StatusReady {
				t.Errorf("B's machine did not converge: %+v", b)
			}
			// The detached claim stays on B's status while MaaS has the
			// attacker's machine, though it claims no more.
			st, c := cluster.status(vmB)
			if st.SystemID != "m-b" || len(st.Problems) != 1 || st.Problems[0].Reason != maas.ReasonDuplicateClaim ||
				!slices.Equal(st.Problems[0].Machines, []string{tt.attackerID}) || c.Reason != maas.ReasonDuplicateClaim {
				t.Errorf("B's status %+v, condition %+v; want m-b with the detached claim of %s", st, c, tt.attackerID)
			}
			ev := cluster.eventsOf(vmB)
			if len(ev) == 0 || ev[0].eventType != "Warning" || ev[0].reason != "MaaSMachine"+maas.ReasonDuplicateClaim || !strings.Contains(ev[0].text, tt.attackerID) {
				t.Errorf("B's events = %+v, want first a Warning DuplicateClaim naming the attacker", ev)
			}
		})
	}
}

// TestDetachFailureWritesNoCredentials: when the claimant cannot be
// detached from the shared BMC row, the VM's credentials are not written,
// and the VM's condition says why.
func TestDetachFailureWritesNoCredentials(t *testing.T) {
	s := maassim.New(t).WithMachine(func() maassim.Machine {
		m := ours("a-evil", vmB, maassim.StatusNew)
		m.HardwareUUID, m.Commissioning = "", nil
		return m
	}()).WithMachine(ours("m-b", vmB, maassim.StatusNew))
	s.FailMatching(maassim.Match{Method: "PUT", Path: "machines/a-evil/"}, -1, maassim.FaultServerError)
	cluster := newFakeCluster().withVM(vmB, "b-pass")
	r := newReconciler(t, s, cluster)
	reconcile(t, r)
	for _, id := range []string{"a-evil", "m-b"} {
		if m, _ := s.Machine(id); m.PowerParameters[maas.PowerPass] == "b-pass" {
			t.Errorf("%s got the password although the claimant could not be detached", id)
		}
	}
	if _, c := cluster.status(vmB); c.Reason != maas.ReasonDuplicateClaim || !strings.Contains(c.Message, "could not be detached") {
		t.Errorf("condition = %+v", c)
	}
	s.ClearFaults()
	reconcile(t, r)
	if m, _ := s.Machine("m-b"); m.PowerParameters[maas.PowerPass] != "b-pass" {
		t.Errorf("B's machine did not get its credentials once the claimant was detached: %+v", m)
	}
	if m, _ := s.Machine("a-evil"); m.PowerParameters[maas.PowerPass] != "" {
		t.Errorf("claimant got B's password: %+v", m)
	}
}
