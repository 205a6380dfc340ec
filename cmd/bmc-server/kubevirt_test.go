package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/internal/kubetest"
)

// TestKubeVirtBackendWiring runs the command as a Deployment would, with a
// kubeconfig, against a real API server: the system it serves is the VM.
func TestKubeVirtBackendWiring(t *testing.T) {
	env, err := kubetest.Start(kubetest.Options{})
	if err != nil {
		t.Fatalf("envtest: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	kubeconfig, err := env.AdminKubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", path)

	const uuid = "5b0c7f2e-8a43-4b0e-9d51-0d7a3c6f1e22"
	halted := kubevirtv1.RunStrategyHalted
	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "node-1"},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &halted,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{
					Firmware: &kubevirtv1.Firmware{UUID: uuid, Serial: "node-1.default"},
					Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{{
						Name: "default", MacAddress: "02:00:00:00:00:01",
						InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}},
					}}},
				},
				Networks: []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
			}},
		},
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := env.Client.Create(ctx, vm); err != nil {
		t.Fatalf("creating the VM: %v", err)
	}

	env2 := map[string]string{"BMC_USERNAME": "maas", "BMC_PASSWORD": "s3cret"}
	var stdout, stderr lockedBuffer
	done := make(chan error, 1)
	args := []string{"--backend", "kubevirt", "--namespace", "default", "--vm", "node-1", "--listen", "127.0.0.1:0", "--insecure-http"}
	go func() { done <- run(ctx, args, func(k string) string { return env2[k] }, &stdout, &stderr) }()
	urlPattern := regexp.MustCompile(`(http://\S+)/redfish/v1/`)
	var base string
	for deadline := time.Now().Add(10 * time.Second); base == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := urlPattern.FindStringSubmatch(stdout.String()); m != nil {
			base = m[1]
		}
	}
	if base == "" {
		t.Fatalf("no URL printed; stdout %q stderr %q", stdout.String(), stderr.String())
	}
	// Not ready until the cache has synced; then ready, and served.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		res, err := http.Get(base + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %d after the cache should have synced", res.StatusCode)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, base+"/redfish/v1/Systems/node-1", nil)
	req.SetBasicAuth("maas", "s3cret")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var system struct {
		UUID, SerialNumber, Manufacturer, PowerState string
	}
	if err := json.NewDecoder(res.Body).Decode(&system); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET system: %d %v", res.StatusCode, err)
	}
	if system.UUID != uuid || system.SerialNumber != "node-1.default" || system.Manufacturer != "KubeVirt" || system.PowerState != "Off" {
		t.Fatalf("system = %+v, want the VM's identity, powered off", system)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run returned %v after shutdown", err)
	}
}
