package controllers_test

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/controllers"
	"github.com/virtmetal/virtmetal/internal/benchsize"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
)

// enrolBenchVMsEnv lists the sizes (VMs) BenchmarkEnrolExistingVMs runs
// at, comma-separated; hack/test.sh's one-shot run sets a small one.
const enrolBenchVMsEnv = "VIRTMETAL_ENROL_BENCH_VMS"

// benchVMsPerNamespace: a size's VMs are spread over namespaces of this
// many, so 10,000 VMs are 100 namespaces, each with its shared bmc-server.
const benchVMsPerNamespace = 100

// enrolBenchWorkersEnv sets the reconciles in parallel per controller
// (default 8, bmc-controller's --max-concurrent-reconciles), to tell how
// the enrolment's time follows them.
const enrolBenchWorkersEnv = "VIRTMETAL_ENROL_BENCH_WORKERS"

func benchWorkers(b *testing.B) int {
	b.Helper()
	v := os.Getenv(enrolBenchWorkersEnv)
	if v == "" {
		return 8
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a number of workers", enrolBenchWorkersEnv, v)
	}
	return n
}

// idleWindow is how long the benchmark watches the controller once every
// VM is enrolled: an idle controller writes nothing and costs little CPU.
const idleWindow = 10 * time.Second

// idleProfileEnv names a directory to write a CPU profile of each idle
// window into (idle-<mode>-vms=N.pprof), which then lasts a minute, so
// that the profile has samples enough to say where an idle controller's
// CPU goes.
const idleProfileEnv = "VIRTMETAL_ENROL_BENCH_IDLE_PROFILE"

// controllerNames are the controllers Setup registers.
var controllerNames = []string{"enrolment", "virtualmachinebmc", "shared"}

// queueTimes is, per controller, its reconciles, the seconds its workers
// spent in them and the seconds its requests waited in its queue.
type queueTimes map[string][3]float64

func readQueueTimes(b *testing.B) queueTimes {
	b.Helper()
	t := queueTimes{}
	for _, c := range controllerNames {
		var v [3]float64
		for i, m := range []struct{ name, label string }{
			{"controller_runtime_reconcile_total", "controller"},
			{"workqueue_work_duration_seconds", "name"},
			{"workqueue_queue_duration_seconds", "name"},
		} {
			n, err := controllerMetric(m.name, m.label, c)
			if err != nil {
				b.Fatal(err)
			}
			v[i] = n
		}
		t[c] = v
	}
	return t
}

// since says, per controller, what it did from before to now: reconciles,
// workers busy on average over elapsed, mean wait in the queue.
func (before queueTimes) since(now queueTimes, elapsed time.Duration) string {
	var parts []string
	for _, c := range controllerNames {
		n := now[c][0] - before[c][0]
		if n == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s: %.0f reconciles, %.1f workers busy, %.2f s queued each",
			c, n, (now[c][1]-before[c][1])/elapsed.Seconds(), (now[c][2]-before[c][2])/n))
	}
	return strings.Join(parts, "; ")
}

// countingTransport counts the requests a client sends, the writes among
// them by verb and resource, and those the API server refused as
// conflicting with what it holds (409: already exists, or written
// meanwhile), which a lagging cache causes.
type countingTransport struct {
	next http.RoundTripper
	c    *requestCounts
}

type requestCounts struct {
	requests, writes, conflicts atomic.Int64
	// waited is the time spent in requests, summed over requests in
	// flight together: over the elapsed time, how many were in flight.
	waited atomic.Int64

	mu      sync.Mutex
	byWrite map[string]int // "POST secrets", "PATCH virtualmachinebmcs/status", ...
}

func (c *requestCounts) reset() {
	c.requests.Store(0)
	c.writes.Store(0)
	c.conflicts.Store(0)
	c.waited.Store(0)
	c.mu.Lock()
	c.byWrite = nil
	c.mu.Unlock()
}

