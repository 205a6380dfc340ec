package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/kubetest/realkubevirt"
	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/internal/ssetest"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
	"github.com/virtmetal/virtmetal/sim/console"
)

// cluster is the package's one cluster, KubeVirt's real control plane with
// its node stand-in (kubevirttest.StartReal): started by the first test that
// needs it (about 15 s), stopped by TestMain.
var cluster struct {
	once sync.Once
	c    *kubevirttest.Cluster
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if cluster.c != nil {
		_ = cluster.c.Stop()
	}
	os.Exit(code)
}

// useAPIServer starts the package's cluster if need be and points
// KUBECONFIG at its kube-apiserver (the network namespace's address), as a
// Deployment's ServiceAccount would.
func useAPIServer(t *testing.T) *kubevirttest.Cluster {
	t.Helper()
	cluster.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cluster.c, cluster.err = kubevirttest.StartReal(ctx, "bmc", realkubevirt.Options{KeepDir: os.Getenv("REALKUBEVIRT_KEEP") != ""})
	})
	if cluster.err != nil {
		t.Fatalf("KubeVirt's real control plane: %v", cluster.err)
	}
	kubeconfig, err := cluster.c.Real.KubeConfigFor("bmc-server-test", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", path)
	return cluster.c
}

// createVM creates a halted VM with a firmware UUID, a serial of
// name.namespace, one NIC and the guest memory virt-api's webhook requires.
func createVM(t *testing.T, c client.Client, namespace, name, uuid, mac string) *kubevirtv1.VirtualMachine {
	t.Helper()
	halted := kubevirtv1.RunStrategyHalted
	memory := resource.MustParse("128Mi")
	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &halted,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{
					Memory:   &kubevirtv1.Memory{Guest: &memory},
					Firmware: &kubevirtv1.Firmware{UUID: types.UID(uuid), Serial: name + "." + namespace},
					Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{{
						Name: "default", MacAddress: mac,
						InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}},
					}}},
				},
				Networks: []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
			}},
		},
	}
	if err := c.Create(t.Context(), vm); err != nil {
		t.Fatalf("creating the VM: %v", err)
	}
	return vm
}

// TestKubeVirtBackendWiring runs the command as a Deployment would, with a
// kubeconfig, on KubeVirt's real control plane: the system it serves is the VM.
func TestKubeVirtBackendWiring(t *testing.T) {
	env := useAPIServer(t)
	const uuid = "5b0c7f2e-8a43-4b0e-9d51-0d7a3c6f1e22"
	createVM(t, env.Client, "default", "node-1", uuid, "02:00:00:00:00:01")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	env2 := map[string]string{"BMC_USERNAME": "maas", "BMC_PASSWORD": "s3cret"}
	var stdout, stderr lockedBuffer
	done := make(chan error, 1)
	args := []string{"--backend", "kubevirt", "--namespace", "default", "--vm", "node-1", "--listen", "127.0.0.1:0", "--insecure-http"}
	go func() { done <- run(ctx, args, func(k string) string { return env2[k] }, &stdout, &stderr) }()
	urlPattern := regexp.MustCompile(`(http://\S+)/redfish/v1/`)
	var base string
	poll.Until(t, "the URL printed", func() error {
		if m := urlPattern.FindStringSubmatch(stdout.String()); m != nil {
			base = m[1]
			return nil
		}
		return fmt.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
	})
	// Not ready until the cache has synced; then ready, and served.
	poll.Until(t, "/readyz once the cache has synced", func() error {
		res, err := http.Get(base + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", res.StatusCode)
		}
		return nil
	})
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

	// A power action is in the BMC's log and, as an Event, on the VM.
	req, _ = http.NewRequest(http.MethodPost, base+"/redfish/v1/Systems/node-1/Actions/ComputerSystem.Reset", strings.NewReader(`{"ResetType":"On"}`))
	req.SetBasicAuth("maas", "s3cret")
	req.Header.Set("Content-Type", "application/json")
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != http.StatusNoContent {
		t.Fatalf("reset: %v %v", res, err)
	}
	const note = "Reset On by maas from 127.0.0.1 via Redfish: done"
	poll.Until(t, "the Event on the VM", func() error {
		var events eventsv1.EventList
		if err := env.Client.List(t.Context(), &events, client.InNamespace("default")); err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(events.Items, func(e eventsv1.Event) bool { return e.Regarding.Name == "node-1" && e.Note == note })
		if i < 0 {
			return fmt.Errorf("no Event %q on the VM; events %+v\n%s", note, events.Items, stderr.String())
		}
		e := events.Items[i]
		if e.Reason != "BMCReset" || e.Action != "Reset" || e.Type != "Normal" || e.Regarding.Kind != "VirtualMachine" || e.Regarding.UID == "" ||
			e.ReportingController != "virtmetal.io/bmc-server" {
			t.Errorf("event %+v", e)
		}
		return nil
	})

	// A change made on the VM, not through the BMC, reaches an event
	// subscriber as the backend tells it, not at the next of the
	// EventService's polls, 5 s apart.
	poll.Until(t, "the VM on", func() error {
		if state := powerState(t, base, "node-1"); state != "On" {
			return fmt.Errorf("PowerState %s", state)
		}
		return nil
	})
	stream, res := ssetest.Open(t, http.DefaultClient, base+"/redfish/v1/EventService/SSE", "maas", "s3cret", nil)
	if stream == nil {
		t.Fatalf("SSE: %d", res.StatusCode)
	}
	halted := []byte(`{"spec":{"runStrategy":"Halted"}}`)
	vm := &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "node-1"}}
	if err := env.Client.Patch(t.Context(), vm, client.RawPatch(types.MergePatchType, halted)); err != nil {
		t.Fatal(err)
	}
	if id, _ := stream.Next(t, 2*time.Second).Record(t); !strings.Contains(id, "PoweringOff") && !strings.Contains(id, "PoweredOff") {
		t.Errorf("after the VM was halted: %s, want its power going off", id)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run returned %v after shutdown", err)
	}
}

