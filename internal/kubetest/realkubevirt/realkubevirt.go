// Package realkubevirt starts a test cluster that runs KubeVirt's real
// control plane: kube-apiserver and etcd (the envtest binaries of
// internal/kubetest), KubeVirt's virt-api and virt-controller (built by
// hack/setup-kubevirt.sh) with what virt-operator would install for them.
// machine/kubevirt, conformance, cmd/bmc-server and the lab run on it
// (issue 22). Start takes about 15 s on 2 cores (kube-apiserver 4 s, CRDs
// 3-5 s, virt-api 5-7 s).
//
// What runs, for real:
//   - etcd and kube-apiserver, configured for the aggregation layer
//     (front-proxy CA and client certificate, --requestheader-* flags,
//     --enable-aggregator-routing) and for ServiceAccount tokens
//     (TokenRequest), with RBAC authorization;
//   - every KubeVirt CRD, the RBAC of virt-api, virt-controller and
//     virt-handler and KubeVirt's cluster roles, virt-api's APIServices
//     (v1 and v1alpha3.subresources.kubevirt.io) and its mutating and
//     validating webhook configurations: all printed by virt-operator's own
//     generators (hack/kubevirt-manifests, run by hack/setup-kubevirt.sh into
//     the binaries' folder, manifests/);
//   - virt-api, reached by kube-apiserver through the Service kubevirt/virt-api
//     (for the APIServices and the webhooks alike), and virt-controller with
//     leader election; each runs with a token of its own ServiceAccount
//     (kubevirt-apiserver, kubevirt-controller), not as admin.
//
// What is made by hand, as virt-operator would: namespace kubevirt, the
// KubeVirt CR (feature gates from Options, status.phase "Deployed" written
// through the status subresource: virt-controller and virt-api ignore a CR
// without a phase), the ConfigMap kubevirt-ca, the selector-less Service
// virt-api with an EndpointSlice of virt-api's address, the certificates
// (CAs and leaves made in Go, in Cluster.Dir), the KubeVirt CR's default
// architecture (virt-operator's GOARCH; without it virt-api refuses every
// VMI).
//
// What does not run: no scheduler, no kubelet, no kube-controller-manager,
// no virt-handler, no virt-operator, no guest. Without a Node (StartNode),
// virt-launcher pods stay Pending and VMIs in Scheduling. StartNode starts
// a node stand-in (node.go) for the scheduler, the kubelet and virt-handler
// of one Node: it binds and "runs" virt-launcher pods and writes VMI status
// with a virt-handler token bound to a pod on that Node, so virt-api's node
// restriction holds, and answers virt-handler's console server for every
// node (consoles.go): virt-api's console and vnc subresources reach
// sim/console's serial console and screen of each running VMI. Namespaces
// are never finalized (create fresh ones);
// the ServiceAccount admission plugin is off (no token controller makes
// "default" accounts).
//
// Known gaps: virt-controller logs, at level "fatal" but keeps running,
// that /etc/virt-controller/exportca and /etc/virt-controller/backupca do
// not exist (fixed paths, no flags): VM export and backup have no CA here.
//
// Networking: an EndpointSlice may not hold a loopback address, so the
// cluster runs in a network namespace made for it (see netns.go): etcd,
// kube-apiserver, virt-api and virt-controller run inside it (ip netns exec),
// kube-apiserver and virt-api listen on the namespace's veth address in
// 198.51.100.0/24, and the test process reaches kube-apiserver there through
// the veth pair. That needs root; without it Start fails and says so. No
// traffic leaves the host. The processes die with the test binary
// (Pdeathsig); a namespace and folder a killed binary left are removed
// when their slot is next used.
//
// Use, from a TestMain (CI runs as root; hack/test.sh exports
// KUBEBUILDER_ASSETS and VIRTMETAL_KUBEVIRT_BIN):
//
//	c, err := realkubevirt.Start(ctx, realkubevirt.Options{})
//	node, err := c.StartNode(ctx, "node01", realkubevirt.NodeOptions{}) // optional
//	... c.Client, c.ConfigFor(user), c.KubeConfigFor(user), node.ShutdownGuest ...
//	c.Stop()
package realkubevirt

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/virtmetal/virtmetal/internal/kubescheme"
	"github.com/virtmetal/virtmetal/internal/kubetest"
)

