// Package bmcserver is what the bmc-server command runs: a Redfish BMC, and
// optionally an IPMI one, for the machines of one backend, or the Redfish
// BMCs of many VMs of one namespace as virtual hosts. The command parses
// its flags into a Config and calls Run; the messages here name the flags,
// since those are what an operator set.
package bmcserver

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/go-logr/logr"

	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/internal/bmcmetrics"
	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/redfish"
)

// Config is the command's flags, one field each; the flags' help says
// what each does.
type Config struct {
	Backend   string // --backend: "memory" or "kubevirt"
	Machines  int    // --machines, of the memory backend
	Namespace string // --namespace
	VM        string // --vm
	// VMsDir (--vms-dir), when set, serves many VMs as virtual hosts.
	VMsDir           string
	CredentialsDir   string        // --credentials-dir
	CredentialsGrace time.Duration // --credentials-grace

	Listen                  string         // --listen
	FQDN                    string         // --fqdn: the host name clients reach the BMC at
	TLSCert, TLSKey         string         // --tls-cert, --tls-key
	InsecureHTTP            bool           // --insecure-http
	TrustedProxies          []netip.Prefix // --trusted-proxies
	MaxConnectionsPerSource int            // --max-connections-per-source
	IPMIListen              string         // --ipmi-listen
	IPMIV15                 bool           // --ipmi-v15
	MetricsListen           string         // --metrics-listen

	EventDestinationsDenied        []netip.Prefix // --destinations-denied: events and images
	EventDestinationsAllowLoopback bool           // --destinations-allow-loopback

	// Tuning has no flag: tests shorten it.
	Tuning Tuning
}

// Tuning is the HTTP timeouts and the reload interval; a zero field is
// its default.
type Tuning struct {
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// ReloadEvery is how often the credentials, the TLS certificate and
	// the VMs' directory are read again.
	ReloadEvery time.Duration
}

// defaultTuning: a request has 10 s to send its headers and 30 s in all
// (bodies are at most 64 KiB), so a client that declares a body and never
// sends it is cut rather than holding its connection; answers are small and
// quick, so 60 s to write them is generous.
var defaultTuning = Tuning{
	ReadHeaderTimeout: 10 * time.Second,
	ReadTimeout:       30 * time.Second,
	WriteTimeout:      60 * time.Second,
	IdleTimeout:       2 * time.Minute,
	ReloadEvery:       5 * time.Second,
}

func (t Tuning) withDefaults() Tuning {
	return Tuning{
		ReadHeaderTimeout: cmp.Or(t.ReadHeaderTimeout, defaultTuning.ReadHeaderTimeout),
		ReadTimeout:       cmp.Or(t.ReadTimeout, defaultTuning.ReadTimeout),
		WriteTimeout:      cmp.Or(t.WriteTimeout, defaultTuning.WriteTimeout),
		IdleTimeout:       cmp.Or(t.IdleTimeout, defaultTuning.IdleTimeout),
		ReloadEvery:       cmp.Or(t.ReloadEvery, defaultTuning.ReloadEvery),
	}
}

