package controllers

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// enrolledVMs is what the manager's /metrics adds to controller-runtime's
// own reconcile counts, errors and latencies.
var enrolledVMs = prometheus.NewGauge(prometheus.GaugeOpts{
	Name: "virtmetal_enrolled_vms",
	Help: "VirtualMachines in opted-in namespaces that have a BMC.",
})

func init() { metrics.Registry.MustRegister(enrolledVMs) }
