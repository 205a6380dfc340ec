// Command bmc-controller gives every KubeVirt VM of an opted-in namespace a
// BMC: a VirtualMachineBMC, its credentials and its bmc-server workload, and
// an identity the guest can trust (SMBIOS serial and UUID, MACs), stamped at
// admission by its webhook and repaired by its reconcile loop.
//
//	bmc-controller --domain bmc.example.org
//
// --bmc-image defaults to the bmc-server image of the controller's own
// version (virtmetal/bmc-server:VERSION, see internal/version; a build
// without a version says virtmetal/bmc-server:dev).
// With --webhook-port 0 it runs without the webhook server (clusters without
// webhook networking): identities are then set by the reconcile loop, before
// a VM's next start. --config NAMESPACE/NAME names a ConfigMap whose keys
// (namespaceSelector, domain, ingressClass, tlsIssuer, tlsClusterIssuer,
// ipmiDefault, bmcImage, workload, destinationsDenied, networkPolicy,
// networkPolicyIngressNamespaces, networkPolicyAPIServer,
// networkPolicyEventDestinations) override the
// flags while the controller runs. --workload shared serves the Redfish-only BMCs of a namespace from
// one bmc-server instead of one per VM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/controllers"
	"github.com/virtmetal/virtmetal/controllers/vmidentity"
	"github.com/virtmetal/virtmetal/internal/kubescheme"
	"github.com/virtmetal/virtmetal/internal/version"
)

func main() {
	ctx := ctrl.SetupSignalHandler()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bmc-controller:", err)
		os.Exit(1)
	}
}

type options struct {
	controller              controllers.Config
	namespaceSelector       string
	macRange                string
	configMap               string
	kubeconfig              string
	metricsAddress          string
	probeAddress            string
	leaderElect             bool
	leaderElectionNamespace string
	webhookHost             string
	webhookPort             int
	webhookCertDir          string
	maxConcurrentReconciles int
	kubeAPIQPS              float64
	kubeAPIBurst            int
	cacheSyncTimeout        time.Duration
	shutdownTimeout         time.Duration
	zap                     zap.Options
}

// bmcServerRepository is bmc-server's image without its tag, as `make
// images` and deploy/ name it.
const bmcServerRepository = "virtmetal/bmc-server"

// defaultBMCImage is the bmc-server image of a controller of version v: the
// two are built and released together, so a controller starts the BMCs it
// was tested with unless told otherwise (the flag, or the ConfigMap's
// bmcImage, which deploy/ sets so that kustomize can rename it).
func defaultBMCImage(v string) string { return bmcServerRepository + ":" + v }

func parseFlags(args []string, stderr io.Writer) (options, error) {
	return parseFlagsOf(version.Get(), args, stderr)
}

