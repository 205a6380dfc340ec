package bmcmetrics_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/internal/bmcmetrics"
	"github.com/virtmetal/virtmetal/internal/promtest"
	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

const user, password = "admin", "a-long-password"

// readiness is a machine.Readiness the test sets.
type readiness struct{ err error }

func (r *readiness) Ready() error { return r.err }

// fixture is a Redfish service wired to metrics as bmc-server wires it.
type fixture struct {
	t       *testing.T
	metrics *bmcmetrics.Metrics
	server  *redfish.Server
	machine *memory.Machine
	ready   *readiness
	ipmi    [2]int // active, handshakes
	streams int    // open SSE streams
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{t: t, metrics: bmcmetrics.New(), ready: &readiness{}}
	backend := memory.New(memory.Options{})
	f.machine = backend.Get("vm-0")
	limiter := throttle.New(throttle.Policy{FreeFailures: 2, BaseDelay: time.Minute, MaxDelay: time.Minute})
	f.metrics.WatchLimiter(limiter)
	f.metrics.WatchReadiness(f.ready)
	f.metrics.WatchIPMI(func() (int, int) { return f.ipmi[0], f.ipmi[1] })
	f.metrics.WatchEventStreams(func() int { return f.streams })
	srv, err := redfish.NewServer(redfish.Config{
		Backend:  machine.InterceptBackend(backend, f.metrics.Intercept),
		Accounts: []redfish.Account{{Username: user, Password: password, Role: redfish.RoleAdministrator}},
		Limiter:  limiter,
		Observer: f.metrics,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.server = srv
	return f
}

func (f *fixture) do(method, path, body, pass string) int {
	f.t.Helper()
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	if pass != "" {
		r.SetBasicAuth(user, pass)
	}
	w := httptest.NewRecorder()
	f.server.ServeHTTP(w, r)
	return w.Code
}

// scrape reads the metrics as Prometheus does, through its own parser.
func (f *fixture) scrape() promtest.Families {
	f.t.Helper()
	return promtest.Scrape(f.t, f.metrics.Handler())
}

// value is the sample of family name whose labels include want; a
// histogram's value is its count. It fails the test when there is none.
func (f *fixture) value(name string, want map[string]string) float64 {
	f.t.Helper()
	v, ok := f.scrape().Value(name, want)
	if !ok {
		f.t.Fatalf("no sample of %s with %v", name, want)
	}
	return v
}

// TestRequestsAreCountedByRoute: requests count under their route
// pattern, method and code, and each is timed.
func TestRequestsAreCountedByRoute(t *testing.T) {
	f := newFixture(t)
	system := "/redfish/v1/Systems/{systemID}"
	for range 3 {
		if code := f.do(http.MethodGet, "/redfish/v1/Systems/vm-0", "", password); code != http.StatusOK {
			t.Fatalf("GET: %d", code)
		}
	}
	f.do(http.MethodGet, "/redfish/v1/Systems/nope", "", password)
	f.do(http.MethodGet, "/redfish/v1/Unknown/x", "", password)
	tests := []struct {
		labels map[string]string
		want   float64
	}{
		{map[string]string{"route": system, "method": "GET", "code": "200"}, 3},
		{map[string]string{"route": system, "method": "GET", "code": "404"}, 1},
		{map[string]string{"route": "", "method": "GET", "code": "404"}, 1},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.labels), func(t *testing.T) {
			if got := f.value("virtmetal_bmc_redfish_requests_total", tt.labels); got != tt.want {
				t.Errorf("requests = %v, want %v", got, tt.want)
			}
		})
	}
	if got := f.value("virtmetal_bmc_redfish_request_duration_seconds", map[string]string{"route": system, "method": "GET"}); got != 4 {
		t.Errorf("timed requests = %v, want 4", got)
	}
}

// TestBackendCallsByOutcome: a Reset that works and one the backend fails
// are counted by their outcome, and timed.
func TestBackendCallsByOutcome(t *testing.T) {
	f := newFixture(t)
	reset := "/redfish/v1/Systems/vm-0/Actions/ComputerSystem.Reset"
	if code := f.do(http.MethodPost, reset, `{"ResetType":"On"}`, password); code != http.StatusNoContent {
		t.Fatalf("reset: %d", code)
	}
	f.machine.SetFault(machine.ErrUnavailable)
	if code := f.do(http.MethodPost, reset, `{"ResetType":"ForceOff"}`, password); code != http.StatusServiceUnavailable {
		t.Fatalf("failing reset: %d", code)
	}
	if got := f.value("virtmetal_bmc_backend_calls_total", map[string]string{"operation": "Reset", "outcome": "ok"}); got != 1 {
		t.Errorf("ok resets = %v", got)
	}
	if got := f.value("virtmetal_bmc_backend_calls_total", map[string]string{"operation": "Reset", "outcome": "unavailable"}); got != 1 {
		t.Errorf("unavailable resets = %v", got)
	}
	if got := f.value("virtmetal_bmc_backend_call_duration_seconds", map[string]string{"operation": "Reset"}); got != 2 {
		t.Errorf("timed resets = %v", got)
	}
}

// TestLoginsAndThrottling: wrong passwords count as failures; past the free
// ones the source must wait, and its next attempts are refused unchecked.
func TestLoginsAndThrottling(t *testing.T) {
	f := newFixture(t)
	if got := f.value("virtmetal_bmc_login_failures_total", nil); got != 0 {
		t.Fatalf("failures before any = %v", got)
	}
	for range 3 {
		f.do(http.MethodGet, "/redfish/v1/Systems", "", "wrong")
	}
	if got := f.value("virtmetal_bmc_throttled_sources", nil); got != 1 {
		t.Errorf("throttled sources = %v, want 1", got)
	}
	f.do(http.MethodGet, "/redfish/v1/Systems", "", password) // refused: the source waits
	if got := f.value("virtmetal_bmc_login_refusals_total", nil); got != 1 {
		t.Errorf("refusals = %v, want 1", got)
	}
	if got := f.value("virtmetal_bmc_login_failures_total", nil); got != 4 {
		t.Errorf("failures = %v, want 4 (3 wrong, 1 refused)", got)
	}
}

// TestGaugesFollowTheirSource: readiness, the IPMI session table and the
// SSE streams are read at each scrape.
func TestGaugesFollowTheirSource(t *testing.T) {
	f := newFixture(t)
	if got := f.value("virtmetal_bmc_backend_ready", nil); got != 1 {
		t.Errorf("ready = %v, want 1", got)
	}
	f.ready.err = fmt.Errorf("cache not synced: %w", machine.ErrUnavailable)
	if got := f.value("virtmetal_bmc_backend_ready", nil); got != 0 {
		t.Errorf("ready = %v, want 0", got)
	}
	f.ipmi = [2]int{2, 1}
	if got := f.value("virtmetal_bmc_ipmi_sessions", map[string]string{"state": "active"}); got != 2 {
		t.Errorf("active sessions = %v", got)
	}
	if got := f.value("virtmetal_bmc_ipmi_sessions", map[string]string{"state": "handshake"}); got != 1 {
		t.Errorf("handshakes = %v", got)
	}
	f.streams = 3
	if got := f.value("virtmetal_bmc_redfish_event_streams", nil); got != 3 {
		t.Errorf("event streams = %v, want 3", got)
	}
	if _, ok := f.scrape()["go_goroutines"]; !ok {
		t.Error("the Go runtime's metrics are missing")
	}
}
