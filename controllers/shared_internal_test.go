package controllers

import (
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/virtmetal/virtmetal/internal/bmcspec"
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

// TestStateEntriesWaitForLeavingVMs: the shared state Secret drops the
// entry of a VM it no longer serves, but not of a VM leaving for a pod of
// its own before the BMC reconciler has moved that entry into the VM's
// own state Secret; nor is it deleted with the namespace's other shared
// objects while such an entry waits.
func TestStateEntriesWaitForLeavingVMs(t *testing.T) {
	const ns = "tenant"
	stateOf := func(names ...string) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: bmcspec.SharedStateSecret, Labels: sharedLabels()}, Data: map[string][]byte{}}
		for _, n := range names {
			s.Data[n] = []byte(`{}`)
		}
		return s
	}
	ownState := func(vm string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: bmcspec.StateSecretName(vm), Labels: childLabels(vm)}}
	}
	tests := []struct {
		name    string
		objects []client.Object
		leaving map[string]bool
		served  []string
		want    []string // the entries left; nil: the Secret deleted
	}{
		{"served, leaving without its own Secret yet, leaving with it, gone",
			[]client.Object{stateOf("served", "waits", "moved", "gone"), ownState("moved")},
			map[string]bool{"waits": true, "moved": true}, []string{"served"}, []string{"served", "waits"}},
		{"none served, one waits: the Secret stays",
			[]client.Object{stateOf("waits")}, map[string]bool{"waits": true}, nil, []string{"waits"}},
		{"none served, none waits: the Secret goes",
			[]client.Object{stateOf("moved"), ownState("moved")}, map[string]bool{"moved": true}, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithObjects(tc.objects...).Build()
			r := &SharedReconciler{Client: c}
			var vms []sharedVM
			for _, n := range tc.served {
				vms = append(vms, sharedVM{name: n})
			}
			var err error
			if len(vms) > 0 {
				err = r.ensureStateSecret(t.Context(), ns, vms, tc.leaving)
			} else {
				err = r.remove(t.Context(), ns, tc.leaving)
			}
			if err != nil {
				t.Fatal(err)
			}
			got := &corev1.Secret{}
			err = c.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: bmcspec.SharedStateSecret}, got)
			switch {
			case tc.want == nil && !apierrors.IsNotFound(err):
				t.Fatalf("state Secret %v (%v), want it deleted", got.Data, err)
			case tc.want == nil:
			case err != nil:
				t.Fatal(err)
			case !slices.Equal(slices.Sorted(maps.Keys(got.Data)), tc.want):
				t.Errorf("entries %v, want %v", slices.Sorted(maps.Keys(got.Data)), tc.want)
			}
		})
	}
}
