// Command reconciler keeps the MaaS machines of virtmetal VMs in shape: it
// binds each machine to the enrolled VM its hardware proves it is, then sets
// BMC credentials from the VM's Secret, hostname, resource pool,
// commissioning of New machines, and reports the machine in the
// VirtualMachineBMC status (see package maas).
//
//	reconciler --maas-url http://maas:5240/MAAS --domain bmc.example.org --once
//
// The MaaS API key comes from --maas-api-key-file (a mounted Secret) or the
// MAAS_API_KEY environment variable, never from the command line. Without
// --once it runs every --interval until SIGTERM; --once runs one cycle (for a
// CronJob), prints the machines that failed and exits non-zero when the
// cycle failed as a whole (MaaS or the API server unreachable or refusing the
// lists) or, after doing every other machine's work, when a machine has met
// the same problem in --fail-after consecutive cycles (the count is kept in
// the VirtualMachineBMC status, so it spans the CronJob's runs). A
// commission MaaS refused is tried again after --commission-backoff,
// doubling up to --max-commission-backoff. --dry-run prints what would
// change and changes nothing in MaaS or Kubernetes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr/funcr"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/virtmetal/virtmetal/internal/metricsserver"
	"github.com/virtmetal/virtmetal/maas"
)

// ErrRecurring is --once's failure when a machine's problem recurs.
var ErrRecurring = errors.New("problems recur")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr, kubeCluster); err != nil {
		fmt.Fprintln(os.Stderr, "reconciler:", err)
		os.Exit(1)
	}
}

type options struct {
	maasURL        string
	maasAPIKeyFile string
	domain         string
	interval       time.Duration
	maxBackoff     time.Duration
	once           bool
	failAfter      int
	commission     struct{ backoff, maxBackoff time.Duration }
	dryRun         bool
	metricsListen  string
	concurrency    int
	verbosity      int
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("reconciler", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.maasURL, "maas-url", getenv("MAAS_URL"), "MaaS URL, e.g. http://maas:5240/MAAS (env MAAS_URL)")
	fs.StringVar(&o.maasAPIKeyFile, "maas-api-key-file", getenv("MAAS_API_KEY_FILE"), "file holding the MaaS API key (env MAAS_API_KEY_FILE; else env MAAS_API_KEY holds the key)")
	fs.StringVar(&o.domain, "domain", getenv("VIRTMETAL_BMC_DOMAIN"), "DNS domain of the BMCs, <vm>.<namespace>.<domain> (env VIRTMETAL_BMC_DOMAIN)")
	fs.DurationVar(&o.interval, "interval", time.Minute, "time between cycles")
	fs.DurationVar(&o.maxBackoff, "max-backoff", 10*time.Minute, "longest wait after repeated failed cycles")
	fs.BoolVar(&o.once, "once", false, "run one cycle and exit, non-zero when it failed as a whole or a machine's problem recurs (--fail-after)")
	fs.IntVar(&o.failAfter, "fail-after", 3, "with --once, exit non-zero when a machine has met the same problem in this many consecutive cycles (0: never)")
	fs.DurationVar(&o.commission.backoff, "commission-backoff", maas.DefaultCommissionBackoff, "wait after MaaS refused to commission a machine, doubling with each refusal")
	fs.DurationVar(&o.commission.maxBackoff, "max-commission-backoff", maas.DefaultMaxCommissionBackoff, "longest wait between refused commissions")
	fs.BoolVar(&o.dryRun, "dry-run", false, "print what would change; change nothing")
	fs.StringVar(&o.metricsListen, "metrics-listen", "", "without --once, address to serve Prometheus metrics on at /metrics, plain HTTP, e.g. :9100 (default: off)")
	fs.IntVar(&o.concurrency, "concurrency", maas.DefaultConcurrency, "machines worked on at once in a cycle; each machine's steps stay in order")
	fs.IntVar(&o.verbosity, "v", 0, "log verbosity")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.maasURL == "":
		return o, errors.New("--maas-url (or MAAS_URL) is required")
	case !validDomain(o.domain):
		return o, fmt.Errorf("--domain (or VIRTMETAL_BMC_DOMAIN) must be a DNS name, got %q", o.domain)
	case o.interval <= 0:
		return o, fmt.Errorf("--interval must be positive, got %v", o.interval)
	case o.once && o.metricsListen != "":
		return o, errors.New("--metrics-listen needs the loop mode: a --once run ends before a scrape (its \"cycle done\" log line is its summary)")
	case o.concurrency < 1:
		return o, fmt.Errorf("--concurrency must be 1 or more, got %d", o.concurrency)
	case o.failAfter < 0:
		return o, fmt.Errorf("--fail-after must be 0 or more, got %d", o.failAfter)
	case o.commission.backoff <= 0 || o.commission.maxBackoff < o.commission.backoff:
		return o, fmt.Errorf("--commission-backoff must be positive and at most --max-commission-backoff, got %v and %v",
			o.commission.backoff, o.commission.maxBackoff)
	}
	return o, nil
}

