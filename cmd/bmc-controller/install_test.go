package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/deploy"
	"github.com/virtmetal/virtmetal/internal/kubetest"
	"github.com/virtmetal/virtmetal/internal/poll"
)

const installNamespace = "virtmetal-system"

// TestInstall installs deploy/ as `kubectl apply -k deploy/` does (kustomize
// build, then server-side apply of every object) on the API server, with
// test-only stand-ins for cert-manager's CRDs, and checks that every object
// is accepted and the webhooks fail closed where they apply. Then it runs
// the command as the installed Deployment does (its args, its ConfigMap, its
// ServiceAccount's permissions, without the webhook server, which envtest
// could not reach) and sees a VM of an opted-in namespace get its BMC, and
// a changed selector in the installed ConfigMap take effect.
func TestInstall(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := env.Client

	objects, err := deploy.Build()
	if err != nil {
		t.Fatal(err)
	}
	// The webhook configurations would refuse the VMs of the package's
	// other tests: they go whatever happens here.
	t.Cleanup(func() {
		for _, o := range objects {
			if strings.HasSuffix(o.GetKind(), "WebhookConfiguration") {
				_ = c.Delete(context.Background(), o.DeepCopy())
			}
		}
	})
	applyAll(ctx, t, c, readObjects(t, "testdata/cert-manager-crds.yaml"))
	early := earlyVMI(ctx, t, c)
	applyAll(ctx, t, c, objects)
	for _, o := range objects {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(o.GroupVersionKind())
		if err := c.Get(ctx, client.ObjectKeyFromObject(o), got); err != nil {
			t.Errorf("%s %s not installed: %v", o.GetKind(), o.GetName(), err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "install-a", Labels: map[string]string{"virtmetal.io/enabled": "true"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "install-plain"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "install-b", Labels: map[string]string{"virtmetal.io/tenant": "b"}}},
	} {
		if err := c.Create(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	// No webhook server answers here, as when the controller is down.
	t.Run("webhooks fail closed where they apply", func(t *testing.T) {
		tests := []struct {
			name, namespace, serial string
			refusedBy               string
		}{
			{"opted-in namespace", "install-a", "", "mvirtualmachine.bmc.virtmetal.io"},
			{"other namespace, claims no identity", "install-plain", "", ""},
			{"other namespace, claims a serial", "install-plain", "web1.install-a", "vvirtualmachine.bmc.virtmetal.io"},
		}
		for i, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				vm := pxeVM(tc.namespace, fmt.Sprintf("closed%d", i))
				if tc.serial != "" {
					vm.Spec.Template.Spec.Domain.Firmware = &kubevirtv1.Firmware{Serial: tc.serial}
				}
				createdOrRefusedBy(ctx, t, c, vm, tc.refusedBy)
			})
		}
	})
	t.Run("webhooks of every door to a VMI fail closed where they apply", func(t *testing.T) {
		doorsFailClosed(ctx, t, c, early)
	})
	for _, o := range objects {
		if strings.HasSuffix(o.GetKind(), "WebhookConfiguration") {
			if err := c.Delete(ctx, o.DeepCopy()); err != nil {
				t.Fatal(err)
			}
		}
	}

	config := &corev1.ConfigMap{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: installNamespace, Name: "virtmetal-config"}, config); err != nil {
		t.Fatal(err)
	}
	args := installedArgs(ctx, t, c, config)
	kubeconfig, err := env.KubeConfigFor(kubetest.ServiceAccountUser(installNamespace, "virtmetal-controller"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	// Appended flags win: a kubeconfig instead of in-cluster config, and no
	// webhook server, metrics or fixed probe port on this shared machine.
	args = append(args, "--kubeconfig", path, "--webhook-port", "0", "--metrics-bind-address", "0", "--health-probe-bind-address", freePort(t))
	// In a process of its own, as in its pod: controller-runtime allows
	// one controller of a name per process, and the package's other test
	// runs the command too.
	var logs syncBuffer
	child := exec.Command(os.Args[0], "-test.run=^$")
	encoded, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	child.Env = append(os.Environ(), runArgsEnv+"="+string(encoded))
	child.Stdout, child.Stderr = &logs, &logs
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	defer func() {
		_ = child.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("bmc-controller: %v; logs:\n%s", err, logs.String())
			}
		case <-time.After(time.Minute):
			_ = child.Process.Kill()
			<-exited
			t.Errorf("bmc-controller still running a minute after SIGTERM; logs:\n%s", logs.String())
		}
	}()

	if err := c.Create(ctx, pxeVM("install-a", "web1")); err != nil {
		t.Fatal(err)
	}
	waitForBMC(ctx, t, c, "install-a", "web1", config.Data["bmcImage"], &logs)
	// The installed host policy (deploy/hostpolicy) admits the controller's
	// own Ingress: its host is in the VM's namespace's zone.
	poll.Until(t, "web1's Ingress", func() error {
		in := &networkingv1.Ingress{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: "install-a", Name: "bmc-web1"}, in); err != nil {
			return fmt.Errorf("%w; logs:\n%s", err, logs.String())
		}
		if want := "web1.install-a." + config.Data["domain"]; in.Spec.Rules[0].Host != want {
			t.Fatalf("Ingress host %s, want %s", in.Spec.Rules[0].Host, want)
		}
		return nil
	})
	// It reconciles as the leader: the installed Role let it take the Lease.
	lease := &coordinationv1.Lease{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: installNamespace, Name: "bmc-controller.virtmetal.io"}, lease); err != nil {
		t.Fatalf("leader election Lease: %v", err)
	}

	config.Data["namespaceSelector"] = "virtmetal.io/tenant=b"
	if err := c.Update(ctx, config); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, pxeVM("install-b", "web1")); err != nil {
		t.Fatal(err)
	}
	waitForBMC(ctx, t, c, "install-b", "web1", config.Data["bmcImage"], &logs)
}

