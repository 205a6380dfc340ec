package bmcmetrics_test

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/internal/bmcmetrics"
	"github.com/virtmetal/virtmetal/internal/poll"
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

func newFixture(t *testing.T, tweaks ...func(*redfish.Config)) *fixture {
	t.Helper()
	f := &fixture{t: t, metrics: bmcmetrics.New(), ready: &readiness{}}
	backend := memory.New(memory.Options{})
	f.machine = backend.Get("vm-0")
	limiter := throttle.New(throttle.Policy{FreeFailures: 2, BaseDelay: time.Minute, MaxDelay: time.Minute})
	f.metrics.WatchLimiter(limiter)
	f.metrics.WatchReadiness(f.ready)
	f.metrics.WatchIPMI(func() (int, int) { return f.ipmi[0], f.ipmi[1] })
	f.metrics.WatchEventStreams(func() int { return f.streams })
	cfg := redfish.Config{
		Backend:  machine.InterceptBackend(backend, f.metrics.Intercept),
		Accounts: []redfish.Account{{Username: user, Password: password, Role: redfish.RoleAdministrator}},
		Limiter:  limiter,
		Observer: f.metrics,
	}
	for _, tweak := range tweaks {
		tweak(&cfg)
	}
	srv, err := redfish.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.server = srv
	t.Cleanup(srv.StopEventStreams) // ends push deliveries too
	f.metrics.WatchEventSubscriptions(srv.EventSubscriptions)
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

// receiver is an event destination on loopback that counts what it is
// sent and answers with status.
type receiver struct {
	ts       *httptest.Server
	received atomic.Int32
	status   int
}

func newReceiver(t *testing.T, status int) *receiver {
	r := &receiver{status: status}
	r.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		r.received.Add(1)
		w.WriteHeader(r.status)
	}))
	t.Cleanup(r.ts.Close)
	return r
}

// TestEventDeliveries: each try of a POST to a subscription's destination
// counts by its outcome (one try and one retry here), the subscriptions
// gauge follows the subscription into suspension when its tries are
// spent, and a destination the guard refuses is sent nothing.
func TestEventDeliveries(t *testing.T) {
	tests := []struct {
		name          string
		status        int    // the receiver's answer
		host          string // the Destination's host, with the receiver's port
		allowLoopback bool
		want          map[string]float64 // by outcome
		wantEnabled   float64
		wantSuspended float64
		wantReceived  int32
	}{
		{name: "delivered", status: http.StatusNoContent, host: "127.0.0.1", allowLoopback: true,
			want: map[string]float64{"delivered": 1}, wantEnabled: 1, wantReceived: 1},
		{name: "failed, retried, suspended", status: http.StatusServiceUnavailable, host: "127.0.0.1", allowLoopback: true,
			want: map[string]float64{"failed": 2}, wantSuspended: 1, wantReceived: 2},
		// A name is taken at POST; the guard refuses the loopback address
		// it resolves to when the delivery dials.
		{name: "refused by the guard", status: http.StatusNoContent, host: "localhost",
			want: map[string]float64{"refused": 2}, wantSuspended: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newReceiver(t, tt.status)
			f := newFixture(t, func(c *redfish.Config) {
				c.EventDestinationsAllowLoopback = tt.allowLoopback
				c.EventDeliveryRetryAttempts = 1
				c.EventDeliveryRetryInterval = 10 * time.Millisecond
			})
			outcomes := []string{"delivered", "failed", "refused", "other"}
			for _, o := range outcomes {
				if got := f.value("virtmetal_bmc_event_deliveries_total", map[string]string{"outcome": o}); got != 0 {
					t.Fatalf("%s before any delivery = %v, want a series at 0", o, got)
				}
			}
			_, port, _ := net.SplitHostPort(r.ts.Listener.Addr().String())
			destination := "http://" + net.JoinHostPort(tt.host, port) + "/events"
			if code := f.do(http.MethodPost, "/redfish/v1/EventService/Subscriptions", `{"Destination":"`+destination+`","Protocol":"Redfish"}`, password); code != http.StatusCreated {
				t.Fatalf("POST a subscription: %d", code)
			}
			if got := f.value("virtmetal_bmc_event_subscriptions", map[string]string{"state": "enabled"}); got != 1 {
				t.Errorf("enabled subscriptions = %v before any event, want 1", got)
			}
			if code := f.do(http.MethodPost, "/redfish/v1/EventService/Actions/EventService.SubmitTestEvent", `{"MessageId":"Test.1.0.Hello"}`, password); code/100 != 2 {
				t.Fatalf("SubmitTestEvent: %d", code)
			}
			total := func() (n float64) {
				for _, o := range outcomes {
					n += f.value("virtmetal_bmc_event_deliveries_total", map[string]string{"outcome": o})
				}
				return n
			}
			var want float64
			for _, n := range tt.want {
				want += n
			}
			suspended := func() float64 {
				return f.value("virtmetal_bmc_event_subscriptions", map[string]string{"state": "suspended"})
			}
			poll.Until(t, "the tries counted", func() error {
				if total() < want || suspended() != tt.wantSuspended {
					return fmt.Errorf("%v tries counted, %v suspended; want %v and %v", total(), suspended(), want, tt.wantSuspended)
				}
				return nil
			})
			for _, o := range outcomes {
				if got := f.value("virtmetal_bmc_event_deliveries_total", map[string]string{"outcome": o}); got != tt.want[o] {
					t.Errorf("%s = %v, want %v", o, got, tt.want[o])
				}
			}
			if got := f.value("virtmetal_bmc_event_subscriptions", map[string]string{"state": "enabled"}); got != tt.wantEnabled {
				t.Errorf("enabled subscriptions = %v, want %v", got, tt.wantEnabled)
			}
			if got := r.received.Load(); got != tt.wantReceived {
				t.Errorf("the receiver was sent %d POSTs, want %d", got, tt.wantReceived)
			}
		})
	}
}

