// Package metricsserver serves Prometheus metrics on a listener of their
// own: plain HTTP, no credentials, /metrics only, for a scraper on the pod
// network. The commands' main ports (Redfish, the webhooks) stay apart.
package metricsserver

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Timeouts of the metrics server: a scrape is one short GET.
const (
	readHeaderTimeout = 10 * time.Second
	requestTimeout    = 30 * time.Second
)

// Serve serves handler at GET /metrics on addr until ctx ends, and returns
// the address it listens on.
func Serve(ctx context.Context, addr string, handler http.Handler) (net.Addr, error) {
	listener, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", handler)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: requestTimeout, WriteTimeout: requestTimeout}
	go func() { _ = srv.Serve(listener) }()
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	return listener.Addr(), nil
}
