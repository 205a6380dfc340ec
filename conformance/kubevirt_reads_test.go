package conformance_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
)

// requestLog records the API requests a backend makes.
type requestLog struct {
	mu       sync.Mutex
	requests []string
	next     http.RoundTripper
}

func (l *requestLog) RoundTrip(r *http.Request) (*http.Response, error) {
	l.mu.Lock()
	l.requests = append(l.requests, r.Method+" "+r.URL.Path)
	l.mu.Unlock()
	return l.next.RoundTrip(r)
}

func (l *requestLog) since(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.requests[n:]...)
}

func (l *requestLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.requests)
}

// TestKubeVirtPollsMakeNoAPIRequests: MaaS polls PowerState over and over;
// every poll must be answered from the informer cache, on clusters with
// and without CDI, never by a request to the API server.
func TestKubeVirtPollsMakeNoAPIRequests(t *testing.T) {
	for _, tt := range []struct {
		name string
		cdi  bool
	}{{"with CDI", true}, {"without CDI", false}} {
		t.Run(tt.name, func(t *testing.T) {
			ns := cluster.NewNamespace(t)
			cfg := cluster.Config
			if !tt.cdi {
				cfg = withoutCDI(cfg)
			}
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			halted := kubevirtv1.RunStrategyHalted
			vm := &kubevirtv1.VirtualMachine{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "polled"},
				Spec: kubevirtv1.VirtualMachineSpec{
					RunStrategy: &halted,
					Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
						Domain: kubevirtv1.DomainSpec{Memory: &kubevirtv1.Memory{Guest: ptr.To(resource.MustParse("1Gi"))}, Firmware: &kubevirtv1.Firmware{UUID: "0f4c8a2e-6b1d-4e3a-9c7f-5d2b8e1a0c46"}},
					}},
				},
			}
			if err := cluster.Client.Create(ctx, vm); err != nil {
				t.Fatalf("creating VM: %v", err)
			}
			log := &requestLog{}
			cfg = rest.CopyConfig(cfg)
			cfg.Wrap(func(next http.RoundTripper) http.RoundTripper { log.next = next; return log })
			backend := kubevirttest.StartBackend(t, cfg, ns, "polled", kubevirt.Options{})
			ts := serveBMC(t, backend)

			// The first request may look up what the cluster serves; the
			// system offers virtual media exactly where CDI is installed.
			status, _, body := kvRequest(t, ts, http.MethodGet, "/redfish/v1/Systems/polled", nil, "")
			if status != http.StatusOK {
				t.Fatalf("GET system: %d", status)
			}
			if _, media := body["VirtualMedia"]; media != tt.cdi {
				t.Fatalf("system offers VirtualMedia: %v, want %v (CDI installed: %v)", media, tt.cdi, tt.cdi)
			}
			before := log.count()
			for range 20 {
				if status, _, _ := kvRequest(t, ts, http.MethodGet, "/redfish/v1/Systems/polled", nil, ""); status != http.StatusOK {
					t.Fatalf("GET system: %d", status)
				}
			}
			if extra := log.since(before); len(extra) != 0 {
				t.Fatalf("20 status polls made %d API requests, want 0: %v", len(extra), extra)
			}
		})
	}
}
