package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/virtmetal/virtmetal/controllers"
	"github.com/virtmetal/virtmetal/internal/kubetest"
	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/internal/version"
)

var env *kubetest.Env

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(runArgsEnv); ok {
		os.Exit(runAsChild(args))
	}
	var err error
	if env, err = kubetest.Start(kubetest.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = env.Stop()
	os.Exit(code)
}

func TestParseFlags(t *testing.T) {
	required := []string{"--domain", "bmc.example.org", "--bmc-image", "img"}
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"defaults", required, ""},
		{"no domain", []string{"--bmc-image", "img"}, "domain is required"},
		{"default image", []string{"--domain", "bmc.example.org"}, ""},
		{"no image", []string{"--domain", "bmc.example.org", "--bmc-image", ""}, "image is required"},
		{"bad domain", []string{"--domain", "Not A Domain", "--bmc-image", "img"}, "not a DNS name"},
		{"bad selector", append([]string{"--namespace-selector", "a in (b"}, required...), "--namespace-selector"},
		{"both issuers", append([]string{"--tls-issuer", "a", "--tls-cluster-issuer", "b"}, required...), "exclude each other"},
		{"shared workload", append([]string{"--workload", "shared"}, required...), ""},
		{"bad workload", append([]string{"--workload", "pod-per-namespace"}, required...), "neither pod-per-vm nor shared"},
		{"bad config name", append([]string{"--config", "just-a-name"}, required...), "NAMESPACE/NAME"},
		{"bad webhook port", append([]string{"--webhook-port", "70000"}, required...), "--webhook-port"},
		{"no cache sync time", append([]string{"--cache-sync-timeout", "0s"}, required...), "--cache-sync-timeout"},
		{"no shutdown time", append([]string{"--graceful-shutdown-timeout", "-1s"}, required...), "--graceful-shutdown-timeout"},
		{"denied networks", append([]string{"--destinations-denied", "10.244.0.0/16, 10.96.0.0/12", "--event-destinations-denied", "fd00::/8"}, required...), ""},
		{"bad denied network", append([]string{"--destinations-denied", "10.0.0.0/33"}, required...), "-destinations-denied"},
		{"bad denied network, former name", append([]string{"--event-destinations-denied", "10.0.0.0/33"}, required...), "-event-destinations-denied"},
		{"trusted proxies", append([]string{"--trusted-proxies", "10.244.3.0/24, 10.244.4.7/32", "--trusted-proxies", "fd00::/120"}, required...), ""},
		{"trusted pod network", append([]string{"--trusted-proxies", "10.244.0.0/16"}, required...), "never a whole pod network"},
		{"trusted proxies covering a denied network", append([]string{"--destinations-denied", "10.244.3.0/24", "--trusted-proxies", "10.244.3.0/24"}, required...), "covers 10.244.3.0/24"},
		{"stray argument", append(required, "extra"), "unexpected arguments"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseFlags(tc.args, &bytes.Buffer{})
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("parseFlags = %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("parseFlags = %v, want an error with %q", err, tc.wantErr)
			}
		})
	}
}

// TestBMCImageDefault: without --bmc-image the controller runs the
// bmc-server image of its own version; the flag replaces it, and the
// ConfigMap's bmcImage replaces both.
func TestBMCImageDefault(t *testing.T) {
	tests := []struct {
		name, version string
		args          []string
		want          string
	}{
		{"release", "v0.1.0", nil, "virtmetal/bmc-server:v0.1.0"},
		{"another release", "v1.2.3", nil, "virtmetal/bmc-server:v1.2.3"},
		{"dev build", "dev", nil, "virtmetal/bmc-server:dev"},
		{"flag", "v0.1.0", []string{"--bmc-image", "example/bmc-server:mine"}, "example/bmc-server:mine"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var usage bytes.Buffer
			o, err := parseFlagsOf(tc.version, append([]string{"--domain", "bmc.example.org"}, tc.args...), &usage)
			if err != nil {
				t.Fatal(err)
			}
			if o.controller.BMCImage != tc.want {
				t.Errorf("bmc-server image %q, want %q", o.controller.BMCImage, tc.want)
			}
		})
	}
	o, err := parseFlagsOf("v0.1.0", []string{"--domain", "bmc.example.org", "--config", "virtmetal-system/virtmetal-config"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	configMap := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "virtmetal-system", Name: "virtmetal-config"},
		Data:       map[string]string{"bmcImage": "example/bmc-server:from-config"},
	}
	source := &controllers.ConfigSource{
		Defaults:  o.controller,
		ConfigMap: types.NamespacedName{Namespace: configMap.Namespace, Name: configMap.Name},
		Reader:    fake.NewClientBuilder().WithObjects(configMap).Build(),
	}
	if cfg, err := source.Get(context.Background()); err != nil || cfg.BMCImage != "example/bmc-server:from-config" {
		t.Errorf("with the ConfigMap: bmc-server image %q (%v), want the ConfigMap's", cfg.BMCImage, err)
	}

	// The usage shows the default of the running binary's version.
	var usage bytes.Buffer
	want := `(default "virtmetal/bmc-server:` + version.Get() + `")`
	if _, err := parseFlags([]string{"--help"}, &usage); err == nil || !strings.Contains(usage.String(), want) {
		t.Errorf("--help: %v, want %s in\n%s", err, want, usage.String())
	}
}

func TestRunRefusesABadMACRange(t *testing.T) {
	err := run(context.Background(), []string{"--domain", "bmc.example.org", "--bmc-image", "img", "--mac-range", "03:00:00:00:00:00-03:00:00:00:00:ff"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "--mac-range") {
		t.Fatalf("run = %v, want a --mac-range error", err)
	}
}

// TestRunServesAnOptedInNamespace runs the command itself, as its
// Deployment does (a kubeconfig instead of in-cluster config, no webhook),
// and sees a VM get its BMC, its serial, and the manager's probes answer.
func TestRunServesAnOptedInNamespace(t *testing.T) {
	kubeconfig, err := env.AdminKubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	probes := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() {
		done <- run(ctx, []string{
			"--kubeconfig", path, "--domain", "bmc.example.org", "--bmc-image", "virtmetal/bmc-server:test",
			"--webhook-port", "0", "--metrics-bind-address", "0", "--health-probe-bind-address", probes,
		}, &logs)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run = %v; logs:\n%s", err, logs.String())
		}
	}()

	c := env.Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cmd", Labels: map[string]string{"virtmetal.io/enabled": "true"}}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "cmd", Name: "web1"},
		Spec: kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
			Spec: kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{
				Interfaces: []kubevirtv1.Interface{{Name: "pxe", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}}}},
			}}},
		}},
	}
	if err := c.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the BMC and the identity", func() error {
		got := &kubevirtv1.VirtualMachine{}
		d := &appsv1.Deployment{}
		errVM := c.Get(ctx, types.NamespacedName{Namespace: "cmd", Name: "web1"}, got)
		errD := c.Get(ctx, types.NamespacedName{Namespace: "cmd", Name: "bmc-web1"}, d)
		fw := got.Spec.Template.Spec.Domain.Firmware
		if errVM == nil && errD == nil && fw != nil && fw.Serial == "web1.cmd" && fw.UUID != "" &&
			got.Spec.Template.Spec.Domain.Devices.Interfaces[0].MacAddress != "" {
			return nil
		}
		return fmt.Errorf("VM %v firmware %+v, Deployment %v; logs:\n%s", errVM, fw, errD, logs.String())
	})
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get("http://" + probes + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s = %d", path, resp.StatusCode)
		}
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
