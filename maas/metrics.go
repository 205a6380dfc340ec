package maas

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are the reconciler's Prometheus metrics, for loop mode (a
// CronJob's run ends before a scrape; its "cycle done" log line is its
// summary).
type Metrics struct {
	registry *prometheus.Registry
	cycles   *prometheus.CounterVec
	duration prometheus.Histogram
	machines *prometheus.GaugeVec
	changes  *prometheus.CounterVec
	failures prometheus.Gauge
	problems *prometheus.GaugeVec
}

// NewMetrics returns the metrics with the Go runtime's and the process's.
func NewMetrics() *Metrics {
	const namespace, subsystem = "virtmetal", "maas_reconciler"
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		cycles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "cycles_total",
			Help: "Reconciler cycles by result: ok, or failed as a whole (MaaS or the API server refusing or unreachable).",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "cycle_duration_seconds",
			Help:    "Time one reconciler cycle took.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14), // 10 ms to about 80 s
		}),
		machines: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "machines",
			Help: "Machines of the last successful cycle: seen in MaaS, managed (their power address names a virtmetal BMC), bound (proven to be their VM).",
		}, []string{"kind"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "changes_total",
			Help: "Changes made in MaaS and Kubernetes (or planned, in a dry run), by action.",
		}, []string{"action"}),
		failures: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "machine_failures",
			Help: "Machines (or VMs) the last successful cycle could not bring in shape.",
		}),
		problems: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "problems",
			Help: "Problems of bound machines after the last successful cycle, by reason.",
		}, []string{"reason"}),
	}
	m.registry.MustRegister(m.cycles, m.duration, m.machines, m.changes, m.failures, m.problems,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics in Prometheus's text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{Registry: m.registry})
}

func (m *Metrics) observe(result CycleResult, took time.Duration, err error) {
	m.duration.Observe(took.Seconds())
	if err != nil {
		m.cycles.WithLabelValues("failed").Inc()
		return
	}
	m.cycles.WithLabelValues("ok").Inc()
	m.machines.WithLabelValues("seen").Set(float64(result.Machines))
	m.machines.WithLabelValues("managed").Set(float64(result.Managed))
	m.machines.WithLabelValues("bound").Set(float64(result.Bound))
	for _, c := range result.Changes {
		m.changes.WithLabelValues(c.Action).Inc()
	}
	m.failures.Set(float64(len(result.Failures)))
	m.problems.Reset()
	for _, reason := range []string{ReasonCommissionRefused, ReasonAddressRejected, ReasonDuplicateClaim, ReasonFailing} {
		m.problems.WithLabelValues(reason).Set(0)
	}
	for _, p := range result.Problems {
		m.problems.WithLabelValues(p.Reason).Inc()
	}
}
