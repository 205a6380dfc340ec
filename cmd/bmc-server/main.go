// Command bmc-server serves a Redfish BMC for a set of machines.
//
//	bmc-server --backend memory --listen 127.0.0.1:8443 --machines 2
//	bmc-server --backend kubevirt --namespace NS --vm NAME --listen :8443 [--ipmi-listen :623]
//
// Credentials come from BMC_USERNAME/BMC_PASSWORD, or from the files
// username and password in --credentials-dir (a mounted Secret); with
// neither, a password is generated and printed. Passwords are never taken
// from the command line, where any local user could read them.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/virtmetal/virtmetal/internal/certs"
	"github.com/virtmetal/virtmetal/ipmi"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

const shutdownTimeout = 10 * time.Second

func main() {
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
	credentialsDir string
	tlsCert        string
	tlsKey         string
	insecureHTTP   bool
	ipmiListen     string
	verbosity      int
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
	fs.StringVar(&o.credentialsDir, "credentials-dir", "", "directory with files username and password")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "PEM certificate file (default: generated self-signed)")
	fs.StringVar(&o.tlsKey, "tls-key", "", "PEM private key file for --tls-cert")
	fs.BoolVar(&o.insecureHTTP, "insecure-http", false, "serve plain HTTP instead of HTTPS")
	fs.StringVar(&o.ipmiListen, "ipmi-listen", "", "UDP address to serve IPMI on, e.g. :623 (default: off); it serves the first machine")
	fs.IntVar(&o.verbosity, "v", 0, "log verbosity (1 logs every request)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.machines < 1:
		return o, fmt.Errorf("--machines must be at least 1, got %d", o.machines)
	case o.backend == "kubevirt" && (o.namespace == "" || o.vm == ""):
		return o, errors.New("--backend kubevirt needs --namespace and --vm")
	case (o.tlsCert == "") != (o.tlsKey == ""):
		return o, errors.New("--tls-cert and --tls-key go together")
	case o.insecureHTTP && o.tlsCert != "":
		return o, errors.New("--insecure-http and --tls-cert exclude each other")
	}
	return o, nil
}

// newBackend is the one place that picks a backend. The kubevirt backend
// runs its informers until ctx ends; until they have synced it reads from
// the API server, and while that is unreachable Redfish answers 503.
func newBackend(ctx context.Context, o options, log logr.Logger) (machine.Backend, error) {
	switch o.backend {
	case "memory":
		return memory.New(memory.Options{Machines: o.machines}), nil
	case "kubevirt":
		cfg, err := config.GetConfig()
		if err != nil {
			return nil, fmt.Errorf("kubeconfig: %w", err)
		}
		b, err := kubevirt.New(cfg, o.namespace, o.vm, kubevirt.Options{Logger: log.WithName("kubevirt")})
		if err != nil {
			return nil, err
		}
		go func() {
			if err := b.Start(ctx); err != nil {
				log.Error(err, "kubevirt backend stopped")
			}
		}()
		return b, nil
	}
	return nil, fmt.Errorf("unknown --backend %q (supported: memory, kubevirt)", o.backend)
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := funcr.NewJSON(func(obj string) { fmt.Fprintln(stderr, obj) }, funcr.Options{Verbosity: o.verbosity})
	backend, err := newBackend(ctx, o, log)
	if err != nil {
		return err
	}
	creds, err := loadCredentials(getenv, o.credentialsDir)
	if err != nil {
		return err
	}
	handler, err := redfish.NewServer(redfish.Config{
		Backend:  backend,
		Accounts: []redfish.Account{{Username: creds.username, Password: creds.password, Role: redfish.RoleAdministrator}},
		Logger:   log.WithName("redfish"),
	})
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           withProbes(handler, backend),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	scheme := "http"
	if !o.insecureHTTP {
		scheme = "https"
		if srv.TLSConfig, err = tlsConfig(o); err != nil {
			return err
		}
	}
	listener, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	if o.ipmiListen != "" {
		addr, err := startIPMI(ctx, o.ipmiListen, backend, creds, log.WithName("ipmi"))
		if err != nil {
			listener.Close()
			return err
		}
		fmt.Fprintf(stdout, "IPMI (lanplus and lan) at udp %s\n", addr)
	}
	fmt.Fprintf(stdout, "Redfish service at %s://%s/redfish/v1/\n", scheme, listener.Addr())
	fmt.Fprintf(stdout, "Username: %s\n", creds.username)
	if creds.generated {
		fmt.Fprintf(stdout, "Password: %s (generated; set BMC_USERNAME/BMC_PASSWORD or --credentials-dir to choose one)\n", creds.password)
	} else {
		fmt.Fprintf(stdout, "Password: from %s\n", creds.source)
	}
	return serve(ctx, srv, listener, log)
}

// withProbes serves the kubelet's probes, which carry no credentials, beside
// the Redfish service: /healthz while the process serves, /readyz while the
// backend can read its first machine (the kubevirt backend: its VM through
// the API server), so that a BMC that cannot act takes no traffic.
func withProbes(redfishHandler http.Handler, backend machine.Backend) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ids, err := backend.Machines(r.Context())
		if err == nil && len(ids) == 0 {
			err = errors.New("no machine")
		}
		if err == nil {
			_, err = backend.Machine(r.Context(), ids[0])
		}
		if err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.Handle("/", redfishHandler)
	return mux
}

func tlsConfig(o options) (*tls.Config, error) {
	var cert tls.Certificate
	var err error
	if o.tlsCert != "" {
		cert, err = tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
	} else {
		var hosts []string
		if hosts, err = certs.HostsFor(o.listen); err == nil {
			cert, err = certs.SelfSigned(hosts, 365*24*time.Hour, time.Now())
		}
	}
	if err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// startIPMI serves the backend's first machine over IPMI until ctx ends. A
// BMC's IPMI channel belongs to one machine; the memory backend's others are
// reachable through Redfish only.
func startIPMI(ctx context.Context, addr string, backend machine.Backend, creds credentials, log logr.Logger) (net.Addr, error) {
	ids, err := backend.Machines(ctx)
	if err != nil || len(ids) == 0 {
		return nil, fmt.Errorf("IPMI: no machine to serve: %v", err)
	}
	m, err := backend.Machine(ctx, ids[0])
	if err != nil {
		return nil, fmt.Errorf("IPMI: %w", err)
	}
	srv, err := ipmi.NewServer(ipmi.Config{Machine: m, Username: creds.username, Password: creds.password, Logger: log})
	if err != nil {
		return nil, err
	}
	conn, err := net.ListenPacket("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("IPMI: %w", err)
	}
	go func() {
		defer conn.Close()
		if err := srv.Serve(ctx, conn); err != nil {
			log.Error(err, "IPMI server stopped")
		}
	}()
	return conn.LocalAddr(), nil
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
	log.Info("shutting down", "timeout", shutdownTimeout)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
