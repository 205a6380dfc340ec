// Command bmc-server serves a Redfish BMC, and optionally an IPMI one, for
// a set of machines.
//
//	bmc-server --backend memory --listen 127.0.0.1:8443 --machines 2 [--fqdn bmc1.example.org]
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
// Requests made on the BMC's behalf, the EventService's push deliveries
// and the virtual media images the backend's importer fetches, never go
// to link-local, cloud metadata, loopback or the BMC's own addresses (nor
// their NAT64, IPv4-mapped or 6to4 forms), nor to the networks of
// --destinations-denied: give it the cluster's pod and service networks
// (unless the event receiver or image server runs in the cluster), so that
// whoever may subscribe or insert media cannot reach into the cluster
// from the BMC's pod or the importer's. An image's host name is resolved
// first and every address must pass. --destinations-allow-loopback lifts
// the loopback refusal, for a receiver on the BMC's own host. The flags'
// former names, --event-destinations-denied and
// --event-destinations-allow-loopback, still work.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"

	"github.com/virtmetal/virtmetal/internal/bmcserver"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
)

var klogOnce sync.Once

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

// options are the flags: the server's, and the log's verbosity.
type options struct {
	bmcserver.Config
	verbosity int
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
	fs.StringVar(&o.Backend, "backend", "memory", `machine backend: "memory" or "kubevirt"`)
	fs.StringVar(&o.Listen, "listen", "127.0.0.1:8443", "address to serve Redfish on")
	fs.IntVar(&o.Machines, "machines", 1, "number of machines (memory backend)")
	fs.StringVar(&o.Namespace, "namespace", "", "the VirtualMachine's namespace (kubevirt backend)")
	fs.StringVar(&o.VM, "vm", "", "the VirtualMachine's name (kubevirt backend)")
	fs.StringVar(&o.VMsDir, "vms-dir", "", `directory of one file per VM of --namespace, {"username","password","hosts"}: serve each VM at its hosts (kubevirt backend)`)
	fs.StringVar(&o.FQDN, "fqdn", "", "the DNS name clients reach this BMC at, served as its Manager's FQDN and HostName (default: unknown, left out)")
	fs.StringVar(&o.CredentialsDir, "credentials-dir", "", "directory with files username and password")
	fs.StringVar(&o.TLSCert, "tls-cert", "", "PEM certificate file (default: generated self-signed)")
	fs.StringVar(&o.TLSKey, "tls-key", "", "PEM private key file for --tls-cert")
	fs.BoolVar(&o.InsecureHTTP, "insecure-http", false, "serve plain HTTP instead of HTTPS")
	fs.StringVar(&o.IPMIListen, "ipmi-listen", "", "UDP address to serve IPMI on, e.g. :623 (default: off); it serves the first machine")
	fs.BoolVar(&o.IPMIV15, "ipmi-v15", false, "also serve IPMI 1.5 sessions (ipmitool -I lan); off because their MD5 auth codes allow offline password guessing")
	fs.DurationVar(&o.CredentialsGrace, "credentials-grace", 10*time.Minute, "how long the previous password keeps working after --credentials-dir, or a VM's file in --vms-dir, changes it")
	fs.Func("trusted-proxies", "comma-separated CIDRs of reverse proxies whose X-Forwarded-For names the client", prefixList(&o.TrustedProxies))
	fs.Func("destinations-denied", "comma-separated CIDRs that event subscriptions never send to and virtual media images are never fetched from, e.g. the cluster's pod and service networks "+
		"(link-local, metadata services and the BMC's own addresses always are, loopback unless --destinations-allow-loopback)", prefixList(&o.EventDestinationsDenied))
	fs.BoolVar(&o.EventDestinationsAllowLoopback, "destinations-allow-loopback", false,
		"let event subscriptions send to, and images be fetched from, loopback, for a receiver on the BMC's own host or the DMTF Protocol Validator run locally; in a pod, loopback reaches its sidecars")
	// The former names, from when only events were sent.
	fs.Func("event-destinations-denied", "former name of --destinations-denied", prefixList(&o.EventDestinationsDenied))
	fs.BoolVar(&o.EventDestinationsAllowLoopback, "event-destinations-allow-loopback", false, "former name of --destinations-allow-loopback")
	fs.IntVar(&o.MaxConnectionsPerSource, "max-connections-per-source", 32, "connections one client address may hold open (trusted proxies are not capped)")
	fs.StringVar(&o.MetricsListen, "metrics-listen", "", "address to serve Prometheus metrics on at /metrics, plain HTTP without credentials, e.g. :9100 (default: off)")
	fs.IntVar(&o.verbosity, "v", 0, "log verbosity (1 logs every request)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.Machines < 1:
		return o, fmt.Errorf("--machines must be at least 1, got %d", o.Machines)
	case o.VMsDir != "" && o.Backend != "kubevirt":
		return o, errors.New("--vms-dir needs --backend kubevirt")
	case o.VMsDir != "" && o.Namespace == "":
		return o, errors.New("--vms-dir needs --namespace: its VMs are in one namespace")
	case o.VMsDir != "" && o.VM != "":
		return o, errors.New("--vms-dir and --vm exclude each other: the directory names the VMs")
	case o.VMsDir != "" && o.CredentialsDir != "":
		return o, errors.New("--vms-dir and --credentials-dir exclude each other: each VM's file holds its credentials")
	case o.VMsDir != "" && o.FQDN != "":
		return o, errors.New("--vms-dir and --fqdn exclude each other: each VM's file names its host")
	case o.FQDN != "" && !bmcspec.IsDNSName(o.FQDN):
		return o, fmt.Errorf("--fqdn %q is not a lower-case DNS name", o.FQDN)
	case o.VMsDir != "" && o.IPMIListen != "":
		return o, errors.New("--ipmi-listen cannot serve --vms-dir: IPMI has no Host header to tell the VMs apart; serve IPMI with one bmc-server per VM (--vm)")
	case o.Backend == "kubevirt" && o.VMsDir == "" && (o.Namespace == "" || o.VM == ""):
		return o, errors.New("--backend kubevirt needs --namespace and --vm (or --vms-dir)")
	case (o.TLSCert == "") != (o.TLSKey == ""):
		return o, errors.New("--tls-cert and --tls-key go together")
	case o.InsecureHTTP && o.TLSCert != "":
		return o, errors.New("--insecure-http and --tls-cert exclude each other")
	case o.MaxConnectionsPerSource < 1:
		return o, fmt.Errorf("--max-connections-per-source must be at least 1, got %d", o.MaxConnectionsPerSource)
	case o.CredentialsGrace < 0:
		return o, errors.New("--credentials-grace must not be negative")
	}
	return o, nil
}

// run is the command with the default tuning (a zero bmcserver.Tuning).
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return runTuned(ctx, args, getenv, stdout, stderr, bmcserver.Tuning{})
}

func runTuned(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, tune bmcserver.Tuning) error {
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
	o.Tuning = tune
	return bmcserver.Run(ctx, o.Config, getenv, stdout, log)
}
