package helm

import (
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"

	"github.com/virtmetal/virtmetal/controllers"
	"github.com/virtmetal/virtmetal/deploy"
	"github.com/virtmetal/virtmetal/internal/kubetest"
)

const chartDir = "virtmetal"

// TestChartIsCurrent regenerates the chart's generated files from deploy/
// and fails when the committed ones differ: run `go generate` in
// deploy/helm after changing deploy/.
func TestChartIsCurrent(t *testing.T) {
	want, err := Files()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string][]byte{}
	for _, dir := range []string{"crds", GeneratedDir} {
		err := filepath.WalkDir(filepath.Join(chartDir, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := os.ReadFile(path)
			rel, _ := filepath.Rel(chartDir, path)
			have[filepath.ToSlash(rel)] = data
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if !bytes.Equal(want[name], have[name]) {
			t.Errorf("%s is stale or missing: run go generate in deploy/helm", name)
		}
	}
	for name := range have {
		if _, ok := want[name]; !ok {
			t.Errorf("%s is no longer generated: run go generate in deploy/helm", name)
		}
	}
}

// TestLint runs Helm's linter, as `helm lint --strict` does: no warning,
// no error, with the default values and with values that change every
// generated toggle. A value the schema refuses is an error.
func TestLint(t *testing.T) {
	tests := []struct {
		name    string
		values  string
		refused string // a lint error mentioning it; "" for none
	}{
		{name: "defaults"},
		{name: "every toggle", values: "webhooks: {enabled: false}\nreconciler: {mode: loop}\nmetrics: {enabled: false}\nnamespace: {create: false}\nmaas: {url: http://maas.example.org:5240/MAAS, apiKey: 'a:b:c'}\n"},
		{name: "unknown workload", values: "workload: one-per-node\n", refused: "workload"},
		{name: "misspelt value", values: "domian: bmc.example.org\n", refused: "domian"},
		{name: "url without key", values: "maas: {url: http://maas.example.org:5240/MAAS}\n", refused: "/maas"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			linter := lint.RunAll(chartDir, parseValues(t, tc.values), Namespace, lint.WithKubeVersion(kubeVersion(t)))
			var problems []string
			for _, m := range linter.Messages {
				if m.Severity >= support.WarningSev {
					problems = append(problems, m.Error())
				}
			}
			if tc.refused == "" && len(problems) > 0 {
				t.Fatalf("lint:\n%s", strings.Join(problems, "\n"))
			}
			if tc.refused != "" && !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.refused) }) {
				t.Fatalf("lint did not refuse %q; it said:\n%s", tc.refused, strings.Join(problems, "\n"))
			}
		})
	}
}

// TestDefaultsAreKustomize: with default values the chart renders, CRD
// included, the objects of `kubectl kustomize deploy`, and each component
// of deploy/components is the value that stands for it.
func TestDefaultsAreKustomize(t *testing.T) {
	tests := []struct {
		name       string
		values     string
		components []string
	}{
		{name: "defaults"},
		{"without webhooks", "webhooks: {enabled: false}\n", []string{"without-webhooks"}},
		{"reconciler loop", "reconciler: {mode: loop}\n", []string{"reconciler-loop"}},
		{"both components", "webhooks: {enabled: false}\nreconciler: {mode: loop}\n", []string{"without-webhooks", "reconciler-loop"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want, err := deploy.Build(tc.components...)
			if err != nil {
				t.Fatal(err)
			}
			compare(t, renderChart(t, Namespace, tc.values), want)
		})
	}
}

