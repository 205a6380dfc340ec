package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/internal/bmcserver"
	"github.com/virtmetal/virtmetal/internal/poll"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--machines", "0"}, "at least 1"},
		{[]string{"--tls-cert", "c.pem"}, "go together"},
		{[]string{"--insecure-http", "--tls-cert", "c", "--tls-key", "k"}, "exclude"},
		{[]string{"--password", "x"}, "not defined"},
		{[]string{"extra"}, "unexpected"},
		{[]string{"--backend", "kubevirt", "--vm", "node-1"}, "needs --namespace and --vm"},
		{[]string{"--trusted-proxies", "10.0.0.0/8,not-a-cidr"}, "not-a-cidr"},
		{[]string{"--event-destinations-denied", "10.244.0.0/16,not-a-cidr"}, "not-a-cidr"},
		{[]string{"--event-destinations-denied", "10.96.0.1"}, `"10.96.0.1"): no '/'`},
		{[]string{"--event-destinations-denied", "10.96.0.0/33"}, "33"},
		{[]string{"--event-destinations-denied", "10.96.0.0/12,"}, `""`},
		{[]string{"--event-destinations-allow-loopback=maybe"}, "maybe"},
		{[]string{"--max-connections-per-source", "0"}, "at least 1"},
		{[]string{"--credentials-grace", "-1m"}, "negative"},
		{[]string{"--namespace", "ns", "--vms-dir", "d"}, "--vms-dir needs --backend kubevirt"},
		{[]string{"--backend", "memory", "--namespace", "ns", "--vms-dir", "d"}, "--vms-dir needs --backend kubevirt"},
		{[]string{"--backend", "kubevirt", "--vms-dir", "d"}, "--vms-dir needs --namespace"},
		{[]string{"--backend", "kubevirt", "--namespace", "ns", "--vms-dir", "d", "--vm", "web1"}, "--vms-dir and --vm exclude each other"},
		{[]string{"--backend", "kubevirt", "--namespace", "ns", "--vms-dir", "d", "--credentials-dir", "c"}, "--vms-dir and --credentials-dir exclude each other"},
		{[]string{"--backend", "kubevirt", "--namespace", "ns", "--vms-dir", "d", "--ipmi-listen", ":623"}, "IPMI has no Host header"},
		{[]string{"--backend", "kubevirt", "--namespace", "ns"}, "needs --namespace and --vm (or --vms-dir)"},
		{[]string{"--backend", "kubevirt", "--namespace", "ns", "--vms-dir", "d", "--fqdn", "web1.ns.bmc.example.org"}, "--vms-dir and --fqdn exclude each other"},
		{[]string{"--fqdn", "Web1.example.org"}, "not a lower-case DNS name"},
		{[]string{"--fqdn", "web1..example.org"}, "not a lower-case DNS name"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := parseFlags(tt.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error = %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
	for _, args := range [][]string{
		{"--backend", "kubevirt", "--namespace", "ns", "--vm", "web1", "--credentials-dir", "c", "--ipmi-listen", ":623", "--fqdn", "web1.ns.bmc.example.org"},
		{"--backend", "kubevirt", "--namespace", "ns", "--vms-dir", "d", "--credentials-grace", "1m", "--tls-cert", "c", "--tls-key", "k"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			if _, err := parseFlags(args, io.Discard); err != nil {
				t.Errorf("error = %v, want none", err)
			}
		})
	}
}

// TestEventDestinationFlags: the CIDRs events are never sent to, and
// whether loopback is allowed, as parsed; bad CIDRs are TestParseFlags'.
func TestEventDestinationFlags(t *testing.T) {
	tests := []struct {
		name         string
		args         []string
		wantDenied   []netip.Prefix
		wantLoopback bool
	}{
		{name: "defaults"},
		{name: "pod and service networks", args: []string{"--destinations-denied", "10.244.0.0/16,10.96.0.0/12"},
			wantDenied: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.96.0.0/12")}},
		{name: "spaces and IPv6", args: []string{"--event-destinations-denied", " fd00:10:244::/56 , 10.244.0.0/16"},
			wantDenied: []netip.Prefix{netip.MustParsePrefix("fd00:10:244::/56"), netip.MustParsePrefix("10.244.0.0/16")}},
		{name: "repeated flag adds", args: []string{"--destinations-denied", "10.244.0.0/16", "--destinations-denied=192.168.0.0/24"},
			wantDenied: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("192.168.0.0/24")}},
		{name: "former name adds too", args: []string{"--destinations-denied", "10.244.0.0/16", "--event-destinations-denied=192.168.0.0/24"},
			wantDenied: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("192.168.0.0/24")}},
		{name: "one host", args: []string{"--event-destinations-denied", "10.96.0.10/32"}, wantDenied: []netip.Prefix{netip.MustParsePrefix("10.96.0.10/32")}},
		{name: "loopback allowed", args: []string{"--destinations-allow-loopback"}, wantLoopback: true},
		{name: "loopback allowed by the former name", args: []string{"--event-destinations-allow-loopback"}, wantLoopback: true},
		{name: "loopback explicitly refused", args: []string{"--destinations-allow-loopback=false"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags(tt.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(o.EventDestinationsDenied, tt.wantDenied) {
				t.Errorf("denied %v, want %v", o.EventDestinationsDenied, tt.wantDenied)
			}
			if o.EventDestinationsAllowLoopback != tt.wantLoopback {
				t.Errorf("allow loopback %v, want %v", o.EventDestinationsAllowLoopback, tt.wantLoopback)
			}
		})
	}
}

