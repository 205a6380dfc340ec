// Package kubevirttest is the KubeVirt cluster of the tests that drive VMs
// through the kubevirt backend: a real API server (envtest) with a simulated
// virt-controller, and backends started for a test's lifetime.
package kubevirttest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/kubetest"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	virtsim "github.com/virtmetal/virtmetal/sim/kubevirt"
)

// Cluster is one API server and one simulated virt-controller, shared by a
// package's tests; each test works in a namespace of its own.
type Cluster struct {
	Env *kubetest.Env
	Sim *virtsim.Simulator

	namespacePrefix string
	namespaces      atomic.Int64
	stopSim         context.CancelFunc
}

// Start starts the cluster; namespacePrefix names the namespaces that
// NewNamespace creates.
func Start(namespacePrefix string, sim virtsim.Options) (*Cluster, error) {
	ctrl.SetLogger(logr.Discard()) // the simulator's manager logs through the global logger
	env, err := kubetest.Start(kubetest.Options{})
	if err != nil {
		return nil, fmt.Errorf("envtest: %w", err)
	}
	s, err := virtsim.New(env.Config, sim)
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("virtsim: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		if err := s.Start(ctx); err != nil {
			fmt.Println("virtsim:", err)
		}
	}()
	return &Cluster{Env: env, Sim: s, namespacePrefix: namespacePrefix, stopSim: cancel}, nil
}

// Stop stops the simulator and the API server.
func (c *Cluster) Stop() error {
	c.stopSim()
	return c.Env.Stop()
}

// NewNamespace creates a fresh namespace (envtest cannot delete them).
func (c *Cluster) NewNamespace(t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", c.namespacePrefix, c.namespaces.Add(1))}}
	if err := c.Env.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}

// StartBackend runs a backend for the VM, reaching the API server with cfg,
// until the test ends, and waits for its cache. Without a logger in opts,
// it logs to the test.
func StartBackend(t testing.TB, cfg *rest.Config, namespace, name string, opts kubevirt.Options) *kubevirt.Backend {
	t.Helper()
	if opts.Logger.GetSink() == nil {
		if tt, ok := t.(*testing.T); ok {
			opts.Logger = testr.New(tt)
		}
	}
	b, err := kubevirt.New(cfg, namespace, name, opts)
	if err != nil {
		t.Fatalf("kubevirt.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := b.Start(ctx); err != nil {
			t.Errorf("Start: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	syncCtx, syncCancel := context.WithTimeout(ctx, 30*time.Second)
	defer syncCancel()
	if !b.WaitForCacheSync(syncCtx) {
		t.Fatalf("backend cache did not sync")
	}
	return b
}

// BenchmarkResets has the machine alternate On and ForceOff, each until c,
// reading from the API server, shows the VM's new runStrategy: the
// KubeVirt backend's Reset figure, on the simulator and on the real control
// plane alike.
func BenchmarkResets(b *testing.B, m machine.Machine, c client.Reader, vm client.ObjectKey) {
	ctx := context.Background()
	steps := []struct {
		reset machine.ResetType
		want  kubevirtv1.VirtualMachineRunStrategy
	}{{machine.ResetOn, kubevirtv1.RunStrategyRerunOnFailure}, {machine.ResetForceOff, kubevirtv1.RunStrategyHalted}}
	i := 0
	for b.Loop() {
		step := steps[i%2]
		i++
		if err := m.Reset(ctx, step.reset); err != nil {
			b.Fatal(err)
		}
		got := &kubevirtv1.VirtualMachine{}
		if err := c.Get(ctx, vm, got); err != nil {
			b.Fatal(err)
		}
		if got.Spec.RunStrategy == nil || *got.Spec.RunStrategy != step.want {
			b.Fatalf("after %s the API server has runStrategy %v", step.reset, got.Spec.RunStrategy)
		}
	}
}
