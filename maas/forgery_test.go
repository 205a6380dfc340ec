package maas_test

import (
	"encoding/json"
	"net/url"
	"slices"
	"testing"

	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

// The forgeries a real MaaS 3.4 region allows (docs/maas-region.md): a
// machine's node token is anyone's who knows its system_id, so a stranger
// can store any commissioning output for it, make a forged set current,
// and re-enlist with its MAC to change its power settings. Each test
// checks that nothing of a VM (its credentials, name, pool, a commission)
// reaches a machine that is not the VM's.

// enlistAsGuest is the VM's own guest enlisting, as MaaS's runner does
// with deploy/maas's script: an anonymous POST with commission=true, the
// VM's MAC and the script's power settings (placeholder credentials),
// the script's output with the proof it read, and the end of the
// enlistment: the machine is New, that set current.
func enlistAsGuest(t *testing.T, s *maassim.Server, vm maas.VMRef, proof string) string {
	t.Helper()
	id := enlistWith(t, s, vm, macOf(vm), true)
	signal(t, s, id, maassim.NodeSignal{Status: maassim.SignalWorking, HardwareUUID: uuidOf(vm),
		Results: []maassim.ScriptResult{{Name: maas.BMCConfigScript, Status: maassim.ScriptPassed,
			Stdout: bmcspec.ProofReportKey + ": " + proof + "\nINFO: Redfish BMC of VM " + vm.String() + "\n"}}})
	signal(t, s, id, maassim.NodeSignal{Status: maassim.SignalOK})
	return id
}

// enlistWith is an anonymous POST machines/ claiming vm's BMC with the MAC.
func enlistWith(t *testing.T, s *maassim.Server, vm maas.VMRef, mac string, commission bool) string {
	t.Helper()
	params, _ := json.Marshal(map[string]string{maas.PowerAddress: maas.BMCAddress(vm, testDomain), maas.PowerNodeID: vm.Name,
		maas.PowerUser: maas.PlaceholderUser, maas.PowerPass: "placeholder"})
	form := url.Values{"architecture": {"amd64/generic"}, "mac_addresses": {mac}, "power_type": {maas.PowerTypeRedfish}, "power_parameters": {string(params)}}
	if commission {
		form.Set("commission", "true")
	}
	id, err := s.EnlistAnonymously(form)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func signal(t *testing.T, s *maassim.Server, id string, sig maassim.NodeSignal) {
	t.Helper()
	if err := s.Signal(id, sig); err != nil {
		t.Fatalf("signal %s to %s: %v", sig.Status, id, err)
	}
}

// forgeCommissioning is a stranger with a New machine's system_id: a
// commissioning of its own, the bmc-config output it likes, ended OK.
// The machine is Ready, the forged set current.
func forgeCommissioning(t *testing.T, s *maassim.Server, id, stdout string) {
	t.Helper()
	signal(t, s, id, maassim.NodeSignal{Status: maassim.SignalCommissioning})
	signal(t, s, id, maassim.NodeSignal{Status: maassim.SignalWorking,
		Results: []maassim.ScriptResult{{Name: maas.BMCConfigScript, Status: maassim.ScriptPassed, Stdout: stdout}}})
	signal(t, s, id, maassim.NodeSignal{Status: maassim.SignalOK})
}

// checkNothingOf checks that nothing of vm reached the machine: not its
// password, not one of its hostnames, not its pool, no commission.
func checkNothingOf(t *testing.T, s *maassim.Server, id string, vm maas.VMRef, password string) {
	t.Helper()
	m, ok := s.Machine(id)
	if !ok {
		return
	}
	names := []string{maas.Hostname(vm), maas.HashedHostname(vm), maas.SystemHostname(vm, id)}
	if slices.Contains(s.PasswordsHeld(id), password) || slices.Contains(names, m.Hostname) || m.Pool == vm.Namespace || commissions(s, id) != 0 {
		t.Errorf("machine %s got something of %s: %+v, passwords %v, commissions %d", id, vm, m, s.PasswordsHeld(id), commissions(s, id))
	}
}

// TestForgerySameProofOnTwoMachines: two machines claiming the VM carry
// its proof. With neither bound, neither gets anything (DuplicateClaim);
// when one is the incumbent, it keeps the VM and the other gets nothing.
func TestForgerySameProofOnTwoMachines(t *testing.T) {
	for _, bound := range []bool{false, true} {
		t.Run(map[bool]string{false: "neither bound", true: "one bound"}[bound], func(t *testing.T) {
			s := maassim.New(t)
			cluster := newFakeCluster().withVM(vmA, "a-pass")
			r := newReconciler(t, s, cluster)
			first := enlistAsGuest(t, s, vmA, proofOf(vmA))
			if bound {
				reconcile(t, r)
			}
			// The second carries the VM's MAC (MaaS moves a MAC to whichever
			// machine reported it last) and the same output.
			second := enlistWith(t, s, vmB, "02:ee:00:00:00:01", true)
			s.Update(second, func(m *maassim.Machine) {
				m.MACs = []string{macOf(vmA)}
				m.PowerParameters[maas.PowerAddress] = maas.BMCAddress(vmA, testDomain)
			})
			signal(t, s, second, maassim.NodeSignal{Status: maassim.SignalWorking,
				Results: []maassim.ScriptResult{{Name: maas.BMCConfigScript, Status: maassim.ScriptPassed, Stdout: bmcspec.ProofReportKey + ": " + proofOf(vmA) + "\n"}}})
			signal(t, s, second, maassim.NodeSignal{Status: maassim.SignalOK})
			for range 2 {
				reconcile(t, r)
			}
			st, c := cluster.status(vmA)
			checkNothingOf(t, s, second, vmA, "a-pass")
			if !bound {
				checkNothingOf(t, s, first, vmA, "a-pass")
				if st.SystemID != "" || c.Reason != maas.ReasonDuplicateClaim {
					t.Errorf("status %+v, condition %+v; want DuplicateClaim", st, c)
				}
				return
			}
			if m, _ := s.Machine(first); st.SystemID != first || m.PowerParameters[maas.PowerPass] != "a-pass" {
				t.Errorf("status names %q, incumbent %+v; want the incumbent kept", st.SystemID, m)
			}
		})
	}
}

// TestForgeryProofOfAnotherVM: a machine claiming VM B carries VM A's
// proof (A's tenant knows its own): it is not B's, and gets nothing of
// B's or A's.
func TestForgeryProofOfAnotherVM(t *testing.T) {
	s := maassim.New(t)
	cluster := newFakeCluster().withVM(vmA, "a-pass").withVM(vmB, "b-pass")
	r := newReconciler(t, s, cluster)
	evil := enlistAsGuest(t, s, vmB, proofOf(vmA))
	for range 2 {
		reconcile(t, r)
	}
	checkNothingOf(t, s, evil, vmB, "b-pass")
	checkNothingOf(t, s, evil, vmA, "a-pass")
	if st, c := cluster.status(vmB); st.SystemID != "" || c.Reason != maas.ReasonUnverified {
		t.Errorf("B's status %+v, condition %+v; want Unverified", st, c)
	}
}

// TestForgerySetMadeCurrent: a stranger makes a forged set current on the
// VM's genuine machine after the genuine output was stored. Not yet
// bound, the machine is no longer proven: no takeover, only a delay.
// Bound already, it stays bound and in shape.
func TestForgerySetMadeCurrent(t *testing.T) {
	for _, bound := range []bool{false, true} {
		t.Run(map[bool]string{false: "not yet bound", true: "bound"}[bound], func(t *testing.T) {
			// No boot images: a bound machine stays New, so the stranger
			// can still start a commissioning of it.
			s := maassim.New(t).WithoutBootImages(true)
			cluster := newFakeCluster().withVM(vmA, "a-pass")
			r := newReconciler(t, s, cluster)
			genuine := enlistAsGuest(t, s, vmA, proofOf(vmA))
			if bound {
				reconcile(t, r)
			}
			forgeCommissioning(t, s, genuine, bmcspec.ProofReportKey+": "+bmcspec.NewMachineProof()+"\n")
			s.WithoutBootImages(false)
			for range 2 {
				reconcile(t, r)
			}
			st, c := cluster.status(vmA)
			if !bound {
				checkNothingOf(t, s, genuine, vmA, "a-pass")
				if st.SystemID != "" || c.Reason != maas.ReasonUnverified {
					t.Errorf("status %+v, condition %+v; want Unverified", st, c)
				}
				return
			}
			m, _ := s.Machine(genuine)
			if st.SystemID != genuine || m.PowerParameters[maas.PowerPass] != "a-pass" || m.Hostname != maas.Hostname(vmA) || m.Pool != vmA.Namespace {
				t.Errorf("status names %q, machine %+v; want it still bound and in shape", st.SystemID, m)
			}
		})
	}
}

// TestForgeryRePOSTChangesBoundAddress: a stranger re-enlists with the
// bound machine's MAC (MaaS updates a New or Commissioning machine so)
// to point it at VM B's BMC, the machine keeping A's password. The next
// cycle replaces that password (it no longer names A's BMC), and the
// machine gets nothing of B's, whether B has a machine or not.
func TestForgeryRePOSTChangesBoundAddress(t *testing.T) {
	for _, bHasMachine := range []bool{false, true} {
		t.Run(map[bool]string{false: "B without machine", true: "B bound"}[bHasMachine], func(t *testing.T) {
			s := maassim.New(t)
			cluster := newFakeCluster().withVM(vmA, "a-pass").withVM(vmB, "b-pass")
			r := newReconciler(t, s, cluster)
			victim := enlistAsGuest(t, s, vmA, proofOf(vmA))
			var bMachine string
			if bHasMachine {
				bMachine = enlistAsGuest(t, s, vmB, proofOf(vmB))
			}
			reconcile(t, r)
			if m, _ := s.Machine(victim); m.Status != maassim.StatusCommissioning || m.PowerParameters[maas.PowerPass] != "a-pass" {
				t.Fatalf("A's machine not bound and commissioning: %+v", m)
			}
			// Only the address (and, where B's machine holds B's address
			// with the same user, a user of its own: MaaS refuses two rows
			// of one address and user): the rest is the machine's.
			repoint := map[string]string{maas.PowerAddress: maas.BMCAddress(vmB, testDomain), maas.PowerNodeID: vmB.Name}
			if bHasMachine {
				repoint[maas.PowerUser] = "evil"
			}
			params, _ := json.Marshal(repoint)
			if id, err := s.EnlistAnonymously(url.Values{"mac_addresses": {macOf(vmA)}, "power_type": {maas.PowerTypeRedfish}, "power_parameters": {string(params)}}); err != nil || id != victim {
				t.Fatalf("re-POST answered %q, %v; want the bound machine", id, err)
			}
			if m, _ := s.Machine(victim); m.PowerParameters[maas.PowerPass] != "a-pass" || m.PowerParameters[maas.PowerAddress] != maas.BMCAddress(vmB, testDomain) {
				t.Fatalf("the re-POST did not leave A's password next to B's address: %v", m.PowerParameters)
			}
			for range 2 {
				reconcile(t, r)
			}
			m, _ := s.Machine(victim)
			if m.PowerParameters[maas.PowerPass] == "a-pass" && m.PowerParameters[maas.PowerAddress] != maas.BMCAddress(vmA, testDomain) {
				t.Errorf("A's password next to %q", m.PowerParameters[maas.PowerAddress])
			}
			if slices.Contains(s.PasswordsHeld(victim), "b-pass") || m.Hostname == maas.Hostname(vmB) || m.Pool == vmB.Namespace {
				t.Errorf("the re-pointed machine got B's: %+v, passwords %v", m, s.PasswordsHeld(victim))
			}
			if st, _ := cluster.status(vmA); st.SystemID == victim {
				t.Errorf("A's status still names %s, which names B's BMC", victim)
			}
			if bHasMachine {
				if st, _ := cluster.status(vmB); st.SystemID != bMachine {
					t.Errorf("B's status names %q, want %s", st.SystemID, bMachine)
				}
			} else if st, c := cluster.status(vmB); st.SystemID != "" {
				t.Errorf("B's status %+v, condition %+v; want no machine", st, c)
			}
		})
	}
}
