package controllers

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestSharedResourcesGrowWithTheVMs(t *testing.T) {
	tests := []struct {
		vms            int
		request, limit string
	}{
		{vms: 1, request: "36Mi", limit: "100Mi"},
		{vms: 16, request: "36Mi", limit: "100Mi"},
		{vms: 17, request: "40Mi", limit: "104Mi"},
		{vms: 1000, request: "288Mi", limit: "352Mi"},
	}
	for _, tc := range tests {
		t.Run(resource.NewQuantity(int64(tc.vms), resource.DecimalSI).String(), func(t *testing.T) {
			r := sharedResources(tc.vms)
			if got := r.Requests[corev1.ResourceMemory]; got.Cmp(resource.MustParse(tc.request)) != 0 {
				t.Errorf("memory request %s, want %s", got.String(), tc.request)
			}
			if got := r.Limits[corev1.ResourceMemory]; got.Cmp(resource.MustParse(tc.limit)) != 0 {
				t.Errorf("memory limit %s, want %s", got.String(), tc.limit)
			}
		})
	}
	if got := defaultResources().Limits[corev1.ResourceMemory]; got.Cmp(resource.MustParse("96Mi")) != 0 {
		t.Errorf("a BMC pod's own limit changed to %s: sharedResources must not write into the defaults", got.String())
	}
}

// TestOnlyAdds: the shared Secret's write may wait only when it would add
// VMs and change none; a VM removed or changed is written at once.
func TestOnlyAdds(t *testing.T) {
	current := map[string][]byte{"vm-a": []byte(`{"username":"a"}`), "vm-b": []byte(`{"username":"b"}`)}
	tests := []struct {
		name string
		want map[string][]byte
		adds bool
	}{
		{"one VM added", map[string][]byte{"vm-a": []byte(`{"username":"a"}`), "vm-b": []byte(`{"username":"b"}`), "vm-c": []byte(`{}`)}, true},
		{"the same VMs", map[string][]byte{"vm-a": []byte(`{"username":"a"}`), "vm-b": []byte(`{"username":"b"}`)}, false},
		{"one VM removed", map[string][]byte{"vm-a": []byte(`{"username":"a"}`)}, false},
		{"one removed, one added", map[string][]byte{"vm-a": []byte(`{"username":"a"}`), "vm-c": []byte(`{}`)}, false},
		{"one changed, one added", map[string][]byte{"vm-a": []byte(`{"username":"a"}`), "vm-b": []byte(`{"username":"new"}`), "vm-c": []byte(`{}`)}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := onlyAdds(current, tc.want); got != tc.adds {
				t.Errorf("onlyAdds = %v, want %v", got, tc.adds)
			}
		})
	}
}
