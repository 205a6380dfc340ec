// Package deploy builds virtmetal's kustomization (deploy/, optionally with
// its components) with the kustomize library, as `kubectl apply -k` does,
// for the tests that check and install it.
package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// Dir is the deploy/ folder of the source tree this package was compiled
// from.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

// Build runs kustomize on deploy/ and returns its objects in kustomize's
// order. Components (folder names under deploy/components) are added the
// way the README tells a user to: by an overlay of their own outside
// deploy/ (a kustomization cannot include the folder it is in).
func Build(components ...string) ([]*unstructured.Unstructured, error) {
	root := Dir()
	if len(components) > 0 {
		overlay, err := os.MkdirTemp("", "virtmetal-overlay-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(overlay)
		// kustomize takes only relative paths.
		base, err := filepath.Rel(overlay, root)
		if err != nil {
			return nil, err
		}
		var k strings.Builder
		fmt.Fprintf(&k, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- %q\ncomponents:\n", base)
		for _, c := range components {
			fmt.Fprintf(&k, "- %q\n", filepath.Join(base, "components", c))
		}
		if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k.String()), 0o644); err != nil {
			return nil, err
		}
		root = overlay
	}
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), root)
	if err != nil {
		return nil, fmt.Errorf("kustomize build (components %q): %w", components, err)
	}
	var objects []*unstructured.Unstructured
	for _, r := range resources.Resources() {
		// Through JSON, so that numbers are the int64 and float64 of the
		// API machinery, not kustomize's ints.
		data, err := r.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("kustomize build: %s: %w", r.CurId(), err)
		}
		o := &unstructured.Unstructured{}
		if err := o.UnmarshalJSON(data); err != nil {
			return nil, fmt.Errorf("kustomize build: %s: %w", r.CurId(), err)
		}
		objects = append(objects, o)
	}
	return objects, nil
}
