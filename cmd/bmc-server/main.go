// Command bmc-server serves a Redfish BMC, and optionally an IPMI one, for
// a set of machines.
//
//	bmc-server --backend memory --listen 127.0.0.1:8443 --machines 2
//	bmc-server --backend kubevirt --namespace NS --vm NAME --listen :8443 [--ipmi-listen :623]
//	bmc-server --backend kubevirt --namespace NS --vms-dir /etc/virtmetal/vms --listen :8443
//
// The third form serves many VMs of one namespace from one process, each as
// a virtual host: every file of --vms-dir (a mounted Secret) named after a
// VM holds {"username": ..., "password": ..., "hosts": [...]}, and a request
// whose Host is one of a VM's hosts reaches a Redfish service of that VM
// alone, with that VM's credentials only; other hosts get 404. The
// directory is re-read while running: new files start serving, removed
// ones stop, changed passwords rotate with --credentials-grace. IPMI, which
// has no Host to tell VMs apart, is served by the second form only.
//
// Otherwise credentials come from BMC_USERNAME/BMC_PASSWORD, or from the files
// username and password in --credentials-dir (a mounted Secret, re-read
// while running: a rotated password takes over at once and the previous
// one keeps working for --credentials-grace); with neither, a random
// username and password are generated and printed. Passwords are never
// taken from the command line, where any local user could read them.
//
// At start the listeners open before the backend is reachable: the
// KubeVirt backend syncs its cache in the background, and until it has
// (or while its API server is unreachable) /readyz, Redfish (503) and IPMI
// ("node busy") say so. /healthz answers as long as the process runs. Failed
// logins throttle the source address over both protocols. The process exits
// non-zero if a listener fails.
//
// The EventService's push subscriptions never send to link-local, cloud
// metadata, loopback or the BMC's own addresses, nor to the networks of
// --event-destinations-denied: give it the cluster's pod and service
// networks (unless the event receiver runs in the cluster), so that whoever
// may subscribe cannot POST into the cluster from the BMC's pod.
// --event-destinations-allow-loopback lifts the loopback refusal, for a
// receiver on the BMC's own host.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/virtmetal/virtmetal/deploy/bmc"
	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/internal/certs"
	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/ipmi"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

const shutdownTimeout = 10 * time.Second

var klogOnce sync.Once

// tuning is what tests shorten: the HTTP timeouts and the reload interval.
type tuning struct {
	readHeaderTimeout, readTimeout, writeTimeout, idleTimeout time.Duration
	reloadEvery                                               time.Duration
}

// defaultTuning: a request has 10 s to send its headers and 30 s in all
// (bodies are at most 64 KiB), so a client that declares a body and never
// sends it is cut rather than holding its connection; answers are small and
// quick, so 60 s to write them is generous.
var defaultTuning = tuning{
	readHeaderTimeout: 10 * time.Second,
	readTimeout:       30 * time.Second,
	writeTimeout:      60 * time.Second,
	idleTimeout:       2 * time.Minute,
	reloadEvery:       5 * time.Second,
}

// defaultMemoryLimit is the Go runtime's soft memory limit unless
// GOMEMLIMIT sets one: a BMC runs per VM, its live heap is a few MB, and
// without a limit the heap grows to twice that under load before the
// collector runs.
const defaultMemoryLimit = 16 << 20

func main() {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bmc-server:", err)
		os.Exit(1)
	}
}

type options struct {
	backend        string
	listen         string
	machines       int
	namespace      string
	vm             string
	vmsDir         string
	credentialsDir string
	tlsCert        string
	tlsKey         string
	insecureHTTP   bool
	ipmiListen     string
	ipmiV15        bool
	grace          time.Duration
	trustedProxies []netip.Prefix
	maxConns       int
	metricsListen  string
	verbosity      int

	eventDestinationsDenied        []netip.Prefix
	eventDestinationsAllowLoopback bool
}

