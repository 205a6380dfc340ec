package maas_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

// enlistAnonymously is what anyone on the provisioning network can do: POST
// machines/ without a key, as a booting machine's enlistment does, with the
// hostname, MACs and power settings it likes. It returns the system ID.
func enlistAnonymously(t *testing.T, s *maassim.Server, hostname string, macs []string, powerType string, params map[string]string) string {
	t.Helper()
	form := url.Values{"architecture": {"amd64/generic"}, "mac_addresses": macs, "power_type": {powerType}}
	if hostname != "" {
		form.Set("hostname", hostname)
	}
	if params != nil {
		raw, err := json.Marshal(params)
		if err != nil {
			t.Fatal(err)
		}
		form.Set("power_parameters", string(raw))
	}
	resp, err := http.PostForm(s.URL()+"/api/2.0/machines/", form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m struct {
		SystemID string `json:"system_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("anonymous enlistment: HTTP %d, %v", resp.StatusCode, err)
	}
	return m.SystemID
}

// TestAttackAnonymousEnlistmentFirst plays issue 35's item 1: everything
// a machine used to prove itself with is derivable from the VM's name (its
// BMC address, MAC and SMBIOS UUID) or broadcast, so another tenant
// enlists a machine with them, anonymously, before the VM's own machine
// is reported. It must get nothing: no credentials, name, pool or
// commission; and the VM's own machine, arriving second, must be bound.
func TestAttackAnonymousEnlistmentFirst(t *testing.T) {
	const victimPassword = "b-secret-password"
	s := maassim.New(t)
	evil := enlistAnonymously(t, s, "", []string{macOf(vmB)}, maas.PowerTypeRedfish, map[string]string{
		maas.PowerAddress: maas.BMCAddress(vmB, testDomain), maas.PowerNodeID: vmB.Name, maas.PowerUser: maas.PlaceholderUser, maas.PowerPass: "anything",
	})
	// It could set the UUID too on a region that lets it: the proof does
	// not depend on it.
	s.Update(evil, func(m *maassim.Machine) { m.HardwareUUID = uuidOf(vmB) })
	cluster := newFakeCluster().withVM(vmB, victimPassword)
	r := newReconciler(t, s, cluster)
	for range 2 {
		reconcile(t, r)
	}
	checkUntouched := func() {
		t.Helper()
		if held := s.PasswordsHeld(evil); slices.Contains(held, victimPassword) {
			t.Errorf("the anonymous enlistment got B's password")
		}
		m, _ := s.Machine(evil)
		if m.Hostname == maas.Hostname(vmB) || m.Pool != maassim.DefaultPool || m.Status != maassim.StatusNew || commissions(s, evil) != 0 {
			t.Errorf("the anonymous enlistment was named, pooled or commissioned as B's: %+v", m)
		}
	}
	checkUntouched()
	if st, c := cluster.status(vmB); st.SystemID != "" || c.Reason != maas.ReasonUnverified || !strings.Contains(c.Message, "MaaS stored no commissioning output") {
		t.Errorf("B's status %+v, condition %+v; want Unverified", st, c)
	}

	// B's own machine enlists, its guest reporting B's proof.
	s.WithMachine(ours("m-b", vmB, maassim.StatusNew))
	for range 2 {
		reconcile(t, r)
	}
	checkUntouched()
	b, _ := s.Machine("m-b")
	if b.PowerParameters[maas.PowerPass] != victimPassword || b.Hostname != maas.Hostname(vmB) || b.Pool != vmB.Namespace || b.Status != maassim.StatusCommissioning {
		t.Errorf("B's machine did not converge: %+v", b)
	}
	if st, _ := cluster.status(vmB); st.SystemID != "m-b" {
		t.Errorf("B's status names %q, want m-b", st.SystemID)
	}
}

// TestProvenLaterNeverDisplaces: the machine bound first keeps its VM
// against a machine proven later, and its stored output is not read again;
// once it stops proving itself (it carries a MAC the VM lacks, it left
// MaaS, or its address names another BMC) the proven one takes the VM.
func TestProvenLaterNeverDisplaces(t *testing.T) {
	for _, stop := range []struct {
		name string
		do   func(s *maassim.Server)
	}{
		{"it carries a MAC the VM lacks", func(s *maassim.Server) {
			s.Update("m1", func(m *maassim.Machine) { m.MACs = append(m.MACs, "02:ff:00:00:00:09") })
		}},
		{"it left MaaS", func(s *maassim.Server) { s.Delete("m1") }},
		{"it names another BMC", func(s *maassim.Server) {
			s.Update("m1", func(m *maassim.Machine) { m.PowerParameters[maas.PowerAddress] = "other.tenant-x." + testDomain })
		}},
	} {
		t.Run(stop.name, func(t *testing.T) {
			s := maassim.New(t).WithMachine(ours("m1", vmA, maassim.StatusNew))
			cluster := newFakeCluster().withVM(vmA, "pw")
			r := newReconciler(t, s, cluster)
			reconcile(t, r)
			s.Step()
			s.WithMachine(ours("m2", vmA, maassim.StatusNew)) // carries the proof too
			s.ResetRequests()
			for range 2 {
				reconcile(t, r)
			}
			if st, _ := cluster.status(vmA); st.SystemID != "m1" {
				t.Fatalf("status names %q, want m1, bound first", st.SystemID)
			}
			if m, _ := s.Machine("m2"); m.PowerParameters[maas.PowerPass] == "pw" || m.PowerType != maas.PowerTypeManual {
				t.Errorf("m2 = %+v, want detached without the password", m)
			}
			if n := s.Count(maassim.Match{Path: "nodes/m1/results/current-commissioning/"}); n != 0 {
				t.Errorf("the bound machine's output was read %d times", n)
			}

			stop.do(s)
			s.WithMachine(ours("m3", vmA, maassim.StatusNew))
			reconcile(t, r)
			if st, _ := cluster.status(vmA); st.SystemID != "m3" {
				t.Errorf("status names %q, want m3 once m1 stopped proving itself", st.SystemID)
			}
			if m, ok := s.Machine("m1"); ok && m.PowerParameters[maas.PowerPass] == "pw" && m.PowerParameters[maas.PowerAddress] != maas.BMCAddress(vmA, testDomain) {
				t.Errorf("m1 keeps the VM's password next to address %q", m.PowerParameters[maas.PowerAddress])
			}
		})
	}
}

// TestMigrationKeepsBindings: a machine bound before machine proofs (its
// VM's status names it, MaaS stored no proof for it) stays bound, with or
// without a proof on its VM, and nothing is written or read for it.
func TestMigrationKeepsBindings(t *testing.T) {
	for _, vmHasProof := range []bool{true, false} {
		t.Run(map[bool]string{true: "VM stamped since", false: "VM without proof"}[vmHasProof], func(t *testing.T) {
			old := withPassword(ours("m1", vmA, maassim.StatusReady), "pw")
			old.Commissioning = nil // commissioned before the script reported proofs
			old.Hostname, old.Pool = maas.Hostname(vmA), vmA.Namespace
			s := maassim.New(t).WithPool(vmA.Namespace).WithMachine(old)
			cluster := newFakeCluster().withVM(vmA, "pw")
			if !vmHasProof {
				cluster.edit(vmA, func(vm *maas.EnrolledVM) { vm.Proof = "" })
			}
			// The status as the reconciler before machine proofs wrote it.
			cluster.statuses[vmA] = maas.MachineStatus{
				MaaS:      &v1beta1.MaaSStatus{SystemID: "m1", StatusName: "Ready", Hostname: maas.Hostname(vmA), Pool: vmA.Namespace},
				Condition: &metav1.Condition{Type: v1beta1.ConditionMaaSMachine, Status: metav1.ConditionTrue, Reason: maas.ReasonBound, Message: "machine m1 is this VM: MAC and SMBIOS UUID match"},
			}
			r := newReconciler(t, s, cluster)
			result := reconcile(t, r)
			if result.Bound != 1 {
				t.Fatalf("result %+v, want m1 still bound", result)
			}
			if st, c := cluster.status(vmA); st.SystemID != "m1" || c.Reason != maas.ReasonBound {
				t.Errorf("status %+v, condition %+v", st, c)
			}
			if writes(s) != 0 || s.Count(maassim.Match{Path: "nodes/m1/results/current-commissioning/"}) != 0 {
				t.Errorf("requests %+v, want no write and no output read", s.Requests())
			}
		})
	}
}

// withPassword gives a machine the credentials the fake cluster's VMs
// have.
func withPassword(m maassim.Machine, password string) maassim.Machine {
	m.PowerParameters[maas.PowerUser] = "admin"
	m.PowerParameters[maas.PowerPass] = password
	return m
}

// TestAttackAddressSwappedAroundTheCredentialWrite plays issue 35's item
// 4: the bound machine's power address is changed to another BMC between
// the cycle's list and the credential write, or between the write and its
// read-back, or in a later cycle. The VM's password must never stay next
// to an address that is not the VM's BMC.
func TestAttackAddressSwappedAroundTheCredentialWrite(t *testing.T) {
	const password = "b-secret-password"
	evilAddress := "evil.tenant-x." + testDomain
	swap := func(s *maassim.Server) func() {
		var once sync.Once
		return func() {
			once.Do(func() {
				s.Update("m-b", func(m *maassim.Machine) { m.PowerParameters[maas.PowerAddress] = evilAddress })
			})
		}
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, s *maassim.Server, r *maas.Reconciler)
	}{
		{
			name: "between the list and the write",
			setup: func(t *testing.T, s *maassim.Server, r *maas.Reconciler) {
				s.Before(maassim.Match{Method: "PUT", Path: "machines/m-b/"}, swap(s))
			},
		},
		{
			name: "between the write and the read-back",
			setup: func(t *testing.T, s *maassim.Server, r *maas.Reconciler) {
				once := swap(s)
				reads := 0
				var mu sync.Mutex
				s.Before(maassim.Match{Method: "GET", Path: "machines/", Op: "power_parameters"}, func() {
					mu.Lock()
					reads++
					second := reads == 2
					mu.Unlock()
					if second {
						once()
					}
				})
			},
		},
		{
			name: "after the machine was bound",
			setup: func(t *testing.T, s *maassim.Server, r *maas.Reconciler) {
				reconcile(t, r)
				swap(s)()
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := maassim.New(t).WithMachine(ours("m-b", vmB, maassim.StatusNew))
			cluster := newFakeCluster().withVM(vmB, password)
			r := newReconciler(t, s, cluster)
			tt.setup(t, s, r)
			reconcile(t, r)
			m, _ := s.Machine("m-b")
			if m.PowerParameters[maas.PowerPass] == password && m.PowerParameters[maas.PowerAddress] != maas.BMCAddress(vmB, testDomain) {
				t.Errorf("machine holds B's password next to address %q", m.PowerParameters[maas.PowerAddress])
			}
			for _, req := range s.Requests() {
				if req.Method == "PUT" && req.Form["power_parameters_power_pass"] != "" &&
					(req.Form["power_parameters_power_address"] == "" || req.Form["power_type"] == "" || req.Form["power_parameters_node_id"] == "") {
					t.Errorf("credentials written without their address, type and node id: %+v", req.Form)
				}
			}
		})
	}
}

// TestAttackSquattedHostnames plays issue 35's item 6: both names the VM's
// machine can get are predictable, so two anonymous enlistments take them
// first. The VM's machine must still be named, pooled and commissioned.
// Squatters that claim the VM's BMC unproven and are New give the names
// back (renamed after their system IDs); others (not claimants, or
// deployed) keep theirs, and the VM's machine takes a name from its own
// system ID, which no one could predict.
func TestAttackSquattedHostnames(t *testing.T) {
	claimant := func(powerType string) map[string]string {
		if powerType == maas.PowerTypeManual {
			return nil
		}
		return map[string]string{maas.PowerAddress: maas.BMCAddress(vmB, testDomain), maas.PowerNodeID: vmB.Name, maas.PowerUser: maas.PlaceholderUser, maas.PowerPass: "anything"}
	}
	tests := []struct {
		name         string
		powerType    string // the squatters'
		status       int    // the squatters'
		wantHostname func(squatters []string) string
		wantRenamed  bool
	}{
		{
			name: "squatters that claim nothing", powerType: maas.PowerTypeManual, status: maassim.StatusNew,
			wantHostname: func([]string) string { return maas.SystemHostname(vmB, "m-b") },
		},
		{
			name: "unproven New claimants", powerType: maas.PowerTypeRedfish, status: maassim.StatusNew,
			wantHostname: func([]string) string { return maas.Hostname(vmB) }, wantRenamed: true,
		},
		{
			name: "unproven deployed claimants", powerType: maas.PowerTypeRedfish, status: maassim.StatusDeployed,
			wantHostname: func([]string) string { return maas.SystemHostname(vmB, "m-b") },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := maassim.New(t)
			names := []string{maas.Hostname(vmB), maas.HashedHostname(vmB)}
			var squatters []string
			for i, name := range names {
				id := enlistAnonymously(t, s, name, []string{fmt.Sprintf("02:ee:00:00:00:%02x", i)}, tt.powerType, claimant(tt.powerType))
				s.Update(id, func(m *maassim.Machine) { m.Status = tt.status })
				squatters = append(squatters, id)
			}
			s.WithMachine(ours("m-b", vmB, maassim.StatusNew))
			cluster := newFakeCluster().withVM(vmB, "pw")
			r := newReconciler(t, s, cluster)
			for range 2 {
				if result := reconcile(t, r); len(result.Failures) != 0 {
					t.Errorf("failures %v", result.Failures)
				}
			}
			m, _ := s.Machine("m-b")
			if want := tt.wantHostname(squatters); m.Hostname != want || m.Pool != vmB.Namespace || m.Status != maassim.StatusCommissioning {
				t.Errorf("B's machine = %+v, want named %q, pooled and commissioning", m, want)
			}
			if st, c := cluster.status(vmB); st.SystemID != "m-b" {
				t.Errorf("status %+v, condition %+v", st, c)
			}
			for i, id := range squatters {
				got, _ := s.Machine(id)
				want := names[i]
				if tt.wantRenamed {
					want = "unproven-" + id
				}
				if got.Hostname != want || got.Pool != maassim.DefaultPool || got.Status != tt.status || slices.Contains(s.PasswordsHeld(id), "pw") {
					t.Errorf("squatter %s = %+v, want hostname %q and otherwise left alone", id, got, want)
				}
			}
		})
	}
}