// parseFlagsOf parses args as a controller of version v does.
func parseFlagsOf(v string, args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("bmc-controller", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &o.controller
	fs.StringVar(&c.Domain, "domain", "", "DNS domain of the BMCs: <vm>.<namespace>.<domain> (required)")
	fs.StringVar(&o.namespaceSelector, "namespace-selector", "virtmetal.io/enabled=true", "label selector of the namespaces whose VMs get a BMC")
	fs.StringVar(&c.IngressClass, "ingress-class", "", "ingressClassName of BMC Ingresses (default: the cluster's default class)")
	fs.StringVar(&c.Issuer, "tls-issuer", "", "cert-manager Issuer (in each VM's namespace) of BMC Ingress certificates")
	fs.StringVar(&c.ClusterIssuer, "tls-cluster-issuer", "", "cert-manager ClusterIssuer of BMC Ingress certificates")
	fs.BoolVar(&c.IPMIDefault, "ipmi-default", false, "serve IPMI for VirtualMachineBMCs that do not say")
	fs.StringVar(&c.BMCImage, "bmc-image", defaultBMCImage(v), "container image of bmc-server; the default is the one of this controller's version")
	fs.StringVar((*string)(&c.Workload), "workload", string(controllers.WorkloadPodPerVM), `how BMCs run: "pod-per-vm" (a bmc-server per VM) or "shared" (one per namespace for the VMs without IPMI)`)
	denied := func(v string) error {
		networks, err := controllers.ParseNetworks(v)
		c.EventDestinationsDenied = append(c.EventDestinationsDenied, networks...)
		return err
	}
	fs.Func("destinations-denied", "comma-separated CIDRs no bmc-server sends events to nor has images fetched from: the cluster's pod and service networks, so that a tenant's subscription or virtual media cannot reach another's pods or the cluster's services", denied)
	fs.Func("event-destinations-denied", "former name of --destinations-denied", denied)
	fs.Func("trusted-proxies", "comma-separated CIDRs of the Ingress controller (its pods, or its nodes with hostNetwork), at most /24 or /120 each and never covering a network of --destinations-denied: every bmc-server takes the client from their X-Forwarded-For, to throttle failed logins per client", func(v string) error {
		networks, err := controllers.ParseNetworks(v)
		c.TrustedProxies = append(c.TrustedProxies, networks...)
		return err
	})
	fs.StringVar(&o.macRange, "mac-range", "02:00:00:00:00:00-02:00:00:ff:ff:ff", `locally administered MACs for interfaces without one, "START-END"; "" assigns none (KubeMacPool)`)
	fs.StringVar(&o.configMap, "config", "", "NAMESPACE/NAME of a ConfigMap that overrides these flags at run time")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, then $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&o.metricsAddress, "metrics-bind-address", ":8080", `Prometheus metrics address; "0" turns it off`)
	fs.StringVar(&o.probeAddress, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "elect one active controller among replicas")
	fs.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's)")
	fs.StringVar(&o.webhookHost, "webhook-host", "", "address the webhook server listens on (default: every interface)")
	fs.IntVar(&o.webhookPort, "webhook-port", 9443, "port of the admission webhook server; 0 runs without it")
	fs.StringVar(&o.webhookCertDir, "webhook-cert-dir", "", "folder with tls.crt and tls.key of the webhook server (default: controller-runtime's)")
	fs.IntVar(&o.maxConcurrentReconciles, "max-concurrent-reconciles", 8, "reconciles in parallel, per controller")
	// Enrolling a cluster's existing VMs costs about ten writes each; the
	// API server's priority and fairness, not a client-side trickle,
	// protects it.
	fs.Float64Var(&o.kubeAPIQPS, "kube-api-qps", 1000, "requests per second to the API server")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", 2000, "burst of requests to the API server")
	fs.DurationVar(&o.cacheSyncTimeout, "cache-sync-timeout", 2*time.Minute, "how long the caches may take to read the cluster before the controller gives up and exits (a missing permission never syncs)")
	fs.DurationVar(&o.shutdownTimeout, "graceful-shutdown-timeout", 30*time.Second, "how long running reconciles may take to finish after SIGTERM")
	o.zap.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	selector, err := labels.Parse(o.namespaceSelector)
	if err != nil {
		return o, fmt.Errorf("--namespace-selector: %w", err)
	}
	c.NamespaceSelector = selector
	if err := c.Validate(); err != nil {
		return o, err
	}
	if o.configMap != "" && len(strings.Split(o.configMap, "/")) != 2 {
		return o, fmt.Errorf("--config must be NAMESPACE/NAME, got %q", o.configMap)
	}
	if o.cacheSyncTimeout <= 0 || o.shutdownTimeout <= 0 {
		return o, errors.New("--cache-sync-timeout and --graceful-shutdown-timeout must be positive")
	}
	if o.webhookPort < 0 || o.webhookPort > 65535 {
		return o, fmt.Errorf("--webhook-port must be 0 to 65535, got %d", o.webhookPort)
	}
	return o, nil
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	var macs vmidentity.MACRange
	if o.macRange != "" {
		if macs, err = vmidentity.ParseMACRange(o.macRange); err != nil {
			return fmt.Errorf("--mac-range: %w", err)
		}
	}
	var configMap types.NamespacedName
	if o.configMap != "" {
		namespace, name, _ := strings.Cut(o.configMap, "/")
		configMap = types.NamespacedName{Namespace: namespace, Name: name}
	}
	o.zap.DestWriter = stderr
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.zap)))

	restConfig, err := restConfigFor(o.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	restConfig.QPS, restConfig.Burst = float32(o.kubeAPIQPS), o.kubeAPIBurst
	scheme := kubescheme.New()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   controllers.CacheOptions(configMap),
		Metrics:                 metricsserver.Options{BindAddress: o.metricsAddress},
		HealthProbeBindAddress:  o.probeAddress,
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        "bmc-controller.virtmetal.io",
		LeaderElectionNamespace: o.leaderElectionNamespace,
		WebhookServer:           webhookServer(o),
		GracefulShutdownTimeout: &o.shutdownTimeout,
	})
	if err != nil {
		return err
	}
	return start(ctx, mgr, o, macs, configMap)
}

func restConfigFor(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return config.GetConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

func webhookServer(o options) webhook.Server {
	if o.webhookPort == 0 {
		return nil
	}
	return webhook.NewServer(webhook.Options{Host: o.webhookHost, Port: o.webhookPort, CertDir: o.webhookCertDir})
}

func start(ctx context.Context, mgr ctrl.Manager, o options, macs vmidentity.MACRange, configMap types.NamespacedName) error {
	source := &controllers.ConfigSource{Defaults: o.controller, ConfigMap: configMap, Reader: mgr.GetClient()}
	stamper := &vmidentity.Stamper{Reader: mgr.GetClient(), MACs: macs}
	if err := vmidentity.SetupIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	enrolment, err := controllers.Setup(mgr, controllers.Options{
		Config: source, Identity: stamper, MaxConcurrentReconciles: o.maxConcurrentReconciles,
	})
	if err != nil {
		return err
	}
	stamper.Enrolled = enrolment.Enrolled
	if o.webhookPort != 0 {
		stamper.SetupWebhooks(mgr)
		if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
			return err
		}
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	return runManager(ctx, mgr, o.cacheSyncTimeout, o.shutdownTimeout)
}

// runManager runs mgr until ctx ends, and gives up when its caches do not
// sync within syncTimeout. A cache that cannot list what it watches (a
// permission missing from the ClusterRole) never syncs, and controller-runtime
// then neither reconciles nor stops: its manager waits for the caches
// without end, even after SIGTERM. So the process stops by itself, saying
// why, rather than idling Ready with nothing reconciled, and a stop that
// takes longer than the shutdown timeout leaves the manager behind.
func runManager(ctx context.Context, mgr ctrl.Manager, syncTimeout, shutdownTimeout time.Duration) error {
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	go func() {
		syncCtx, cancel := context.WithTimeout(ctx, syncTimeout)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(syncCtx) && ctx.Err() == nil {
			stop(fmt.Errorf("the caches did not sync within %s: the log says which list the API server refused or could not answer", syncTimeout))
		}
	}()
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		select {
		case err = <-done:
		case <-time.After(shutdownTimeout + 5*time.Second):
			err = fmt.Errorf("the manager did not stop within %s", shutdownTimeout)
		}
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