// TestValues: each value changes, from deploy/'s objects, exactly what
// edit does, and nothing else.
func TestValues(t *testing.T) {
	tests := []struct {
		name       string
		namespace  string
		values     string
		components []string
		edit       func(t *testing.T, objects []*unstructured.Unstructured) []*unstructured.Unstructured
	}{
		{
			name:   "domain",
			values: "domain: bmc.lab.example\n",
			edit:   configKey("domain", "bmc.lab.example"),
		},
		{
			name:   "shared workload",
			values: "workload: shared\n",
			edit:   configKey("workload", "shared"),
		},
		{
			name:   "ipmi on by default",
			values: "ipmiDefault: true\n",
			edit:   configKey("ipmiDefault", "true"),
		},
		{
			name:   "trusted proxies",
			values: "trustedProxies: [10.1.0.0/24, 'fd00::/120']\n",
			edit:   configKey("trustedProxies", "10.1.0.0/24,fd00::/120"),
		},
		{
			name:   "cluster issuer",
			values: "tlsClusterIssuer: letsencrypt\n",
			edit:   configKey("tlsClusterIssuer", "letsencrypt"),
		},
		{
			name:   "issuer and ingress class",
			values: "tlsIssuer: bmc-ca\ningressClass: nginx\n",
			edit: func(t *testing.T, objects []*unstructured.Unstructured) []*unstructured.Unstructured {
				objects = configKey("tlsIssuer", "bmc-ca")(t, objects)
				return configKey("ingressClass", "nginx")(t, objects)
			},
		},
		{
			name:   "denied destinations and network policy",
			values: "destinationsDenied: [10.32.0.0/12]\nnetworkPolicy: {enabled: false, ingressNamespaceSelector: 'ingress in (nginx),team=net', apiServer: [192.0.2.10/32], eventDestinations: [198.51.100.0/24, 203.0.113.0/24]}\n",
			edit: func(t *testing.T, objects []*unstructured.Unstructured) []*unstructured.Unstructured {
				for key, value := range map[string]string{
					"destinationsDenied":             "10.32.0.0/12",
					"networkPolicy":                  "false",
					"networkPolicyIngressNamespaces": "ingress in (nginx),team=net",
					"networkPolicyAPIServer":         "192.0.2.10/32",
					"networkPolicyEventDestinations": "198.51.100.0/24,203.0.113.0/24",
				} {
					objects = configKey(key, value)(t, objects)
				}
				return objects
			},
		},
		{
			name:   "opted-in namespaces",
			values: "namespaceSelector: tenant.example.org/bmc=enabled,team=metal\n",
			edit: func(t *testing.T, objects []*unstructured.Unstructured) []*unstructured.Unstructured {
				objects = configKey("namespaceSelector", "tenant.example.org/bmc=enabled,team=metal")(t, objects)
				webhooks := get(t, objects, "MutatingWebhookConfiguration", "virtmetal-vm-identity-mutating").Object["webhooks"].([]any)
				for _, w := range webhooks {
					w.(map[string]any)["namespaceSelector"] = map[string]any{"matchLabels": map[string]any{"tenant.example.org/bmc": "enabled", "team": "metal"}}
				}
				return objects
			},
		},
		{
			name:   "images",
			values: "image: {prefix: registry.example.org/metal, tag: v0.2.0-rc.1}\n",
			edit: func(t *testing.T, objects []*unstructured.Unstructured) []*unstructured.Unstructured {
				objects = configKey("bmcImage", "registry.example.org/metal/bmc-server:v0.2.0-rc.1")(t, objects)
				setContainer(t, objects, "Deployment", "virtmetal-controller", "image", "registry.example.org/metal/bmc-controller:v0.2.0-rc.1")
				setContainer(t, objects, "CronJob", "maas-reconciler", "image", "registry.example.org/metal/reconciler:v0.2.0-rc.1")
				return objects
			},
		},
		{
			name:       "images, loop",
			values:     "image: {tag: v0.3.0}\nreconciler: {mode: loop}\n",
			components: []string{"reconciler-loop"},
			edit: func(t *testing.T, objects []*unstructured.Unstructured) []*unstructured.Unstructured {
				objects = configKey("bmcImage", "virtmetal/bmc-server:v0.3.0")(t, objects)
				setContainer(t, objects, "Deployment", "virtmetal-controller", "image", "virtmetal/bmc-controller:v0.3.0")
				setContainer(t, objects, "Deployment", "maas-reconciler", "image", "virtmetal/reconciler:v0.3.0")
				return objects
			},
		},
		{
			name:   "controller",
			values: "controller: {replicas: 3, macRange: '02:10:00:00:00:00-02:10:00:00:ff:ff', resources: {requests: {cpu: 100m, memory: 128Mi}, limits: {memory: 1Gi}}}\n",
			edit: func(t *testing.T, objects []*unstructured.Unstructured) []*unstructured.Unstructured {
				d := get(t, objects, "Deployment", "virtmetal-controller")
				d.Object["spec"].(map[string]any)["replicas"] = int64(3)
				replaceArg(t, objects, "Deployment", "virtmetal-controller", "--mac-range=", "--mac-range=02:10:00:00:00:00-02:10:00:00:ff:ff")
				setContainer(t, objects, "Deployment", "virtmetal-controller", "resources", map[string]any{
					"requests": map[string]any{"cpu": "100m", "memory": "128Mi"},
					"limits":   map[string]any{"memory": "1Gi"},
				})
				return objects
			},
		},
		{
			name:   "reconciler schedule and resources",
			values: "reconciler: {schedule: '*/5 * * * *', resources: {requests: {cpu: 20m}}}\n",
			edit: func(t *testing.T, objects []*unstructured.Unstructured) []*unstructured.Unstructured {
				get(t, objects, "CronJob", "maas-reconciler").Object["spec"].(map[string]any)["schedule"] = "*/5 * * * *"
				// Helm merges maps: the limits stay.
				setContainer(t, objects, "CronJob", "maas-reconciler", "resources", map[string]any{
					"requests": map[string]any{"cpu": "20m", "memory": "32Mi"},
					"limits":   map[string]any{"memory": "128Mi"},
				})
				return objects
			},
		},
		{
			name:       "reconciler loop interval",
			values:     "reconciler: {mode: loop, interval: 30s}\n",
			components: []string{"reconciler-loop"},
			edit: func(t *testing.T, objects []*unstructured.Unstructured) []*unstructured.Unstructured {
				replaceArg(t, objects, "Deployment", "maas-reconciler", "--interval=", "--interval=30s")
				return objects
			},
		},
		{
			name:   "metrics off",
			values: "metrics: {enabled: false}\n",
			edit: func(t *testing.T, objects []*unstructured.Unstructured) []*unstructured.Unstructured {
				replaceArg(t, objects, "Deployment", "virtmetal-controller", "--metrics-bind-address=", "--metrics-bind-address=0")
				c := containerOf(t, objects, "Deployment", "virtmetal-controller")
				c["ports"] = slices.DeleteFunc(c["ports"].([]any), func(p any) bool { return p.(map[string]any)["name"] == "metrics" })
				return objects
			},
		},
		{
			name:       "metrics off, loop",
			values:     "metrics: {enabled: false}\nreconciler: {mode: loop}\n",
			components: []string{"reconciler-loop"},
			edit: func(t *testing.T, objects []*unstructured.Unstructured) []*unstructured.Unstructured {
				replaceArg(t, objects, "Deployment", "virtmetal-controller", "--metrics-bind-address=", "--metrics-bind-address=0")
				c := containerOf(t, objects, "Deployment", "virtmetal-controller")
				c["ports"] = slices.DeleteFunc(c["ports"].([]any), func(p any) bool { return p.(map[string]any)["name"] == "metrics" })
				r := containerOf(t, objects, "Deployment", "maas-reconciler")
				r["args"] = slices.DeleteFunc(r["args"].([]any), func(a any) bool { return strings.HasPrefix(a.(string), "--metrics-listen=") })
				delete(r, "ports")
				return objects
			},
		},
		{
			name:   "MaaS Secret made by the chart",
			values: "maas: {secretName: maas-region, url: 'http://maas.example.org:5240/MAAS', apiKey: 'ck:tk:ts'}\n",
			edit: func(t *testing.T, objects []*unstructured.Unstructured) []*unstructured.Unstructured {
				renameMaaSSecret(t, objects, "CronJob", "maas-region")
				secret := &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
					"metadata": map[string]any{"name": "maas-region", "namespace": Namespace, "labels": map[string]any{
						"app.kubernetes.io/name": "maas-reconciler", "app.kubernetes.io/part-of": "virtmetal",
					}},
					"stringData": map[string]any{"url": "http://maas.example.org:5240/MAAS", "api-key": "ck:tk:ts"},
				}}
				return append(objects, secret)
			},
		},
		{
			name:       "MaaS Secret of the user's, loop",
			values:     "maas: {secretName: maas-prod}\nreconciler: {mode: loop}\n",
			components: []string{"reconciler-loop"},
			edit: func(t *testing.T, objects []*unstructured.Unstructured) []*unstructured.Unstructured {
				renameMaaSSecret(t, objects, "Deployment", "maas-prod")
				return objects
			},
		},
		{
			name:   "namespace not created",
			values: "namespace: {create: false}\n",
			edit: func(t *testing.T, objects []*unstructured.Unstructured) []*unstructured.Unstructured {
				return slices.DeleteFunc(objects, func(o *unstructured.Unstructured) bool { return o.GetKind() == "Namespace" })
			},
		},
		{
			name:      "another namespace",
			namespace: "metal-bmcs",
			edit: func(t *testing.T, objects []*unstructured.Unstructured) []*unstructured.Unstructured {
				for _, o := range objects {
					o.Object = replaceNamespace(o.Object, Namespace, "metal-bmcs").(map[string]any)
				}
				return objects
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want, err := deploy.Build(tc.components...)
			if err != nil {
				t.Fatal(err)
			}
			want = tc.edit(t, want)
			namespace := Namespace
			if tc.namespace != "" {
				namespace = tc.namespace
			}
			got := renderChart(t, namespace, tc.values)
			compare(t, got, want)
			controllerReads(t, get(t, got, "ConfigMap", "virtmetal-config"))
		})
	}
}