// powerState is the system's PowerState as the BMC at base serves it.
func powerState(t *testing.T, base, system string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/redfish/v1/Systems/"+system, nil)
	req.SetBasicAuth("maas", "s3cret")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body struct{ PowerState string }
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return body.PowerState
}

// TestSharedKubeVirtWiring runs the command as the per-namespace
// Deployment does, --vms-dir with two VMs, on KubeVirt's real control plane: each
// host serves its VM alone, with its credentials alone, and a power action
// on one host changes that VM only.
func TestSharedKubeVirtWiring(t *testing.T) {
	env := useAPIServer(t)
	const namespace = "team-a"
	if err := env.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		t.Fatal(err)
	}
	createVM(t, env.Client, namespace, "web1", "0f6c2a3e-1b2d-4c5e-8f90-a1b2c3d4e5f1", "02:00:00:00:01:01")
	createVM(t, env.Client, namespace, "web2", "0f6c2a3e-1b2d-4c5e-8f90-a1b2c3d4e5f2", "02:00:00:00:01:02")
	dir := t.TempDir()
	const web1Host, web2Host = "web1.team-a.bmc.example.com", "web2.team-a.bmc.example.com"
	writeVMFile(t, dir, "web1", "maas-web1", "pw-web1", web1Host)
	writeVMFile(t, dir, "web2", "maas-web2", "pw-web2", web2Host)

	s := startServer(t, []string{"--backend", "kubevirt", "--namespace", namespace, "--vms-dir", dir,
		"--listen", "127.0.0.1:0", "--insecure-http"}, nil, fastTuning)
	if !strings.Contains(s.stdout.String(), "VMs: 2 read from "+dir) {
		t.Errorf("banner %q: want it to count the 2 VMs", s.stdout.String())
	}
	httpClient := &http.Client{Timeout: 15 * time.Second}
	if got := doAtHost(t, httpClient, "GET", s.base+"/readyz", "10.244.0.7:8443", "", "", "").status; got != http.StatusOK {
		t.Errorf("/readyz at the pod's address: %d, want 200", got)
	}
	systems := func(host, user, pass string) (int, []string) {
		res := doAtHost(t, httpClient, "GET", s.base+"/redfish/v1/Systems", host, user, pass, "")
		return res.status, memberIDs(res.body)
	}
	for _, vm := range []struct{ name, host, user, pass string }{
		{"web1", web1Host, "maas-web1", "pw-web1"},
		{"web2", web2Host, "maas-web2", "pw-web2"},
	} {
		// 503 until the VM's cache has synced.
		var status int
		var ids []string
		poll.True(t, vm.name+"'s cache synced", func() bool {
			status, ids = systems(vm.host, vm.user, vm.pass)
			return status != http.StatusServiceUnavailable
		})
		if want := []string{"/redfish/v1/Systems/" + vm.name}; status != http.StatusOK || !slices.Equal(ids, want) {
			t.Fatalf("Systems at %s: %d %v, want 200 %v; stderr %s", vm.host, status, ids, want, s.stderr.String())
		}
	}
	if status, _ := systems(web1Host, "maas-web2", "pw-web2"); status != http.StatusUnauthorized {
		t.Errorf("web2's credentials at web1's host: %d, want 401", status)
	}

	reset := doAtHost(t, httpClient, "POST", s.base+"/redfish/v1/Systems/web1/Actions/ComputerSystem.Reset", web1Host,
		"maas-web1", "pw-web1", `{"ResetType": "On"}`)
	if reset.status/100 != 2 {
		t.Fatalf("Reset On at web1's host: %d %s", reset.status, reset.body)
	}
	runStrategy := func(name string) kubevirtv1.VirtualMachineRunStrategy {
		var vm kubevirtv1.VirtualMachine
		if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, &vm); err != nil {
			t.Fatal(err)
		}
		if vm.Spec.RunStrategy == nil {
			return ""
		}
		return *vm.Spec.RunStrategy
	}
	if got := runStrategy("web1"); got != kubevirtv1.RunStrategyRerunOnFailure {
		t.Errorf("web1's runStrategy after Reset On: %q, want %q", got, kubevirtv1.RunStrategyRerunOnFailure)
	}
	if got := runStrategy("web2"); got != kubevirtv1.RunStrategyHalted {
		t.Errorf("web2's runStrategy after Reset On at web1's host: %q, want %q", got, kubevirtv1.RunStrategyHalted)
	}

	// Each host's consoles are its VM's, with its credentials only.
	consoleURL := "ws" + strings.TrimPrefix(s.base, "http") + "/redfish/v1/Systems/web1/Oem/VirtMetal/SerialConsole"
	var serial *websocket.Conn
	poll.True(t, "web1's serial console once it runs", func() bool {
		var err error
		serial, _, err = dialAtHost(consoleURL, web1Host, "maas-web1", "pw-web1")
		return err == nil
	})
	defer serial.Close()
	var seen strings.Builder
	_ = serial.SetReadDeadline(time.Now().Add(30 * time.Second))
	for !strings.Contains(seen.String(), console.Prompt("web1")) {
		_, data, err := serial.ReadMessage()
		if err != nil {
			t.Fatalf("web1's serial console: %v after %q", err, seen.String())
		}
		seen.Write(data)
	}
	for _, tt := range []struct {
		name, url, host, user, pass string
		want                        int
	}{
		{"web2's credentials at web1's host", consoleURL, web1Host, "maas-web2", "pw-web2", http.StatusUnauthorized},
		{"web1's console at web2's host", consoleURL, web2Host, "maas-web2", "pw-web2", http.StatusNotFound},
		{"web2's console, web2 halted", strings.Replace(consoleURL, "web1", "web2", 1), web2Host, "maas-web2", "pw-web2", http.StatusConflict},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conn, res, err := dialAtHost(tt.url, tt.host, tt.user, tt.pass)
			if err == nil {
				conn.Close()
			}
			if res == nil || res.StatusCode != tt.want {
				t.Errorf("%v, %v; want %d", res, err, tt.want)
			}
		})
	}
}

// dialAtHost opens a console WebSocket at url, sent to the host an
// Ingress would route by, with Basic credentials.
func dialAtHost(url, host, user, pass string) (*websocket.Conn, *http.Response, error) {
	req, _ := http.NewRequest(http.MethodGet, "/", nil)
	req.SetBasicAuth(user, pass)
	header := http.Header{"Authorization": req.Header["Authorization"], "Host": {host}}
	return (&websocket.Dialer{HandshakeTimeout: 15 * time.Second}).Dial(url, header)
}

// memberIDs are the @odata.id of a collection's Members.
func memberIDs(collection []byte) []string {
	var body struct {
		Members []struct {
			ID string `json:"@odata.id"`
		}
	}
	_ = json.Unmarshal(collection, &body)
	var ids []string
	for _, m := range body.Members {
		ids = append(ids, m.ID)
	}
	return ids
}
