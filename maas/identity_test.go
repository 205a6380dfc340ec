package maas_test

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/maas"
	"github.com/virtmetal/virtmetal/maas/maastest"
)

// TestIdentityProof: a machine claiming an enrolled VM gets nothing until
// its hardware proves it is the VM, and the VM's status says why.
func TestIdentityProof(t *testing.T) {
	otherMAC := "02:ff:ff:ff:ff:01"
	tests := []struct {
		name       string
		machine    func(m *maastest.Machine)
		vm         func(vm *maas.EnrolledVM)
		instances  []string // the running instance's MACs
		wantReason string
		wantWhy    string // in the condition's message
		wantLists  int    // instance lists
	}{
		{name: "MAC and UUID match", wantReason: maas.ReasonBound, wantWhy: "MAC and SMBIOS UUID match"},
		{name: "MAC matches, MaaS knows no UUID", machine: func(m *maastest.Machine) { m.HardwareUUID = "" }, wantReason: maas.ReasonBound, wantWhy: "MAC matches"},
		{name: "MAC matches, VM sets no UUID", vm: func(vm *maas.EnrolledVM) { vm.FirmwareUUID = "" }, wantReason: maas.ReasonBound, wantWhy: "MAC matches"},
		{
			name: "MaaS spells MAC and UUID in upper case",
			machine: func(m *maastest.Machine) {
				m.MACs[0], m.HardwareUUID = strings.ToUpper(m.MACs[0]), strings.ToUpper(m.HardwareUUID)
			},
			wantReason: maas.ReasonBound, wantWhy: "MAC and SMBIOS UUID match",
		},
		{
			name:       "boot interface among others",
			machine:    func(m *maastest.Machine) { m.MACs = []string{otherMAC, m.MACs[0]} },
			wantReason: maas.ReasonBound, wantWhy: "MAC and SMBIOS UUID match",
		},
		{name: "no MAC matches", machine: func(m *maastest.Machine) { m.MACs = []string{otherMAC} }, wantReason: maas.ReasonUnverified, wantWhy: "none of its MACs"},
		{name: "machine has no interfaces", machine: func(m *maastest.Machine) { m.MACs = nil }, wantReason: maas.ReasonUnverified, wantWhy: "none of its MACs"},
		{
			name:       "UUID differs",
			machine:    func(m *maastest.Machine) { m.HardwareUUID = "00000000-0000-4000-8000-000000000000" },
			wantReason: maas.ReasonUnverified, wantWhy: "is not the VM's firmware UUID",
		},
		{name: "VirtualMachine missing", vm: func(vm *maas.EnrolledVM) { vm.VMFound = false }, wantReason: maas.ReasonUnverified, wantWhy: "does not exist"},
		{
			name: "spec sets no MAC, the running instance's matches",
			vm:   func(vm *maas.EnrolledVM) { vm.MACs = nil }, instances: []string{macOf(vmA)},
			wantReason: maas.ReasonBound, wantWhy: "MAC and SMBIOS UUID match", wantLists: 1,
		},
		{
			name: "spec sets no MAC, the running instance's differs",
			vm:   func(vm *maas.EnrolledVM) { vm.MACs = nil }, instances: []string{otherMAC},
			wantReason: maas.ReasonUnverified, wantWhy: "none of its MACs", wantLists: 1,
		},
		{
			name:       "spec sets no MAC, no running instance",
			vm:         func(vm *maas.EnrolledVM) { vm.MACs = nil },
			wantReason: maas.ReasonUnverified, wantWhy: "MACs are unknown", wantLists: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := ours("m1", vmA, maastest.StatusNew)
			if tt.machine != nil {
				tt.machine(&m)
			}
			s := maastest.New(t).WithMachine(m)
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
			if cluster.instanceCalls != tt.wantLists {
				t.Errorf("instance lists = %d, want %d", cluster.instanceCalls, tt.wantLists)
			}
			got, _ := s.Machine("m1")
			events := cluster.eventsOf(vmA)
			if tt.wantReason == maas.ReasonBound {
				if result.Bound != 1 || got.Status != maastest.StatusCommissioning || c.Status != metav1.ConditionTrue {
					t.Errorf("bound machine not converged: %+v, result %+v", got, result)
				}
				return
			}
			if writes(s) != 0 || result.Bound != 0 || got.PowerParameters[maas.PowerPass] != "" {
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

// TestDuplicateClaims: of two machines claiming one VM the better-proven one
// keeps it; on a tie the one already reported does; else neither.
func TestDuplicateClaims(t *testing.T) {
	withoutUUID := func(m maastest.Machine) maastest.Machine { m.HardwareUUID = ""; return m }
	tests := []struct {
		name        string
		machines    []maastest.Machine
		reported    string // system ID already in the VM's status
		wantBound   string // "" for none
		wantReason  string
		wantMention string
	}{
		{
			name:      "UUID match beats MAC-only",
			machines:  []maastest.Machine{withoutUUID(ours("a", vmA, maastest.StatusNew)), ours("b", vmA, maastest.StatusNew)},
			wantBound: "b", wantReason: maas.ReasonDuplicated, wantMention: "a (MAC matches)",
		},
		{
			name: "a matching machine beats an unverified one",
			machines: []maastest.Machine{ours("a", vmA, maastest.StatusNew), func() maastest.Machine {
				m := ours("b", vmA, maastest.StatusNew)
				m.MACs = []string{"02:ff:00:00:00:01"}
				return m
			}()},
			wantBound: "a", wantReason: maas.ReasonDuplicated, wantMention: "b (none of its MACs",
		},
		{
			name:       "tie, none reported: neither gets credentials",
			machines:   []maastest.Machine{withoutUUID(ours("a", vmA, maastest.StatusNew)), withoutUUID(ours("b", vmA, maastest.StatusNew))},
			wantReason: maas.ReasonDuplicated, wantMention: "all claim this VM equally",
		},
		{
			name:      "tie: the machine already reported keeps the VM",
			machines:  []maastest.Machine{withoutUUID(ours("a", vmA, maastest.StatusNew)), withoutUUID(ours("b", vmA, maastest.StatusNew))},
			reported:  "b",
			wantBound: "b", wantReason: maas.ReasonDuplicated, wantMention: "a (MAC matches) also claim",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := maastest.New(t)
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
			st, c := cluster.status(vmA)
			if st.SystemID != tt.wantBound || c.Reason != tt.wantReason || !strings.Contains(c.Message, tt.wantMention) {
				t.Errorf("status %+v, condition %+v; want machine %q, %s mentioning %q", st, c, tt.wantBound, tt.wantReason, tt.wantMention)
			}
			if ev := cluster.eventsOf(vmA); len(ev) != 1 || ev[0].eventType != "Warning" || ev[0].reason != "MaaSMachineDuplicated" {
				t.Errorf("events = %+v", ev)
			}
		})
	}
}

// TestAttackClaimingAnotherTenantsVM plays the attack of issue 8: tenant A
// writes B's name into its VM's SMBIOS serial, so its machine enlists with
// B's BMC address, and copies B's MAC onto its VM, in a namespace that is
// not enrolled. B's password must never reach MaaS for A's machine, and B's
// machine must still converge, whichever enlisted first.
func TestAttackClaimingAnotherTenantsVM(t *testing.T) {
	attacker := maas.VMRef{Namespace: "tenant-x", Name: "evil"}
	const victimPassword = "b-secret-password"
	tests := []struct {
		name         string
		attackerUUID string // the hardware UUID MaaS shows for A's machine
		attackerID   string // system IDs order who is seen first
	}{
		{name: "MaaS cleared the duplicate UUID, attacker listed first", attackerUUID: "", attackerID: "a-evil"},
		{name: "MaaS cleared the duplicate UUID, attacker listed last", attackerUUID: "", attackerID: "z-evil"},
		{name: "attacker's own UUID", attackerUUID: uuidOf(attacker), attackerID: "a-evil"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evil := ours(tt.attackerID, vmB, maastest.StatusNew) // B's address and MAC
			evil.HardwareUUID = tt.attackerUUID
			s := maastest.New(t).WithMachine(evil).WithMachine(ours("m-b", vmB, maastest.StatusNew))
			// Only B is enrolled; A's VM has no VirtualMachineBMC.
			cluster := newFakeCluster().withVM(vmB, victimPassword)
			r := newReconciler(t, s, cluster)
			for range 3 {
				reconcile(t, r)
				s.Step()
			}

			for _, req := range s.Requests() {
				if strings.Contains(req.Path, tt.attackerID) && req.Method != "GET" {
					t.Errorf("attacker's machine was written to: %+v", req)
				}
				for _, v := range req.Form {
					if v == victimPassword && req.Path != "machines/m-b/" {
						t.Errorf("B's password sent in %s %s", req.Method, req.Path)
					}
				}
			}
			if m, _ := s.Machine(tt.attackerID); m.PowerParameters[maas.PowerPass] != "" || m.Status != maastest.StatusNew || m.Pool != maastest.DefaultPool {
				t.Errorf("attacker's machine = %+v", m)
			}
			b, _ := s.Machine("m-b")
			if b.PowerParameters[maas.PowerPass] != victimPassword || b.Hostname != maas.Hostname(vmB) || b.Pool != vmB.Namespace || b.Status != maastest.StatusReady {
				t.Errorf("B's machine did not converge: %+v", b)
			}
			st, c := cluster.status(vmB)
			if st.SystemID != "m-b" || c.Reason != maas.ReasonDuplicated || !strings.Contains(c.Message, tt.attackerID) {
				t.Errorf("B's status %+v, condition %+v; want m-b with the attacker reported", st, c)
			}
			if ev := cluster.eventsOf(vmB); len(ev) != 1 || ev[0].eventType != "Warning" {
				t.Errorf("B's events = %+v", ev)
			}
		})
	}
}