// lockedBuffer collects run's output while the test polls it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRunServesAndShutsDown starts the command on a loopback port, calls it
// over HTTPS and plain HTTP, and stops it as SIGTERM would. --fqdn is the
// Manager's FQDN; without it FQDN and HostName are left out.
func TestRunServesAndShutsDown(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		scheme string
		fqdn   string // what the Manager's NetworkProtocol says; "" none
	}{
		{"self-signed TLS", []string{"--listen", "127.0.0.1:0", "--machines", "3", "--fqdn", "rack1.bmc.example.org"}, "https", "rack1.bmc.example.org"},
		{"plain HTTP", []string{"--listen", "127.0.0.1:0", "--insecure-http"}, "http", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			env := map[string]string{"BMC_USERNAME": "maas", "BMC_PASSWORD": "s3cret"}
			var stdout, stderr lockedBuffer
			done := make(chan error, 1)
			go func() { done <- run(ctx, tt.args, func(k string) string { return env[k] }, &stdout, &stderr) }()

			urlPattern := regexp.MustCompile(`(https?://\S+)/redfish/v1/`)
			var base string
			poll.Until(t, "the URL printed", func() error {
				if m := urlPattern.FindStringSubmatch(stdout.String()); m != nil && strings.Contains(stdout.String(), "Password:") {
					base = m[1]
					return nil
				}
				return fmt.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
			})
			if !strings.HasPrefix(base, tt.scheme+"://") {
				t.Errorf("URL %s, want scheme %s", base, tt.scheme)
			}
			if strings.Contains(stdout.String(), "s3cret") {
				t.Errorf("a configured password was printed: %q", stdout.String())
			}
			client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
			get := func(user, pass string) int {
				req, _ := http.NewRequest("GET", base+"/redfish/v1/Systems", nil)
				if user != "" {
					req.SetBasicAuth(user, pass)
				}
				res, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
				return res.StatusCode
			}
			if got := get("maas", "s3cret"); got != http.StatusOK {
				t.Errorf("with credentials: %d, want 200", got)
			}
			if got := get("", ""); got != http.StatusUnauthorized {
				t.Errorf("without credentials: %d, want 401", got)
			}
			req, _ := http.NewRequest("GET", base+"/redfish/v1/Managers/vm-0/NetworkProtocol", nil)
			req.SetBasicAuth("maas", "s3cret")
			res, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var protocols map[string]any
			err = json.NewDecoder(res.Body).Decode(&protocols)
			res.Body.Close()
			wantHostName, _, _ := strings.Cut(tt.fqdn, ".")
			switch fqdn, hostName := protocols["FQDN"], protocols["HostName"]; {
			case err != nil:
				t.Fatalf("NetworkProtocol: %v", err)
			case tt.fqdn == "" && (fqdn != nil || hostName != nil):
				t.Errorf("FQDN %v, HostName %v without --fqdn; want neither", fqdn, hostName)
			case tt.fqdn != "" && (fqdn != tt.fqdn || hostName != wantHostName):
				t.Errorf("FQDN %v, HostName %v; want %s and %s", fqdn, hostName, tt.fqdn, wantHostName)
			}
			// The Deployment's probes carry no credentials.
			for _, probe := range []string{"/healthz", "/readyz"} {
				res, err := client.Get(base + probe)
				if err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					t.Errorf("%s: %d, want 200", probe, res.StatusCode)
				}
			}
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("run returned %v after shutdown", err)
				}
			case <-time.After(bmcserver.ShutdownTimeout + time.Second):
				t.Fatal("run did not return after the context ended")
			}
		})
	}
}

// TestIPMIListen checks the wiring of --ipmi-listen: the IPMI server answers
// on the printed address, and stops with the process.
func TestIPMIListen(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env := map[string]string{"BMC_USERNAME": "maas", "BMC_PASSWORD": "s3cret"}
	var stdout, stderr lockedBuffer
	done := make(chan error, 1)
	args := []string{"--listen", "127.0.0.1:0", "--insecure-http", "--ipmi-listen", "127.0.0.1:0"}
	go func() { done <- run(ctx, args, func(k string) string { return env[k] }, &stdout, &stderr) }()

	addrPattern := regexp.MustCompile(`IPMI \(lanplus\) at udp (\S+)`)
	var addr string
	poll.Until(t, "the IPMI address printed", func() error {
		if m := addrPattern.FindStringSubmatch(stdout.String()); m != nil {
			addr = m[1]
			return nil
		}
		return fmt.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
	})
	conn, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Get Channel Authentication Capabilities, outside a session, as every
	// IPMI client sends first: RMCP header, IPMI 1.5 session header with
	// auth type none, then the message (rsAddr, netFn/LUN, checksum, rqAddr,
	// rqSeq, cmd 0x38, channel 0x0e with the v2.0 bit, privilege 4, checksum).
	request := []byte{0x06, 0x00, 0xff, 0x07, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0x09,
		0x20, 0x18, 0xc8, 0x81, 0x00, 0x38, 0x8e, 0x04, 0xb5}
	if _, err := conn.Write(request); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	reply := make([]byte, 256)
	n, err := conn.Read(reply)
	if err != nil {
		t.Fatalf("no IPMI answer: %v", err)
	}
	// The completion code follows the 14-byte headers and 6 message bytes.
	if n < 21 || reply[19] != 0x38 || reply[20] != 0x00 {
		t.Fatalf("answer % x is not a successful Get Channel Authentication Capabilities", reply[:n])
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run returned %v after shutdown", err)
	}
}