// prefixList is a flag.Func that appends comma-separated CIDRs to dst, so
// that a repeated flag adds to the list.
func prefixList(dst *[]netip.Prefix) func(string) error {
	return func(v string) error {
		for _, cidr := range strings.Split(v, ",") {
			p, err := netip.ParsePrefix(strings.TrimSpace(cidr))
			if err != nil {
				return err
			}
			*dst = append(*dst, p)
		}
		return nil
	}
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("bmc-server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.backend, "backend", "memory", `machine backend: "memory" or "kubevirt"`)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8443", "address to serve Redfish on")
	fs.IntVar(&o.machines, "machines", 1, "number of machines (memory backend)")
	fs.StringVar(&o.namespace, "namespace", "", "the VirtualMachine's namespace (kubevirt backend)")
	fs.StringVar(&o.vm, "vm", "", "the VirtualMachine's name (kubevirt backend)")
	fs.StringVar(&o.vmsDir, "vms-dir", "", `directory of one file per VM of --namespace, {"username","password","hosts"}: serve each VM at its hosts (kubevirt backend)`)
	fs.StringVar(&o.credentialsDir, "credentials-dir", "", "directory with files username and password")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "PEM certificate file (default: generated self-signed)")
	fs.StringVar(&o.tlsKey, "tls-key", "", "PEM private key file for --tls-cert")
	fs.BoolVar(&o.insecureHTTP, "insecure-http", false, "serve plain HTTP instead of HTTPS")
	fs.StringVar(&o.ipmiListen, "ipmi-listen", "", "UDP address to serve IPMI on, e.g. :623 (default: off); it serves the first machine")
	fs.BoolVar(&o.ipmiV15, "ipmi-v15", false, "also serve IPMI 1.5 sessions (ipmitool -I lan); off because their MD5 auth codes allow offline password guessing")
	fs.DurationVar(&o.grace, "credentials-grace", 10*time.Minute, "how long the previous password keeps working after --credentials-dir, or a VM's file in --vms-dir, changes it")
	fs.Func("trusted-proxies", "comma-separated CIDRs of reverse proxies whose X-Forwarded-For names the client", prefixList(&o.trustedProxies))
	fs.Func("event-destinations-denied", "comma-separated CIDRs that event subscriptions never send to, e.g. the cluster's pod and service networks "+
		"(link-local, metadata services and the BMC's own addresses always are, loopback unless --event-destinations-allow-loopback)", prefixList(&o.eventDestinationsDenied))
	fs.BoolVar(&o.eventDestinationsAllowLoopback, "event-destinations-allow-loopback", false,
		"let event subscriptions send to loopback, for a receiver on the BMC's own host or the DMTF Protocol Validator run locally; in a pod, loopback reaches its sidecars")
	fs.IntVar(&o.maxConns, "max-connections-per-source", 32, "connections one client address may hold open (trusted proxies are not capped)")
	fs.StringVar(&o.metricsListen, "metrics-listen", "", "address to serve Prometheus metrics on at /metrics, plain HTTP without credentials, e.g. :9100 (default: off)")
	fs.IntVar(&o.verbosity, "v", 0, "log verbosity (1 logs every request)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.machines < 1:
		return o, fmt.Errorf("--machines must be at least 1, got %d", o.machines)
	case o.vmsDir != "" && o.backend != "kubevirt":
		return o, errors.New("--vms-dir needs --backend kubevirt")
	case o.vmsDir != "" && o.namespace == "":
		return o, errors.New("--vms-dir needs --namespace: its VMs are in one namespace")
	case o.vmsDir != "" && o.vm != "":
		return o, errors.New("--vms-dir and --vm exclude each other: the directory names the VMs")
	case o.vmsDir != "" && o.credentialsDir != "":
		return o, errors.New("--vms-dir and --credentials-dir exclude each other: each VM's file holds its credentials")
	case o.vmsDir != "" && o.ipmiListen != "":
		return o, errors.New("--ipmi-listen cannot serve --vms-dir: IPMI has no Host header to tell the VMs apart; serve IPMI with one bmc-server per VM (--vm)")
	case o.backend == "kubevirt" && o.vmsDir == "" && (o.namespace == "" || o.vm == ""):
		return o, errors.New("--backend kubevirt needs --namespace and --vm (or --vms-dir)")
	case (o.tlsCert == "") != (o.tlsKey == ""):
		return o, errors.New("--tls-cert and --tls-key go together")
	case o.insecureHTTP && o.tlsCert != "":
		return o, errors.New("--insecure-http and --tls-cert exclude each other")
	case o.maxConns < 1:
		return o, fmt.Errorf("--max-connections-per-source must be at least 1, got %d", o.maxConns)
	case o.grace < 0:
		return o, errors.New("--credentials-grace must not be negative")
	}
	return o, nil
}

