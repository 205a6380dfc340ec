package maas_test

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/virtmetal/virtmetal/internal/benchsize"
	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

// idleBenchMachinesEnv lists the fleet sizes of BenchmarkIdleCycle,
// comma-separated, smallest first; hack/test.sh's one-shot run sets small
// ones.
const idleBenchMachinesEnv = "VIRTMETAL_IDLE_BENCH_MACHINES"

// BenchmarkIdleCycle measures one reconciler cycle over converged machines
// (Ready, named, pooled, credentials current, status reported) against a
// real API server and the MaaS simulator, counts the requests a cycle
// sends to each, and samples the heap while it runs. It grows the fleet
// through the sizes (1,000 and 10,000 machines unless
// VIRTMETAL_IDLE_BENCH_MACHINES says otherwise) in one run, so they compare
// side by side: the request counts must not grow.
//
//   - loop: one Reconciler and one client for every cycle, as the
//     Deployment runs;
//   - once: new clients every cycle, as a --once CronJob run pays.
func BenchmarkIdleCycle(b *testing.B) {
	s := maassim.New(b)
	fleet := 0
	for _, size := range benchsize.FromEnv(b, idleBenchMachinesEnv, 1000, 10000) {
		grow(b, s, fleet, size)
		fleet = size
		b.Run(fmt.Sprintf("loop/machines=%d", size), func(b *testing.B) {
			var counter requestCounter
			r := newReconciler(b, s, kubeCluster(b, counter.config(env.Config)))
			benchmarkCycles(b, s, &counter, size, func() *maas.Reconciler { return r })
		})
		b.Run(fmt.Sprintf("once/machines=%d", size), func(b *testing.B) {
			var counter requestCounter
			benchmarkCycles(b, s, &counter, size, func() *maas.Reconciler {
				return newReconciler(b, s, kubeCluster(b, counter.config(env.Config)))
			})
		})
	}
}

func benchmarkCycles(b *testing.B, s *maassim.Server, counter *requestCounter, machines int, reconciler func() *maas.Reconciler) {
	ctx := context.Background()
	s.ResetRequests()
	counter.take()
	// The heap before the cycles (the simulator's machines, the test's
	// clients): what a cycle adds to it is the reconciler's.
	runtime.GC()
	base := heapBytes()
	stopSampling, peak := sampleHeap()
	for b.Loop() {
		result, err := reconciler().Reconcile(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if result.Bound != machines || len(result.Changes) != 0 || len(result.Failures) != 0 {
			b.Fatalf("idle cycle bound %d of %d, changed %v, failures %v", result.Bound, machines, result.Changes, result.Failures)
		}
	}
	b.StopTimer()
	stopSampling()
	maasRequests := float64(len(s.Requests())) / float64(b.N)
	kubeRequests := float64(len(counter.take())) / float64(b.N)
	b.ReportMetric(maasRequests, "maas-requests/cycle")
	b.ReportMetric(kubeRequests, "kube-requests/cycle")
	b.ReportMetric(float64(b.Elapsed().Seconds())/float64(b.N), "s/cycle")
	b.ReportMetric((float64(*peak)-float64(base))/(1<<20), "cycle-peak-heap-MB")
	if maasRequests > 3 || kubeRequests > 3 {
		b.Fatalf("an idle cycle costs %.1f MaaS and %.1f Kubernetes requests, want at most 3 each", maasRequests, kubeRequests)
	}
}

// heapBytes is the heap's live and not yet swept objects now.
func heapBytes() uint64 {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(sample)
	return sample[0].Value.Uint64()
}

// sampleHeap records the largest heapBytes, every millisecond, until stop
// is called; peak is final once stop has returned.
func sampleHeap() (stop func(), peak *uint64) {
	peak = new(uint64)
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			*peak = max(*peak, heapBytes())
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() { close(done); <-stopped }, peak
}

// grow enrolls VMs from up to size, gives each its converged machine in
// MaaS, and runs the cycle that reports them.
func grow(b *testing.B, s *maassim.Server, from, size int) {
	b.Helper()
	const perNamespace = 100
	var wg sync.WaitGroup
	work := make(chan maas.VMRef)
	for range 8 {
		wg.Go(func() {
			for vm := range work {
				enrollment{vm: vm, password: "pw"}.create(b, env.Client)
			}
		})
	}
	var ns string
	for i := from; i < size; i++ {
		if i%perNamespace == 0 || ns == "" { // a size not a multiple of 100 starts one too
			ns = newNamespace(b)
			s.WithPool(ns)
		}
		vm := maas.VMRef{Namespace: ns, Name: fmt.Sprintf("vm-%d", i)}
		m := ours(fmt.Sprintf("bench%05d", i), vm, maassim.StatusReady)
		m.Hostname, m.Pool = maas.Hostname(vm), vm.Namespace
		m.PowerParameters[maas.PowerUser] = "admin"
		m.PowerParameters[maas.PowerPass] = "pw"
		s.WithMachine(m)
		work <- vm
	}
	close(work)
	wg.Wait()
	r := &maas.Reconciler{MaaS: s.Client(b), Cluster: kubeCluster(b, env.Config), Domain: testDomain, Out: io.Discard, Log: logr.Discard()}
	if _, err := r.Reconcile(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkNewMachinesCycle is the cycle that takes 50 new machines to
// commissioning (credentials, hostname and pool, commission: three writes
// each) against a MaaS region 20 ms away, with the machines one at a time
// (concurrency=1, the reconciler before it worked on machines at once) and
// DefaultConcurrency at once, side by side. The Kubernetes side is the fake
// cluster: this measures what MaaS's round trips cost.
func BenchmarkNewMachinesCycle(b *testing.B) {
	const machines = 50
	for _, concurrency := range []int{1, maas.DefaultConcurrency} {
		b.Run(fmt.Sprintf("machines=%d/concurrency=%d", machines, concurrency), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				s := maassim.New(b).WithLatency(20 * time.Millisecond)
				cluster := newFakeCluster()
				for i := range machines {
					vm := maas.VMRef{Namespace: fmt.Sprintf("tenant-%d", i%5), Name: fmt.Sprintf("web%d", i)}
					s.WithMachine(ours(fmt.Sprintf("m%d", i), vm, maassim.StatusNew))
					cluster.withVM(vm, "s3cret-"+vm.Name) // one password per BMC, as enrolment makes them
				}
				r := newReconciler(b, s, cluster)
				r.Concurrency = concurrency
				b.StartTimer()
				result, err := r.Reconcile(context.Background())
				b.StopTimer()
				if err != nil || len(result.Failures) != 0 {
					b.Fatalf("cycle: %v, failures %v", err, result.Failures)
				}
				for i := range machines {
					if m, _ := s.Machine(fmt.Sprintf("m%d", i)); m.Status != maassim.StatusCommissioning {
						b.Fatalf("m%d is %d after the cycle, want commissioning", i, m.Status)
					}
				}
				s.Close()
				b.StartTimer()
			}
		})
	}
}
