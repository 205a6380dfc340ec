package redfish_test

import (
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/redfish"
)

// recordingObserver keeps every observed request.
type recordingObserver struct {
	mu       sync.Mutex
	requests []observed
}

type observed struct {
	route, method string
	status        int
	took          time.Duration
}

func (o *recordingObserver) ObserveRequest(route, method string, status int, took time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.requests = append(o.requests, observed{route, method, status, took})
}

// TestObserverSeesEveryRequest: each request is observed once under its
// route's pattern (never the URI asked for), with the status answered,
// refusals and unknown URIs included.
func TestObserverSeesEveryRequest(t *testing.T) {
	obs := &recordingObserver{}
	f := newFixture(t, func(cfg *redfish.Config, _ *stubBackend) { cfg.Observer = obs })
	tests := []struct {
		name string
		req  request
		want observed
	}{
		{"service root", request{method: http.MethodGet, path: "/redfish/v1"}, observed{"/redfish/v1", http.MethodGet, http.StatusOK, 0}},
		{"a system", asAdmin(http.MethodGet, "/redfish/v1/Systems/vm-0", ""), observed{"/redfish/v1/Systems/{systemID}", http.MethodGet, http.StatusOK, 0}},
		{"the system again, from the kept answer", asAdmin(http.MethodGet, "/redfish/v1/Systems/vm-0", ""), observed{"/redfish/v1/Systems/{systemID}", http.MethodGet, http.StatusOK, 0}},
		{"a reset", asAdmin(http.MethodPost, "/redfish/v1/Systems/vm-0/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`),
			observed{"/redfish/v1/Systems/{systemID}/Actions/ComputerSystem.Reset", http.MethodPost, http.StatusNoContent, 0}},
		{"no credentials", request{method: http.MethodGet, path: "/redfish/v1/Systems/vm-1"}, observed{"/redfish/v1/Systems/{systemID}", http.MethodGet, http.StatusUnauthorized, 0}},
		{"wrong password", request{method: http.MethodGet, path: "/redfish/v1/Systems", user: adminUser, pass: "wrong"}, observed{"/redfish/v1/Systems", http.MethodGet, http.StatusUnauthorized, 0}},
		{"unknown machine", asAdmin(http.MethodGet, "/redfish/v1/Systems/nope", ""), observed{"/redfish/v1/Systems/{systemID}", http.MethodGet, http.StatusNotFound, 0}},
		{"unknown URI", asAdmin(http.MethodGet, "/redfish/v1/NoSuchThing/a/b", ""), observed{"", http.MethodGet, http.StatusNotFound, 0}},
		{"method not allowed", asAdmin(http.MethodDelete, "/redfish/v1/Systems", ""), observed{"/redfish/v1/Systems", http.MethodDelete, http.StatusMethodNotAllowed, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(obs.requests)
			res := f.do(tt.req)
			if res.status != tt.want.status {
				t.Fatalf("status %d, want %d", res.status, tt.want.status)
			}
			got := slices.Clone(obs.requests[before:])
			for i := range got {
				got[i].took = 0
			}
			if len(got) != 1 || got[0] != tt.want {
				t.Errorf("observed %+v, want [%+v]", got, tt.want)
			}
		})
	}
}

// TestObserverMeasuresTime: the time observed is the server clock's.
func TestObserverMeasuresTime(t *testing.T) {
	obs := &recordingObserver{}
	f := newFixture(t, func(cfg *redfish.Config, _ *stubBackend) {
		cfg.Observer = obs
		now := cfg.Now()
		cfg.Now = func() time.Time { now = now.Add(time.Millisecond); return now } // each look moves it on
	})
	f.do(request{method: http.MethodGet, path: "/redfish"})
	if len(obs.requests) != 1 || obs.requests[0].took <= 0 {
		t.Errorf("observed %+v, want a positive duration", obs.requests)
	}
}