// controllerReads fails unless the controller takes the ConfigMap as its
// config.
func controllerReads(t *testing.T, o *unstructured.Unstructured) {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, cm); err != nil {
		t.Fatal(err)
	}
	source := &controllers.ConfigSource{
		ConfigMap: types.NamespacedName{Namespace: cm.Namespace, Name: cm.Name},
		Reader:    fake.NewClientBuilder().WithObjects(cm).Build(),
	}
	if _, err := source.Get(context.Background()); err != nil {
		t.Errorf("the controller refuses the chart's config: %v", err)
	}
}

// TestRenderRefuses: values the chart cannot honour fail the render with
// a message that names them.
func TestRenderRefuses(t *testing.T) {
	tests := []struct{ name, values, message string }{
		{"API key without url", "maas: {apiKey: 'ck:tk:ts'}\n", "'/maas/url'"},
		{"no domain", "domain: ''\n", "'/domain'"},
		{"unknown reconciler mode", "reconciler: {mode: daemonset}\n", "'/reconciler/mode'"},
		{"empty namespace selector", "namespaceSelector: ''\n", "'/namespaceSelector'"},
		{"set-based namespace selector", "namespaceSelector: 'tier in (metal)'\n", "'/namespaceSelector'"},
		{"two issuers", "tlsIssuer: a\ntlsClusterIssuer: b\n", "'not' failed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := helmTemplate(t, Namespace, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("render error %v, want one about %s", err, tc.message)
			}
		})
	}
}