// TestUnknownDeliveryOutcome: an outcome the metrics do not know counts as
// other rather than growing the label's values.
func TestUnknownDeliveryOutcome(t *testing.T) {
	f := newFixture(t)
	f.metrics.ObserveEventDelivery("throttled")
	f.metrics.ObserveEventDelivery("delivered")
	for outcome, want := range map[string]float64{"other": 1, "delivered": 1, "failed": 0} {
		if got := f.value("virtmetal_bmc_event_deliveries_total", map[string]string{"outcome": outcome}); got != want {
			t.Errorf("%s = %v, want %v", outcome, got, want)
		}
	}
	if _, ok := f.scrape().Value("virtmetal_bmc_event_deliveries_total", map[string]string{"outcome": "throttled"}); ok {
		t.Error("an unknown outcome became a label value")
	}
}

// TestExpositionAsPrometheusReadsIt: what Prometheus's client library
// exported is still there under its names and types, read back by
// Prometheus's own parser: label values that need escaping, cumulative
// histogram buckets, and the Go runtime's and process's figures.
func TestExpositionAsPrometheusReadsIt(t *testing.T) {
	f := newFixture(t)
	odd := "/redfish/v1/\"quoted\"\\back\nslash"
	f.metrics.ObserveRequest(odd, "GET", 200, 3*time.Millisecond)
	f.metrics.ObserveRequest(odd, "GET", 200, 30*time.Millisecond)
	f.metrics.ObserveRequest(odd, "GET", 200, time.Minute)
	families := f.scrape()
	if got, ok := families.Value("virtmetal_bmc_redfish_requests_total", map[string]string{"route": odd}); !ok || got != 3 {
		t.Errorf("requests with an escaped route = %v (found %v), want 3", got, ok)
	}
	histogram := families["virtmetal_bmc_redfish_request_duration_seconds"].Metric[0].Histogram
	for _, b := range histogram.Bucket {
		var want uint64
		switch bound := b.GetUpperBound(); {
		case math.IsInf(bound, 1):
			want = 3 // the minute is above every other bound
		case bound >= 0.05:
			want = 2
		case bound >= 0.005:
			want = 1
		}
		if b.GetCumulativeCount() != want {
			t.Errorf("bucket le=%v holds %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want)
		}
	}
	if histogram.GetSampleCount() != 3 || histogram.GetSampleSum() < 60 {
		t.Errorf("count %d, sum %v; want 3 and over 60 s", histogram.GetSampleCount(), histogram.GetSampleSum())
	}
	for _, tt := range []struct {
		name     string
		kind     string
		min, max float64
	}{
		{"go_goroutines", "GAUGE", 1, 1e6},
		{"go_memstats_heap_alloc_bytes", "GAUGE", 1, 1 << 40},
		{"go_memstats_mallocs_total", "COUNTER", 1, math.Inf(1)},
		{"go_gc_duration_seconds", "SUMMARY", 0, math.Inf(1)},
		{"go_sched_gomaxprocs_threads", "GAUGE", 1, 1 << 20},
		{"go_threads", "GAUGE", 1, 1 << 20},
		{"process_resident_memory_bytes", "GAUGE", 1 << 20, 1 << 40},
		{"process_open_fds", "GAUGE", 1, 1 << 20},
		{"process_cpu_seconds_total", "COUNTER", 0, 1e9},
		{"process_start_time_seconds", "GAUGE", float64(time.Now().Add(-24 * time.Hour).Unix()), float64(time.Now().Unix() + 1)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			family := families[tt.name]
			if family == nil {
				t.Fatal("missing")
			}
			if got := family.GetType().String(); got != tt.kind {
				t.Errorf("type %s, want %s", got, tt.kind)
			}
			if v, _ := families.Value(tt.name, nil); tt.kind != "SUMMARY" && (v < tt.min || v > tt.max) {
				t.Errorf("%v, want within [%v, %v]", v, tt.min, tt.max)
			}
		})
	}
}
