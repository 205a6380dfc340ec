package kubevirt_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/deploy/bmc"
	"github.com/virtmetal/virtmetal/internal/kubetest"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
)

func getDataVolume(t *testing.T, ns, name string) (*cdiv1beta1.DataVolume, error) {
	t.Helper()
	dv := &cdiv1beta1.DataVolume{}
	err := cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name + "-virtmetal-media"}, dv)
	return dv, err
}

// TestConcurrentInsertsAndEject: of concurrent inserts exactly one wins and
// its DataVolume survives, importing its image, owned by the VM; eject
// deletes it.
func TestConcurrentInsertsAndEject(t *testing.T) {
	ns := cluster.NewNamespace(t)
	newVM(t, ns, "vm", nil)
	m := mustMachine(t, kubevirttest.StartBackend(t, cluster.Config, ns, "vm", kubevirt.Options{}), "vm")
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = m.InsertMedia(ctx, fmt.Sprintf("http://images.example/%d.iso", i)) })
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner < 0:
			winner = i
		case err == nil:
			t.Fatalf("inserts %d and %d both succeeded", winner, i)
		case !errors.Is(err, machine.ErrConflict):
			t.Fatalf("losing insert %d: %v, want ErrConflict", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no insert succeeded")
	}
	image := fmt.Sprintf("http://images.example/%d.iso", winner)
	if media, err := m.VirtualMedia(ctx); err != nil || media.Image != image {
		t.Fatalf("VirtualMedia = %+v, %v; want %s", media, err, image)
	}
	dv, err := getDataVolume(t, ns, "vm")
	if err != nil {
		t.Fatalf("the winner's DataVolume: %v", err)
	}
	if got := dv.Spec.Source.HTTP.URL; got != image {
		t.Errorf("DataVolume imports %s, want the winner's %s", got, image)
	}
	owners := dv.OwnerReferences
	if len(owners) != 1 || owners[0].Kind != "VirtualMachine" || owners[0].Name != "vm" || owners[0].UID != getVM(t, ns, "vm").UID {
		t.Errorf("DataVolume owners %+v, want the VM", owners)
	}
	if size := dv.Spec.Storage.Resources.Requests.Storage().String(); size != "8Gi" || dv.Labels["app.kubernetes.io/managed-by"] != "virtmetal" {
		t.Errorf("DataVolume size %s, labels %v", size, dv.Labels)
	}
	if err := m.EjectMedia(ctx); err != nil {
		t.Fatalf("EjectMedia: %v", err)
	}
	if _, err := getDataVolume(t, ns, "vm"); !apierrors.IsNotFound(err) {
		t.Errorf("DataVolume after eject: %v, want deleted", err)
	}
	if media, _ := m.VirtualMedia(ctx); media.Inserted {
		t.Errorf("media still inserted after eject")
	}
}

// failVMWrites answers every write of the VM with a server error, as an API
// server that fails the update after the DataVolume was created would.
type failVMWrites struct{ next http.RoundTripper }

func (f failVMWrites) RoundTrip(req *http.Request) (*http.Response, error) {
	if (req.Method == http.MethodPut || req.Method == http.MethodPatch) && strings.Contains(req.URL.Path, "/virtualmachines/") {
		body := `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected","reason":"InternalError","code":500}`
		return &http.Response{StatusCode: http.StatusInternalServerError, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(body)), Request: req}, nil
	}
	return f.next.RoundTrip(req)
}

// TestFailedInsertLeavesNoDataVolume: when attaching fails, the DataVolume
// the insert created is deleted.
func TestFailedInsertLeavesNoDataVolume(t *testing.T) {
	ns := cluster.NewNamespace(t)
	newVM(t, ns, "vm", nil)
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return failVMWrites{next: rt} })
	m := mustMachine(t, kubevirttest.StartBackend(t, cfg, ns, "vm", kubevirt.Options{}), "vm")
	if err := m.InsertMedia(t.Context(), "http://images.example/a.iso"); err == nil {
		t.Fatal("InsertMedia succeeded although the VM could not be written")
	}
	if _, err := getDataVolume(t, ns, "vm"); !apierrors.IsNotFound(err) {
		t.Fatalf("DataVolume after a failed insert: %v, want none", err)
	}
}

