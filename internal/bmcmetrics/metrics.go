// Package bmcmetrics is bmc-server's Prometheus metrics: what the Redfish
// service answered, what the backend calls cost, how logins fare, the IPMI
// session table and whether the backend can serve. It observes through the
// hooks the protocol and backend packages offer (redfish.Observer,
// machine.Interceptor, throttle.Stats), so they stay free of Prometheus.
//
// Labels are bounded by construction: routes are the route table's path
// patterns (an unknown URI is ""), operations the Machine methods,
// outcomes the backend contract's sentinel errors, and event deliveries'
// outcomes the few redfish.EventDeliveryObserver tells. Machines are not
// a label: a shared bmc-server serves thousands of VMs.
package bmcmetrics

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/machine"
)

const namespace = "virtmetal_bmc"

// Metrics holds one process's metrics.
type Metrics struct {
	registry     *registry
	requests     *counterVec
	duration     *histogramVec
	calls        *counterVec
	callDuration *histogramVec
	deliveries   *counterVec
}

// deliveryOutcomes are the outcomes redfish.EventDeliveryObserver tells;
// anything else counts as "other", so the label stays bounded whatever
// the protocol package adds later.
var deliveryOutcomes = []string{"delivered", "failed", "refused"}

// New returns the metrics with the Go runtime's and the process's.
func New() *Metrics {
	m := &Metrics{
		registry: &registry{families: map[string]family{}},
		requests: newCounterVec(namespace+"_redfish_requests_total",
			"Redfish requests answered, by route pattern, method and status code.",
			"route", "method", "code"),
		duration: newHistogramVec(namespace+"_redfish_request_duration_seconds",
			"Time to answer a Redfish request, by route pattern and method.",
			[]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
			"route", "method"),
		calls: newCounterVec(namespace+"_backend_calls_total",
			"Backend calls, by operation and outcome (ok, or the contract's error: not_found, not_supported, invalid_argument, conflict, unavailable, canceled, other).",
			"operation", "outcome"),
		callDuration: newHistogramVec(namespace+"_backend_call_duration_seconds",
			"Time a backend call took, by operation.",
			[]float64{.0001, .0005, .001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
			"operation"),
		deliveries: newCounterVec(namespace+"_event_deliveries_total",
			"POSTs of events to push subscriptions' destinations, each try counted, by outcome: delivered (the destination answered 2xx), "+
				"failed (it answered otherwise or could not be reached; the subscription's DeliveryRetryPolicy retries or gives up), "+
				"refused (its address is one events are never sent to: nothing was sent), other.",
			"outcome"),
	}
	// Every outcome is exported from the start, so that a rate or an
	// alert on failures has a series before the first one.
	for _, o := range slices.Concat(deliveryOutcomes, []string{"other"}) {
		m.deliveries.with(labelValues{o})
	}
	m.registry.add(m.requests, m.duration, m.calls, m.callDuration, m.deliveries,
		group{"go_", goRuntime}, group{"process_", process})
	return m
}

// Handler serves the metrics in Prometheus's text format.
func (m *Metrics) Handler() http.Handler { return m.registry }

// ObserveRequest implements redfish.Observer.
func (m *Metrics) ObserveRequest(route, method string, status int, took time.Duration) {
	m.requests.with(labelValues{route, method, strconv.Itoa(status)}).Add(1)
	m.duration.observe(labelValues{route, method}, took.Seconds())
}

// ObserveEventDelivery implements redfish.EventDeliveryObserver.
func (m *Metrics) ObserveEventDelivery(outcome string) {
	if !slices.Contains(deliveryOutcomes, outcome) {
		outcome = "other"
	}
	m.deliveries.with(labelValues{outcome}).Add(1)
}

// Intercept is a machine.Interceptor that times every backend call and
// counts its outcome.
func (m *Metrics) Intercept(ctx context.Context, c machine.Call, call func(context.Context) error) error {
	start := time.Now()
	err := call(ctx)
	m.callDuration.observe(labelValues{string(c.Op)}, time.Since(start).Seconds())
	m.calls.with(labelValues{string(c.Op), outcome(err)}).Add(1)
	return err
}

// outcome is the label of a backend call's result.
func outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, machine.ErrNotFound):
		return "not_found"
	case errors.Is(err, machine.ErrNotSupported):
		return "not_supported"
	case errors.Is(err, machine.ErrInvalidArgument):
		return "invalid_argument"
	case errors.Is(err, machine.ErrConflict):
		return "conflict"
	case errors.Is(err, machine.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	}
	return "other"
}