// Namespace is where KubeVirt's components live (virt-api and
// virt-controller have no flag for it: outside a pod they use "kubevirt").
const Namespace = "kubevirt"

// KubeVirtVersion is the version of the binaries and manifests.
const KubeVirtVersion = "1.9.0"

const (
	apiServerPort      = 6443
	virtAPIPort        = 8443
	virtControllerPort = 8182
)

// DefaultFeatureGates are the KubeVirt feature gates the kubevirt backend
// uses: DeclarativeHotplugVolumes lets a running VM see an inserted CD-ROM.
var DefaultFeatureGates = []string{"DeclarativeHotplugVolumes"}

// Options chooses how the cluster starts.
type Options struct {
	// FeatureGates of the KubeVirt CR; DefaultFeatureGates when nil.
	FeatureGates []string
	// WithoutCDI leaves out CDI's DataVolume CRD, as on a cluster without
	// CDI.
	WithoutCDI bool
	// KeepDir leaves the folder of certificates, kubeconfigs and logs in
	// place after Stop (its path is Cluster.Dir), until a later cluster
	// uses the same network namespace slot. A failed Start always keeps it.
	KeepDir bool
	// Logf, when set, hears how long each step of Start took.
	Logf func(format string, args ...any)
}

// Cluster is a running cluster.
type Cluster struct {
	// Dir holds the certificates, kubeconfigs and each process's log
	// (NAME.log).
	Dir string
	// Config authenticates as a cluster admin (system:masters).
	Config *rest.Config
	// Client is an admin client with kubescheme's types.
	Client client.Client
	// Kube is an admin clientset.
	Kube kubernetes.Interface

	opts      Options
	ns        *netns
	clientCA  *ca
	servingCA *ca
	procs     []*proc
	nodes     []*Node
	keepDir   bool
	// consoles is virt-handler's console server (consoles.go).
	consoles consoles
}

// Start starts the cluster. On error it stops what it started.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if opts.FeatureGates == nil {
		opts.FeatureGates = DefaultFeatureGates
	}
	if err := canMakeNetns(); err != nil {
		return nil, err
	}
	assets, err := kubetest.AssetsDir()
	if err != nil {
		return nil, err
	}
	kvBin, err := BinDir()
	if err != nil {
		return nil, err
	}
	ns, err := newNetns()
	if err != nil {
		return nil, err
	}
	// The folder is the slot's: one a killed test binary left behind is
	// removed here, when its slot is used again.
	dir := filepath.Join(os.TempDir(), "realkubevirt-"+ns.Name)
	if err := os.RemoveAll(dir); err != nil {
		ns.close()
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		ns.close()
		return nil, err
	}
	c = &Cluster{Dir: dir, ns: ns, opts: opts, keepDir: opts.KeepDir}
	defer func() {
		if err != nil {
			c.keepDir = true // the logs say why
			err = fmt.Errorf("%w (logs in %s)", err, dir)
			_ = c.Stop()
			c = nil
		}
	}()
	for _, step := range []struct {
		name string
		run  func() error
	}{
		{"etcd and kube-apiserver", func() error { return c.startAPIServer(ctx, assets) }},
		{"CRDs, RBAC, KubeVirt CR", func() error { return c.install(ctx, kvBin) }},
		{"virt-api (registered)", func() error { return c.startVirtAPI(ctx, kvBin) }},
		{"virt-controller (leading)", func() error { return c.startVirtController(ctx, kvBin, time.Time{}) }},
	} {
		t0 := time.Now()
		if err = step.run(); err != nil {
			return c, err
		}
		if opts.Logf != nil {
			opts.Logf("realkubevirt: %s in %v", step.name, time.Since(t0).Round(time.Millisecond))
		}
	}
	return c, nil
}

// BinDir is where hack/setup-kubevirt.sh put virt-api, virt-controller and
// manifests/: VIRTMETAL_KUBEVIRT_BIN, else its default folder.
func BinDir() (string, error) {
	dir := os.Getenv("VIRTMETAL_KUBEVIRT_BIN")
	if dir == "" {
		if os.Getenv("CI") == "true" {
			return "", errors.New("VIRTMETAL_KUBEVIRT_BIN is not set: run hack/setup-kubevirt.sh and export its output")
		}
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache")
		}
		dir = filepath.Join(cache, "virtmetal", "kubevirt", KubeVirtVersion)
	}
	for _, f := range []string{"virt-api", "virt-controller", "manifests/crds.yaml", "manifests/rbac.yaml", "manifests/virt-api.yaml"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return "", fmt.Errorf("%s missing in %s (run hack/setup-kubevirt.sh): %w", f, dir, err)
		}
	}
	return dir, nil
}