// Run serves cfg until ctx ends, and prints where, and with which
// credentials, to stdout. getenv is the process's environment, for
// BMC_USERNAME, BMC_PASSWORD and GOMEMLIMIT. Run returns nil once ctx has
// ended and requests have drained, or the error of a part that failed: a
// listener that cannot open or stops serving.
func Run(ctx context.Context, cfg Config, getenv func(string) string, stdout io.Writer, log logr.Logger) error {
	cfg.Tuning = cfg.Tuning.withDefaults()
	if cfg.EventDestinationsAllowLoopback {
		// Said once at start: whoever can subscribe can then POST to
		// anything listening on loopback, in a pod its sidecars' ports.
		log.Info("event subscriptions may send to, and images be fetched from, loopback addresses", "destinationsDenied", cfg.EventDestinationsDenied)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// One limiter: a source that fails over Redfish is slowed over IPMI
	// too; serving many VMs, each VM counts in a scope of its own.
	limiter := throttle.New(throttle.Policy{})
	metrics, err := startMetrics(ctx, cfg, limiter, stdout)
	if err != nil {
		return err
	}
	if cfg.VMsDir != "" {
		return serveVirtualHosts(ctx, cfg, getenv, stdout, limiter, metrics, log)
	}
	return serveBackend(ctx, cancel, cfg, getenv, stdout, limiter, metrics, log)
}

// serveBackend serves the machines of one backend, over Redfish and, with
// --ipmi-listen, the first of them over IPMI, until ctx ends or a part
// fails (stop ends ctx with the failure).
func serveBackend(ctx context.Context, stop context.CancelCauseFunc, cfg Config, getenv func(string) string, stdout io.Writer,
	limiter *throttle.Limiter, metrics *bmcmetrics.Metrics, log logr.Logger) error {
	backend, err := newBackend(ctx, cfg, log)
	if err != nil {
		return err
	}
	// One audit log for both protocols; its power and boot actions also
	// go to the backend's own record (KubeVirt: Events on the VM).
	audit := auditlog.New(auditlog.Options{})
	if recorder, ok := backend.(machine.ActionRecorder); ok {
		audit.ForwardActions(ctx, recorder, func(e auditlog.Entry, err error) {
			log.Error(err, "the action is in the BMC's log but not recorded on the VM", "action", e.Message())
		})
	}
	// One console per machine and kind, whichever protocol opens it.
	consoles := &machine.ConsoleSessions{}
	var observer redfish.Observer
	if metrics != nil {
		backend, observer = machine.InterceptBackend(backend, metrics.Intercept), metrics
		metrics.WatchReadiness(backend.(machine.Readiness))
	}
	creds, err := loadCredentials(getenv, cfg.CredentialsDir)
	if err != nil {
		return err
	}
	handler, err := redfish.NewServer(redfish.Config{
		Backend:         backend,
		Accounts:        []redfish.Account{{Username: creds.username, Password: creds.password, Role: redfish.RoleAdministrator}},
		Logger:          log.WithName("redfish"),
		Limiter:         limiter,
		TrustedProxies:  cfg.TrustedProxies,
		Observer:        observer,
		AuditLog:        audit,
		ConsoleSessions: consoles,
		NetworkProtocol: networkProtocol(ctx, cfg, backend),

		EventDestinationsDenied:        cfg.EventDestinationsDenied,
		EventDestinationsAllowLoopback: cfg.EventDestinationsAllowLoopback,
		EventPoll:                      eventPoll(cfg.Backend),
	})
	if err != nil {
		return err
	}
	rotators := []rotator{func(c credentials, grace time.Duration) error {
		return handler.SetAccounts([]redfish.Account{{Username: c.username, Password: c.password, Role: redfish.RoleAdministrator}}, grace)
	}}
	ready, _ := backend.(machine.Readiness)
	srv, listener, scheme, err := listenRedfish(ctx, cfg, withHealth(handler, ready), log)
	if err != nil {
		return err
	}
	if cfg.IPMIListen != "" {
		ipmiSrv, addr, err := startIPMI(ctx, stop, cfg, backend, creds, sharedByProtocols{limiter, audit, consoles}, log.WithName("ipmi"))
		if err != nil {
			listener.Close()
			return err
		}
		rotators = append(rotators, func(c credentials, grace time.Duration) error {
			return ipmiSrv.SetCredentials(c.username, c.password, grace)
		})
		if metrics != nil {
			metrics.WatchIPMI(ipmiSrv.Sessions)
		}
		protocols := "lanplus"
		if cfg.IPMIV15 {
			protocols = "lanplus and lan"
		}
		fmt.Fprintf(stdout, "IPMI (%s) at udp %s\n", protocols, addr)
	}
	if cfg.CredentialsDir != "" {
		go watchCredentials(ctx, cfg.CredentialsDir, creds, cfg.Tuning.ReloadEvery, cfg.CredentialsGrace, log.WithName("credentials"), rotators...)
	}
	srv.RegisterOnShutdown(handler.StopEventStreams)
	if metrics != nil {
		metrics.WatchEventStreams(handler.EventStreams)
		metrics.WatchEventSubscriptions(handler.EventSubscriptions)
	}
	go func() { _ = handler.Run(ctx) }()
	fmt.Fprintf(stdout, "Redfish service at %s://%s/redfish/v1/\n", scheme, listener.Addr())
	fmt.Fprintf(stdout, "Username: %s\n", creds.username)
	if creds.generated {
		fmt.Fprintf(stdout, "Password: %s (generated; set BMC_USERNAME/BMC_PASSWORD or --credentials-dir to choose one)\n", creds.password)
	} else {
		fmt.Fprintf(stdout, "Password: from %s\n", creds.source)
	}
	return serveUntilDone(ctx, srv, listener, log)
}
