package controllers

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/virtmetal/virtmetal/internal/kubescheme"
)

// serialStamper stamps the serial "<vm>.<namespace>", as the identity
// stamper does.
type serialStamper struct{}

func (serialStamper) Stamp(_ context.Context, vm *kubevirtv1.VirtualMachine) ([]string, error) {
	vm.Spec.Template.Spec.Domain.Firmware = &kubevirtv1.Firmware{Serial: vm.Name + "." + vm.Namespace}
	return nil, nil
}

// TestIdentityPatchWaitsForTheCache: a VM read again as it was before its
// identity patch (a cache behind that patch) gets no second patch, which
// would only conflict; read as it is after, none is needed.
func TestIdentityPatchWaitsForTheCache(t *testing.T) {
	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "web1"},
		Spec:       kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{}},
	}
	patches := 0
	c := fake.NewClientBuilder().WithScheme(kubescheme.New()).WithObjects(vm).WithInterceptorFuncs(interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			patches++
			return c.Patch(ctx, obj, patch, opts...)
		},
	}).Build()
	r := &EnrolmentReconciler{Client: c, Identity: serialStamper{}}
	before := &kubevirtv1.VirtualMachine{}
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(vm), before); err != nil {
		t.Fatal(err)
	}
	after := &kubevirtv1.VirtualMachine{}
	steps := []struct {
		name    string
		read    func() *kubevirtv1.VirtualMachine
		patches int
	}{
		{"first read: patched", func() *kubevirtv1.VirtualMachine { return before.DeepCopyObject().(*kubevirtv1.VirtualMachine) }, 1},
		{"the same version again: no patch", func() *kubevirtv1.VirtualMachine { return before.DeepCopyObject().(*kubevirtv1.VirtualMachine) }, 1},
		{"the patched version: nothing to patch", func() *kubevirtv1.VirtualMachine {
			if err := c.Get(t.Context(), client.ObjectKeyFromObject(vm), after); err != nil {
				t.Fatal(err)
			}
			return after
		}, 1},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			if _, _, err := r.repairIdentity(t.Context(), step.read()); err != nil {
				t.Fatal(err)
			}
			if patches != step.patches {
				t.Errorf("%d patches, want %d", patches, step.patches)
			}
		})
	}
	if len(r.patchedFrom) != 0 {
		t.Errorf("patchedFrom %v, want it forgotten once the cache shows the patch", r.patchedFrom)
	}
}
