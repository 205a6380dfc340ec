// Package kubevirttest is the KubeVirt cluster of the tests that drive VMs
// through the kubevirt backend, and backends started for a test's
// lifetime. A package's tests share one cluster: KubeVirt's real control
// plane (StartReal: internal/kubetest/realkubevirt with its node
// stand-in); faults of virt-api come from sim/kubevirt's proxy in front of
// it (NewVirtAPI).
package kubevirttest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/kubetest/realkubevirt"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	virtsim "github.com/virtmetal/virtmetal/sim/kubevirt"
)

// Cluster is one cluster shared by a package's tests; each test works in a
// namespace of its own.
type Cluster struct {
	// Config and Client act as a cluster admin.
	Config *rest.Config
	Client client.Client

	// Real and Node are the real control plane and its node stand-in.
	Real *realkubevirt.Cluster
	Node *realkubevirt.Node

	namespacePrefix string
	namespaces      atomic.Int64
}

// StartReal starts KubeVirt's real control plane with one node stand-in.
// It needs root (realkubevirt's network namespace) and fails without it:
// it never falls back to the simulator.
func StartReal(ctx context.Context, namespacePrefix string, opts realkubevirt.Options) (*Cluster, error) {
	ctrl.SetLogger(logr.Discard())
	real, err := realkubevirt.Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	node, err := real.StartNode(ctx, "node01", realkubevirt.NodeOptions{})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("node stand-in: %w", err), real.Stop())
	}
	return &Cluster{Config: real.Config, Client: real.Client, Real: real, Node: node, namespacePrefix: namespacePrefix}, nil
}

// Stop stops everything StartReal started.
func (c *Cluster) Stop() error { return c.Real.Stop() }

// NewNamespace creates a fresh namespace (the cluster never deletes them).
func (c *Cluster) NewNamespace(t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", c.namespacePrefix, c.namespaces.Add(1))}}
	if err := c.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}

// UpdateVMIStatus changes the status of the VM's VMI as virt-handler
// would, writing as the node's virt-handler: virt-api reverts status
// written by anyone else.
func (c *Cluster) UpdateVMIStatus(ctx context.Context, namespace, name string, change func(*kubevirtv1.VirtualMachineInstanceStatus)) error {
	writer, err := client.New(c.Node.HandlerConfig, client.Options{Scheme: c.Client.Scheme()})
	if err != nil {
		return err
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		vmi := &kubevirtv1.VirtualMachineInstance{}
		// virt-handler may list and watch VMIs but not get one.
		if err := c.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, vmi); err != nil {
			return err
		}
		change(&vmi.Status)
		return writer.Update(ctx, vmi)
	})
}

// ConfigFor authenticates as the user, in the groups, and nothing more.
func (c *Cluster) ConfigFor(user string, groups ...string) (*rest.Config, error) {
	return c.Real.ConfigFor(user, groups...)
}

// Boots returns the device each guest of the VM booted from so far (one
// per VMI that reached Running, and one per guest reboot), oldest first.
func (c *Cluster) Boots(namespace, name string) []machine.BootTarget {
	return c.Node.BootTargets(namespace, name)
}

// ShutdownGuest acts as the guest of the VM's running VMI powering itself
// off.
func (c *Cluster) ShutdownGuest(ctx context.Context, namespace, name string) error {
	c.Node.ShutdownGuest(namespace, name)
	return nil
}

// HoldStartAnnotation is the annotation that, on a VM, keeps its VMI from
// running (the VM caught Starting) until it is removed.
func (c *Cluster) HoldStartAnnotation() string { return realkubevirt.HoldStartAnnotation }

// NewVirtAPI puts a proxy between a client and the cluster that records
// the requests and can be told to fail virt-api's subresource calls
// (VirtAPI.Answer). It closes when the test ends; clients use its Config.
func (c *Cluster) NewVirtAPI(t testing.TB) *virtsim.VirtAPI {
	t.Helper()
	api, err := virtsim.NewFaultProxy(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(api.Close)
	return api
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
// KubeVirt backend's Reset figure.
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