func kubeVersion(t *testing.T) *common.KubeVersion {
	t.Helper()
	v, err := common.ParseKubeVersion("v" + kubetest.KubernetesVersion)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func parseValues(t *testing.T, text string) map[string]any {
	t.Helper()
	values := map[string]any{}
	if err := yaml.Unmarshal([]byte(text), &values); err != nil {
		t.Fatal(err)
	}
	return values
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// helmTemplate is `helm template --include-crds` of the chart with values, as
// release virtmetal in namespace.
func helmTemplate(t *testing.T, namespace, values string) (*release.Release, error) {
	t.Helper()
	install := action.NewInstall(action.NewConfiguration())
	install.DryRunStrategy = action.DryRunClient
	install.Replace = true
	install.ReleaseName = "virtmetal"
	install.Namespace = namespace
	install.IncludeCRDs = true
	install.KubeVersion = kubeVersion(t)
	r, err := install.Run(loadChart(t), parseValues(t, values))
	if err != nil {
		return nil, err
	}
	rel, ok := r.(*release.Release)
	if !ok {
		t.Fatalf("release of type %T", r)
	}
	return rel, nil
}

func renderChart(t *testing.T, namespace, values string) []*unstructured.Unstructured {
	t.Helper()
	rel, err := helmTemplate(t, namespace, values)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, rel.Manifest)
}

// decode reads a multi-document manifest into objects, as kubectl does.
func decode(t *testing.T, manifest string) []*unstructured.Unstructured {
	t.Helper()
	var objects []*unstructured.Unstructured
	d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	for {
		o := &unstructured.Unstructured{}
		err := d.Decode(&o.Object)
		if errors.Is(err, io.EOF) {
			return objects
		}
		if err != nil {
			t.Fatalf("%v in:\n%s", err, manifest)
		}
		if len(o.Object) > 0 {
			objects = append(objects, o)
		}
	}
}

func key(o *unstructured.Unstructured) string {
	return o.GetAPIVersion() + " " + o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

// compare fails unless got and want hold the same objects, whatever their
// order.
func compare(t *testing.T, got, want []*unstructured.Unstructured) {
	t.Helper()
	index := func(objects []*unstructured.Unstructured) map[string]map[string]any {
		m := map[string]map[string]any{}
		for _, o := range objects {
			if _, dup := m[key(o)]; dup {
				t.Errorf("%s twice", key(o))
			}
			// Through JSON, as deploy.Build's are: int64 and float64 numbers.
			data, err := o.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			n := &unstructured.Unstructured{}
			if err := n.UnmarshalJSON(data); err != nil {
				t.Fatal(err)
			}
			m[key(o)] = n.Object
		}
		return m
	}
	g, w := index(got), index(want)
	for _, k := range slices.Sorted(maps.Keys(w)) {
		if _, ok := g[k]; !ok {
			t.Errorf("chart lacks %s", k)
			continue
		}
		if diff := cmp.Diff(w[k], g[k]); diff != "" {
			t.Errorf("%s (-want +chart):\n%s", k, diff)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(g)) {
		if _, ok := w[k]; !ok {
			t.Errorf("chart adds %s", k)
		}
	}
}

func get(t *testing.T, objects []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objects {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s", kind, name)
	return nil
}

func configKey(key, value string) func(*testing.T, []*unstructured.Unstructured) []*unstructured.Unstructured {
	return func(t *testing.T, objects []*unstructured.Unstructured) []*unstructured.Unstructured {
		data := get(t, objects, "ConfigMap", "virtmetal-config").Object["data"].(map[string]any)
		if _, ok := data[key]; !ok {
			t.Fatalf("the ConfigMap has no key %s", key)
		}
		data[key] = value
		return objects
	}
}

func containerOf(t *testing.T, objects []*unstructured.Unstructured, kind, name string) map[string]any {
	t.Helper()
	c, err := container(get(t, objects, kind, name), map[string]string{"virtmetal-controller": "manager", "maas-reconciler": "reconciler"}[name])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func setContainer(t *testing.T, objects []*unstructured.Unstructured, kind, name, field string, value any) {
	t.Helper()
	c := containerOf(t, objects, kind, name)
	if _, ok := c[field]; !ok {
		t.Fatalf("%s %s has no %s", kind, name, field)
	}
	c[field] = value
}

func replaceArg(t *testing.T, objects []*unstructured.Unstructured, kind, name, prefix, arg string) {
	t.Helper()
	args := containerOf(t, objects, kind, name)["args"].([]any)
	for i, a := range args {
		if strings.HasPrefix(a.(string), prefix) {
			args[i] = arg
			return
		}
	}
	t.Fatalf("%s %s has no argument %s…", kind, name, prefix)
}

// renameMaaSSecret points the reconciler's env and volume at secret.
func renameMaaSSecret(t *testing.T, objects []*unstructured.Unstructured, kind, secret string) {
	t.Helper()
	o := get(t, objects, kind, "maas-reconciler")
	c := containerOf(t, objects, kind, "maas-reconciler")
	renamed := 0
	for _, e := range c["env"].([]any) {
		if ref, ok := nested(e, "valueFrom", "secretKeyRef").(map[string]any); ok {
			ref["name"] = secret
			renamed++
		}
	}
	for _, v := range nested(podSpec(o), "volumes").([]any) {
		if s, ok := nested(v, "secret").(map[string]any); ok {
			s["secretName"] = secret
			renamed++
		}
	}
	if renamed != 2 {
		t.Fatalf("%d references to the MaaS Secret, want the env's and the volume's", renamed)
	}
}

func replaceNamespace(v any, from, to string) any {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			v[k] = replaceNamespace(x, from, to)
		}
	case []any:
		for i, x := range v {
			v[i] = replaceNamespace(x, from, to)
		}
	case string:
		return strings.ReplaceAll(v, from, to)
	}
	return v
}
