package kubevirt_test

import (
	"context"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
)

func benchMachine(b *testing.B) (machine.Machine, string) { return benchMachineVia(b, cluster.Config) }

// benchMachineVia runs the machine's backend with cfg.
func benchMachineVia(b *testing.B, cfg *rest.Config) (machine.Machine, string) {
	ns := cluster.NewNamespace(b)
	newVM(b, ns, "vm", nil)
	backend := kubevirttest.StartBackend(b, cfg, ns, "vm", kubevirt.Options{Logger: logr.Discard()})
	m, err := backend.Machine(context.Background(), "vm")
	if err != nil {
		b.Fatal(err)
	}
	return m, ns
}

// BenchmarkPowerState reads power from the informer cache.
func BenchmarkPowerState(b *testing.B) {
	m, _ := benchMachine(b)
	ctx := context.Background()
	for b.Loop() {
		if _, err := m.PowerState(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkInventory reads the inventory from the informer cache.
func BenchmarkInventory(b *testing.B) {
	m, _ := benchMachine(b)
	ctx := context.Background()
	for b.Loop() {
		if _, err := m.Inventory(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReset alternates On and ForceOff and measures until the API
// server's VM carries the new runStrategy, with virt-api's stand-in serving
// ForceOff's stop.
func BenchmarkReset(b *testing.B) {
	m, ns := benchMachineVia(b, cluster.NewVirtAPI(b).Config())
	kubevirttest.BenchmarkResets(b, m, cluster.Client, client.ObjectKey{Namespace: ns, Name: "vm"})
}
