package kubevirt

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// TestCDIDiscoveryBounded: against an API server that never answers, the
// CDI lookup every machine read makes gives up at the request timeout,
// holds no lock meanwhile, and concurrent reads neither queue behind it
// nor send lookups of their own.
func TestCDIDiscoveryBounded(t *testing.T) {
	release := make(chan struct{})
	var lookups atomic.Int32
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lookups.Add(1)
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
	if !b.cdi.mu.TryLock() {
		t.Fatal("the CDI lock is held while discovery waits on the network")
	}
	b.cdi.mu.Unlock()
	// Reads while the lookup is under way do not change the version at
	// every read (which would wake every watcher in a loop).
	b.cdiInstalledRecently(t.Context())
	before := b.state.current(time.Now())
	b.cdiInstalledRecently(t.Context())
	if after := b.state.current(time.Now()); after != before {
		t.Errorf("the version moved from %d to %d between two reads during the lookup", before, after)
	}
	wg.Wait()
	// Serialized behind one lock, three lookups would take three timeouts.
	if elapsed := time.Since(start); elapsed > 2*timeout {
		t.Fatalf("three concurrent reads took %v, want about one timeout (%v)", elapsed, timeout)
	}
	if n := lookups.Load(); n != 1 {
		t.Errorf("three concurrent reads sent %d lookups, want 1", n)
	}
	// No answer was had: the next read asks again.
	b.cdiInstalledRecently(t.Context())
	if n := lookups.Load(); n != 2 {
		t.Errorf("after a lookup without an answer, the next read sent %d lookups in all, want 2", n)
	}
}

// TestCDIAnswerShared: the backends of shared Informers (a bmc-server
// serving a namespace) ask the API server once between them, and each
// reports the answer.
func TestCDIAnswerShared(t *testing.T) {
	var lookups atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/cdi.kubevirt.io/v1beta1" {
			http.NotFound(w, r)
			return
		}
		lookups.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"cdi.kubevirt.io/v1beta1","resources":[]}`))
	}))
	defer api.Close()
	cfg := &rest.Config{Host: api.URL}
	informers, err := NewInformers(cfg, "ns", InformersOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, vm := range []string{"web1", "web2", "web3"} {
		b, err := New(cfg, "ns", vm, Options{Informers: informers})
		if err != nil {
			t.Fatal(err)
		}
		if !b.cdiInstalledRecently(t.Context()) {
			t.Errorf("%s: CDI read as absent", vm)
		}
	}
	if n := lookups.Load(); n != 1 {
		t.Errorf("three backends sent %d lookups, want 1", n)
	}
}
