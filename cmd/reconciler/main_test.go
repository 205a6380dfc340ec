package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"

	"github.com/virtmetal/virtmetal/maas"
	"github.com/virtmetal/virtmetal/maas/maastest"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
		check   func(t *testing.T, o options)
	}{
		{
			name: "flags",
			args: []string{"--maas-url", "http://maas/MAAS", "--domain", "bmc.example.org", "--interval", "30s", "--once", "--dry-run"},
			check: func(t *testing.T, o options) {
				if o.maasURL != "http://maas/MAAS" || o.domain != "bmc.example.org" || o.interval != 30*time.Second || !o.once || !o.dryRun {
					t.Errorf("options = %+v", o)
				}
			},
		},
		{
			name: "environment",
			env:  map[string]string{"MAAS_URL": "http://maas/MAAS", "VIRTMETAL_BMC_DOMAIN": "bmc.example.org", "MAAS_API_KEY_FILE": "/k"},
			check: func(t *testing.T, o options) {
				if o.maasURL != "http://maas/MAAS" || o.domain != "bmc.example.org" || o.maasAPIKeyFile != "/k" || o.interval != time.Minute {
					t.Errorf("options = %+v", o)
				}
			},
		},
		{name: "no URL", args: []string{"--domain", "d.org"}, wantErr: "--maas-url"},
		{name: "no domain", args: []string{"--maas-url", "http://m"}, wantErr: "--domain"},
		{name: "bad domain", args: []string{"--maas-url", "http://m", "--domain", "bad_domain.org"}, wantErr: "--domain"},
		{name: "zero interval", args: []string{"--maas-url", "http://m", "--domain", "d.org", "--interval", "0s"}, wantErr: "--interval"},
		{name: "stray argument", args: []string{"--maas-url", "http://m", "--domain", "d.org", "extra"}, wantErr: "unexpected"},
		{name: "unknown flag", args: []string{"--api-key", "x"}, wantErr: "flag provided but not defined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags(tt.args, env(tt.env), io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, o)
		})
	}
}

func TestLoadAPIKey(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(good, []byte("c:t:s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("only-secret-part"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		file    string
		env     map[string]string
		want    maas.APIKey
		wantErr bool
	}{
		{name: "file", file: good, want: maas.APIKey{Consumer: "c", Token: "t", Secret: "s"}},
		{name: "file wins over env", file: good, env: map[string]string{"MAAS_API_KEY": "x:y:z"}, want: maas.APIKey{Consumer: "c", Token: "t", Secret: "s"}},
		{name: "env", env: map[string]string{"MAAS_API_KEY": "x:y:z"}, want: maas.APIKey{Consumer: "x", Token: "y", Secret: "z"}},
		{name: "malformed file", file: bad, wantErr: true},
		{name: "malformed env", env: map[string]string{"MAAS_API_KEY": "only-secret-part"}, wantErr: true},
		{name: "missing file", file: filepath.Join(dir, "nope"), wantErr: true},
		{name: "none", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := loadAPIKey(options{maasAPIKeyFile: tt.file}, env(tt.env))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("got %v, %v", got, err)
			}
			if err != nil && strings.Contains(err.Error(), "only-secret-part") {
				t.Errorf("error leaks the key: %v", err)
			}
		})
	}
}

var testVM = maas.VMRef{Namespace: "tenant-a", Name: "vm-0"}

// fakeKube is a real KubeCluster on controller-runtime's fake client with
// one VM and its BMC Secret.
func fakeKube(t *testing.T) (client.Client, func() (maas.Cluster, error)) {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := kubevirtv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: testVM.Namespace, Name: testVM.Name}},
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: testVM.Namespace, Name: maas.BMCSecretName(testVM.Name)},
			Data:       map[string][]byte{maas.BMCSecretUsernameKey: []byte("admin"), maas.BMCSecretPasswordKey: []byte("pw")},
		},
	).Build()
	return c, func() (maas.Cluster, error) { return maas.KubeCluster{Client: c}, nil }
}

func newMaaS(t *testing.T) *maastest.Server {
	return maastest.New(t).WithMachine(maastest.Machine{
		SystemID: "m1", Hostname: "enlisted", PowerType: "redfish",
		PowerParameters: map[string]string{"power_address": maas.BMCAddress(testVM, "bmc.example.org"), "node_id": testVM.Name},
	})
}

func args(s *maastest.Server, extra ...string) []string {
	return append([]string{"--maas-url", s.URL(), "--domain", "bmc.example.org"}, extra...)
}

var keyEnv = env(map[string]string{"MAAS_API_KEY": maastest.APIKey})

