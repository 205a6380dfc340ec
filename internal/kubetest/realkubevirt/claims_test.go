package realkubevirt_test

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/controllers"
	"github.com/virtmetal/virtmetal/internal/kubetest"
	"github.com/virtmetal/virtmetal/machine"
)

// controllerRBAC creates the ServiceAccount, Role and RoleBinding that
// bmc-controller renders for vm's pod-per-VM bmc-server, as it renders
// them (without the owner, which this test has no VirtualMachineBMC for).
func controllerRBAC(t *testing.T, vm *kubevirtv1.VirtualMachine) {
	t.Helper()
	b := &v1beta1.VirtualMachineBMC{ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: vm.Name}, Spec: v1beta1.VirtualMachineBMCSpec{VMName: vm.Name}}
	w, err := controllers.PodPerVM(controllers.WorkloadInput{BMC: b, VM: vm, Config: controllers.Config{Domain: "bmc.example.org", BMCImage: "virtmetal/bmc-server:test"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.ClusterObjects) > 0 {
		t.Fatalf("cluster RBAC %v for a VM without a cluster instancetype", w.ClusterObjects)
	}
	for _, o := range w.Objects {
		switch o.(type) {
		case *corev1.ServiceAccount, *rbacv1.Role, *rbacv1.RoleBinding:
			o.SetOwnerReferences(nil)
			if err := cluster.Client.Create(context.Background(), o); err != nil {
				t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
			}
		}
	}
}

// newClaim creates a claim of request; bound, its status says capacity
// (as the volume's binder would: no binder runs here).
func newClaim(t *testing.T, namespace, name, request, capacity string) {
	t.Helper()
	ctx := context.Background()
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(request)}},
		},
	}
	if err := cluster.Client.Create(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	if capacity == "" {
		return
	}
	pvc.Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(capacity)}}
	if err := cluster.Client.Status().Update(ctx, pvc); err != nil {
		t.Fatal(err)
	}
}

// TestClaimSizesOnRealKubeVirt: the disks on claims a VM names but does not
// make (a persistentVolumeClaim volume, a DataVolume made elsewhere) get
// their size from the claim, read by the backend as the VM's bmc-server
// with the Role bmc-controller renders: no 403. That Role opens no other
// claim of the namespace, nor the list of them.
func TestClaimSizesOnRealKubeVirt(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	newClaim(t, ns, "data", "10G", "10Gi") // the provisioner rounded it up
	newClaim(t, ns, "golden", "4Gi", "")   // not bound yet: its request
	newClaim(t, ns, "private", "1Gi", "1Gi")
	vm := newVM(ns, "vm", kubevirtv1.RunStrategyHalted)
	spec := &vm.Spec.Template.Spec
	for _, d := range []struct {
		name   string
		source kubevirtv1.VolumeSource
	}{
		{"data", kubevirtv1.VolumeSource{PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}},
		{"image", kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: "golden"}}},
		{"later", kubevirtv1.VolumeSource{PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "not-yet"}}}},
	} {
		spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, kubevirtv1.Disk{Name: d.name,
			DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}})
		spec.Volumes = append(spec.Volumes, kubevirtv1.Volume{Name: d.name, VolumeSource: d.source})
	}
	if err := cluster.Client.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	controllerRBAC(t, vm)
	m := machineAs(t, ns, "vm")

	want := []machine.Disk{
		{Name: "data", Kind: machine.DiskKindDisk, Bus: machine.DiskBusVirtio, CapacityBytes: 10 << 30},
		{Name: "image", Kind: machine.DiskKindDisk, Bus: machine.DiskBusVirtio, CapacityBytes: 4 << 30},
		{Name: "later", Kind: machine.DiskKindDisk, Bus: machine.DiskBusVirtio},
	}
	var inv machine.Inventory
	eventually(t, "the inventory", func() (bool, error) {
		var err error
		inv, err = m.Inventory(ctx) // once virt-controller has given the VM its firmware UUID
		return err == nil, err
	})
	if !slices.Equal(inv.Disks, want) {
		t.Errorf("disks\n%+v\nwant\n%+v", inv.Disks, want)
	}

	cfg, err := cluster.ConfigFor(kubetest.ServiceAccountUser(ns, "bmc-vm"), "system:serviceaccounts", "system:serviceaccounts:"+ns)
	if err != nil {
		t.Fatal(err)
	}
	k, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	claims := k.CoreV1().PersistentVolumeClaims(ns)
	for what, call := range map[string]func() error{
		"get data":    func() error { _, err := claims.Get(ctx, "data", metav1.GetOptions{}); return err },
		"get private": func() error { _, err := claims.Get(ctx, "private", metav1.GetOptions{}); return err },
		"list":        func() error { _, err := claims.List(ctx, metav1.ListOptions{}); return err },
		"watch": func() error {
			w, err := claims.Watch(ctx, metav1.ListOptions{})
			if err == nil {
				w.Stop()
			}
			return err
		},
		"update data": func() error {
			_, err := claims.Update(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: ns}}, metav1.UpdateOptions{})
			return err
		},
	} {
		err := call()
		switch allowed := what == "get data"; {
		case allowed && err != nil:
			t.Errorf("%s as the BMC: %v", what, err)
		case !allowed && !apierrors.IsForbidden(err):
			t.Errorf("%s as the BMC: %v, want Forbidden", what, err)
		}
	}
}
