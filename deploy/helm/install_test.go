package helm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/kube"
	release "helm.sh/helm/v4/pkg/release/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/kubetest"
	"github.com/virtmetal/virtmetal/internal/poll"
)

// TestInstall installs the chart with Helm's install action on a real
// kube-apiserver (envtest; cert-manager's two kinds from test-only CRDs),
// as `helm install virtmetal deploy/helm/virtmetal -n virtmetal-system
// --create-namespace` does: the CRD from crds/, every rendered object
// accepted, the namespace restricted. An upgrade to the loop reconciler
// without webhooks then removes what those components delete, which
// `kubectl apply -k` leaves behind; an uninstall keeps the CRD.
func TestInstall(t *testing.T) {
	env, err := kubetest.Start(kubetest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	ctx := context.Background()
	c := env.Client
	for _, crd := range decode(t, readFile(t, "../../cmd/bmc-controller/testdata/cert-manager-crds.yaml")) {
		if err := c.Create(ctx, crd); err != nil {
			t.Fatal(err)
		}
	}

	kubeconfig, err := env.AdminKubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	namespace := Namespace
	getter := genericclioptions.NewConfigFlags(false)
	getter.KubeConfig, getter.Namespace = &path, &namespace
	cfg := action.NewConfiguration()
	if err := cfg.Init(getter, namespace, "secret"); err != nil {
		t.Fatal(err)
	}

	install := action.NewInstall(cfg)
	install.ReleaseName = "virtmetal"
	install.Namespace = namespace
	install.CreateNamespace = true
	// Nothing runs pods here: wait for the CRDs only, as Helm always does.
	install.WaitStrategy = kube.HookOnlyStrategy
	install.Timeout = 2 * time.Minute
	r, err := install.RunWithContext(ctx, loadChart(t), parseValues(t, "maas: {url: 'http://maas.example.org:5240/MAAS', apiKey: 'ck:tk:ts'}\n"))
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	installed := decode(t, r.(*release.Release).Manifest)
	mustExist(ctx, t, c, installed...)
	crd := &unstructured.Unstructured{}
	crd.SetAPIVersion("apiextensions.k8s.io/v1")
	crd.SetKind("CustomResourceDefinition")
	crd.SetName("virtualmachinebmcs.bmc.virtmetal.io")
	mustExist(ctx, t, c, crd)
	ns := &unstructured.Unstructured{}
	ns.SetAPIVersion("v1")
	ns.SetKind("Namespace")
	if err := c.Get(ctx, client.ObjectKey{Name: namespace}, ns); err != nil {
		t.Fatal(err)
	}
	if level := ns.GetLabels()["pod-security.kubernetes.io/enforce"]; level != "restricted" {
		t.Errorf("namespace %s enforces Pod Security level %q, want restricted", namespace, level)
	}
	for _, want := range []string{"Secret/maas-api", "CronJob/maas-reconciler", "MutatingWebhookConfiguration/virtmetal-vm-identity-mutating", "Certificate/virtmetal-webhook-cert"} {
		if !slices.Contains(kindNames(installed), want) {
			t.Errorf("the release lacks %s", want)
		}
	}

	upgrade := action.NewUpgrade(cfg)
	upgrade.Namespace = namespace
	upgrade.WaitStrategy = kube.HookOnlyStrategy
	upgrade.Timeout = 2 * time.Minute
	upgrade.ResetValues = true
	r, err = upgrade.RunWithContext(ctx, "virtmetal", loadChart(t), parseValues(t, "webhooks: {enabled: false}\nreconciler: {mode: loop}\n"))
	if err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
	upgraded := decode(t, r.(*release.Release).Manifest)
	mustExist(ctx, t, c, upgraded...)
	var gone []*unstructured.Unstructured
	for _, o := range installed {
		if !slices.Contains(kindNames(upgraded), o.GetKind()+"/"+o.GetName()) {
			gone = append(gone, o)
		}
	}
	if got, want := kindNames(gone), []string{
		"Certificate/virtmetal-webhook-cert", "CronJob/maas-reconciler", "Issuer/virtmetal-selfsigned",
		"MutatingWebhookConfiguration/virtmetal-vm-identity-mutating", "Secret/maas-api", "Service/virtmetal-webhook",
		"ValidatingWebhookConfiguration/virtmetal-vm-identity-validating",
	}; !slices.Equal(got, want) {
		t.Errorf("the upgrade drops %v, want %v", got, want)
	}
	mustBeGone(ctx, t, c, gone...)

	uninstall := action.NewUninstall(cfg)
	uninstall.WaitStrategy = kube.HookOnlyStrategy
	uninstall.Timeout = 2 * time.Minute
	if _, err := uninstall.Run("virtmetal"); err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
	// The Namespace stays Terminating: envtest runs no namespace
	// controller. The CRD, not the release's, stays.
	mustBeGone(ctx, t, c, slices.DeleteFunc(upgraded, func(o *unstructured.Unstructured) bool { return o.GetKind() == "Namespace" })...)
	mustExist(ctx, t, c, crd)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// kindNames are the objects' Kind/name, sorted.
func kindNames(objects []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objects {
		out = append(out, o.GetKind()+"/"+o.GetName())
	}
	slices.Sort(out)
	return out
}

func fetch(ctx context.Context, c client.Client, o *unstructured.Unstructured) error {
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(schema.FromAPIVersionAndKind(o.GetAPIVersion(), o.GetKind()))
	return c.Get(ctx, client.ObjectKeyFromObject(o), got)
}

func mustExist(ctx context.Context, t *testing.T, c client.Client, objects ...*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objects {
		if err := fetch(ctx, c, o); err != nil {
			t.Errorf("%s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
}

// mustBeGone waits for the objects to be deleted (garbage collection
// runs in kube-apiserver's controller manager, absent here, so nothing
// with finalizers is expected).
func mustBeGone(ctx context.Context, t *testing.T, c client.Client, objects ...*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objects {
		poll.Until(t, o.GetKind()+" "+o.GetName()+" deleted", func() error {
			err := fetch(ctx, c, o)
			if apierrors.IsNotFound(err) {
				return nil
			}
			if err != nil {
				t.Fatal(err)
			}
			return errStill
		})
	}
}

var errStill = errors.New("still there")