// breakdown is the writes by verb and resource, most first.
func (c *requestCounts) breakdown(vms int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := slices.Collect(maps.Keys(c.byWrite))
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(c.byWrite[b], c.byWrite[a]), cmp.Compare(a, b)) })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.2f", k, float64(c.byWrite[k])/float64(vms)))
	}
	return strings.Join(parts, ", ")
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.c.requests.Add(1)
	if r.Method != http.MethodGet {
		t.c.writes.Add(1)
		t.c.mu.Lock()
		if t.c.byWrite == nil {
			t.c.byWrite = map[string]int{}
		}
		t.c.byWrite[r.Method+" "+resourceOf(r.URL.Path)]++
		t.c.mu.Unlock()
	}
	start := time.Now()
	resp, err := t.next.RoundTrip(r)
	t.c.waited.Add(int64(time.Since(start)))
	if err == nil && resp.StatusCode == http.StatusConflict {
		t.c.conflicts.Add(1)
	}
	return resp, err
}

// resourceOf is the resource (and subresource) of an API path:
// /apis/g/v/namespaces/ns/res/name/sub is "res/sub".
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if len(parts) > 0 && parts[0] == "api" {
		parts = parts[2:] // api, v1
	} else if len(parts) > 2 {
		parts = parts[3:] // apis, group, version
	}
	if len(parts) > 2 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	switch len(parts) {
	case 0:
		return path
	case 1, 2:
		return parts[0]
	default:
		return parts[0] + "/" + parts[2]
	}
}

// BenchmarkEnrolExistingVMs measures a controller installed on a cluster
// that already has vms=N VMs, spread over namespaces of 100 that only this
// run opts in: the time until every VM has a consistent set of children
// (envtest runs no pods, so "ready" means every object created as wanted),
// the API requests and writes per VM it took, the memory of this process
// (the controller, plus the test's client) at that point, and then, over
// idleWindow with nothing changing, the controller's writes and CPU. The
// shared mode runs at every size (1,000 and 10,000 VMs unless
// VIRTMETAL_ENROL_BENCH_VMS says otherwise), the pod-per-VM mode at the
// sizes up to 1,000.
func BenchmarkEnrolExistingVMs(b *testing.B) {
	stopSharedManager() // two managers would enrol the same VMs
	for _, vms := range benchsize.FromEnv(b, enrolBenchVMsEnv, 1000, 10000) {
		for _, mode := range []controllers.WorkloadMode{controllers.WorkloadPodPerVM, controllers.WorkloadShared} {
			if mode == controllers.WorkloadPodPerVM && vms > 1000 {
				continue
			}
			b.Run(fmt.Sprintf("%s/vms=%d", mode, vms), func(b *testing.B) { benchmarkEnrolment(b, mode, vms) })
		}
	}
}