// --- kube-apiserver and etcd ----------------------------------------------------

func (c *Cluster) startAPIServer(ctx context.Context, assets string) error {
	var err error
	if c.clientCA, err = newCA("realkubevirt-client-ca"); err != nil {
		return err
	}
	if c.servingCA, err = newCA("realkubevirt-serving-ca"); err != nil {
		return err
	}
	frontProxyCA, err := newCA("realkubevirt-front-proxy-ca")
	if err != nil {
		return err
	}
	d := c.Dir
	for name, pem := range map[string][]byte{"client-ca.crt": c.clientCA.certPEM, "serving-ca.crt": c.servingCA.certPEM, "front-proxy-ca.crt": frontProxyCA.certPEM} {
		if err := os.WriteFile(filepath.Join(d, name), pem, 0o600); err != nil {
			return err
		}
	}
	serving, err := c.servingCA.issue("kube-apiserver", nil, []string{c.ns.IP, "127.0.0.1", "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "10.96.0.1"}, true, false)
	if err != nil {
		return err
	}
	servingCrt, servingKey, err := serving.write(d, "apiserver")
	if err != nil {
		return err
	}
	proxyClient, err := frontProxyCA.issue("front-proxy-client", nil, nil, false, true)
	if err != nil {
		return err
	}
	proxyCrt, proxyKey, err := proxyClient.write(d, "front-proxy-client")
	if err != nil {
		return err
	}
	saPub, saKey, err := serviceAccountKey(d)
	if err != nil {
		return err
	}

	etcdDir := filepath.Join(d, "etcd")
	if _, err := c.start("etcd", filepath.Join(assets, "etcd"),
		"--data-dir", etcdDir,
		"--listen-client-urls", "http://127.0.0.1:2379",
		"--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380",
		"--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "default=http://127.0.0.1:2380",
		"--unsafe-no-fsync",
	); err != nil {
		return err
	}
	if _, err := c.start("kube-apiserver", filepath.Join(assets, "kube-apiserver"),
		"--etcd-servers", "http://127.0.0.1:2379",
		"--bind-address", "0.0.0.0",
		"--secure-port", strconv.Itoa(apiServerPort),
		"--advertise-address", c.ns.IP,
		"--endpoint-reconciler-type", "none",
		"--service-cluster-ip-range", "10.96.0.0/16",
		"--tls-cert-file", servingCrt,
		"--tls-private-key-file", servingKey,
		"--client-ca-file", filepath.Join(d, "client-ca.crt"),
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", saPub,
		"--service-account-signing-key-file", saKey,
		"--disable-admission-plugins", "ServiceAccount",
		"--allow-privileged=true",
		"--requestheader-client-ca-file", filepath.Join(d, "front-proxy-ca.crt"),
		"--requestheader-allowed-names", "front-proxy-client",
		"--requestheader-extra-headers-prefix", "X-Remote-Extra-",
		"--requestheader-group-headers", "X-Remote-Group",
		"--requestheader-username-headers", "X-Remote-User",
		"--proxy-client-cert-file", proxyCrt,
		"--proxy-client-key-file", proxyKey,
		"--enable-aggregator-routing=true",
	); err != nil {
		return err
	}

	if c.Config, err = c.ConfigFor("realkubevirt-admin", "system:masters"); err != nil {
		return err
	}
	if c.Kube, err = kubernetes.NewForConfig(c.Config); err != nil {
		return err
	}
	if c.Client, err = client.New(c.Config, client.Options{Scheme: kubescheme.New()}); err != nil {
		return err
	}
	return c.waitFor(ctx, time.Minute, "kube-apiserver ready", func() error {
		_, err := c.Kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	})
}

// HostIP is the host's address as the cluster's network namespace sees it
// (the host end of the veth pair): a server of the test that kube-apiserver
// must reach, an admission webhook's, listens there.
func (c *Cluster) HostIP() string { return c.ns.HostIP }

// RestartAPIServer stops kube-apiserver (SIGTERM, as a rolling upgrade of
// the control plane does) and starts it again with the same flags, port
// and certificates; etcd and virt-api keep running, and every config and
// kubeconfig handed out stays valid: clients see a pause. virt-controller
// exits when it cannot renew its leader Lease in time, as it does in a
// cluster, where its Deployment starts it again: so does this, and it
// returns once virt-controller leads again.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	i := slices.IndexFunc(c.procs, func(p *proc) bool { return p.name == "kube-apiserver" })
	if i < 0 {
		return errors.New("kube-apiserver is not running")
	}
	p := c.procs[i]
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(2 * time.Minute):
		_ = p.cmd.Process.Kill()
		<-p.done
	case <-ctx.Done():
		return ctx.Err()
	}
	c.procs = slices.Delete(c.procs, i, i+1)
	_ = os.Rename(p.log, filepath.Join(c.Dir, fmt.Sprintf("kube-apiserver.%d.log", time.Now().UnixNano())))
	apiServer, err := c.start(p.name, p.bin, p.args...)
	if err != nil {
		return err
	}
	if err := poll(ctx, time.Minute, func() (bool, error) {
		select {
		case <-apiServer.done:
			return false, fmt.Errorf("kube-apiserver exited (%v); its log ends:\n%s", apiServer.err, c.LogTail("kube-apiserver", 30))
		default:
		}
		_, err := c.Kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("waiting for kube-apiserver ready again: %w", err)
	}
	ready := time.Now()
	restart := false
	if err := poll(ctx, 30*time.Second, func() (bool, error) {
		if c.exited("virt-controller") {
			restart = true
			return true, nil
		}
		return c.leading(ctx, ready) == nil, nil
	}); err != nil || !restart {
		if err != nil {
			return fmt.Errorf("waiting for virt-controller to lead again or exit: %w", err)
		}
		return nil
	}
	return c.RestartVirtController(ctx)
}

// errPollTimeout is poll's answer when the timeout passed first.
var errPollTimeout = errors.New("timed out")

// poll calls done every 200 ms until it is true or fails, or the timeout
// passes (errPollTimeout).
func poll(ctx context.Context, timeout time.Duration, done func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return errPollTimeout
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// exited says whether the named process of the cluster has exited.
func (c *Cluster) exited(name string) bool {
	for _, p := range c.procs {
		if p.name == name {
			select {
			case <-p.done:
				return true
			default:
			}
		}
	}
	return false
}

// ConfigFor returns a rest.Config that authenticates, by a client
// certificate, as the named user in the given groups; RBAC applies to it.
func (c *Cluster) ConfigFor(user string, groups ...string) (*rest.Config, error) {
	l, err := c.clientCA.issue(user, groups, nil, false, true)
	if err != nil {
		return nil, err
	}
	return &rest.Config{
		Host: fmt.Sprintf("https://%s:%d", c.ns.IP, apiServerPort),
		TLSClientConfig: rest.TLSClientConfig{
			CAData: c.servingCA.certPEM, CertData: l.certPEM, KeyData: l.keyPEM,
		},
		QPS: 100, Burst: 200,
	}, nil
}

// KubeConfigFor returns a kubeconfig file's content for ConfigFor's user,
// for a program under test that loads its configuration the usual way; it
// reaches kube-apiserver at the network namespace's address, as the test
// process does.
func (c *Cluster) KubeConfigFor(user string, groups ...string) ([]byte, error) {
	cfg, err := c.ConfigFor(user, groups...)
	if err != nil {
		return nil, err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	return clientcmd.Write(*kc)
}

// serviceAccountConfig gets a token of a ServiceAccount in Namespace by the
// TokenRequest API, and writes a kubeconfig with it, for a component that
// runs inside the network namespace (it reaches kube-apiserver on loopback).
func (c *Cluster) serviceAccountConfig(ctx context.Context, sa string) (kubeconfig string, cfg *rest.Config, err error) {
	tr, err := c.Kube.CoreV1().ServiceAccounts(Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](48 * 3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", nil, fmt.Errorf("token of ServiceAccount %s: %w", sa, err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: fmt.Sprintf("https://127.0.0.1:%d", apiServerPort), CertificateAuthorityData: c.servingCA.certPEM}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	kubeconfig = filepath.Join(c.Dir, sa+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		return "", nil, err
	}
	cfg = &rest.Config{
		Host:            c.Config.Host,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.servingCA.certPEM},
		BearerToken:     tr.Status.Token,
		QPS:             100, Burst: 200,
	}
	return kubeconfig, cfg, nil
}

// --- what virt-operator would install ------------------------------------------

func (c *Cluster) install(ctx context.Context, kvBin string) error {
	if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}); err != nil {
		return err
	}
	crds, err := readManifests(filepath.Join(kvBin, "manifests", "crds.yaml"))
	if err != nil {
		return err
	}
	rbac, err := readManifests(filepath.Join(kvBin, "manifests", "rbac.yaml"))
	if err != nil {
		return err
	}
	for _, o := range append(crds, rbac...) {
		if err := c.Client.Create(ctx, o); err != nil {
			return fmt.Errorf("creating %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	// CDI's DataVolume and virtmetal's own CRDs, as the envtest clusters
	// have them; KubeVirt's are the manifests' above.
	ours, err := kubetest.CRDs(kubetest.Options{WithoutCDI: c.opts.WithoutCDI})
	if err != nil {
		return err
	}
	names := []string{}
	for _, crd := range crds {
		names = append(names, crd.GetName())
	}
	if !c.opts.WithoutCDI {
		ours = append(ours, cdiCompanionCRDs()...)
	}
	for _, crd := range ours {
		obj, err := k8sruntime.DefaultUnstructuredConverter.ToUnstructured(crd)
		if err != nil {
			return err
		}
		u := &unstructured.Unstructured{Object: obj}
		u.SetAPIVersion("apiextensions.k8s.io/v1")
		u.SetKind("CustomResourceDefinition")
		switch err := c.Client.Create(ctx, u); {
		case apierrors.IsAlreadyExists(err):
		case err != nil:
			return fmt.Errorf("creating CRD %s: %w", crd.Name, err)
		default:
			names = append(names, crd.Name)
		}
	}
	for _, name := range names {
		if err := c.waitFor(ctx, 30*time.Second, "CRD "+name+" established", func() error {
			u := &unstructured.Unstructured{}
			u.SetAPIVersion("apiextensions.k8s.io/v1")
			u.SetKind("CustomResourceDefinition")
			if err := c.Client.Get(ctx, client.ObjectKey{Name: name}, u); err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, cond := range conds {
				m, _ := cond.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
			return errors.New("not established")
		}); err != nil {
			return err
		}
	}

	// The KubeVirt CR, deployed as far as virt-api and virt-controller can tell.
	kv := &kubevirtv1.KubeVirt{
		ObjectMeta: metav1.ObjectMeta{Name: "kubevirt", Namespace: Namespace},
		Spec: kubevirtv1.KubeVirtSpec{Configuration: kubevirtv1.KubeVirtConfiguration{
			DeveloperConfiguration: &kubevirtv1.DeveloperConfiguration{FeatureGates: c.opts.FeatureGates},
			// virt-operator sets it from its own GOARCH; without it virt-api
			// refuses every VMI ("unsupported architecture: ").
			ArchitectureConfiguration: &kubevirtv1.ArchConfiguration{DefaultArchitecture: runtime.GOARCH},
		}},
	}
	if err := c.Client.Create(ctx, kv); err != nil {
		return fmt.Errorf("creating the KubeVirt CR: %w", err)
	}
	kv.Status.Phase = kubevirtv1.KubeVirtPhaseDeployed
	kv.Status.DefaultArchitecture = runtime.GOARCH
	kv.Status.ObservedKubeVirtVersion = "v" + KubeVirtVersion
	kv.Status.TargetKubeVirtVersion = "v" + KubeVirtVersion
	if err := c.Client.Status().Update(ctx, kv); err != nil {
		return fmt.Errorf("setting the KubeVirt CR's phase: %w", err)
	}
	// The CA virt-api would trust for virt-handler's connections: there is
	// no virt-handler, so the serving CA stands in.
	if err := c.Client.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "kubevirt-ca", Namespace: Namespace},
		Data:       map[string]string{"ca-bundle": string(c.servingCA.certPEM)},
	}); err != nil {
		return err
	}
	// virt-api's Service, selector-less, and its endpoint: the namespace's
	// address, where virt-api listens.
	if err := c.Client.Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "virt-api", Namespace: Namespace},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: "https", Port: 443, TargetPort: intstr.FromInt32(virtAPIPort), Protocol: corev1.ProtocolTCP,
		}}},
	}); err != nil {
		return err
	}
	if err := c.Client.Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "virt-api", Namespace: Namespace, Labels: map[string]string{
			discoveryv1.LabelServiceName: "virt-api",
			discoveryv1.LabelManagedBy:   "realkubevirt",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{c.ns.IP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To[int32](virtAPIPort), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}); err != nil {
		return err
	}
	return nil
}