// newBackend is the one place that picks a backend. The kubevirt backend
// runs its informers until ctx ends; it contacts no API server here, so the
// process starts while the API server is down, and the backend reports
// itself not ready until its cache has synced and while the API server is
// unreachable.
func newBackend(ctx context.Context, o options, log logr.Logger) (machine.Backend, error) {
	switch o.backend {
	case "memory":
		return memory.New(memory.Options{Machines: o.machines}), nil
	case "kubevirt":
		cfg, err := kubeConfig()
		if err != nil {
			return nil, fmt.Errorf("kubeconfig: %w", err)
		}
		return startKubeVirt(ctx, cfg, o.namespace, o.vm, log)
	}
	return nil, fmt.Errorf("unknown --backend %q (supported: memory, kubevirt)", o.backend)
}

// startKubeVirt starts the kubevirt backend of one VM, which runs its
// informers until ctx ends.
func startKubeVirt(ctx context.Context, cfg *rest.Config, namespace, vm string, log logr.Logger) (machine.Backend, error) {
	b, err := kubevirt.New(cfg, namespace, vm, kubevirt.Options{Logger: log.WithName("kubevirt"), StateSecret: bmc.StateSecretName(vm)})
	if err != nil {
		return nil, err
	}
	go func() {
		if err := b.Start(ctx); err != nil {
			log.Error(err, "kubevirt backend stopped", "vm", vm)
		}
	}()
	return b, nil
}

// kubeConfig finds the API server as kubectl does ($KUBECONFIG, else
// ~/.kube/config), else as a pod (its ServiceAccount). Like
// controller-runtime's clients, it sends without a client-side rate limit:
// the API server's priority and fairness protects it, and a limit of a few
// requests a second would queue MaaS's power actions behind one another.
func kubeConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, err
	}
	cfg.QPS = -1
	return cfg, nil
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return runTuned(ctx, args, getenv, stdout, stderr, defaultTuning)
}

func runTuned(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, tune tuning) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := funcr.NewJSON(func(obj string) { fmt.Fprintln(stderr, obj) }, funcr.Options{Verbosity: o.verbosity})
	// client-go reports what goes wrong inside its informers through klog:
	// one log stream, one format. klog's logger is the process's, so the
	// first run sets it (tests run several in one process, whose earlier
	// informers may still be logging).
	klogOnce.Do(func() { klog.SetLogger(log.WithName("client-go")) })
	if o.eventDestinationsAllowLoopback {
		// Said once at start: whoever can subscribe can then POST to
		// anything listening on loopback, in a pod its sidecars' ports.
		log.Info("event subscriptions may send to loopback addresses", "eventDestinationsDenied", o.eventDestinationsDenied)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// One limiter: a source that fails over Redfish is slowed over IPMI
	// too, and, serving many VMs, on every VM's host.
	limiter := throttle.New(throttle.Policy{})
	metrics, err := startMetrics(ctx, o, limiter, stdout)
	if err != nil {
		return err
	}
	if o.vmsDir != "" {
		return runShared(ctx, o, getenv, stdout, tune, limiter, metrics, log)
	}
	backend, err := newBackend(ctx, o, log)
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
	var observer redfish.Observer
	if metrics != nil {
		backend, observer = machine.InterceptBackend(backend, metrics.Intercept), metrics
		metrics.WatchReadiness(backend.(machine.Readiness))
	}
	creds, err := loadCredentials(getenv, o.credentialsDir)
	if err != nil {
		return err
	}
	handler, err := redfish.NewServer(redfish.Config{
		Backend:        backend,
		Accounts:       []redfish.Account{{Username: creds.username, Password: creds.password, Role: redfish.RoleAdministrator}},
		Logger:         log.WithName("redfish"),
		Limiter:        limiter,
		TrustedProxies: o.trustedProxies,
		Observer:       observer,
		AuditLog:       audit,

		EventDestinationsDenied:        o.eventDestinationsDenied,
		EventDestinationsAllowLoopback: o.eventDestinationsAllowLoopback,
	})
	if err != nil {
		return err
	}
	rotators := []rotator{func(c credentials, grace time.Duration) error {
		return handler.SetAccounts([]redfish.Account{{Username: c.username, Password: c.password, Role: redfish.RoleAdministrator}}, grace)
	}}
	ready, _ := backend.(machine.Readiness)
	srv, listener, scheme, err := listen(ctx, o, tune, withHealth(handler, ready), log)
	if err != nil {
		return err
	}
	if o.ipmiListen != "" {
		ipmiSrv, addr, err := startIPMI(ctx, cancel, o, backend, creds, limiter, audit, log.WithName("ipmi"))
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
		if o.ipmiV15 {
			protocols = "lanplus and lan"
		}
		fmt.Fprintf(stdout, "IPMI (%s) at udp %s\n", protocols, addr)
	}
	if o.credentialsDir != "" {
		go watchCredentials(ctx, o.credentialsDir, creds, tune.reloadEvery, o.grace, log.WithName("credentials"), rotators...)
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
	return serve(ctx, srv, listener, log)
}

// listen opens the Redfish listener, capped per source, and builds its
// server with the timeouts of tune and TLS unless --insecure-http.
func listen(ctx context.Context, o options, tune tuning, handler http.Handler, log logr.Logger) (*http.Server, net.Listener, string, error) {
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: tune.readHeaderTimeout,
		ReadTimeout:       tune.readTimeout,
		WriteTimeout:      tune.writeTimeout,
		IdleTimeout:       tune.idleTimeout,
		ErrorLog:          stdlog.New(io.Discard, "", 0), // TLS probes and cut slow clients are not errors worth a line each
	}
	scheme := "http"
	if !o.insecureHTTP {
		scheme = "https"
		var err error
		if srv.TLSConfig, err = tlsConfig(ctx, o, tune, log); err != nil {
			return nil, nil, "", err
		}
	}
	listener, err := net.Listen("tcp", o.listen)
	if err != nil {
		return nil, nil, "", err
	}
	return srv, limitPerSource(listener, o.maxConns, o.trustedProxies), scheme, nil
}

