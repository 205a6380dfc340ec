package maas_test

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/virtmetal/virtmetal/maas"
)

func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := kubevirtv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return scheme
}

func bmcSecret(vm maas.VMRef, data map[string]string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: maas.BMCSecretName(vm.Name)}, Data: map[string][]byte{}}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

func TestKubeClusterBMCCredentials(t *testing.T) {
	dotted := maas.VMRef{Namespace: "ns", Name: "web.prod"}
	tests := []struct {
		name    string
		objects []client.Object
		vm      maas.VMRef
		want    maas.Credentials
		wantErr error
	}{
		{
			name:    "present",
			objects: []client.Object{bmcSecret(vmA, map[string]string{"username": "admin", "password": "pw"})},
			vm:      vmA,
			want:    maas.Credentials{Username: "admin", Password: "pw"},
		},
		{
			name:    "dotted VM name",
			objects: []client.Object{bmcSecret(dotted, map[string]string{"username": "u", "password": "p"})},
			vm:      dotted,
			want:    maas.Credentials{Username: "u", Password: "p"},
		},
		{
			name:    "same VM name in the other namespace is not used",
			objects: []client.Object{bmcSecret(vmB, map[string]string{"username": "admin", "password": "pw"})},
			vm:      vmA,
			wantErr: maas.ErrNotFound,
		},
		{name: "missing", vm: vmA, wantErr: maas.ErrNotFound},
		{
			name:    "no password",
			objects: []client.Object{bmcSecret(vmA, map[string]string{"username": "admin"})},
			vm:      vmA,
			wantErr: maas.ErrInvalidArgument,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(tt.objects...).Build()
			got, err := maas.KubeCluster{Client: c}.BMCCredentials(context.Background(), tt.vm)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) || got != tt.want {
				t.Fatalf("got %+v, %v; want %+v, %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestKubeClusterBMCCredentialsAPIError(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return errors.New("apiserver down")
		},
	}).Build()
	_, err := maas.KubeCluster{Client: c}.BMCCredentials(context.Background(), vmA)
	if !errors.Is(err, maas.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
}

func TestKubeClusterReportMachine(t *testing.T) {
	vm := &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{
		Namespace: vmA.Namespace, Name: vmA.Name,
		Annotations: map[string]string{"keep": "me"},
	}}
	patches := 0
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(vm).WithInterceptorFuncs(interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			patches++
			if patch.Type() != types.MergePatchType {
				t.Errorf("patch type = %s, want merge patch", patch.Type())
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	}).Build()
	cluster := maas.KubeCluster{Client: c}
	ctx := context.Background()

	steps := []struct {
		systemID, status string
		wantPatches      int
	}{
		{"abc123", "Commissioning", 1},
		{"abc123", "Commissioning", 1}, // unchanged: no patch
		{"abc123", "Ready", 2},
	}
	for _, step := range steps {
		if err := cluster.ReportMachine(ctx, vmA, step.systemID, step.status); err != nil {
			t.Fatal(err)
		}
		if patches != step.wantPatches {
			t.Fatalf("after reporting %s: %d patches, want %d", step.status, patches, step.wantPatches)
		}
		var got kubevirtv1.VirtualMachine
		if err := c.Get(ctx, types.NamespacedName{Namespace: vmA.Namespace, Name: vmA.Name}, &got); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"keep": "me", maas.AnnotationSystemID: step.systemID, maas.AnnotationStatus: step.status}
		if len(got.Annotations) != len(want) {
			t.Fatalf("annotations = %v, want %v", got.Annotations, want)
		}
		for k, v := range want {
			if got.Annotations[k] != v {
				t.Fatalf("annotations = %v, want %v", got.Annotations, want)
			}
		}
	}

	if err := cluster.ReportMachine(ctx, vmB, "x", "New"); !errors.Is(err, maas.ErrNotFound) {
		t.Fatalf("missing VM: err = %v, want ErrNotFound", err)
	}
}