// setImportStatus writes the media DataVolume's status as CDI's importer
// would: the test cluster serves CDI's API but runs no importer, so the
// test plays its part.
func setImportStatus(t *testing.T, ns, vm string, status cdiv1beta1.DataVolumeStatus) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		dv, err := getDataVolume(t, ns, vm)
		if err != nil {
			return err
		}
		dv.Status = status
		return cluster.Client.Status().Update(t.Context(), dv)
	})
	if err != nil {
		t.Fatalf("writing the DataVolume's status: %v", err)
	}
}

// TestImportProgress: the media's State and Percent follow the
// DataVolume's import, inserting the same URL again (Ironic's retry)
// changes nothing, another URL is a conflict, and the VM's own CD-ROM
// and volumes stay as they were through insert and eject; all of it with
// the per-VM Role's rights.
func TestImportProgress(t *testing.T) {
	ns := cluster.NewNamespace(t)
	newVM(t, ns, "vm", func(vm *kubevirtv1.VirtualMachine) {
		spec := &vm.Spec.Template.Spec
		spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, kubevirtv1.Disk{
			Name: "own-cdrom", DiskDevice: kubevirtv1.DiskDevice{CDRom: &kubevirtv1.CDRomTarget{Bus: kubevirtv1.DiskBusSATA}},
		})
		spec.Volumes = append(spec.Volumes, kubevirtv1.Volume{
			Name:         "own-cdrom",
			VolumeSource: kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: "own-installer"}},
		})
	})
	own := getVM(t, ns, "vm").Spec.Template.Spec
	// As the VM's bmc-server is: its ServiceAccount with the per-VM Role,
	// which must grant every call the media makes.
	objs, err := bmc.RBACObjects(bmc.RBACParams{Namespace: ns, VMName: "vm"})
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range objs {
		if err := cluster.Client.Create(t.Context(), obj); err != nil {
			t.Fatalf("creating %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
	cfg, err := cluster.ConfigFor(kubetest.ServiceAccountUser(ns, objs[0].GetName()), "system:serviceaccounts", "system:serviceaccounts:"+ns)
	if err != nil {
		t.Fatal(err)
	}
	m := mustMachine(t, kubevirttest.StartBackend(t, cfg, ns, "vm", kubevirt.Options{}), "vm")
	ctx := t.Context()
	const image = "http://images.example/installer.iso"
	if err := m.InsertMedia(ctx, image); err != nil {
		t.Fatalf("InsertMedia: %v", err)
	}
	dv, err := getDataVolume(t, ns, "vm")
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name    string
		status  cdiv1beta1.DataVolumeStatus
		state   machine.MediaState
		percent int
		problem string
	}{
		{"no status yet", cdiv1beta1.DataVolumeStatus{}, machine.MediaImporting, 0, ""},
		{"waiting for the VM to start", cdiv1beta1.DataVolumeStatus{Phase: cdiv1beta1.WaitForFirstConsumer}, machine.MediaPending, 0, ""},
		{"importing", cdiv1beta1.DataVolumeStatus{Phase: cdiv1beta1.ImportInProgress, Progress: "45.3%"}, machine.MediaImporting, 45, ""},
		{"progress not known", cdiv1beta1.DataVolumeStatus{Phase: cdiv1beta1.ImportInProgress, Progress: "N/A"}, machine.MediaImporting, 0, ""},
		{"failed", cdiv1beta1.DataVolumeStatus{Phase: cdiv1beta1.Failed, Progress: "12.0%", Conditions: []cdiv1beta1.DataVolumeCondition{
			{Type: cdiv1beta1.DataVolumeBound, Status: corev1.ConditionTrue, Message: "PVC bound"},
			{Type: cdiv1beta1.DataVolumeRunning, Status: corev1.ConditionFalse, Reason: "Error", Message: "HTTP 404 fetching the image"},
		}}, machine.MediaFailed, 12, "HTTP 404 fetching the image"},
		{"succeeded", cdiv1beta1.DataVolumeStatus{Phase: cdiv1beta1.Succeeded, Progress: "100.0%"}, machine.MediaReady, 100, ""},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			setImportStatus(t, ns, "vm", s.status)
			media, err := m.VirtualMedia(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !media.Inserted || media.Image != image || media.State != s.state || media.Percent != s.percent || media.Problem != s.problem {
				t.Errorf("media %+v, want %s at %d%% (problem %q)", media, s.state, s.percent, s.problem)
			}
		})
	}
	if err := m.InsertMedia(ctx, image); err != nil {
		t.Errorf("inserting the inserted image again: %v, want nil", err)
	}
	if err := m.InsertMedia(ctx, "http://images.example/other.iso"); !errors.Is(err, machine.ErrConflict) {
		t.Errorf("inserting another image: %v, want ErrConflict", err)
	}
	if again, err := getDataVolume(t, ns, "vm"); err != nil || again.UID != dv.UID || again.Spec.Source.HTTP.URL != image {
		t.Errorf("the refused and the repeated insert replaced the DataVolume: %v", err)
	}
	inserted := getVM(t, ns, "vm").Spec.Template.Spec
	if got := withoutMedia(inserted); !equality.Semantic.DeepEqual(got.Disks, own.Domain.Devices.Disks) || !equality.Semantic.DeepEqual(got.Volumes, own.Volumes) {
		t.Errorf("insert changed the VM's own drives:\ndisks %+v\nvolumes %+v", got.Disks, got.Volumes)
	}
	if len(inserted.Volumes) != len(own.Volumes)+1 {
		t.Errorf("inserted media is not a volume of its own: %+v", inserted.Volumes)
	}
	if err := m.EjectMedia(ctx); err != nil {
		t.Fatal(err)
	}
	ejected := getVM(t, ns, "vm").Spec.Template.Spec
	if !equality.Semantic.DeepEqual(ejected.Domain.Devices.Disks, own.Domain.Devices.Disks) || !equality.Semantic.DeepEqual(ejected.Volumes, own.Volumes) {
		t.Errorf("after eject the VM's drives are\ndisks %+v\nvolumes %+v\nwant as created", ejected.Domain.Devices.Disks, ejected.Volumes)
	}
	if media, err := m.VirtualMedia(ctx); err != nil || media.Inserted || media.State != "" {
		t.Errorf("after eject: %+v, %v", media, err)
	}
}

