package maas_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/virtmetal/virtmetal/maas"
	"github.com/virtmetal/virtmetal/maas/maastest"
)

// BenchmarkIdleCycle measures one cycle over 1,000 converged machines (Ready,
// named, pooled, credentials current) and reports the MaaS requests a cycle
// makes, which must not grow with the number of machines.
func BenchmarkIdleCycle(b *testing.B) {
	const machines = 1000
	s := maastest.New(b)
	cluster := newFakeCluster()
	for i := range machines {
		vm := maas.VMRef{Namespace: fmt.Sprintf("ns-%d", i%10), Name: fmt.Sprintf("vm-%d", i)}
		if i < 10 {
			s.WithPool(vm.Namespace)
		}
		m := ours(fmt.Sprintf("m%05d", i), vm, maastest.StatusReady)
		m.Hostname, m.Pool = maas.Hostname(vm), vm.Namespace
		m.PowerParameters[maas.PowerUser] = "admin"
		m.PowerParameters[maas.PowerPass] = "pw"
		s.WithMachine(m)
		cluster.withVM(vm, "pw")
	}
	r := newReconciler(b, s, cluster)
	ctx := context.Background()
	if _, err := r.Reconcile(ctx); err != nil { // warms the report cache
		b.Fatal(err)
	}
	s.ResetRequests()

	b.ResetTimer()
	for b.Loop() {
		result, err := r.Reconcile(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if result.Managed != machines || len(result.Changes) != 0 {
			b.Fatalf("cycle managed %d, changed %d", result.Managed, len(result.Changes))
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(len(s.Requests()))/float64(b.N), "requests/cycle")
	if writes(s) != 0 {
		b.Fatalf("idle cycles wrote %d times", writes(s))
	}
}
