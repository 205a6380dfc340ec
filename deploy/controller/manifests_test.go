package controller

import (
	"os"
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