// ownDrives are a VM's disks and volumes.
type ownDrives struct {
	Disks   []kubevirtv1.Disk
	Volumes []kubevirtv1.Volume
}

// withoutMedia is spec's drives but the media's.
func withoutMedia(spec kubevirtv1.VirtualMachineInstanceSpec) ownDrives {
	var d ownDrives
	for _, disk := range spec.Domain.Devices.Disks {
		if disk.Name != "virtmetal-media" {
			d.Disks = append(d.Disks, disk)
		}
	}
	for _, v := range spec.Volumes {
		if v.Name != "virtmetal-media" {
			d.Volumes = append(d.Volumes, v)
		}
	}
	return d
}

// TestMediaLeavesOthersDataVolumes: a DataVolume named as the media volume
// that the BMC did not make (a user's disk, owned by the VM through a
// dataVolumeTemplate, or labelled as the BMC labels, or neither) survives
// InsertMedia, which is refused as a conflict, and Eject, which empties
// the drive all the same. One the BMC left behind for this VM is
// replaced.
func TestMediaLeavesOthersDataVolumes(t *testing.T) {
	tests := []struct {
		name            string
		labelled, owned bool
	}{
		{"neither labelled nor owned", false, false},
		{"owned by the VM, not labelled", false, true},
		{"labelled, not owned by the VM", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := cluster.NewNamespace(t)
			vm := getVM(t, ns, newVM(t, ns, "vm", nil).Name)
			users := userDataVolume(ns, "vm")
			if tt.labelled {
				users.Labels = map[string]string{"app.kubernetes.io/managed-by": "virtmetal"}
			}
			if tt.owned {
				users.OwnerReferences = []metav1.OwnerReference{{APIVersion: kubevirtv1.SchemeGroupVersion.String(), Kind: "VirtualMachine", Name: vm.Name, UID: vm.UID}}
			}
			if err := cluster.Client.Create(t.Context(), users); err != nil {
				t.Fatal(err)
			}
			m := mustMachine(t, kubevirttest.StartBackend(t, cluster.Config, ns, "vm", kubevirt.Options{}), "vm")
			if err := m.EjectMedia(t.Context()); err != nil {
				t.Errorf("EjectMedia of the empty drive: %v, want nil", err)
			}
			survives(t, ns, users, "EjectMedia")
			if err := m.InsertMedia(t.Context(), "http://images.example/installer.iso"); !errors.Is(err, machine.ErrConflict) {
				t.Errorf("InsertMedia: %v, want ErrConflict", err)
			}
			survives(t, ns, users, "InsertMedia")
			if media, err := m.VirtualMedia(t.Context()); err != nil || media.Inserted {
				t.Errorf("media %+v, %v; want an empty drive", media, err)
			}
		})
	}
	t.Run("the BMC's own left behind is replaced", func(t *testing.T) {
		ns := cluster.NewNamespace(t)
		vm := getVM(t, ns, newVM(t, ns, "vm", nil).Name)
		left := userDataVolume(ns, "vm")
		left.Labels = map[string]string{"app.kubernetes.io/managed-by": "virtmetal"}
		left.OwnerReferences = []metav1.OwnerReference{{APIVersion: kubevirtv1.SchemeGroupVersion.String(), Kind: "VirtualMachine", Name: vm.Name, UID: vm.UID}}
		if err := cluster.Client.Create(t.Context(), left); err != nil {
			t.Fatal(err)
		}
		m := mustMachine(t, kubevirttest.StartBackend(t, cluster.Config, ns, "vm", kubevirt.Options{}), "vm")
		const image = "http://images.example/installer.iso"
		if err := m.InsertMedia(t.Context(), image); err != nil {
			t.Fatalf("InsertMedia: %v", err)
		}
		if dv, err := getDataVolume(t, ns, "vm"); err != nil || dv.UID == left.UID || dv.Spec.Source.HTTP.URL != image {
			t.Errorf("DataVolume %v, %v; want a new one importing %s", dv.UID, err, image)
		}
		if err := m.EjectMedia(t.Context()); err != nil {
			t.Fatal(err)
		}
		if _, err := getDataVolume(t, ns, "vm"); !apierrors.IsNotFound(err) {
			t.Errorf("the BMC's DataVolume after eject: %v, want deleted", err)
		}
	})
}

// userDataVolume is a blank DataVolume a user made under the media
// volume's name.
func userDataVolume(ns, vm string) *cdiv1beta1.DataVolume {
	return &cdiv1beta1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{Name: vm + "-virtmetal-media", Namespace: ns},
		Spec: cdiv1beta1.DataVolumeSpec{
			Source: &cdiv1beta1.DataVolumeSource{Blank: &cdiv1beta1.DataVolumeBlankImage{}},
			Storage: &cdiv1beta1.StorageSpec{Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			}},
		},
	}
}

// survives fails t unless the DataVolume want is still there, unchanged.
func survives(t *testing.T, ns string, want *cdiv1beta1.DataVolume, after string) {
	t.Helper()
	got, err := getDataVolume(t, ns, "vm")
	if err != nil || got.UID != want.UID || got.DeletionTimestamp != nil || got.Spec.Source.Blank == nil {
		t.Errorf("the user's DataVolume after %s: %v (deleting %v), want it untouched", after, err, err == nil && got.DeletionTimestamp != nil)
	}
}
