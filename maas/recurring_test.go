package maas_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

// clock is a settable Now for the reconciler.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time          { return c.now }
func (c *clock) advance(d time.Duration) { c.now = c.now.Add(d) }

// TestCommissionRefusedBacksOff: a commission MaaS refuses is tried again
// only after a wait that doubles with each refusal up to the cap; a waiting
// cycle sends nothing and writes nothing; the count of refusals is in the
// VM's status; a change of the machine's status ends the wait; and once
// MaaS has an image the machine is commissioned and the problem is gone.
func TestCommissionRefusedBacksOff(t *testing.T) {
	s := maassim.New(t).WithoutBootImages(true).WithMachine(ours("m1", vmA, maassim.StatusNew))
	cluster := newFakeCluster().withVM(vmA, "pw")
	c := &clock{now: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	r := newReconciler(t, s, cluster)
	r.Now, r.CommissionBackoff, r.MaxCommissionBackoff = c.Now, time.Minute, 3*time.Minute

	refusal := func(t *testing.T) (cycles int32, retryAfter time.Time) {
		t.Helper()
		st, cond := cluster.status(vmA)
		if len(st.Problems) != 1 || st.Problems[0].Reason != maas.ReasonCommissionRefused || st.Problems[0].RetryAfter == nil ||
			!strings.Contains(st.Problems[0].Message, maassim.NoImageError) {
			t.Fatalf("problems = %+v, want one CommissionRefused with MaaS's words", st.Problems)
		}
		if cond.Reason != maas.ReasonCommissionRefused || cond.Status != metav1.ConditionFalse {
			t.Fatalf("condition = %+v", cond)
		}
		return st.Problems[0].Cycles, st.Problems[0].RetryAfter.Time
	}
	start := c.now
	// attempt at, wanted count and wait after it: 1, 2, 3 (capped), 3.
	steps := []struct {
		at     time.Duration
		cycles int32
		wait   time.Duration
	}{
		{0, 1, time.Minute},
		{time.Minute, 2, 2 * time.Minute},
		{3 * time.Minute, 3, 3 * time.Minute},
		{6 * time.Minute, 4, 3 * time.Minute},
	}
	for i, step := range steps {
		t.Run(fmt.Sprintf("attempt %d", i+1), func(t *testing.T) {
			c.now = start.Add(step.at)
			result := reconcile(t, r)
			if n := s.Count(maassim.Match{Op: "commission"}); n != i+1 {
				t.Fatalf("%d commission requests, want %d", n, i+1)
			}
			cycles, retryAfter := refusal(t)
			if cycles != step.cycles || !retryAfter.Equal(c.now.Add(step.wait)) {
				t.Errorf("cycles %d, retry after %v; want %d, %v", cycles, retryAfter, step.cycles, c.now.Add(step.wait))
			}
			if got := result.Recurring(int(step.cycles)); len(got) != 1 || got[0].SystemID != "m1" || got[0].VM != vmA {
				t.Errorf("Recurring(%d) = %+v", step.cycles, got)
			}
			if got := result.Recurring(int(step.cycles) + 1); len(got) != 0 {
				t.Errorf("Recurring(%d) = %+v, want none", step.cycles+1, got)
			}

			// Within the wait: no commission, no write, the problem as it was.
			reports := cluster.reportCalls
			c.advance(step.wait - time.Second)
			result = reconcile(t, r)
			if n := s.Count(maassim.Match{Op: "commission"}); n != i+1 {
				t.Errorf("commissioned within the wait: %d requests", n)
			}
			if cluster.reportCalls != reports {
				t.Errorf("a waiting cycle wrote the status %d times", cluster.reportCalls-reports)
			}
			if cycles, _ := refusal(t); cycles != step.cycles || len(result.Failures) != 1 {
				t.Errorf("waiting cycle: cycles %d, failures %v", cycles, result.Failures)
			}
		})
	}

	t.Run("a change of status ends the wait", func(t *testing.T) {
		_, retryAfter := refusal(t)
		s.Update("m1", func(m *maassim.Machine) { m.Status = maassim.StatusBroken })
		reconcile(t, r)
		if st, _ := cluster.status(vmA); len(st.Problems) != 0 || st.StatusName != "Broken" {
			t.Errorf("a Broken machine is not refused a commission: %+v", st)
		}
		s.Update("m1", func(m *maassim.Machine) { m.Status = maassim.StatusNew })
		before := s.Count(maassim.Match{Op: "commission"})
		if !c.now.Before(retryAfter) {
			t.Fatal("test set-up: the old wait has ended anyway")
		}
		reconcile(t, r)
		if s.Count(maassim.Match{Op: "commission"}) != before+1 {
			t.Error("New again, the machine waited out the old refusal")
		}
		if cycles, _ := refusal(t); cycles != 1 {
			t.Errorf("cycles = %d after the change, want 1", cycles)
		}
	})

	t.Run("images imported", func(t *testing.T) {
		s.WithoutBootImages(false)
		c.advance(time.Minute)
		reconcile(t, r)
		st, cond := cluster.status(vmA)
		if len(st.Problems) != 0 || cond.Reason != maas.ReasonBound || st.StatusName != "Commissioning" {
			t.Errorf("status %+v, condition %+v; want commissioning, bound, no problem", st, cond)
		}
		ev := cluster.eventsOf(vmA)
		if last := ev[len(ev)-1]; last.eventType != "Normal" || last.reason != "MaaSMachine"+maas.ReasonBound {
			t.Errorf("last event %+v, want Normal Bound", last)
		}
	})
}

// TestRefusalDoesNotHideDuplicateClaim: the VM's machine is refused a
// commission and another machine claims the VM: the status lists both
// problems, the condition names both, and each gets its Warning Event.
func TestRefusalDoesNotHideDuplicateClaim(t *testing.T) {
	claimant := ours("z-other", vmA, maassim.StatusReady)
	claimant.HardwareUUID, claimant.MACs = "", []string{"02:ff:00:00:00:09"}
	s := maassim.New(t).WithoutBootImages(true).WithMachine(ours("m1", vmA, maassim.StatusNew)).WithMachine(claimant)
	cluster := newFakeCluster().withVM(vmA, "pw")
	c := &clock{now: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	r := newReconciler(t, s, cluster)
	r.Now = c.Now
	reconcile(t, r)

	st, cond := cluster.status(vmA)
	var reasons []string
	for _, p := range st.Problems {
		reasons = append(reasons, p.Reason)
	}
	if !slices.Equal(reasons, []string{maas.ReasonCommissionRefused, maas.ReasonDuplicateClaim}) {
		t.Fatalf("problems %+v, want CommissionRefused then DuplicateClaim", st.Problems)
	}
	if cond.Reason != maas.ReasonCommissionRefused || !strings.Contains(cond.Message, maassim.NoImageError) || !strings.Contains(cond.Message, "z-other") {
		t.Errorf("condition %+v hides a problem", cond)
	}
	var events []string
	for _, e := range cluster.eventsOf(vmA) {
		events = append(events, e.eventType+" "+e.reason)
	}
	if !slices.Equal(events, []string{"Warning MaaSMachineCommissionRefused", "Warning MaaSMachineDuplicateClaim"}) {
		t.Errorf("events = %v", events)
	}

	// The claimant is detached and claims no more; the claim stays on the
	// status until the machine is gone from MaaS.
	s.WithoutBootImages(false)
	c.advance(maas.DefaultCommissionBackoff)
	reconcile(t, r)
	if st, cond := cluster.status(vmA); len(st.Problems) != 1 || st.Problems[0].Reason != maas.ReasonDuplicateClaim || cond.Reason != maas.ReasonDuplicateClaim {
		t.Errorf("after the commission: problems %+v, condition %+v", st.Problems, cond)
	}
	reports := cluster.reportCalls
	reconcile(t, r)
	if cluster.reportCalls != reports {
		t.Error("an unchanged detached claim is written again")
	}
	s.Delete("z-other")
	reconcile(t, r)
	if st, cond := cluster.status(vmA); len(st.Problems) != 0 || cond.Reason != maas.ReasonBound {
		t.Errorf("the claimant is gone: problems %+v, condition %+v", st.Problems, cond)
	}
}

// TestAddressRejectedRecurs: a region that refuses the power address every
// cycle is counted every cycle (no wait: a region upgrade may take it any
// time), and the other VM's machine converges all the same.
func TestAddressRejectedRecurs(t *testing.T) {
	s := maassim.New(t).WithMachine(ours("m1", vmA, maassim.StatusNew)).WithMachine(ours("m2", vmB, maassim.StatusNew))
	s.FailMatching(maassim.Match{Method: "PUT", Path: "machines/m1/"}, -1, maassim.FaultAddressRejected)
	cluster := newFakeCluster().withVM(vmA, "pw-a").withVM(vmB, "pw-b")
	r := newReconciler(t, s, cluster)
	for cycle := int32(1); cycle <= 3; cycle++ {
		result := reconcile(t, r)
		st, cond := cluster.status(vmA)
		if len(st.Problems) != 1 || st.Problems[0].Reason != maas.ReasonAddressRejected || st.Problems[0].Cycles != cycle ||
			cond.Reason != maas.ReasonAddressRejected || !strings.Contains(cond.Message, maassim.Shape34AddressError) {
			t.Fatalf("cycle %d: problems %+v, condition %+v", cycle, st.Problems, cond)
		}
		if got := result.Recurring(3); (len(got) == 1) != (cycle == 3) {
			t.Errorf("cycle %d: Recurring(3) = %v", cycle, got)
		}
	}
	if m, _ := s.Machine("m2"); m.Status != maassim.StatusCommissioning || m.PowerParameters[maas.PowerPass] != "pw-b" {
		t.Errorf("the other VM's machine did not converge: %+v", m)
	}
	// Another kind of failure starts its own count.
	s.ClearFaults()
	s.FailMatching(maassim.Match{Method: "PUT", Path: "machines/m1/"}, -1, maassim.FaultConflict)
	reconcile(t, r)
	if st, _ := cluster.status(vmA); len(st.Problems) != 1 || st.Problems[0].Reason != maas.ReasonFailing || st.Problems[0].Cycles != 1 {
		t.Errorf("problems %+v, want Failing counted from 1", st.Problems)
	}
}

// TestShapes runs the reconciler against each MaaS version the simulator
// models: machines enlisted with the bare address and machines stored with
// an older script's forms (a scheme, a port, a slash) all converge to the
// bare address, Ready, named and pooled, on every shape, 3.4's too.
func TestShapes(t *testing.T) {
	forms := map[string]func(host string) string{
		"bare":        func(host string) string { return host },
		"https":       func(host string) string { return "https://" + host },
		"https port":  func(host string) string { return "https://" + host + ":443" },
		"https slash": func(host string) string { return "https://" + host + "/" },
		"port only":   func(host string) string { return host + ":443" },
		"upper case":  func(host string) string { return "https://" + strings.ToUpper(host) },
	}
	for _, shape := range maassim.Shapes {
		t.Run(string(shape), func(t *testing.T) {
			s := maassim.New(t).WithShape(shape)
			cluster := newFakeCluster()
			var names []string
			vms := map[string]maas.VMRef{}
			for i, name := range slices.Sorted(maps.Keys(forms)) {
				vm := maas.VMRef{Namespace: "tenant-" + string(rune('a'+i)), Name: "vm"}
				m := ours(fmt.Sprintf("m%d", i), vm, maassim.StatusNew)
				m.PowerParameters[maas.PowerAddress] = forms[name](maas.BMCAddress(vm, testDomain))
				s.WithMachine(m) // stored as an older region or script left it
				cluster.withVM(vm, "pw-"+name)
				names = append(names, name)
				vms[m.SystemID] = vm
			}
			r := newReconciler(t, s, cluster)
			for range 2 {
				if result := reconcile(t, r); len(result.Failures) != 0 {
					t.Fatalf("failures: %v", failures(result))
				}
				s.Step()
			}
			for systemID, vm := range vms {
				m, _ := s.Machine(systemID)
				if m.Status != maassim.StatusReady || m.Hostname != maas.Hostname(vm) || m.Pool != vm.Namespace ||
					m.PowerParameters[maas.PowerAddress] != maas.BMCAddress(vm, testDomain) || m.PowerParameters[maas.PowerPass] == "" {
					t.Errorf("%s (%s): %+v", systemID, vm, m)
				}
				if _, cond := cluster.status(vm); cond.Reason != maas.ReasonBound {
					t.Errorf("%s: condition %+v", vm, cond)
				}
			}
			t.Logf("%d address forms converged: %v", len(names), names)
		})
	}
}
