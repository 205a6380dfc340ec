package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime/debug"

	"github.com/go-logr/logr"

	"github.com/virtmetal/virtmetal/internal/bmcmetrics"
	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/internal/vhost"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/redfish"
)

// runShared serves every VM of --vms-dir, each at its own hosts, until ctx
// ends. The first read of the directory happens before the listener opens,
// so the banner can say how many VMs there are; if it fails, the process
// still starts, not ready, and reads again every tune.reloadEvery.
func runShared(ctx context.Context, o options, getenv func(string) string, stdout io.Writer, tune tuning, limiter *throttle.Limiter, metrics *bmcmetrics.Metrics, log logr.Logger) error {
	if getenv("BMC_USERNAME") != "" || getenv("BMC_PASSWORD") != "" {
		return errors.New("BMC_USERNAME/BMC_PASSWORD cannot be used with --vms-dir: each VM's file holds its credentials")
	}
	// main's default memory limit is sized for one VM; a shared server's
	// heap grows with its VMs, and under a limit it would collect without
	// end. GOMEMLIMIT still sets one.
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(math.MaxInt64)
	}
	cfg, err := kubeConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	var observer redfish.Observer
	var intercept machine.Interceptor
	if metrics != nil {
		observer, intercept = metrics, metrics.Intercept
	}
	router, err := vhost.New(vhost.Config{
		Dir: o.vmsDir,
		// Each VM has a backend, and informers, of its own, selected on
		// its name, so the pod's Role can list the VMs by resourceNames.
		// For very large namespaces the next step is one namespace-wide
		// informer shared by the VMs.
		StartBackend: func(ctx context.Context, vm string) (machine.Backend, error) {
			return startKubeVirt(ctx, cfg, o.namespace, vm, log)
		},
		Limiter:        limiter,
		Observer:       observer,
		Intercept:      intercept,
		TrustedProxies: o.trustedProxies,
		Grace:          o.grace,
		Logger:         log,

		EventDestinationsDenied:        o.eventDestinationsDenied,
		EventDestinationsAllowLoopback: o.eventDestinationsAllowLoopback,
	})
	if err != nil {
		return err
	}
	if metrics != nil {
		metrics.WatchReadiness(router)
		metrics.WatchEventStreams(router.EventStreams)
		metrics.WatchEventSubscriptions(router.EventSubscriptions)
	}
	vms, readErr := router.Reload(ctx)
	srv, listener, scheme, err := listen(ctx, o, tune, withHealth(router, router), log)
	if err != nil {
		return err
	}
	srv.RegisterOnShutdown(router.StopEventStreams)
	go router.Run(ctx, tune.reloadEvery)
	fmt.Fprintf(stdout, "Redfish service at %s://%s/redfish/v1/, one virtual host per VM of namespace %s\n", scheme, listener.Addr(), o.namespace)
	if readErr != nil {
		fmt.Fprintf(stdout, "VMs: none yet, %s cannot be read (retrying every %s)\n", o.vmsDir, tune.reloadEvery)
	} else {
		fmt.Fprintf(stdout, "VMs: %d read from %s\n", vms, o.vmsDir)
	}
	return serve(ctx, srv, listener, log)
}