func benchmarkEnrolment(b *testing.B, mode controllers.WorkloadMode, vms int) {
	ctx := context.Background()
	for i := range b.N {
		b.StopTimer()
		run := fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), i)
		// Opted in alone: the namespaces of earlier runs keep their VMs.
		optIn := map[string]string{"virtmetal.io/bench": run}
		var namespaces []string
		for n := 0; n*benchVMsPerNamespace < vms; n++ {
			ns := fmt.Sprintf("%s-%d", run, n)
			if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metaWithLabels(ns, optIn)}); err != nil {
				b.Fatal(err)
			}
			namespaces = append(namespaces, ns)
		}
		createVMs(b, namespaces, vms)
		var counts requestCounts
		cfg := rest.CopyConfig(controllerConfig)
		cfg.QPS, cfg.Burst = 1000, 2000 // as bmc-controller's --kube-api-qps/--kube-api-burst defaults
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt, &counts} })
		config := defaultConfig()
		config.NamespaceSelector = labels.SelectorFromSet(optIn)
		config.Workload = mode
		reconcilesBefore := reconciles(b, "")
		queuesBefore := readQueueTimes(b)
		b.StartTimer()
		start := time.Now()
		stop, err := startManager(cfg, config, benchWorkers(b))
		if err != nil {
			b.Fatal(err)
		}
		waitConsistent(b, namespaces, vms, mode == controllers.WorkloadShared)
		elapsed := time.Since(start)
		b.StopTimer()
		runtime.GC()
		var mem runtime.MemStats
		runtime.ReadMemStats(&mem)
		b.ReportMetric(elapsed.Seconds(), "s-until-consistent")
		b.ReportMetric(float64(counts.requests.Load())/float64(vms), "requests/VM")
		b.ReportMetric(float64(counts.writes.Load())/float64(vms), "writes/VM")
		b.ReportMetric(float64(counts.conflicts.Load())/float64(vms), "conflicts/VM")
		b.ReportMetric(float64(reconciles(b, "")-reconcilesBefore)/float64(vms), "reconciles/VM")
		b.ReportMetric(float64(mem.HeapInuse)/(1<<20), "heap-MB")
		b.ReportMetric(rssMB(), "rss-MB")
		b.Logf("writes per VM: %s", counts.breakdown(vms))
		b.Logf("requests in flight on average %.1f, %.0f ms each; %s",
			float64(counts.waited.Load())/float64(elapsed), float64(counts.waited.Load())/float64(counts.requests.Load())/1e6,
			queuesBefore.since(readQueueTimes(b), elapsed))

		// Idle: the reconciles the enrolment's last events queued are
		// still to run (at 10,000 VMs, minutes of them): the controller is
		// idle once its queues are empty and stay so.
		reconcilesBefore = reconciles(b, "")
		b.ReportMetric(waitSettled(b).Seconds(), "s-until-settled")
		b.ReportMetric(float64(reconciles(b, "")-reconcilesBefore)/float64(vms), "settling-reconciles/VM")
		b.Logf("writes per VM until settled: %s", counts.breakdown(vms))
		counts.reset()
		window, stopProfile := idleProfile(b, mode, vms)
		cpuBefore := cpuTime(b)
		idleStart := time.Now()
		time.Sleep(window)
		cpu := cpuTime(b) - cpuBefore
		stopProfile()
		b.ReportMetric(float64(counts.writes.Load()), "idle-writes")
		b.ReportMetric(float64(counts.requests.Load()), "idle-requests")
		b.ReportMetric(100*cpu.Seconds()/time.Since(idleStart).Seconds(), "idle-CPU-%")
		if n := counts.writes.Load(); n > 0 {
			b.Errorf("the idle controller wrote %d times in %s: %s", n, window, counts.breakdown(1))
		}
		stop()
		for _, ns := range namespaces {
			clearNamespace(b, ns)
		}
		b.StartTimer()
	}
}

// waitSettled waits until no controller has a request queued or a worker
// busy, twice in a row a second apart (a batch delay is a second), and
// says how long that took.
func waitSettled(b *testing.B) time.Duration {
	b.Helper()
	start := time.Now()
	for quiet := 0; quiet < 2; time.Sleep(time.Second) {
		busy := 0.0
		for _, c := range controllerNames {
			queued, err := controllerMetric("workqueue_depth", "name", c)
			if err != nil {
				b.Fatal(err)
			}
			running, err := controllerMetric("controller_runtime_active_workers", "controller", c)
			if err != nil {
				b.Fatal(err)
			}
			busy += queued + running
		}
		if busy > 0 {
			quiet = 0
		} else {
			quiet++
		}
	}
	return time.Since(start)
}

// idleProfile starts the idle window's CPU profile when idleProfileEnv
// asks for one, and says how long the window is.
func idleProfile(b *testing.B, mode controllers.WorkloadMode, vms int) (time.Duration, func()) {
	b.Helper()
	dir := os.Getenv(idleProfileEnv)
	if dir == "" {
		return idleWindow, func() {}
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("idle-%s-vms=%d.pprof", mode, vms)))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return time.Minute, func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Error(err)
		}
	}
}

// cpuTime is the CPU this process has used, user and system.
func cpuTime(b *testing.B) time.Duration {
	b.Helper()
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		b.Fatal(err)
	}
	return time.Duration(usage.Utime.Nano() + usage.Stime.Nano())
}

