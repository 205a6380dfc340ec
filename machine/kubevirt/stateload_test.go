package kubevirt

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// TestSharedStateLoadsBounded: the backends of shared Informers, all
// reading their state Secrets at once (a bmc-server starting), keep at most
// sharedStateLoads reads in flight, and every read is answered.
func TestSharedStateLoadsBounded(t *testing.T) {
	var inFlight, most atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(20 * time.Millisecond) // a busy API server
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"Secret","apiVersion":"v1","metadata":{"name":"x"},"data":{"k":"dg=="}}`))
	}))
	defer api.Close()
	cfg := &rest.Config{Host: api.URL, QPS: -1} // as bmc-server: no client-side limit
	informers, err := NewInformers(cfg, "ns", InformersOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const vms = 4 * sharedStateLoads
	var wg sync.WaitGroup
	for i := range vms {
		b, err := New(cfg, "ns", "vm"+strconv.Itoa(i), Options{Informers: informers, StateSecret: "vm" + strconv.Itoa(i) + "-bmc-state"})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			if data, err := b.LoadState(t.Context(), "k"); err != nil || string(data) != "v" {
				t.Errorf("LoadState = %q, %v", data, err)
			}
		})
	}
	wg.Wait()
	if n := most.Load(); n > sharedStateLoads || n < 2 {
		t.Errorf("%d reads in flight at most, want between 2 and %d", n, sharedStateLoads)
	}
}
