package controller

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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
	if strings.Join(got, ", ") != "MutatingWebhookConfiguration mvirtualmachine.bmc.virtmetal.io, ValidatingWebhookConfiguration vvirtualmachine.bmc.virtmetal.io" {
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
