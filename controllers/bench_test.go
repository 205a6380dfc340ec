package controllers_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/controllers"
)

// benchVMs is 1,000 unless VIRTMETAL_BENCH_VMS says otherwise.
var benchVMs = func() int {
	if n, err := strconv.Atoi(os.Getenv("VIRTMETAL_BENCH_VMS")); err == nil && n > 0 {
		return n
	}
	return 1000
}()

// countingTransport counts the requests a client sends, and those the API
// server refused as conflicting with what it holds (409: already exists,
// or written meanwhile), which a lagging cache causes.
type countingTransport struct {
	next            http.RoundTripper
	count, conflict *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.count.Add(1)
	resp, err := c.next.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusConflict {
		c.conflict.Add(1)
	}
	return resp, err
}

// BenchmarkEnrolExistingVMs measures a controller installed on a cluster
// that already has 1,000 VMs in an opted-in namespace, in each workload
// mode: the time until every VM has a consistent set of children (envtest
// runs no pods, so "ready" means every object created as wanted), the API
// requests per VM it took, and the memory of this process (the controller,
// plus the test's client) at that point.
func BenchmarkEnrolExistingVMs(b *testing.B) {
	stopSharedManager() // two managers would enrol the same VMs
	for _, mode := range []controllers.WorkloadMode{controllers.WorkloadPodPerVM, controllers.WorkloadShared} {
		b.Run(string(mode), func(b *testing.B) { benchmarkEnrolment(b, mode) })
	}
}

func benchmarkEnrolment(b *testing.B, mode controllers.WorkloadMode) {
	ctx := context.Background()
	for i := range b.N {
		b.StopTimer()
		ns := fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), i)
		// Opted in alone: the namespaces of earlier runs keep their VMs.
		optIn := map[string]string{"virtmetal.io/bench": ns}
		if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metaWithLabels(ns, optIn)}); err != nil {
			b.Fatal(err)
		}
		createVMs(b, ns, benchVMs)
		var requests, conflicts atomic.Int64
		cfg := rest.CopyConfig(controllerConfig)
		cfg.QPS, cfg.Burst = 1000, 2000 // as bmc-controller's --kube-api-qps/--kube-api-burst defaults
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt, &requests, &conflicts} })
		config := defaultConfig()
		config.NamespaceSelector = labels.SelectorFromSet(optIn)
		config.Workload = mode
		reconcilesBefore := reconciles(b, "")
		b.StartTimer()
		start := time.Now()
		stop, err := startManager(cfg, config, 8)
		if err != nil {
			b.Fatal(err)
		}
		waitConsistent(b, ns, benchVMs, mode == controllers.WorkloadShared)
		elapsed := time.Since(start)
		b.StopTimer()
		runtime.GC()
		var mem runtime.MemStats
		runtime.ReadMemStats(&mem)
		b.ReportMetric(elapsed.Seconds(), "s-until-consistent")
		b.ReportMetric(float64(requests.Load())/float64(benchVMs), "requests/VM")
		b.ReportMetric(float64(conflicts.Load())/float64(benchVMs), "conflicts/VM")
		b.ReportMetric(float64(reconciles(b, "")-reconcilesBefore)/float64(benchVMs), "reconciles/VM")
		b.ReportMetric(float64(mem.HeapInuse)/(1<<20), "heap-MB")
		b.ReportMetric(rssMB(), "rss-MB")
		stop()
		clearNamespace(b, ns)
		b.StartTimer()
	}
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

func createVMs(b *testing.B, ns string, n int) {
	b.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				if err := admin.Create(ctx, newVM(ns, fmt.Sprintf("vm-%04d", i))); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// waitConsistent waits until n VMs of ns each have every child (in the
// shared mode: a VirtualMachineBMC, Secret and Ingress each, and the shared
// Secret and Role serving all of them). It polls metadata only, once a
// second, so that the watching costs the API server little beside the
// controller it measures.
func waitConsistent(b *testing.B, ns string, n int, shared bool) {
	b.Helper()
	ctx := context.Background()
	kinds := []schema.GroupVersionKind{
		v1beta1.GroupVersion.WithKind("VirtualMachineBMCList"),
		corev1.SchemeGroupVersion.WithKind("SecretList"),
		networkingv1.SchemeGroupVersion.WithKind("IngressList"),
	}
	if !shared {
		kinds = append(kinds,
			corev1.SchemeGroupVersion.WithKind("ServiceAccountList"),
			rbacv1.SchemeGroupVersion.WithKind("RoleList"),
			rbacv1.SchemeGroupVersion.WithKind("RoleBindingList"),
			appsv1.SchemeGroupVersion.WithKind("DeploymentList"),
			corev1.SchemeGroupVersion.WithKind("ServiceList"))
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		missing := ""
		for _, kind := range kinds {
			list := &metav1.PartialObjectMetadataList{}
			list.SetGroupVersionKind(kind)
			// Per VM: the shared objects do not count.
			if err := admin.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{v1beta1.LabelManagedBy: v1beta1.ManagedByValue}, client.HasLabels{v1beta1.LabelVM}); err != nil {
				b.Fatal(err)
			}
			if len(list.Items) < n {
				missing = fmt.Sprintf("%s has %d of %d", kind.Kind, len(list.Items), n)
				break
			}
		}
		if missing == "" && shared {
			missing = sharedServesAll(ctx, b, ns, n)
		}
		if missing == "" {
			var vms kubevirtv1.VirtualMachineList
			if err := admin.List(ctx, &vms, client.InNamespace(ns)); err != nil {
				b.Fatal(err)
			}
			stamped := 0
			for _, vm := range vms.Items {
				if fw := vm.Spec.Template.Spec.Domain.Firmware; fw != nil && fw.Serial == vm.Name+"."+ns {
					stamped++
				}
			}
			if stamped == n {
				return
			}
			missing = fmt.Sprintf("%d of %d VMs stamped", stamped, n)
		}
		if time.Now().After(deadline) {
			b.Fatalf("not consistent after 5 minutes: %s", missing)
		}
		time.Sleep(time.Second)
	}
}

// sharedServesAll says what of ns's shared bmc-server is missing, or lacks
// of n VMs, or "".
func sharedServesAll(ctx context.Context, b *testing.B, ns string, n int) string {
	secret := &corev1.Secret{}
	role := &rbacv1.Role{}
	for _, obj := range []client.Object{secret, role, &rbacv1.RoleBinding{}, &corev1.ServiceAccount{}, &appsv1.Deployment{}, &corev1.Service{}} {
		if err := admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: sharedName}, obj); err != nil {
			if apierrors.IsNotFound(err) {
				return fmt.Sprintf("no shared %T", obj)
			}
			b.Fatal(err)
		}
	}
	if len(secret.Data) < n {
		return fmt.Sprintf("shared Secret has %d of %d VMs", len(secret.Data), n)
	}
	if len(role.Rules[0].ResourceNames) < n {
		return fmt.Sprintf("shared Role names %d of %d VMs", len(role.Rules[0].ResourceNames), n)
	}
	return ""
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
