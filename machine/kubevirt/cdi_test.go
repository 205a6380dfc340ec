package kubevirt

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// TestCDIDiscoveryBounded: against an API server that never answers, the
// CDI lookup every machine read makes gives up at the request timeout,
// holds no lock meanwhile, and concurrent reads wait side by side rather
// than in a queue.
func TestCDIDiscoveryBounded(t *testing.T) {
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer hung.Close()
	defer close(release)
	const timeout = 300 * time.Millisecond
	b, err := New(&rest.Config{Host: hung.URL}, "ns", "vm", Options{RequestTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if !b.cdiInstalledRecently(t.Context()) {
				t.Error("unknown CDI read as absent: media would vanish while the API server is slow")
			}
		})
	}
	time.Sleep(timeout / 3)
	if !b.cdiMu.TryLock() {
		t.Fatal("the CDI lock is held while discovery waits on the network")
	}
	b.cdiMu.Unlock()
	wg.Wait()
	// Serialized behind one lock, three lookups would take three timeouts.
	if elapsed := time.Since(start); elapsed > 2*timeout {
		t.Fatalf("three concurrent lookups took %v, want about one timeout (%v)", elapsed, timeout)
	}
}