// applyAll server-side applies objects as kubectl apply --server-side
// would: Namespaces and CRDs first, the rest once the CRDs are served.
func applyAll(ctx context.Context, t *testing.T, c client.Client, objects []*unstructured.Unstructured) {
	t.Helper()
	first := func(o *unstructured.Unstructured) bool {
		return o.GetKind() == "Namespace" || o.GetKind() == "CustomResourceDefinition"
	}
	for _, pass := range []bool{true, false} {
		for _, o := range objects {
			if first(o) != pass {
				continue
			}
			if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(o.DeepCopy()), client.FieldOwner("kubectl"), client.ForceOwnership); err != nil {
				t.Fatalf("apply %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
			}
			if o.GetKind() == "CustomResourceDefinition" {
				waitEstablished(ctx, t, c, o.GetName())
			}
		}
	}
}

func waitEstablished(ctx context.Context, t *testing.T, c client.Client, name string) {
	t.Helper()
	poll.Until(t, "CRD "+name+" established", func() error {
		// The client's scheme has no apiextensions types.
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
		if err := c.Get(ctx, types.NamespacedName{Name: name}, u); err != nil {
			t.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, crd); err != nil {
			t.Fatal(err)
		}
		for _, cond := range crd.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("conditions %+v", crd.Status.Conditions)
	})
}