// cdiCompanionCRDs are the CDI kinds virt-controller watches once the
// DataVolume API exists (CDI, CDIConfig, DataSource, StorageProfile): without
// them its caches never sync and it acts on no VM. Nothing here creates
// such objects, so their schemas accept anything.
func cdiCompanionCRDs() []*apiextensionsv1.CustomResourceDefinition {
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, k := range []struct {
		kind, plural string
		scope        apiextensionsv1.ResourceScope
	}{
		{"CDI", "cdis", apiextensionsv1.ClusterScoped},
		{"CDIConfig", "cdiconfigs", apiextensionsv1.ClusterScoped},
		{"StorageProfile", "storageprofiles", apiextensionsv1.ClusterScoped},
		{"DataSource", "datasources", apiextensionsv1.NamespaceScoped},
	} {
		out = append(out, &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: k.plural + ".cdi.kubevirt.io"},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{
				Group: "cdi.kubevirt.io",
				Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: k.kind, ListKind: k.kind + "List", Plural: k.plural, Singular: strings.ToLower(k.kind)},
				Scope: k.scope,
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
					Name: "v1beta1", Served: true, Storage: true,
					Schema:       &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr.To(true)}},
					Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
				}},
			},
		})
	}
	return out
}

// readManifests decodes a multi-document YAML file.
func readManifests(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &u.Object); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		// Generated objects carry an empty creationTimestamp and status.
		unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
		unstructured.RemoveNestedField(u.Object, "status")
		out = append(out, u)
	}
	return out, nil
}

