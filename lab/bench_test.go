package lab_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtmetal/virtmetal/internal/benchsize"
	"github.com/virtmetal/virtmetal/lab"
	"github.com/virtmetal/virtmetal/maas"
)

// BenchmarkKubeVirtPowerCycles is CreateToReady's reference: KubeVirt's
// control plane alone taking VMs created at once, each in its own
// namespace, through the power changes the MaaS flow makes of each: on at
// creation, then off, on and off, each waited for as MaaS's driver waits
// (Running, or the instance gone). The namespaces are not opted in and the
// VMs boot from their disk, so neither virtmetal nor MaaS sees them: what
// this takes on this machine, the flow cannot beat. Reported as
// CreateToReady is.
func BenchmarkKubeVirtPowerCycles(b *testing.B) {
	benchFleet(b, "alone", "s-all-done", powerCycles)
}

// BenchmarkCreateToReady creates VMs at once, each in its own namespace,
// and waits until all are Ready in MaaS: one VM, the flow's own latency,
// and 50, the flow under load; KubeVirtPowerCycles of the same size is
// what KubeVirt alone takes for the power changes it contains. Reported:
// the time until the last is Ready, and the median and slowest VM's time
// from its creation to Ready.
func BenchmarkCreateToReady(b *testing.B) {
	benchFleet(b, "bench", "s-all-ready", createToReady)
}

// benchFleet runs the sizes VIRTMETAL_LAB_BENCH_VMS lists (default 1,50)
// as sub-benchmarks vms=N, each iteration a fleet through run in
// namespaces named after prefix, and reports the time until the last VM
// was done (as allUnit) and the median and slowest VM's.
func benchFleet(b *testing.B, prefix, allUnit string, run func(b *testing.B, prefix string, n int) (all, median, slowest time.Duration)) {
	for _, n := range benchsize.FromEnv(b, "VIRTMETAL_LAB_BENCH_VMS", 1, 50) {
		b.Run(fmt.Sprintf("vms=%d", n), func(b *testing.B) {
			var all, median, slowest time.Duration
			for i := range b.N {
				a, m, s := run(b, fmt.Sprintf("%s%d-%d", prefix, n, i), n)
				all, median, slowest = all+a, median+m, slowest+s
			}
			b.ReportMetric(all.Seconds()/float64(b.N), allUnit)
			b.ReportMetric(median.Seconds()/float64(b.N), "s-median-vm")
			b.ReportMetric(slowest.Seconds()/float64(b.N), "s-slowest-vm")
		})
	}
}

// fleet names n VMs web1, each in a namespace of its own named after
// prefix, which createNamespace makes.
func fleet(ctx context.Context, b *testing.B, prefix string, n int, createNamespace func(context.Context, string) error) []maas.VMRef {
	vms := make([]maas.VMRef, n)
	for i := range vms {
		vms[i] = maas.VMRef{Namespace: fmt.Sprintf("%s-%d", prefix, i), Name: "web1"}
		if err := createNamespace(ctx, vms[i].Namespace); err != nil {
			b.Fatal(err)
		}
	}
	return vms
}

func powerCycles(b *testing.B, prefix string, n int) (all, median, slowest time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	l := theLab
	vms := fleet(ctx, b, prefix, n, func(ctx context.Context, name string) error {
		return l.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	})
	times := make([]time.Duration, n)
	errs := make(chan error, n)
	start := time.Now()
	var wg sync.WaitGroup
	for i, vm := range vms {
		wg.Go(func() {
			steps := []func() error{
				func() error { return l.CreateVM(ctx, vm, lab.VMOptions{DiskBoot: true}) },
				func() error { return l.WaitVMI(ctx, vm, true) },
				func() error { return l.StopVM(ctx, vm) },
				func() error { return l.WaitVMI(ctx, vm, false) },
				func() error { return l.StartVM(ctx, vm) },
				func() error { return l.WaitVMI(ctx, vm, true) },
				func() error { return l.StopVM(ctx, vm) },
				func() error { return l.WaitVMI(ctx, vm, false) },
			}
			for step, do := range steps {
				if err := do(); err != nil {
					errs <- fmt.Errorf("%s, step %d: %w", vm, step, err)
					return
				}
			}
			times[i] = time.Since(start)
		})
	}
	wg.Wait()
	all = time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	slices.Sort(times)
	return all, times[n/2], times[n-1]
}

func createToReady(b *testing.B, prefix string, n int) (all, median, slowest time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	l := theLab
	vms := fleet(ctx, b, prefix, n, l.CreateNamespace)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, vm := range vms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.CreateVM(ctx, vm, lab.VMOptions{}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	if err := l.WaitReady(ctx, vms...); err != nil {
		b.Fatalf("not all %d Ready: %v", n, err)
	}
	all = time.Since(start)
	times := make([]time.Duration, n)
	for i, vm := range vms {
		times[i], _ = l.TimeToReady(vm)
	}
	slowestVM := vms[0]
	for i, vm := range vms {
		if times[i] > times[slices.Index(vms, slowestVM)] {
			slowestVM = vm
		}
	}
	for _, e := range l.Timeline(slowestVM) {
		b.Logf("slowest VM %s: %-15s at +%v", slowestVM, e.Step, e.At.Sub(start).Round(time.Millisecond))
	}
	slices.Sort(times)
	return all, times[n/2], times[n-1]
}