func validDomain(domain string) bool {
	if domain == "" || len(domain) > 253 {
		return false
	}
	for label := range strings.SplitSeq(domain, ".") {
		if !maas.IsDNSLabel(label) {
			return false
		}
	}
	return true
}

// loadAPIKey reads the key from the file, else from MAAS_API_KEY. Errors
// name the source, never the key.
func loadAPIKey(o options, getenv func(string) string) (maas.APIKey, error) {
	if o.maasAPIKeyFile != "" {
		data, err := os.ReadFile(o.maasAPIKeyFile)
		if err != nil {
			return maas.APIKey{}, fmt.Errorf("reading MaaS API key: %w", err)
		}
		key, err := maas.ParseAPIKey(string(data))
		if err != nil {
			return maas.APIKey{}, fmt.Errorf("%s: %w", o.maasAPIKeyFile, err)
		}
		return key, nil
	}
	if value := getenv("MAAS_API_KEY"); value != "" {
		key, err := maas.ParseAPIKey(value)
		if err != nil {
			return maas.APIKey{}, fmt.Errorf("MAAS_API_KEY: %w", err)
		}
		return key, nil
	}
	return maas.APIKey{}, errors.New("no MaaS API key: set --maas-api-key-file or MAAS_API_KEY")
}

// kubeCluster connects to the cluster the usual way (in-cluster config,
// KUBECONFIG or ~/.kube/config).
func kubeCluster() (maas.Cluster, error) {
	cfg, err := config.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes config: %w", err)
	}
	return maas.NewKubeCluster(cfg)
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, newCluster func() (maas.Cluster, error)) error {
	o, err := parseFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	key, err := loadAPIKey(o, getenv)
	if err != nil {
		return err
	}
	maasClient, err := maas.NewClient(o.maasURL, key, nil)
	if err != nil {
		return err
	}
	cluster, err := newCluster()
	if err != nil {
		return err
	}
	log := funcr.NewJSON(func(obj string) { fmt.Fprintln(stderr, obj) }, funcr.Options{Verbosity: o.verbosity})
	r := &maas.Reconciler{
		MaaS:    maasClient,
		Cluster: cluster,
		Domain:  o.domain,
		DryRun:  o.dryRun,
		Out:     stdout,
		Log:     log.WithName("maas"),

		CommissionBackoff:    o.commission.backoff,
		MaxCommissionBackoff: o.commission.maxBackoff,
		Concurrency:          o.concurrency,
	}
	if o.once {
		result, err := r.Reconcile(ctx)
		if err != nil {
			return err
		}
		for _, f := range result.Failures {
			fmt.Fprintln(stderr, "reconciler: failed:", f)
		}
		if o.failAfter == 0 {
			return nil
		}
		recurring := result.Recurring(o.failAfter)
		for _, p := range recurring {
			fmt.Fprintln(stderr, "reconciler: recurring:", p)
		}
		if len(recurring) > 0 {
			return fmt.Errorf("%d machine problems met in %d or more consecutive cycles: %w", len(recurring), o.failAfter, ErrRecurring)
		}
		return nil
	}
	if o.metricsListen != "" {
		r.Metrics = maas.NewMetrics()
		addr, err := metricsserver.Serve(ctx, o.metricsListen, r.Metrics.Handler())
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "Metrics at http://%s/metrics\n", addr)
	}
	return r.Run(ctx, o.interval, o.maxBackoff)
}