// clearNamespace deletes what a run made and enrolled in ns: envtest has no
// garbage collector, and the next run's controller reconciles every
// VirtualMachineBMC of the cluster (the next mode would convert these) and
// caches every managed object.
func clearNamespace(b *testing.B, ns string) {
	b.Helper()
	ctx := context.Background()
	for _, obj := range []client.Object{
		&kubevirtv1.VirtualMachine{}, &v1beta1.VirtualMachineBMC{}, &corev1.Secret{}, &corev1.ServiceAccount{},
		&rbacv1.Role{}, &rbacv1.RoleBinding{}, &appsv1.Deployment{}, &networkingv1.Ingress{},
	} {
		if err := admin.DeleteAllOf(ctx, obj, client.InNamespace(ns)); err != nil {
			b.Fatal(err)
		}
	}
	// Services have no delete-collection.
	var services corev1.ServiceList
	if err := admin.List(ctx, &services, client.InNamespace(ns)); err != nil {
		b.Fatal(err)
	}
	for i := range services.Items {
		if err := admin.Delete(ctx, &services.Items[i]); client.IgnoreNotFound(err) != nil {
			b.Fatal(err)
		}
	}
}

func metaWithLabels(name string, l map[string]string) (m metav1.ObjectMeta) {
	m.Name, m.Labels = name, l
	return m
}

