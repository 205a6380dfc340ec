// Command ceiling-server serves the throughput reference of
// docs/benchmarks.md (internal/ceiling) over HTTPS with a self-signed
// certificate, for load generators such as wrk to compare bmc-server with:
//
//	BMC_USERNAME=u BMC_PASSWORD=p go run ./hack/ceiling-server --listen 127.0.0.1:9443
package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/virtmetal/virtmetal/internal/ceiling"
	"github.com/virtmetal/virtmetal/internal/certs"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "ceiling-server:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "127.0.0.1:9443", "address to serve on")
	flag.Parse()
	user, pass := os.Getenv("BMC_USERNAME"), os.Getenv("BMC_PASSWORD")
	if user == "" || pass == "" {
		return errors.New("set BMC_USERNAME and BMC_PASSWORD")
	}
	hosts, err := certs.HostsFor(*listen)
	if err != nil {
		return err
	}
	cert, err := certs.SelfSigned(hosts, 24*time.Hour, time.Now())
	if err != nil {
		return err
	}
	srv := &http.Server{
		Addr:              *listen,
		Handler:           ceiling.Handler(user, pass),
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}},
		ReadHeaderTimeout: 10 * time.Second,
	}
	fmt.Printf("ceiling at https://%s/\n", *listen)
	return srv.ListenAndServeTLS("", "")
}