// tlsConfig serves --tls-cert/--tls-key, reloaded when they change, or a
// generated self-signed certificate.
func tlsConfig(ctx context.Context, o options, tune tuning, log logr.Logger) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.tlsCert != "" {
		reloader, err := newCertReloader(o.tlsCert, o.tlsKey)
		if err != nil {
			return nil, err
		}
		go reloader.watch(ctx, tune.reloadEvery, log.WithName("tls"))
		cfg.GetCertificate = reloader.getCertificate
		return cfg, nil
	}
	hosts, err := certs.HostsFor(o.listen)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	cert, err := certs.SelfSigned(hosts, 365*24*time.Hour, time.Now())
	if err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	cfg.Certificates = []tls.Certificate{cert}
	return cfg, nil
}

// startIPMI serves the backend's first machine over IPMI until ctx ends. A
// BMC's IPMI channel belongs to one machine; the memory backend's others are
// reachable through Redfish only. The machine is looked up per call, so
// IPMI starts (answering "node busy") while the backend cannot answer yet.
// If serving fails, stop ends the process with the error: half a BMC that
// looks whole is worse than a restart.
func startIPMI(ctx context.Context, stop context.CancelCauseFunc, o options, backend machine.Backend, creds credentials, limiter *throttle.Limiter, audit *auditlog.Log, log logr.Logger) (*ipmi.Server, net.Addr, error) {
	ids, err := backend.Machines(ctx)
	if err != nil || len(ids) == 0 {
		return nil, nil, fmt.Errorf("IPMI: no machine to serve: %v", err)
	}
	srv, err := ipmi.NewServer(ipmi.Config{
		Machine:   &lazyMachine{backend: backend, id: ids[0]},
		Username:  creds.username,
		Password:  creds.password,
		EnableV15: o.ipmiV15,
		Limiter:   limiter,
		AuditLog:  audit,
		Logger:    log,
	})
	if err != nil {
		return nil, nil, err
	}
	conn, err := net.ListenPacket("udp", o.ipmiListen)
	if err != nil {
		return nil, nil, fmt.Errorf("IPMI: %w", err)
	}
	go func() {
		defer conn.Close()
		if err := srv.Serve(ctx, conn); err != nil {
			stop(err)
		}
	}()
	return srv, conn.LocalAddr(), nil
}

// serve runs srv until ctx ends, then drains in-flight requests.
func serve(ctx context.Context, srv *http.Server, listener net.Listener, log logr.Logger) error {
	errc := make(chan error, 1)
	go func() {
		if srv.TLSConfig != nil {
			errc <- srv.ServeTLS(listener, "", "")
		} else {
			errc <- srv.Serve(listener)
		}
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// A cause other than the caller's own cancellation is a failed part
	// of the BMC (the IPMI listener): stop serving and report it.
	failure := context.Cause(ctx)
	if errors.Is(failure, context.Canceled) {
		failure = nil
	}
	log.Info("shutting down", "timeout", shutdownTimeout)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return failure
}