// --- virt-api -------------------------------------------------------------------

func (c *Cluster) startVirtAPI(ctx context.Context, kvBin string) error {
	serving, err := c.servingCA.issue("virt-api", nil, []string{"virt-api.kubevirt.svc", "virt-api.kubevirt.svc.cluster.local", "virt-api", c.ns.IP, "127.0.0.1"}, true, true)
	if err != nil {
		return err
	}
	crt, key, err := serving.write(c.Dir, "virt-api")
	if err != nil {
		return err
	}
	kubeconfig, _, err := c.serviceAccountConfig(ctx, "kubevirt-apiserver")
	if err != nil {
		return err
	}
	if _, err := c.start("virt-api", filepath.Join(kvBin, "virt-api"),
		"--kubeconfig", kubeconfig,
		"--listen", c.ns.IP, "--port", strconv.Itoa(virtAPIPort),
		"--tls-cert-file", crt, "--tls-key-file", key,
		"--handler-cert-file", crt, "--handler-key-file", key,
	); err != nil {
		return err
	}
	// virt-api serves only after its informers synced; /healthz also checks
	// its connection to kube-apiserver.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: c.servingTransport()}
	if err := c.waitFor(ctx, time.Minute, "virt-api healthy", func() error {
		resp, err := hc.Get(fmt.Sprintf("https://%s:%d/healthz", c.ns.IP, virtAPIPort))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("healthz %d: %s", resp.StatusCode, body)
		}
		return nil
	}); err != nil {
		return err
	}
	return c.RegisterVirtAPI(ctx)
}

