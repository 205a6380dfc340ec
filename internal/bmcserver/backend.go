package bmcserver

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/memory"
)

// newBackend is the one place that picks a backend. The kubevirt backend
// runs its informers until ctx ends; it contacts no API server here, so the
// process starts while the API server is down, and the backend reports
// itself not ready until its cache has synced and while the API server is
// unreachable.
func newBackend(ctx context.Context, cfg Config, log logr.Logger) (machine.Backend, error) {
	switch cfg.Backend {
	case "memory":
		return memory.New(memory.Options{Machines: cfg.Machines}), nil
	case "kubevirt":
		restCfg, err := kubeConfig()
		if err != nil {
			return nil, fmt.Errorf("kubeconfig: %w", err)
		}
		return startKubeVirt(ctx, restCfg, cfg.Namespace, cfg.VM, nil, "", log)
	}
	return nil, fmt.Errorf("unknown --backend %q (supported: memory, kubevirt)", cfg.Backend)
}

// kubevirtEventPoll is how often a VM's EventService polls a KubeVirt
// backend, in a pod of its own or in the shared server. The backend tells
// every change of its VM at once (machine.ChangeNotifier), so the poll only
// catches what falls due with time. At the default 100 ms, 2,000 idle VMs
// of a shared server took 12 % of a core, and an idle bmc-server of its own
// 0.3 % (docs/benchmarks.md). The memory backend's power transitions end
// with time, which only the poll tells: it keeps the default.
const kubevirtEventPoll = 5 * time.Second

// eventPoll is the EventService's poll for a --backend.
func eventPoll(backend string) time.Duration {
	if backend == "kubevirt" {
		return kubevirtEventPoll
	}
	return 0 // events.WatcherOptions' default
}

// startKubeVirt starts the kubevirt backend of one VM, which serves until
// ctx ends, reading from informers (nil: informers of its own, selected on
// the VM's name, so the VM's Role with resourceNames suffices). It keeps
// the VM's state in stateSecret's key named after the VM (the shared
// server's Secret of the namespace, bmcspec.SharedStateSecret) or, when
// stateSecret is empty, in the VM's own Secret, as older controllers made.
func startKubeVirt(ctx context.Context, restCfg *rest.Config, namespace, vm string, informers *kubevirt.Informers, stateSecret string, log logr.Logger) (machine.Backend, error) {
	opts := kubevirt.Options{Logger: log.WithName("kubevirt"), StateSecret: bmcspec.StateSecretName(vm), Informers: informers}
	if stateSecret != "" {
		opts.StateSecret, opts.StateEntry = stateSecret, vm
	}
	b, err := kubevirt.New(restCfg, namespace, vm, opts)
	if err != nil {
		return nil, err
	}
	go func() {
		if err := b.Start(ctx); err != nil {
			log.Error(err, "kubevirt backend stopped", "vm", vm)
		}
	}()
	return b, nil
}

// kubeConfig finds the API server as kubectl does ($KUBECONFIG, else
// ~/.kube/config), else as a pod (its ServiceAccount). Like
// controller-runtime's clients, it sends without a client-side rate limit:
// the API server's priority and fairness protects it, and a limit of a few
// requests a second would queue MaaS's power actions behind one another.
func kubeConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, err
	}
	cfg.QPS = -1
	return cfg, nil
}
