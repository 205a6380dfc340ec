package bmcserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime/debug"

	"github.com/go-logr/logr"

	"github.com/virtmetal/virtmetal/internal/bmcmetrics"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/internal/vhost"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/redfish"
)

// serveVirtualHosts serves every VM of --vms-dir, each at its own hosts,
// until ctx ends. The first read of the directory happens before the
// listener opens, so the banner can say how many VMs there are; if it
// fails, the process still starts, not ready, and reads again every
// cfg.Tuning.ReloadEvery.
func serveVirtualHosts(ctx context.Context, cfg Config, getenv func(string) string, stdout io.Writer,
	limiter *throttle.Limiter, metrics *bmcmetrics.Metrics, log logr.Logger) error {
	if getenv("BMC_USERNAME") != "" || getenv("BMC_PASSWORD") != "" {
		return errors.New("BMC_USERNAME/BMC_PASSWORD cannot be used with --vms-dir: each VM's file holds its credentials")
	}
	// The command's default memory limit is sized for one VM; a shared
	// server's heap grows with its VMs, and under a limit it would collect
	// without end. GOMEMLIMIT still sets one.
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(math.MaxInt64)
	}
	restCfg, err := kubeConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	// One VM and one VMI informer for the namespace, whatever the number
	// of VMs served: the shared server's Role lists and watches the
	// namespace's VMs and VMIs, and writes only those it serves.
	informers, err := kubevirt.NewInformers(restCfg, cfg.Namespace, kubevirt.InformersOptions{})
	if err != nil {
		return err
	}
	go informers.Run(ctx)
	var observer redfish.Observer
	var intercept machine.Interceptor
	if metrics != nil {
		observer, intercept = metrics, metrics.Intercept
	}
	router, err := vhost.New(vhost.Config{
		Dir: cfg.VMsDir,
		// Each VM has a backend of its own, reading from the shared
		// informers and told only of its own VM's events.
		StartBackend: func(ctx context.Context, vm string, spec bmcspec.SharedVM) (machine.Backend, error) {
			return startKubeVirt(ctx, restCfg, cfg.Namespace, vm, informers, spec.StateSecret, log)
		},
		Limiter:         limiter,
		Observer:        observer,
		Intercept:       intercept,
		TrustedProxies:  cfg.TrustedProxies,
		Grace:           cfg.CredentialsGrace,
		NetworkProtocol: networkProtocol(ctx, cfg, nil),
		Logger:          log,

		EventDestinationsDenied:        cfg.EventDestinationsDenied,
		EventDestinationsAllowLoopback: cfg.EventDestinationsAllowLoopback,
		EventPoll:                      kubevirtEventPoll,
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
	srv, listener, scheme, err := listenRedfish(ctx, cfg, withHealth(router, router), log)
	if err != nil {
		return err
	}
	srv.RegisterOnShutdown(router.StopEventStreams)
	go router.Run(ctx, cfg.Tuning.ReloadEvery)
	fmt.Fprintf(stdout, "Redfish service at %s://%s/redfish/v1/, one virtual host per VM of namespace %s\n", scheme, listener.Addr(), cfg.Namespace)
	if readErr != nil {
		fmt.Fprintf(stdout, "VMs: none yet, %s cannot be read (retrying every %s)\n", cfg.VMsDir, cfg.Tuning.ReloadEvery)
	} else {
		fmt.Fprintf(stdout, "VMs: %d read from %s\n", vms, cfg.VMsDir)
	}
	return serveUntilDone(ctx, srv, listener, log)
}
