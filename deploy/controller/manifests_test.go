package controller

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"sigs.k8s.io/yaml"
)

func TestWriteWebhooks(t *testing.T) {
	dir := t.TempDir()
	if err := WriteWebhooks(dir); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "manifests.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := Webhooks.ReadFile("webhook/manifests.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != string(want) {
		t.Fatal("written webhook configurations differ from the embedded ones")
	}
	var got []string
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var config struct {
			Kind     string
			Webhooks []struct{ Name string }
		}
		if err := yaml.Unmarshal([]byte(doc), &config); err != nil {
			t.Fatal(err)
		}
		for _, w := range config.Webhooks {
			got = append(got, config.Kind+" "+w.Name)
		}
	}
	wantHooks := []string{
		"MutatingWebhookConfiguration mvirtualmachine.bmc.virtmetal.io",
		"MutatingWebhookConfiguration mvirtualmachineinstancereplicaset.bmc.virtmetal.io",
		"MutatingWebhookConfiguration mvirtualmachinepool.bmc.virtmetal.io",
		"ValidatingWebhookConfiguration vvirtualmachine.bmc.virtmetal.io",
		"ValidatingWebhookConfiguration vvirtualmachineinstance.bmc.virtmetal.io",
		"ValidatingWebhookConfiguration vvirtualmachineinstancereplicaset.bmc.virtmetal.io",
		"ValidatingWebhookConfiguration vvirtualmachinepool.bmc.virtmetal.io",
	}
	if !slices.Equal(got, wantHooks) {
		t.Fatalf("webhooks = %v", got)
	}
}

// TestGeneratedManifestsAreCurrent regenerates the CRD, the ClusterRole and
// the webhook configurations from the Go types and markers and fails when
// the committed files differ: run hack/generate.sh after changing them.
func TestGeneratedManifestsAreCurrent(t *testing.T) {
	out := t.TempDir()
	cmd := exec.Command("../../hack/generate.sh", out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/generate.sh: %v\n%s", err, msg)
	}
	for _, dir := range []string{"crd", "rbac", "webhook"} {
		want, err := filepath.Glob(filepath.Join(out, dir, "*.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		have, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
		if len(want) != len(have) {
			t.Errorf("%s: generated %d files, committed %d", dir, len(want), len(have))
		}
		for _, generated := range want {
			committed := filepath.Join(dir, filepath.Base(generated))
			a, err := os.ReadFile(generated)
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(committed)
			if err != nil {
				t.Errorf("%s is not committed: run hack/generate.sh", committed)
				continue
			}
			if string(a) != string(b) {
				t.Errorf("%s differs from what its Go types and markers generate: run hack/generate.sh", committed)
			}
		}
	}
}

// TestCRDDocumentsItself: `kubectl get vmbmc` shows VM, READY, URL, MAAS
// STATUS and AGE, and `kubectl explain vmbmc.spec` has a description for
// every field.
func TestCRDDocumentsItself(t *testing.T) {
	data, err := CRDs.ReadFile("crd/bmc.virtmetal.io_virtualmachinebmcs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(data, crd); err != nil {
		t.Fatal(err)
	}
	version := crd.Spec.Versions[0]
	var columns []string
	for _, c := range version.AdditionalPrinterColumns {
		columns = append(columns, strings.ToUpper(c.Name))
	}
	if got := strings.Join(columns, ","); got != "VM,READY,URL,MAAS STATUS,AGE" {
		t.Errorf("printer columns %s", got)
	}
	if !slices.Contains(crd.Spec.Names.ShortNames, "vmbmc") {
		t.Errorf("short names %v, want vmbmc", crd.Spec.Names.ShortNames)
	}
	var undocumented []string
	var walk func(path string, s apiextensionsv1.JSONSchemaProps)
	walk = func(path string, s apiextensionsv1.JSONSchemaProps) {
		if s.Description == "" {
			undocumented = append(undocumented, path)
		}
		for name, p := range s.Properties {
			walk(path+"."+name, p)
		}
		if s.Items != nil && s.Items.Schema != nil {
			walk(path+"[]", *s.Items.Schema)
		}
	}
	spec := version.Schema.OpenAPIV3Schema.Properties["spec"]
	for name, p := range spec.Properties {
		walk("spec."+name, p)
	}
	if len(undocumented) > 0 {
		slices.Sort(undocumented)
		t.Errorf("fields without a description (kubectl explain shows nothing): %v", undocumented)
	}
}
