package kubetest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAssetsDir(t *testing.T) {
	complete := t.TempDir()
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if err := os.WriteFile(filepath.Join(complete, bin), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	empty := t.TempDir()
	tests := []struct {
		name    string
		assets  string
		ci      string
		cache   string
		want    string
		wantErr string
	}{
		{"from KUBEBUILDER_ASSETS", complete, "true", empty, complete, ""},
		{"missing under CI is an error", "", "true", empty, "", "KUBEBUILDER_ASSETS is not set"},
		{"missing locally falls back to the cache folder", "", "", empty, "", filepath.Join(empty, "virtmetal", "envtest")},
		{"incomplete folder", empty, "", empty, "", "envtest binary kube-apiserver missing"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBEBUILDER_ASSETS", tc.assets)
			t.Setenv("CI", tc.ci)
			t.Setenv("XDG_CACHE_HOME", tc.cache)
			got, err := AssetsDir()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("AssetsDir = %q, %v; want error %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("AssetsDir = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	t.Run("default folder", func(t *testing.T) {
		t.Setenv("XDG_CACHE_HOME", "/cache")
		if got := DefaultAssetsDir(); got != "/cache/virtmetal/envtest/"+KubernetesVersion {
			t.Fatalf("DefaultAssetsDir = %q", got)
		}
	})
}

func TestCRDs(t *testing.T) {
	tests := []struct {
		opts Options
		want []string
	}{
		{Options{}, []string{
			"datavolumes.cdi.kubevirt.io", "virtualmachineclusterinstancetypes.instancetype.kubevirt.io",
			"virtualmachineinstancereplicasets.kubevirt.io", "virtualmachineinstances.kubevirt.io",
			"virtualmachineinstancetypes.instancetype.kubevirt.io", "virtualmachinepools.pool.kubevirt.io",
			"virtualmachines.kubevirt.io", "virtualmachinebmcs.bmc.virtmetal.io",
		}},
		{Options{WithoutCDI: true}, []string{
			"virtualmachineclusterinstancetypes.instancetype.kubevirt.io",
			"virtualmachineinstancereplicasets.kubevirt.io", "virtualmachineinstances.kubevirt.io",
			"virtualmachineinstancetypes.instancetype.kubevirt.io", "virtualmachinepools.pool.kubevirt.io",
			"virtualmachines.kubevirt.io", "virtualmachinebmcs.bmc.virtmetal.io",
		}},
	}
	for _, tc := range tests {
		crds, err := CRDs(tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, c := range crds {
			names = append(names, c.Name)
			if c.Spec.Versions[0].Schema == nil || len(c.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties) == 0 {
				t.Errorf("%s has no real spec schema", c.Name)
			}
		}
		if strings.Join(names, " ") != strings.Join(tc.want, " ") {
			t.Errorf("CRDs(%+v) = %v, want %v", tc.opts, names, tc.want)
		}
	}
}