func TestRunOnce(t *testing.T) {
	s := newMaaS(t)
	kube, newCluster := fakeKube(t)
	var stderr bytes.Buffer
	if err := run(context.Background(), args(s, "--once"), keyEnv, io.Discard, &stderr, newCluster); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	m, _ := s.Machine("m1")
	if m.Status != maastest.StatusCommissioning || m.Hostname != "vm-0-tenant-a" || m.PowerParameters["power_pass"] != "pw" {
		t.Errorf("machine = %+v", m)
	}
	var vm kubevirtv1.VirtualMachine
	if err := kube.Get(context.Background(), types.NamespacedName{Namespace: testVM.Namespace, Name: testVM.Name}, &vm); err != nil {
		t.Fatal(err)
	}
	if vm.Annotations[maas.AnnotationSystemID] != "m1" || vm.Annotations[maas.AnnotationStatus] != "Commissioning" {
		t.Errorf("annotations = %v", vm.Annotations)
	}
	if strings.Contains(stderr.String(), "tokensecret") || strings.Contains(stderr.String(), `"pw"`) {
		t.Errorf("log leaks a secret:\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), `"systemID":"m1"`) {
		t.Errorf("log lacks lowerCamel machine keys:\n%s", stderr.String())
	}
}

func TestRunOnceFailsWhenMaaSDoes(t *testing.T) {
	s := newMaaS(t)
	s.FailMatching(maastest.Match{}, -1, maastest.FaultServerError)
	_, newCluster := fakeKube(t)
	err := run(context.Background(), args(s, "--once"), keyEnv, io.Discard, io.Discard, newCluster)
	if !errors.Is(err, maas.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
}

func TestRunDryRun(t *testing.T) {
	s := newMaaS(t)
	kube, newCluster := fakeKube(t)
	var stdout bytes.Buffer
	if err := run(context.Background(), args(s, "--once", "--dry-run"), keyEnv, &stdout, io.Discard, newCluster); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "would commission m1") {
		t.Errorf("stdout = %q", stdout.String())
	}
	for _, r := range s.Requests() {
		if r.Method != "GET" {
			t.Errorf("dry run sent %s %s", r.Method, r.Path)
		}
	}
	var vm kubevirtv1.VirtualMachine
	if err := kube.Get(context.Background(), types.NamespacedName{Namespace: testVM.Namespace, Name: testVM.Name}, &vm); err != nil {
		t.Fatal(err)
	}
	if len(vm.Annotations) != 0 {
		t.Errorf("dry run annotated the VM: %v", vm.Annotations)
	}
}

func TestRunLoopUntilCanceled(t *testing.T) {
	s := newMaaS(t)
	_, newCluster := fakeKube(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- run(ctx, args(s, "--interval", "5ms"), keyEnv, io.Discard, io.Discard, newCluster) }()
	deadline := time.Now().Add(10 * time.Second)
	for s.Count(maastest.Match{Method: "GET", Path: "machines/", Op: ""}) < 3 {
		if time.Now().After(deadline) {
			t.Fatal("loop did not run three cycles")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

func TestRunConfigErrors(t *testing.T) {
	_, newCluster := fakeKube(t)
	for name, tc := range map[string]struct {
		args []string
		env  func(string) string
	}{
		"no key":  {[]string{"--maas-url", "http://127.0.0.1:1/MAAS", "--domain", "d.org", "--once"}, env(nil)},
		"bad URL": {[]string{"--maas-url", "127.0.0.1/MAAS", "--domain", "d.org", "--once"}, keyEnv},
	} {
		t.Run(name, func(t *testing.T) {
			if err := run(context.Background(), tc.args, tc.env, io.Discard, io.Discard, newCluster); err == nil {
				t.Fatal("run succeeded")
			}
		})
	}
}

// TestDeploymentArgsParse keeps deploy/reconciler/deployment.yaml in step
// with the flags.
func TestDeploymentArgsParse(t *testing.T) {
	data, err := os.ReadFile("../../deploy/reconciler/deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(data, &d); err != nil {
		t.Fatal(err)
	}
	c := d.Spec.Template.Spec.Containers[0]
	vars := map[string]string{}
	for _, e := range c.Env {
		vars[e.Name] = "http://maas.example.org:5240/MAAS"
	}
	o, err := parseFlags(c.Args, env(vars), io.Discard)
	if err != nil {
		t.Fatalf("deployment args %q: %v", c.Args, err)
	}
	if o.once || o.dryRun || o.maasAPIKeyFile == "" {
		t.Errorf("deployment options = %+v, want loop mode with a key file", o)
	}
}
