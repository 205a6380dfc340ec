package maas_test

import (
	"context"
	"testing"

	"github.com/virtmetal/virtmetal/internal/promtest"
	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

// sample is the value of the sample of name whose label key is value ("" for
// the only one), -1 when there is none.
func sample(families promtest.Families, name, key, value string) float64 {
	var want map[string]string
	if key != "" {
		want = map[string]string{key: value}
	}
	if v, ok := families.Value(name, want); ok {
		return v
	}
	return -1
}

// TestMetricsFollowTheCycles: a cycle that converges a machine, a refused
// commission and a cycle failing as a whole each move what they should.
func TestMetricsFollowTheCycles(t *testing.T) {
	s := maassim.New(t).WithMachine(ours("m1", vmA, maassim.StatusNew)).WithMachine(ours("m2", vmB, maassim.StatusNew))
	cluster := newFakeCluster().withVM(vmA, "pw-a").withVM(vmB, "pw-b")
	r := newReconciler(t, s, cluster)
	r.Metrics = maas.NewMetrics()
	s.FailMatching(maassim.Match{Op: "commission", Path: "machines/m2/"}, 1, maassim.FaultConflict)
	reconcile(t, r)

	got := promtest.Scrape(t, r.Metrics.Handler())
	checks := []struct {
		name, key, value string
		want             float64
	}{
		{"virtmetal_maas_reconciler_cycles_total", "result", "ok", 1},
		{"virtmetal_maas_reconciler_cycle_duration_seconds", "", "", 1},
		{"virtmetal_maas_reconciler_machines", "kind", "seen", 2},
		{"virtmetal_maas_reconciler_machines", "kind", "bound", 2},
		{"virtmetal_maas_reconciler_changes_total", "action", maas.ActionCommission, 2},
		{"virtmetal_maas_reconciler_changes_total", "action", maas.ActionSetCredentials, 2},
		{"virtmetal_maas_reconciler_machine_failures", "", "", 1},
		{"virtmetal_maas_reconciler_problems", "reason", maas.ReasonFailing, 1},
		{"virtmetal_maas_reconciler_problems", "reason", maas.ReasonCommissionRefused, 0},
	}
	for _, c := range checks {
		t.Run(c.name+" "+c.value, func(t *testing.T) {
			if v := sample(got, c.name, c.key, c.value); v != c.want {
				t.Errorf("%v, want %v", v, c.want)
			}
		})
	}

	s.FailNext(1, maassim.FaultServerError)
	if _, err := r.Reconcile(context.Background()); err == nil {
		t.Fatal("a cycle without the machine list did not fail")
	}
	got = promtest.Scrape(t, r.Metrics.Handler())
	if v := sample(got, "virtmetal_maas_reconciler_cycles_total", "result", "failed"); v != 1 {
		t.Errorf("failed cycles = %v, want 1", v)
	}
	if v := sample(got, "virtmetal_maas_reconciler_machines", "kind", "bound"); v != 2 {
		t.Errorf("a failed cycle changed the machines of the last successful one: bound %v", v)
	}
}