// createVMs creates vms VMs, benchVMsPerNamespace in each namespace.
func createVMs(b *testing.B, namespaces []string, vms int) {
	b.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, vms)
	next := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				ns := namespaces[i/benchVMsPerNamespace]
				if err := admin.Create(ctx, newVM(ns, fmt.Sprintf("vm-%05d", i))); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range vms {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// waitConsistent waits until the vms VMs of namespaces each have every
// child (in the shared mode: a VirtualMachineBMC each, and in each
// namespace the shared objects serving all of its VMs, their credentials
// and Ingress rules among them) and
// their SMBIOS serial. It lists across the cluster, metadata only where it
// can, every second, so that the watching costs the API server little
// beside the controller it measures.
func waitConsistent(b *testing.B, namespaces []string, vms int, shared bool) {
	b.Helper()
	ctx := context.Background()
	ours := map[string]bool{}
	for _, ns := range namespaces {
		ours[ns] = true
	}
	kinds := []schema.GroupVersionKind{v1beta1.GroupVersion.WithKind("VirtualMachineBMCList")}
	if !shared {
		kinds = append(kinds,
			corev1.SchemeGroupVersion.WithKind("SecretList"),
			networkingv1.SchemeGroupVersion.WithKind("IngressList"),
			corev1.SchemeGroupVersion.WithKind("ServiceAccountList"),
			rbacv1.SchemeGroupVersion.WithKind("RoleList"),
			rbacv1.SchemeGroupVersion.WithKind("RoleBindingList"),
			appsv1.SchemeGroupVersion.WithKind("DeploymentList"),
			corev1.SchemeGroupVersion.WithKind("ServiceList"))
	}
	timeout := 5*time.Minute + time.Duration(vms)*100*time.Millisecond
	deadline := time.Now().Add(timeout)
	for {
		missing := ""
		for _, kind := range kinds {
			list := &metav1.PartialObjectMetadataList{}
			list.SetGroupVersionKind(kind)
			// Per VM: the shared objects do not count.
			if err := admin.List(ctx, list, client.MatchingLabels{v1beta1.LabelManagedBy: v1beta1.ManagedByValue}, client.HasLabels{v1beta1.LabelVM}); err != nil {
				missing = overloaded(b, err)
				break
			}
			if n := countIn(ours, list.Items, func(o metav1.PartialObjectMetadata) string { return o.Namespace }); n < vms {
				missing = fmt.Sprintf("%s has %d of %d", kind.Kind, n, vms)
				break
			}
		}
		if missing == "" && shared {
			missing = sharedServesAll(ctx, b, ours, vms)
		}
		if missing == "" {
			var list kubevirtv1.VirtualMachineList
			if err := admin.List(ctx, &list); err != nil {
				missing = overloaded(b, err)
				time.Sleep(time.Second)
				continue
			}
			stamped := 0
			for _, vm := range list.Items {
				if fw := vm.Spec.Template.Spec.Domain.Firmware; ours[vm.Namespace] && fw != nil && fw.Serial == vm.Name+"."+vm.Namespace {
					stamped++
				}
			}
			if stamped == vms {
				return
			}
			missing = fmt.Sprintf("%d of %d VMs stamped", stamped, vms)
		}
		if time.Now().After(deadline) {
			b.Fatalf("not consistent after %s: %s", timeout, missing)
		}
		time.Sleep(time.Second)
	}
}

// countIn counts the items in one of the namespaces.
func countIn[T any](namespaces map[string]bool, items []T, namespace func(T) string) int {
	n := 0
	for _, item := range items {
		if namespaces[namespace(item)] {
			n++
		}
	}
	return n
}

// sharedServesAll says what of the namespaces' shared bmc-servers is
// missing, or serves fewer than vms VMs in all, or "".
func sharedServesAll(ctx context.Context, b *testing.B, namespaces map[string]bool, vms int) string {
	shared := client.MatchingLabels{v1beta1.LabelShared: "true"}
	for _, kind := range []schema.GroupVersionKind{
		rbacv1.SchemeGroupVersion.WithKind("RoleBindingList"),
		corev1.SchemeGroupVersion.WithKind("ServiceAccountList"),
		appsv1.SchemeGroupVersion.WithKind("DeploymentList"),
		corev1.SchemeGroupVersion.WithKind("ServiceList"),
	} {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(kind)
		if err := admin.List(ctx, list, shared); err != nil {
			return overloaded(b, err)
		}
		if n := countIn(namespaces, list.Items, func(o metav1.PartialObjectMetadata) string { return o.Namespace }); n < len(namespaces) {
			return fmt.Sprintf("%d of %d namespaces have a shared %s", n, len(namespaces), strings.TrimSuffix(kind.Kind, "List"))
		}
	}
	var secrets corev1.SecretList
	if err := admin.List(ctx, &secrets, shared); err != nil {
		return overloaded(b, err)
	}
	var roles rbacv1.RoleList
	if err := admin.List(ctx, &roles, shared); err != nil {
		return overloaded(b, err)
	}
	inSecrets, inRoles, stateSecrets := 0, 0, 0
	for _, s := range secrets.Items {
		switch {
		case !namespaces[s.Namespace]:
		case s.Name == sharedName:
			inSecrets += len(s.Data)
		case s.Name == bmcspec.SharedStateSecret:
			stateSecrets++
		}
	}
	if stateSecrets < len(namespaces) {
		return fmt.Sprintf("%d of %d namespaces have a state Secret", stateSecrets, len(namespaces))
	}
	for _, r := range roles.Items {
		if namespaces[r.Namespace] && r.Name == sharedName {
			inRoles += len(r.Rules[0].ResourceNames)
		}
	}
	if inSecrets < vms {
		return fmt.Sprintf("shared Secrets hold %d of %d VMs", inSecrets, vms)
	}
	if inRoles < vms {
		return fmt.Sprintf("shared Roles name %d of %d VMs", inRoles, vms)
	}
	// A VM's host is a rule of an Ingress of its own or, since the shared
	// Ingress, of its namespace's: count the rules either way, so that the
	// benchmark runs on both versions.
	var ingresses networkingv1.IngressList
	if err := admin.List(ctx, &ingresses, client.MatchingLabels{v1beta1.LabelManagedBy: v1beta1.ManagedByValue}); err != nil {
		return overloaded(b, err)
	}
	routed := 0
	for _, in := range ingresses.Items {
		if namespaces[in.Namespace] {
			routed += len(in.Spec.Rules)
		}
	}
	if routed < vms {
		return fmt.Sprintf("Ingresses route %d of %d VMs", routed, vms)
	}
	return ""
}

// overloaded returns a list's failure as what is missing when the API
// server only ran out of time or capacity for it (a loaded machine at
// 10,000 VMs), so that the poll tries again; any other failure ends the
// benchmark.
func overloaded(b *testing.B, err error) string {
	b.Helper()
	if !apierrors.IsTimeout(err) && !apierrors.IsServerTimeout(err) && !apierrors.IsTooManyRequests(err) {
		b.Fatal(err)
	}
	return "a list failed: " + err.Error()
}

// rssMB is this process's resident set size.
func rssMB() float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}
