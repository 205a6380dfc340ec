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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/machine"
)

const namespace = "virtmetal_bmc"

// Metrics holds one process's metrics on a registry of its own.
type Metrics struct {
	registry     *prometheus.Registry
	requests     *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	calls        *prometheus.CounterVec
	callDuration *prometheus.HistogramVec
	deliveries   *prometheus.CounterVec
}

// deliveryOutcomes are the outcomes redfish.EventDeliveryObserver tells;
// anything else counts as "other", so the label stays bounded whatever
// the protocol package adds later.
var deliveryOutcomes = []string{"delivered", "failed", "refused"}

// New returns the metrics with the Go runtime's and the process's.
func New() *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "redfish", Name: "requests_total",
			Help: "Redfish requests answered, by route pattern, method and status code.",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "redfish", Name: "request_duration_seconds",
			Help:    "Time to answer a Redfish request, by route pattern and method.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route", "method"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "backend", Name: "calls_total",
			Help: "Backend calls, by operation and outcome (ok, or the contract's error: not_found, not_supported, invalid_argument, conflict, unavailable, canceled, other).",
		}, []string{"operation", "outcome"}),
		callDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "backend", Name: "call_duration_seconds",
			Help:    "Time a backend call took, by operation.",
			Buckets: []float64{.0001, .0005, .001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"operation"}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "event_deliveries_total",
			Help: "POSTs of events to push subscriptions' destinations, each try counted, by outcome: delivered (the destination answered 2xx), " +
				"failed (it answered otherwise or could not be reached; the subscription's DeliveryRetryPolicy retries or gives up), " +
				"refused (its address is one events are never sent to: nothing was sent), other.",
		}, []string{"outcome"}),
	}
	// Every outcome is exported from the start, so that a rate or an
	// alert on failures has a series before the first one.
	for _, o := range slices.Concat(deliveryOutcomes, []string{"other"}) {
		m.deliveries.WithLabelValues(o)
	}
	m.registry.MustRegister(m.requests, m.duration, m.calls, m.callDuration, m.deliveries,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics in Prometheus's text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{Registry: m.registry})
}

// ObserveRequest implements redfish.Observer.
func (m *Metrics) ObserveRequest(route, method string, status int, took time.Duration) {
	m.requests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
	m.duration.WithLabelValues(route, method).Observe(took.Seconds())
}

// ObserveEventDelivery implements redfish.EventDeliveryObserver.
func (m *Metrics) ObserveEventDelivery(outcome string) {
	if !slices.Contains(deliveryOutcomes, outcome) {
		outcome = "other"
	}
	m.deliveries.WithLabelValues(outcome).Inc()
}

// Intercept is a machine.Interceptor that times every backend call and
// counts its outcome.
func (m *Metrics) Intercept(ctx context.Context, c machine.Call, call func(context.Context) error) error {
	start := time.Now()
	err := call(ctx)
	m.callDuration.WithLabelValues(string(c.Op)).Observe(time.Since(start).Seconds())
	m.calls.WithLabelValues(string(c.Op), outcome(err)).Inc()
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
	m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: "backend", Name: "ready",
		Help: "1 when the backend can serve calls (its cache has synced, its API server answers), else 0.",
	}, func() float64 {
		if r.Ready() != nil {
			return 0
		}
		return 1
	}))
}

// WatchLimiter exports the login throttle's counts; it is shared by Redfish
// and IPMI, so they are the BMC's, not one protocol's.
func (m *Metrics) WatchLimiter(l *throttle.Limiter) {
	stat := func(pick func(throttle.Stats) float64) func() float64 {
		return func() float64 { return pick(l.Stats()) }
	}
	m.registry.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: namespace, Name: "login_failures_total",
			Help: "Failed logins over Redfish and IPMI, refused ones included.",
		}, stat(func(s throttle.Stats) float64 { return float64(s.Failures) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: namespace, Name: "login_refusals_total",
			Help: "Logins refused unchecked because their source must wait before trying that account again.",
		}, stat(func(s throttle.Stats) float64 { return float64(s.Refused) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "ipmi", Name: "handshakes_refused_total",
			Help: "IPMI session handshakes refused by the per-source rate limit.",
		}, stat(func(s throttle.Stats) float64 { return float64(s.HandshakesRefused) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Name: "throttled_sources",
			Help: "Client addresses that must wait before their next login at some account is checked.",
		}, stat(func(s throttle.Stats) float64 { return float64(s.ThrottledSources) })),
	)
}

// WatchEventStreams exports how many Redfish SSE streams are open
// (redfish.Server.EventStreams, or the sum over a shared BMC's VMs).
func (m *Metrics) WatchEventStreams(streams func() int) {
	m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: "redfish", Name: "event_streams",
		Help: "Open server-sent event streams of the EventService.",
	}, func() float64 { return float64(streams()) }))
}

// WatchEventSubscriptions exports the push subscriptions, those
// delivering and those suspended (redfish.Server.EventSubscriptions, or
// the sum over a shared BMC's VMs).
func (m *Metrics) WatchEventSubscriptions(subscriptions func() (enabled, suspended int)) {
	for _, state := range []string{"enabled", "suspended"} {
		m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Name: "event_subscriptions",
			Help:        "Push subscriptions of the EventService (SSE streams not included), enabled or suspended: a suspended one is sent nothing until a client resumes it.",
			ConstLabels: prometheus.Labels{"state": state},
		}, func() float64 {
			enabled, suspended := subscriptions()
			if state == "enabled" {
				return float64(enabled)
			}
			return float64(suspended)
		}))
	}
}

// WatchIPMI exports the IPMI session table: sessions returns the active
// sessions and the handshakes under way (ipmi.Server.Sessions).
func (m *Metrics) WatchIPMI(sessions func() (active, handshakes int)) {
	for _, state := range []string{"active", "handshake"} {
		m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: "ipmi", Name: "sessions",
			Help:        "Entries of the IPMI session table: active sessions and handshakes under way.",
			ConstLabels: prometheus.Labels{"state": state},
		}, func() float64 {
			active, handshakes := sessions()
			if state == "active" {
				return float64(active)
			}
			return float64(handshakes)
		}))
	}
}
