package bmcserver

import (
	"context"
	"fmt"
	"io"

	"github.com/virtmetal/virtmetal/internal/bmcmetrics"
	"github.com/virtmetal/virtmetal/internal/metricsserver"
	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/redfish"
)

// The Redfish service finds the delivery observer by a type assertion on
// its Observer; this keeps a renamed method from silently counting nothing.
var _ redfish.EventDeliveryObserver = (*bmcmetrics.Metrics)(nil)

// startMetrics serves --metrics-listen until ctx ends; nil when it is off.
// The Redfish port stays the only one behind the Service and Ingress.
func startMetrics(ctx context.Context, cfg Config, limiter *throttle.Limiter, stdout io.Writer) (*bmcmetrics.Metrics, error) {
	if cfg.MetricsListen == "" {
		return nil, nil
	}
	metrics := bmcmetrics.New()
	metrics.WatchLimiter(limiter)
	addr, err := metricsserver.Serve(ctx, cfg.MetricsListen, metrics.Handler())
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "Metrics at http://%s/metrics\n", addr)
	return metrics, nil
}
