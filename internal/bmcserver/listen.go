package bmcserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/go-logr/logr"

	"github.com/virtmetal/virtmetal/internal/certs"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/redfish"
)

// ShutdownTimeout is how long in-flight requests may take to finish once
// Run's context has ended.
const ShutdownTimeout = 10 * time.Second

// listenRedfish opens the Redfish listener, capped per source, and builds
// its server with the timeouts of cfg.Tuning and TLS unless --insecure-http.
func listenRedfish(ctx context.Context, cfg Config, handler http.Handler, log logr.Logger) (*http.Server, net.Listener, string, error) {
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: cfg.Tuning.ReadHeaderTimeout,
		ReadTimeout:       cfg.Tuning.ReadTimeout,
		WriteTimeout:      cfg.Tuning.WriteTimeout,
		IdleTimeout:       cfg.Tuning.IdleTimeout,
		ErrorLog:          stdlog.New(io.Discard, "", 0), // TLS probes and cut slow clients are not errors worth a line each
	}
	scheme := "http"
	if !cfg.InsecureHTTP {
		scheme = "https"
		var err error
		if srv.TLSConfig, err = tlsConfig(ctx, cfg, log); err != nil {
			return nil, nil, "", err
		}
	}
	listener, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, nil, "", err
	}
	return srv, limitPerSource(listener, cfg.MaxConnectionsPerSource, cfg.TrustedProxies), scheme, nil
}

// tlsConfig serves --tls-cert/--tls-key, reloaded when they change, or a
// generated self-signed certificate.
func tlsConfig(ctx context.Context, cfg Config, log logr.Logger) (*tls.Config, error) {
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.TLSCert != "" {
		reloader, err := newCertReloader(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, err
		}
		go reloader.watch(ctx, cfg.Tuning.ReloadEvery, log.WithName("tls"))
		tlsCfg.GetCertificate = reloader.getCertificate
		return tlsCfg, nil
	}
	hosts, err := certs.HostsFor(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	cert, err := certs.SelfSigned(hosts, 365*24*time.Hour, time.Now())
	if err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	tlsCfg.Certificates = []tls.Certificate{cert}
	return tlsCfg, nil
}

// serveUntilDone runs srv until ctx ends, then drains in-flight requests.
func serveUntilDone(ctx context.Context, srv *http.Server, listener net.Listener, log logr.Logger) error {
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
	log.Info("shutting down", "timeout", ShutdownTimeout)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return failure
}

// networkProtocol is what the Managers say of the BMC's services: the
// Redfish port from --listen (unknown for port 0) and, with --ipmi-listen,
// IPMI's port for the machine it serves, the backend's first (startIPMI's
// choice; backend is nil where IPMI cannot be served).
func networkProtocol(ctx context.Context, cfg Config, backend machine.Backend) redfish.NetworkProtocol {
	p := redfish.NetworkProtocol{RedfishPort: listenPort(cfg.Listen), PlainHTTP: cfg.InsecureHTTP, FQDN: cfg.FQDN}
	if cfg.IPMIListen == "" || backend == nil {
		return p
	}
	// A failure here fails startIPMI too, which ends the process.
	if ids, err := backend.Machines(ctx); err == nil && len(ids) > 0 {
		p.IPMIPort, p.IPMIMachine = listenPort(cfg.IPMIListen), ids[0]
	}
	return p
}

// listenPort is the port of a listen address; 0 when none is fixed.
func listenPort(addr string) int {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return 0
	}
	return n
}
