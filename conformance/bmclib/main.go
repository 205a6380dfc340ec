// Command bmclib-flow drives one BMC through bmclib's redfish provider, as
// Tinkerbell's rufio does: sessions, power state, power off and on, and a
// one-time PXE boot. conformance/bmclib_test.go builds and runs it and
// checks the wire and the backend.
//
// It is a module of its own: bmclib v2 imports gofish's redfish and common
// packages, which gofish v0.26 (virtmetal's) no longer has, so the two
// cannot share a build.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/bmc-toolbox/bmclib/v2"
)

// step is one bmclib call and what it returned.
type step struct {
	Call   string `json:"call"`
	Result string `json:"result,omitempty"`
	Error  string `json:"error,omitempty"`
}

func main() {
	rawURL := flag.String("url", "", "the BMC's base URL (https://host:port)")
	user := flag.String("username", "", "the BMC account")
	bootOnly := flag.Bool("boot-only", false, "only set the one-time PXE boot")
	flag.Parse()
	steps, err := run(*rawURL, *user, os.Getenv("REDFISH_PASSWORD"), *bootOnly)
	out := map[string]any{"steps": steps}
	if err != nil {
		out["error"] = err.Error()
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
	if err != nil {
		os.Exit(1)
	}
}

func run(rawURL, user, pass string, bootOnly bool) ([]step, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The BMC's certificate is self-signed, as rufio's BMCs' usually are.
	httpClient := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec
	client := bmclib.NewClient(host, user, pass, bmclib.WithRedfishPort(port), bmclib.WithHTTPClient(httpClient))
	// Only the redfish provider: the others would probe IPMI and vendor APIs.
	client.Registry.Drivers = client.Registry.For("gofish")

	var steps []step
	record := func(call, result string, err error) error {
		s := step{Call: call, Result: result}
		if err != nil {
			s.Error = err.Error()
		}
		steps = append(steps, s)
		if err != nil {
			return fmt.Errorf("%s: %w", call, err)
		}
		return nil
	}
	if err := record("Open", "", client.Open(ctx)); err != nil {
		return steps, err
	}
	defer func() { _ = client.Close(ctx) }()
	if bootOnly {
		ok, err := client.SetBootDevice(ctx, "pxe", false, false)
		return steps, record("SetBootDevice pxe", fmt.Sprint(ok), err)
	}

	state, err := client.GetPowerState(ctx)
	if err := record("GetPowerState", state, err); err != nil {
		return steps, err
	}
	for _, want := range []string{"off", "on"} {
		if want == "on" {
			// One-time PXE boot, Legacy firmware (efiBoot=false), as rufio
			// asks for it unless told UEFI.
			ok, err := client.SetBootDevice(ctx, "pxe", false, false)
			if err := record("SetBootDevice pxe", fmt.Sprint(ok), err); err != nil {
				return steps, err
			}
		}
		ok, err := client.SetPowerState(ctx, want)
		if err := record("SetPowerState "+want, fmt.Sprint(ok), err); err != nil {
			return steps, err
		}
		if err := waitPower(ctx, client, want); err != nil {
			return steps, record("GetPowerState until "+want, "", err)
		}
		if err := record("GetPowerState until "+want, want, nil); err != nil {
			return steps, err
		}
	}
	return steps, nil
}

func waitPower(ctx context.Context, client *bmclib.Client, want string) error {
	for {
		state, err := client.GetPowerState(ctx)
		if err == nil && strings.EqualFold(state, want) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("power state %q (%v), want %q: %w", state, err, want, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
