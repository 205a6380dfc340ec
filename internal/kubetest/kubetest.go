// Package kubetest starts a real kube-apiserver and etcd (controller-runtime
// envtest) with the KubeVirt and CDI CRDs installed, for the packages that
// talk to Kubernetes. Share one Env per package from TestMain: it takes
// seconds to start.
//
// The binaries come from KUBEBUILDER_ASSETS (hack/setup-envtest.sh fills
// it). Under CI (CI=true) a missing KUBEBUILDER_ASSETS is an error; locally
// the default cache folder of hack/setup-envtest.sh is tried instead.
package kubetest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	controllermanifests "github.com/virtmetal/virtmetal/deploy/controller"
	"github.com/virtmetal/virtmetal/internal/kubescheme"
	"github.com/virtmetal/virtmetal/test/crds"
)

// KubernetesVersion is the kube-apiserver version the suites run against.
const KubernetesVersion = "1.37.2"

// DefaultAssetsDir is where hack/setup-envtest.sh puts the binaries when
// given no destination.
func DefaultAssetsDir() string {
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "virtmetal", "envtest", KubernetesVersion)
}

// AssetsDir finds the kube-apiserver and etcd binaries.
func AssetsDir() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		if os.Getenv("CI") == "true" {
			return "", errors.New("KUBEBUILDER_ASSETS is not set: run hack/setup-envtest.sh and export its output")
		}
		dir = DefaultAssetsDir()
	}
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return "", fmt.Errorf("envtest binary %s missing in %s (run hack/setup-envtest.sh %s): %w", bin, dir, dir, err)
		}
	}
	return dir, nil
}

// Options chooses what the Env installs.
type Options struct {
	// WithoutCDI leaves out the DataVolume CRD, as on a cluster without CDI.
	WithoutCDI bool
	// WebhookPaths are files or folders of webhook configurations to install,
	// pointed at a local webhook server (see Env.Webhook).
	WebhookPaths []string
	// StopTimeout is how long stopping waits for kube-apiserver and etcd to
	// exit gracefully; envtest's 20 s when 0. After it, envtest kills the
	// process and returns an error without waiting for it to exit, so
	// RestartAPIServer fails. A kube-apiserver with clients still watching
	// took about a minute to stop in the lab.
	StopTimeout time.Duration
}

// Env is a running API server.
type Env struct {
	env *envtest.Environment
	// certDir is the API server's: chosen here, not by envtest, so that a
	// restart keeps it (envtest removes a folder it chose on every stop).
	certDir string
	// Config authenticates as a cluster admin.
	Config *rest.Config
	// Client is an admin client with Scheme.
	Client client.Client
}

// Start starts etcd and kube-apiserver and installs the CRDs.
func Start(opts Options) (*Env, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	defs, err := CRDs(opts)
	if err != nil {
		return nil, err
	}
	scheme := kubescheme.New()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory:   assets,
		CRDs:                    defs,
		Scheme:                  scheme,
		WebhookInstallOptions:   envtest.WebhookInstallOptions{Paths: opts.WebhookPaths},
		ControlPlaneStopTimeout: opts.StopTimeout,
	}
	certDir, err := os.MkdirTemp("", "kubetest-apiserver-")
	if err != nil {
		return nil, err
	}
	apiServer := env.ControlPlane.GetAPIServer()
	apiServer.CertDir = certDir
	// envtest's default service range holds 253 Services; a cluster's holds
	// thousands, and every BMC has one.
	apiServer.Configure().Set("service-cluster-ip-range", "10.96.0.0/16")
	// A webhook or APIService that names a Service is reached through the
	// Service's endpoints, not its cluster IP: envtest has no kube-proxy, so
	// a cluster IP would be dialled through the machine's own network.
	// Without endpoints the call fails before any connection is made.
	apiServer.Configure().Set("enable-aggregator-routing", "true")
	cfg, err := env.Start()
	if err != nil {
		_ = os.RemoveAll(certDir)
		return nil, fmt.Errorf("starting envtest from %s: %w", assets, err)
	}
	e := &Env{env: env, certDir: certDir, Config: cfg}
	if e.Client, err = client.New(cfg, client.Options{Scheme: env.Scheme}); err != nil {
		_ = e.Stop()
		return nil, err
	}
	return e, nil
}

// RestartAPIServer stops kube-apiserver and starts it again, as a crash or
// an upgrade of the control plane does; etcd keeps running. The server
// comes back on the same port with the same serving and client
// certificates, so every config and kubeconfig handed out stays valid and
// clients see only a pause.
func (e *Env) RestartAPIServer() error {
	apiServer := e.env.ControlPlane.APIServer
	if err := apiServer.Stop(); err != nil {
		return fmt.Errorf("stopping kube-apiserver: %w", err)
	}
	if err := apiServer.Start(); err != nil {
		return fmt.Errorf("starting kube-apiserver again: %w", err)
	}
	return nil
}

// Webhook says where the installed webhook configurations send their
// requests: the host, port and certificate folder a webhook server must use.
func (e *Env) Webhook() *envtest.WebhookInstallOptions { return &e.env.WebhookInstallOptions }

// Stop stops the API server and etcd.
func (e *Env) Stop() error {
	err := e.env.Stop()
	return errors.Join(err, os.RemoveAll(e.certDir))
}

// ConfigFor returns a rest.Config that authenticates as the named user, in
// the given groups, and nothing more: RBAC applies to it.
func (e *Env) ConfigFor(user string, groups ...string) (*rest.Config, error) {
	u, err := e.env.ControlPlane.AddUser(envtest.User{Name: user, Groups: groups}, e.Config)
	if err != nil {
		return nil, err
	}
	return u.Config(), nil
}

// KubeConfigFor returns a kubeconfig file's content that authenticates as
// the named user, in the given groups, for programs under test that load
// their configuration the usual way (KUBECONFIG) and must meet RBAC.
func (e *Env) KubeConfigFor(user string, groups ...string) ([]byte, error) {
	u, err := e.env.ControlPlane.AddUser(envtest.User{Name: user, Groups: groups}, e.Config)
	if err != nil {
		return nil, err
	}
	return u.KubeConfig()
}

// AdminKubeConfig returns a kubeconfig file's content for a cluster admin,
// for programs under test that load their configuration the usual way.
func (e *Env) AdminKubeConfig() ([]byte, error) {
	return e.KubeConfigFor("virtmetal-test-admin", "system:masters")
}

// ServiceAccountUser is the user name Kubernetes gives a ServiceAccount.
func ServiceAccountUser(namespace, name string) string {
	return "system:serviceaccount:" + namespace + ":" + name
}

// CRDs decodes the generated KubeVirt CRDs in test/crds and virtmetal's own
// in deploy/controller/crd.
func CRDs(opts Options) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, dir := range []struct {
		fsys    fs.FS
		pattern string
	}{{crds.FS, "*.yaml"}, {controllermanifests.CRDs, "crd/*.yaml"}} {
		defs, err := decodeCRDs(dir.fsys, dir.pattern, opts)
		if err != nil {
			return nil, err
		}
		out = append(out, defs...)
	}
	return out, nil
}

func decodeCRDs(fsys fs.FS, pattern string, opts Options) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	files, err := fs.Glob(fsys, pattern)
	if err != nil {
		return nil, err
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, name := range files {
		if opts.WithoutCDI && strings.HasSuffix(name, ".cdi.kubevirt.io.yaml") {
			continue
		}
		data, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, crd); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out = append(out, crd)
	}
	return out, nil
}
