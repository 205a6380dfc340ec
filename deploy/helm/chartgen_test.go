package helm

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virtmetal/virtmetal/deploy"
)

// TestGeneratorRefuses: a change to deploy/ that the chart's rules do not
// cover fails the generator, rather than leaving a value that does nothing.
func TestGeneratorRefuses(t *testing.T) {
	tests := []struct {
		name, kind, object string
		change             func(o *unstructured.Unstructured)
		message            string
	}{
		{
			name: "a new ConfigMap key", kind: "ConfigMap", object: "virtmetal-config",
			change:  func(o *unstructured.Unstructured) { o.Object["data"].(map[string]any)["newKey"] = "x" },
			message: "ConfigMap key newKey has no value in the chart",
		},
		{
			name: "a flag a value sets is gone", kind: "Deployment", object: "virtmetal-controller",
			change: func(o *unstructured.Unstructured) {
				c, _ := container(o, "manager")
				c["args"] = []any{"--leader-elect"}
			},
			message: "no argument --mac-range=",
		},
		{
			name: "a template delimiter in a manifest", kind: "Service", object: "virtmetal-webhook",
			change:  func(o *unstructured.Unstructured) { o.SetAnnotations(map[string]string{"note": "{{ x }}"}) },
			message: "holds {{",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objects, err := deploy.Build()
			if err != nil {
				t.Fatal(err)
			}
			o := get(t, objects, tc.kind, tc.object)
			if _, err := render(o); err != nil {
				t.Fatalf("deploy/'s own %s: %v", tc.object, err)
			}
			tc.change(o)
			if _, err := render(o); err == nil || !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("render error %v, want %q", err, tc.message)
			}
		})
	}
}