// installedArgs are the installed controller container's args, with the
// $(VAR) references the kubelet would expand from the container's env,
// here all from the installed ConfigMap.
func installedArgs(ctx context.Context, t *testing.T, c client.Client, config *corev1.ConfigMap) []string {
	t.Helper()
	d := &appsv1.Deployment{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: installNamespace, Name: "virtmetal-controller"}, d); err != nil {
		t.Fatal(err)
	}
	container := d.Spec.Template.Spec.Containers[0]
	var args []string
	for _, arg := range container.Args {
		for _, e := range container.Env {
			ref := e.ValueFrom.ConfigMapKeyRef
			if ref.Name != config.Name {
				t.Fatalf("env %s comes from ConfigMap %s, not the installed %s", e.Name, ref.Name, config.Name)
			}
			value, ok := config.Data[ref.Key]
			if !ok {
				t.Fatalf("env %s: key %s is not in ConfigMap %s", e.Name, ref.Key, config.Name)
			}
			arg = strings.ReplaceAll(arg, "$("+e.Name+")", value)
		}
		if strings.Contains(arg, "$(") {
			t.Fatalf("arg %q refers to a variable the container does not define", arg)
		}
		args = append(args, arg)
	}
	want := "--config=" + config.Namespace + "/" + config.Name
	if !slices.Contains(args, want) {
		t.Fatalf("args %q lack %s", args, want)
	}
	return args
}

func waitForBMC(ctx context.Context, t *testing.T, c client.Client, namespace, vm, image string, logs *syncBuffer) {
	t.Helper()
	poll.Until(t, namespace+"/"+vm+"'s BMC", func() error {
		bmc := &v1beta1.VirtualMachineBMC{}
		d := &appsv1.Deployment{}
		errBMC := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: vm}, bmc)
		errD := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: "bmc-" + vm}, d)
		if errBMC != nil || errD != nil {
			return fmt.Errorf("no VirtualMachineBMC (%v) or Deployment (%v); logs:\n%s", errBMC, errD, logs.String())
		}
		if got := d.Spec.Template.Spec.Containers[0].Image; got != image {
			t.Fatalf("BMC Deployment runs %q, want the configured %q", got, image)
		}
		return nil
	})
}

// pxeVM is a VM as deploy/examples writes them: a bridge interface, no MAC,
// no serial.
// createdOrRefusedBy creates o and wants it accepted (then deletes it)
// when refusedBy is empty, else refused by that webhook: with no webhook
// server answering, a webhook that is called fails closed, before any
// connection (the API server finds no endpoints; kubetest).
func createdOrRefusedBy(ctx context.Context, t *testing.T, c client.Client, o client.Object, refusedBy string) {
	t.Helper()
	err := c.Create(ctx, o)
	switch {
	case refusedBy == "" && err != nil:
		t.Fatalf("create = %v, want it accepted without calling a webhook", err)
	case refusedBy == "" && err == nil:
		if err := c.Delete(ctx, o); err != nil {
			t.Fatal(err)
		}
	case err == nil || !strings.Contains(err.Error(), refusedBy) || !strings.Contains(err.Error(), "no endpoints available"):
		t.Fatalf("create = %v, want it refused by webhook %s, for want of endpoints", err, refusedBy)
	}
}

func pxeVM(namespace, name string) *kubevirtv1.VirtualMachine {
	halted := kubevirtv1.RunStrategyHalted
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &halted,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				Spec: kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{
					Interfaces: []kubevirtv1.Interface{{Name: "pxe", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}}}},
				}}},
			},
		},
	}
}

func readObjects(t *testing.T, file string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	decoder := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var out []*unstructured.Unstructured
	for {
		o := &unstructured.Unstructured{}
		if err := decoder.Decode(&o.Object); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if o.Object != nil {
			out = append(out, o)
		}
	}
}

// runArgsEnv carries, as a JSON list, the arguments of a bmc-controller that
// the test binary runs instead of its tests (TestMain).
const runArgsEnv = "VIRTMETAL_TEST_RUN_BMC_CONTROLLER"

// runAsChild runs the command with args until SIGTERM and returns its exit
// code.
func runAsChild(encoded string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	var args []string
	if err := json.Unmarshal([]byte(encoded), &args); err != nil {
		fmt.Fprintln(os.Stderr, runArgsEnv+":", err)
		return 2
	}
	if err := run(ctx, args, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bmc-controller:", err)
		return 1
	}
	return 0
}

// syncBuffer is the controller's log, written by its goroutines while the
// test may read it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
