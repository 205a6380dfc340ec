package kubevirt_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
