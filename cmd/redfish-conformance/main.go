// Command redfish-conformance checks any Redfish service against the DMTF
// schemas and the protocol rules of DSP0266, and prints pass, warn and fail
// per rule with the URI and reason of each problem (JSON with --json). It
// exits 1 when a rule fails, 2 when the run itself cannot go on.
//
//	REDFISH_USERNAME=admin REDFISH_PASSWORD=... redfish-conformance \
//	    --url https://bmc.example:443 --schemas ../shared/redfish-schemas [--insecure] [--write [--event-listen HOST:PORT]] [--json]
//
// Credentials come from the environment, never the command line, where any
// local user could read them.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/virtmetal/virtmetal/conformance"
	"github.com/virtmetal/virtmetal/conformance/schemacheck"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// errFailed means the service failed a rule; the report says which.
var errFailed = errors.New("conformance failures")

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	err := check(ctx, args, getenv, stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errFailed):
		return 1
	case errors.Is(err, flag.ErrHelp):
		return 2
	}
	fmt.Fprintln(stderr, "redfish-conformance:", err)
	return 2
}

func check(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("redfish-conformance", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "", "the service, scheme://host[:port]")
	schemas := fs.String("schemas", "", "DMTF schema bundle folder with json-schema/ and csdl/ (default: $REDFISH_SCHEMA_DIR or ../shared/redfish-schemas above the module)")
	insecure := fs.Bool("insecure", false, "accept any TLS certificate (BMCs mostly have self-signed ones)")
	writes := fs.Bool("write", false, "also run the checks that write: PATCH a system (writing back the value it read), open an event stream, make a push subscription, send it a test event and delete it")
	eventListen := fs.String("event-listen", "", "with --write, host:port the push subscription's receiver listens on, an address the service can reach (default 127.0.0.1:0, used only for a service on loopback)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	timeout := fs.Duration("timeout", 30*time.Second, "timeout of each request")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" {
		return errors.New("--url is required")
	}
	username, password := getenv("REDFISH_USERNAME"), getenv("REDFISH_PASSWORD")
	if username == "" || password == "" {
		return errors.New("set REDFISH_USERNAME and REDFISH_PASSWORD")
	}
	dir := *schemas
	if dir == "" {
		var err error
		if dir, err = schemacheck.BundleDir(); err != nil {
			return fmt.Errorf("%w; pass --schemas", err)
		}
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = &tls.Config{InsecureSkipVerify: *insecure} //nolint:gosec // the operator's explicit choice
	report, err := conformance.Run(ctx, conformance.Target{
		BaseURL:   *url,
		Client:    &http.Client{Transport: transport, Timeout: *timeout},
		Username:  username,
		Password:  password,
		SchemaDir: dir,
		Writes:    *writes,

		EventListenAddress: *eventListen,
	})
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(report)
	} else {
		err = report.WriteSummary(stdout)
	}
	if err != nil {
		return err
	}
	if report.Failed() {
		return errFailed
	}
	return nil
}