// WatchReadiness exports whether the backend can serve (1) or not (0),
// e.g. before its cache's first sync.
func (m *Metrics) WatchReadiness(r machine.Readiness) {
	m.registry.addFunc(namespace+"_backend_ready",
		"1 when the backend can serve calls (its cache has synced, its API server answers), else 0.", "gauge",
		funcSample{read: func() float64 {
			if r.Ready() != nil {
				return 0
			}
			return 1
		}})
}

// WatchLimiter exports the login throttle's counts; it is shared by Redfish
// and IPMI, so they are the BMC's, not one protocol's.
func (m *Metrics) WatchLimiter(l *throttle.Limiter) {
	stat := func(pick func(throttle.Stats) float64) funcSample {
		return funcSample{read: func() float64 { return pick(l.Stats()) }}
	}
	m.registry.addFunc(namespace+"_login_failures_total",
		"Failed logins over Redfish and IPMI, refused ones included.", "counter",
		stat(func(s throttle.Stats) float64 { return float64(s.Failures) }))
	m.registry.addFunc(namespace+"_login_refusals_total",
		"Logins refused unchecked because their source must wait before trying that account again.", "counter",
		stat(func(s throttle.Stats) float64 { return float64(s.Refused) }))
	m.registry.addFunc(namespace+"_ipmi_handshakes_refused_total",
		"IPMI session handshakes refused by the per-source rate limit.", "counter",
		stat(func(s throttle.Stats) float64 { return float64(s.HandshakesRefused) }))
	m.registry.addFunc(namespace+"_throttled_sources",
		"Client addresses that must wait before their next login at some account is checked.", "gauge",
		stat(func(s throttle.Stats) float64 { return float64(s.ThrottledSources) }))
}

// WatchEventStreams exports how many Redfish SSE streams are open
// (redfish.Server.EventStreams, or the sum over a shared BMC's VMs).
func (m *Metrics) WatchEventStreams(streams func() int) {
	m.registry.addFunc(namespace+"_redfish_event_streams", "Open server-sent event streams of the EventService.", "gauge",
		funcSample{read: func() float64 { return float64(streams()) }})
}

// WatchEventSubscriptions exports the push subscriptions, those
// delivering and those suspended (redfish.Server.EventSubscriptions, or
// the sum over a shared BMC's VMs).
func (m *Metrics) WatchEventSubscriptions(subscriptions func() (enabled, suspended int)) {
	m.addStatePair(namespace+"_event_subscriptions",
		"Push subscriptions of the EventService (SSE streams not included), enabled or suspended: a suspended one is sent nothing until a client resumes it.",
		[2]string{"enabled", "suspended"}, subscriptions)
}

// WatchIPMI exports the IPMI session table: sessions returns the active
// sessions and the handshakes under way (ipmi.Server.Sessions).
func (m *Metrics) WatchIPMI(sessions func() (active, handshakes int)) {
	m.addStatePair(namespace+"_ipmi_sessions", "Entries of the IPMI session table: active sessions and handshakes under way.",
		[2]string{"active", "handshake"}, sessions)
}

// addStatePair exports a gauge with a "state" label of two values, read
// at each scrape: read's first result is states[0]'s, its second
// states[1]'s.
func (m *Metrics) addStatePair(metric, help string, states [2]string, read func() (int, int)) {
	for i, state := range states {
		m.registry.addFunc(metric, help, "gauge", funcSample{label: "state", value: state, read: func() float64 {
			first, second := read()
			return float64([2]int{first, second}[i])
		}})
	}
}
