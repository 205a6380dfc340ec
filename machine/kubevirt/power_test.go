package kubevirt_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
)

// vmWrites counts the PUTs of one VM the API server accepted and can hold
// the first until told. A PUT refused with 409 Conflict is not counted: the
// simulated virt-controller writes the VM's status as it starts the VMI, and
// a write that read the VM just before that is retried, as it must be.
type vmWrites struct {
	next     http.RoundTripper
	vmPath   string
	attempts atomic.Int64
	puts     atomic.Int64
	held     chan struct{} // closed when the first PUT is held
	release  chan struct{} // closing it lets the first PUT through
}

func (w *vmWrites) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodPut || !strings.HasSuffix(r.URL.Path, w.vmPath) {
		return w.next.RoundTrip(r)
	}
	if w.attempts.Add(1) == 1 {
		close(w.held)
		<-w.release
	}
	resp, err := w.next.RoundTrip(r)
	if err == nil && resp.StatusCode != http.StatusConflict {
		w.puts.Add(1)
	}
	return resp, err
}

// TestConcurrentResetsEndInTheLastOne: eight clients act on one VM at
// once; while the first one's write is in flight, six more arrive and then
// the last. None gets an error, their writes are coalesced (the held one and
// one more), and the VM ends in the state of the last request.
func TestConcurrentResetsEndInTheLastOne(t *testing.T) {
	ns := cluster.NewNamespace(t)
	newVM(t, ns, "vm", nil)
	writes := &vmWrites{vmPath: "/namespaces/" + ns + "/virtualmachines/vm", held: make(chan struct{}), release: make(chan struct{})}
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Wrap(func(next http.RoundTripper) http.RoundTripper { writes.next = next; return writes })
	backend := kubevirttest.StartBackend(t, cfg, ns, "vm", kubevirt.Options{Logger: logr.Discard()})
	m, err := backend.Machine(t.Context(), "vm")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	reset := func(r machine.ResetType) {
		wg.Go(func() { errs <- m.Reset(context.Background(), r) })
	}
	reset(machine.ResetOn)
	<-writes.held
	for i := range 6 {
		reset([]machine.ResetType{machine.ResetGracefulShutdown, machine.ResetOn}[i%2])
	}
	waitForWishes(t, backend, 7)
	reset(machine.ResetGracefulShutdown) // the last request
	waitForWishes(t, backend, 8)
	close(writes.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Reset: %v", err)
		}
	}
	vm := &kubevirtv1.VirtualMachine{}
	if err := cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "vm"}, vm); err != nil {
		t.Fatal(err)
	}
	if vm.Spec.RunStrategy == nil || *vm.Spec.RunStrategy != kubevirtv1.RunStrategyHalted {
		t.Errorf("runStrategy %v, want Halted (the last request was GracefulShutdown)", vm.Spec.RunStrategy)
	}
	if n := writes.puts.Load(); n != 2 {
		t.Errorf("%d accepted writes of the VM (%d attempts), want 2 (the held one, then the other seven coalesced)", n, writes.attempts.Load())
	}
}

func waitForWishes(t *testing.T, b *kubevirt.Backend, n uint64) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return b.PowerWishes() >= n, nil
	})
	if err != nil {
		t.Fatalf("%d resets asked for, want %d", b.PowerWishes(), n)
	}
}