// servingTransport trusts the serving CA and presents no client
// certificate (virt-api would check one against the front-proxy CA).
func (c *Cluster) servingTransport() *http.Transport {
	tlsCfg, _ := rest.TLSConfigFor(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CAData: c.servingCA.certPEM}})
	return &http.Transport{TLSClientConfig: tlsCfg}
}

// RegisterVirtAPI creates (or updates) virt-api's APIServices and webhook
// configurations, with the CA of virt-api's certificate, and waits until
// kube-apiserver serves the subresource API through virt-api. Start calls
// it; a test that unregisters virt-api calls it to undo that.
func (c *Cluster) RegisterVirtAPI(ctx context.Context) error {
	kvBin, err := BinDir()
	if err != nil {
		return err
	}
	objs, err := readManifests(filepath.Join(kvBin, "manifests", "virt-api.yaml"))
	if err != nil {
		return err
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "APIService":
			if err := unstructured.SetNestedField(o.Object, b64(c.servingCA.certPEM), "spec", "caBundle"); err != nil {
				return err
			}
		case "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
			hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
			for i := range hooks {
				h := hooks[i].(map[string]any)
				if err := unstructured.SetNestedField(h, b64(c.servingCA.certPEM), "clientConfig", "caBundle"); err != nil {
					return err
				}
			}
			if err := unstructured.SetNestedSlice(o.Object, hooks, "webhooks"); err != nil {
				return err
			}
		}
		existing := &unstructured.Unstructured{}
		existing.SetGroupVersionKind(o.GroupVersionKind())
		switch err := c.Client.Get(ctx, client.ObjectKeyFromObject(o), existing); {
		case apierrors.IsNotFound(err):
			err = c.Client.Create(ctx, o)
			if err != nil {
				return fmt.Errorf("creating %s %s: %w", o.GetKind(), o.GetName(), err)
			}
		case err != nil:
			return err
		default:
			o.SetResourceVersion(existing.GetResourceVersion())
			if err := c.Client.Update(ctx, o); err != nil {
				return fmt.Errorf("updating %s %s: %w", o.GetKind(), o.GetName(), err)
			}
		}
	}
	for _, gv := range []string{"v1", "v1alpha3"} {
		path := "/apis/subresources.kubevirt.io/" + gv + "/version"
		if err := c.waitFor(ctx, time.Minute, "kube-apiserver serving "+path+" through virt-api", func() error {
			_, err := c.Kube.Discovery().RESTClient().Get().AbsPath(path).DoRaw(ctx)
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

// UnregisterVirtAPI deletes virt-api's APIServices (virt-api keeps running
// and its webhooks stay registered): what a cluster without virt-api's
// aggregated API looks like to a client of the subresources.
func (c *Cluster) UnregisterVirtAPI(ctx context.Context) error {
	for _, name := range []string{"v1.subresources.kubevirt.io", "v1alpha3.subresources.kubevirt.io"} {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("apiregistration.k8s.io/v1")
		u.SetKind("APIService")
		u.SetName(name)
		if err := c.Client.Delete(ctx, u); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return c.waitFor(ctx, 30*time.Second, "subresources.kubevirt.io gone", func() error {
		_, err := c.Kube.Discovery().RESTClient().Get().AbsPath("/apis/subresources.kubevirt.io/v1/version").DoRaw(ctx)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still served: %v", err)
	})
}

// --- virt-controller ------------------------------------------------------------

// RestartVirtController kills virt-controller, as a crash does, starts it
// again and waits until it leads again (it finds its own identity, the host
// name, in the Lease and takes it back at once).
func (c *Cluster) RestartVirtController(ctx context.Context) error {
	c.StopVirtController()
	return c.StartVirtController(ctx)
}

// StopVirtController kills virt-controller, as a crash does: nothing
// writes VMs' status or creates VMIs until StartVirtController.
func (c *Cluster) StopVirtController() {
	for i, p := range c.procs {
		if p.name != "virt-controller" {
			continue
		}
		_ = p.cmd.Process.Kill()
		<-p.done
		c.procs = append(c.procs[:i], c.procs[i+1:]...)
		_ = os.Rename(p.log, filepath.Join(c.Dir, fmt.Sprintf("virt-controller.%d.log", time.Now().UnixNano())))
		return
	}
}

// StartVirtController starts virt-controller after StopVirtController and
// waits until it leads.
func (c *Cluster) StartVirtController(ctx context.Context) error {
	kvBin, err := BinDir()
	if err != nil {
		return err
	}
	return c.startVirtController(ctx, kvBin, time.Now())
}

// startVirtController starts virt-controller and waits until it holds the
// Lease, renewed after since.
func (c *Cluster) startVirtController(ctx context.Context, kvBin string, since time.Time) error {
	prom, err := c.servingCA.issue("virt-controller", nil, []string{"127.0.0.1"}, true, true)
	if err != nil {
		return err
	}
	crt, key, err := prom.write(c.Dir, "virt-controller")
	if err != nil {
		return err
	}
	kubeconfig, _, err := c.serviceAccountConfig(ctx, "kubevirt-controller")
	if err != nil {
		return err
	}
	if _, err := c.start("virt-controller", filepath.Join(kvBin, "virt-controller"),
		"--kubeconfig", kubeconfig,
		"--listen", "127.0.0.1", "--port", strconv.Itoa(virtControllerPort),
		"--prom-cert-file", crt, "--prom-key-file", key,
		"--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "1s",
		// A 2-core test machine: fewer workers than a cluster's.
		"--vmi-controller-threads", "2", "--vm-controller-threads", "2", "--migration-controller-threads", "1",
		"--snapshot-controller-threads", "1", "--restore-controller-threads", "1", "--export-controller-threads", "1",
		"--clone-controller-threads", "1", "--pool-controller-threads", "1", "--rs-controller-threads", "1",
		"--backup-controller-threads", "1", "--node-controller-threads", "1", "--evacuation-controller-threads", "1",
		"--disruption-budget-controller-threads", "1",
	); err != nil {
		return err
	}
	return c.waitFor(ctx, time.Minute, "virt-controller leading (Lease kubevirt/virt-controller)", func() error { return c.leading(ctx, since) })
}

// leading says why virt-controller's Lease has no holder that renewed it
// after since; nil when it has.
func (c *Cluster) leading(ctx context.Context, since time.Time) error {
	l, err := c.Kube.CoordinationV1().Leases(Namespace).Get(ctx, "virt-controller", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return errors.New("no holder")
	}
	if l.Spec.RenewTime == nil || l.Spec.RenewTime.Time.Before(since.Truncate(time.Second)) {
		return fmt.Errorf("lease of %s not renewed since %v", *l.Spec.HolderIdentity, since)
	}
	return nil
}

// --- processes --------------------------------------------------------------------

type proc struct {
	name string
	bin  string
	args []string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// start runs a program inside the network namespace, its output going to
// Dir/NAME.log.
func (c *Cluster) start(name, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(c.Dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := c.ns.command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// ip netns exec execs the program: the child is the program itself. It
	// dies with the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, bin: bin, args: args, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
	return p, nil
}

// waitFor polls check until it succeeds, a process of the cluster exits or
// the timeout passes.
func (c *Cluster) waitFor(ctx context.Context, timeout time.Duration, what string, check func() error) error {
	var last error
	err := poll(ctx, timeout, func() (bool, error) {
		if last = check(); last == nil {
			return true, nil
		}
		for _, p := range c.procs {
			select {
			case <-p.done:
				return false, fmt.Errorf("waiting for %s: %s exited (%v); its log ends:\n%s", what, p.name, p.err, c.LogTail(p.name, 30))
			default:
			}
		}
		return false, nil
	})
	if errors.Is(err, errPollTimeout) {
		return fmt.Errorf("waiting for %s: %v", what, last)
	}
	return err
}

// LogTail returns the last n lines of a process's log (etcd, kube-apiserver,
// virt-api, virt-controller).
func (c *Cluster) LogTail(name string, n int) string {
	f, err := os.Open(filepath.Join(c.Dir, name+".log"))
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		lines = append(lines, s.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// Stop stops every process (KubeVirt's at once, kube-apiserver and etcd
// gracefully), removes the network namespace and, unless KeepDir, the
// folder.
func (c *Cluster) Stop() error {
	var errs []error
	for _, n := range c.nodes {
		n.Stop()
	}
	c.nodes = nil
	c.stopConsoles()
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		sig := syscall.SIGTERM
		if p.name == "virt-api" || p.name == "virt-controller" {
			sig = syscall.SIGKILL // nothing to save; virt-api's graceful stop takes 10 s
		}
		_ = p.cmd.Process.Signal(sig)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
			errs = append(errs, fmt.Errorf("%s did not stop in 20 s", p.name))
		}
	}
	c.procs = nil
	if c.ns != nil {
		c.ns.close()
	}
	if !c.keepDir {
		errs = append(errs, os.RemoveAll(c.Dir))
	}
	return errors.Join(errs...)
}
