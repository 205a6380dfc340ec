package conformance_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
	"github.com/virtmetal/virtmetal/machine/memory"
)

// The client flows of issue 18: Ironic's through sushy
// (ironic/ironic_flows.py) and Tinkerbell's through bmclib (bmclib/, a
// module of its own), each against a BMC on both backends. The tests check
// what the client printed, what it sent (wireLog) and what the backend
// ended up with.

// wireRequest is one request as the BMC received it.
type wireRequest struct {
	Method, Path string
	IfMatch      string
	Token        bool // X-Auth-Token (a session) rather than Basic
	Body         map[string]any
	Status       int
}

func (r wireRequest) write() bool { return r.Method != http.MethodGet && r.Method != http.MethodHead }

// wireLog records every request the BMC receives.
type wireLog struct {
	mu   sync.Mutex
	reqs []wireRequest
}

func (l *wireLog) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		req := wireRequest{Method: r.Method, Path: r.URL.Path, IfMatch: r.Header.Get("If-Match"), Token: r.Header.Get("X-Auth-Token") != ""}
		_ = json.Unmarshal(body, &req.Body)
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		req.Status = sw.status
		l.mu.Lock()
		l.reqs = append(l.reqs, req)
		l.mu.Unlock()
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

// Flush keeps the event streams working through the recorder.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (l *wireLog) all() []wireRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reqs)
}

// writes are the requests that change something, but logins and logouts.
func (l *wireLog) writes() []wireRequest {
	var out []wireRequest
	for _, r := range l.all() {
		if r.write() && !strings.HasPrefix(r.Path, "/redfish/v1/SessionService/") {
			out = append(out, r)
		}
	}
	return out
}

// flowBMC is a BMC over TLS on one backend, serving one running machine
// with UEFI firmware, whose requests are recorded. With uefiOnly the
// machine cannot have Legacy firmware: on KubeVirt an arm64 VM (KubeVirt
// has SeaBIOS on amd64 only), powered off; on the memory backend, which
// offers both, the machine refuses Legacy when asked.
type flowBMC struct {
	ts     *httptest.Server
	wire   *wireLog
	system string
	m      machine.Machine
	boots  func() []machine.BootTarget
}

func startFlowBMC(t *testing.T, backend string, uefiOnly bool) flowBMC {
	t.Helper()
	wire := &wireLog{}
	if backend == "memory" {
		b := memory.New(memory.Options{})
		m := b.Get("vm-0")
		if err := m.Reset(t.Context(), machine.ResetOn); err != nil {
			t.Fatal(err)
		}
		var served machine.Backend = b
		if uefiOnly {
			served = machine.InterceptBackend(b, func(ctx context.Context, c machine.Call, call func(context.Context) error) error {
				if c.Op == machine.OpSetBootOverride && strings.Contains(c.Arg, string(machine.BootModeLegacy)) {
					return machine.Errorf(machine.ErrNotSupported, "boot mode Legacy")
				}
				return call(ctx)
			})
		}
		ts := serveBMCThrough(t, served, nil, wire.wrap)
		return flowBMC{ts: ts, wire: wire, system: "/redfish/v1/Systems/vm-0", m: m, boots: m.Boots}
	}
	ctx := t.Context()
	ns, name := cluster.NewNamespace(t), "node"
	vm := pxeVM(ns, name, "02:00:00:00:18:06")
	if uefiOnly {
		vm.Spec.Template.Spec.Architecture = "arm64"
		vm.Spec.RunStrategy = ptr.To(kubevirtv1.RunStrategyHalted)
	}
	createRunning(t, vm)
	importMedia(t, ns, name)
	b := kubevirttest.StartBackend(t, cluster.Config, ns, name, kubevirt.Options{})
	m, err := b.Machine(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	ts := serveBMCThrough(t, b, nil, wire.wrap)
	return flowBMC{ts: ts, wire: wire, system: "/redfish/v1/Systems/" + name, m: m, boots: func() []machine.BootTarget { return cluster.Boots(ns, name) }}
}

// importMedia stands in for CDI's importer, which the test cluster does
// not run, for the VM's media DataVolume: while one exists that has not
// finished, it makes its PVC, Bound, and marks the import Succeeded, so
// that KubeVirt starts the VM with the CD attached.
func importMedia(t *testing.T, namespace, vm string) {
	key := client.ObjectKey{Namespace: namespace, Name: vm + "-virtmetal-media"}
	inBackground(t, 100*time.Millisecond, func(ctx context.Context) {
		dv := &cdiv1beta1.DataVolume{}
		if err := cluster.Client.Get(ctx, key, dv); err != nil || dv.Status.Phase == cdiv1beta1.Succeeded || dv.DeletionTimestamp != nil || dv.Spec.Storage == nil {
			return
		}
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: dv.Name},
			Spec:       corev1.PersistentVolumeClaimSpec{AccessModes: dv.Spec.Storage.AccessModes, Resources: dv.Spec.Storage.Resources},
		}
		// A PVC an earlier import left (nothing collects garbage here)
		// serves the new one too.
		if err := cluster.Client.Create(ctx, pvc); err != nil && !apierrors.IsAlreadyExists(err) {
			return
		}
		if err := cluster.Client.Get(ctx, key, pvc); err != nil {
			return
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			pvc.Status.Phase = corev1.ClaimBound
			pvc.Status.AccessModes = pvc.Spec.AccessModes
			pvc.Status.Capacity = pvc.Spec.Resources.Requests
			if err := cluster.Client.Status().Update(ctx, pvc); err != nil {
				return
			}
		}
		dv.Status.Phase, dv.Status.Progress = cdiv1beta1.Succeeded, "100.0%"
		_ = cluster.Client.Status().Update(ctx, dv)
	})
}

// inBackground runs step every interval on a goroutine until the test
// ends, as a controller the test stands in for would.
func inBackground(t *testing.T, interval time.Duration, step func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(interval):
			}
			step(ctx)
		}
	}()
}

// requireSushy returns Debian's python3 with python3-sushy (hack/test.sh
// installs it). Under CI its absence fails the test.
func requireSushy(t *testing.T) string {
	t.Helper()
	const python = "/usr/bin/python3"
	out, err := exec.Command(python, "-c", "import sushy").CombinedOutput()
	if err == nil {
		return python
	}
	msg := "python3-sushy is not installed (apt-get install python3-sushy): " + err.Error() + ": " + string(out)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// ironicResult is what ironic/ironic_flows.py prints.
type ironicResult struct {
	Log        []map[string]any `json:"log"`
	Media      []map[string]any `json:"media"`
	Inspection map[string]any   `json:"inspection"`
	Error      string           `json:"error"`
}

// runIronic runs one of Ironic's flows through sushy against the BMC.
func runIronic(t *testing.T, bmc flowBMC, flow string, args ...string) ironicResult {
	t.Helper()
	python := requireSushy(t)
	cmd := exec.CommandContext(t.Context(), python, append([]string{"ironic/ironic_flows.py", flow,
		"--url", bmc.ts.URL, "--username", maasUser, "--system", bmc.system}, args...)...)
	// requests lets a CA bundle named in the environment override
	// verify=False; Ironic's conductor runs without one.
	env := []string{"REDFISH_PASSWORD=" + maasPass}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "REQUESTS_CA_BUNDLE=") && !strings.HasPrefix(kv, "CURL_CA_BUNDLE=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	var res ironicResult
	runClient(t, cmd, &res, &res.Error)
	return res
}

// TestIronicVirtualMediaDeploy is Ironic's redfish-virtualmedia deploy
// through sushy: power off, eject the stale ISO, insert the deploy ISO, set
// the node's boot mode (bios here, the machine has UEFI), one-time boot
// from the CD, power on; then its inspection.
func TestIronicVirtualMediaDeploy(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			bmc := startFlowBMC(t, backend, false)
			ctx := t.Context()
			// What a previous deploy left in the drive, for the eject.
			const stale, iso = "http://127.0.0.1:8080/stale.iso", "http://127.0.0.1:8080/deploy.iso"
			if err := bmc.m.InsertMedia(ctx, stale); err != nil {
				t.Fatal(err)
			}
			bootsBefore := len(bmc.boots())

			res := runIronic(t, bmc, "deploy", "--image", iso, "--boot-mode", "bios")

			// On the wire: the writes in Ironic's order.
			var got []string
			for _, r := range bmc.wire.writes() {
				got = append(got, r.Method+" "+strings.TrimPrefix(r.Path, bmc.system)+" "+compactJSON(r.Body))
			}
			want := []string{
				`POST /Actions/ComputerSystem.Reset {"ResetType":"ForceOff"}`,
				`POST /VirtualMedia/Cd/Actions/VirtualMedia.EjectMedia null`,
				`POST /VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia {"Image":"` + iso + `"}`,
				`PATCH  {"Boot":{"BootSourceOverrideMode":"Legacy"}}`,
				`PATCH  {"Boot":{"BootSourceOverrideEnabled":"Once","BootSourceOverrideTarget":"Cd"}}`,
				`POST /Actions/ComputerSystem.Reset {"ResetType":"On"}`,
			}
			if !slices.Equal(got, want) {
				t.Errorf("writes on the wire:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			for _, r := range bmc.wire.all() {
				if r.Method == http.MethodPatch && r.IfMatch == "" {
					t.Errorf("sushy's PATCH without If-Match: %+v", r)
				}
				if !r.Token && r.Path != "/redfish/v1/" && r.Path != "/redfish/v1/SessionService/Sessions" {
					t.Errorf("%s %s outside sushy's session", r.Method, r.Path)
				}
			}

			// The backend: on, booted once from the CD with the deploy
			// ISO in it, the override spent, Legacy firmware.
			if p, _ := bmc.m.PowerState(ctx); p != machine.PowerOn {
				t.Errorf("power %s, want On", p)
			}
			poll.Until(t, "a boot from the CD", func() error {
				if boots := bmc.boots(); len(boots) <= bootsBefore || boots[len(boots)-1] != machine.BootCd {
					return fmt.Errorf("boots %v (%d before the deploy)", boots, bootsBefore)
				}
				return nil
			})
			poll.Until(t, "the one-time override spent", func() error {
				if o, err := bmc.m.BootOverride(ctx); err != nil || o.Enabled != machine.BootDisabled || o.Mode != machine.BootModeLegacy {
					return fmt.Errorf("override %+v, %v", o, err)
				}
				return nil
			})
			if media, err := bmc.m.VirtualMedia(ctx); err != nil || !media.Inserted || media.Image != iso {
				t.Errorf("media %+v, %v; want %s inserted", media, err, iso)
			}
			if fw, err := bmc.m.Firmware(ctx); err != nil || fw.Next.Mode != machine.BootModeLegacy || fw.Current.Mode != machine.BootModeLegacy {
				t.Errorf("firmware %+v, %v; want Legacy, and booted with it", fw, err)
			}
			if len(res.Media) != 1 || res.Media[0]["image"] != iso || res.Media[0]["inserted"] != true {
				t.Errorf("sushy reads the media as %v", res.Media)
			}

			// Inspection, against the backend's inventory.
			inv, err := bmc.m.Inventory(ctx)
			if err != nil {
				t.Fatal(err)
			}
			checkInspection(t, res.Inspection, inv, "bios")
		})
	}
}

// checkInspection compares what Ironic's inspection made of the system with
// the machine's inventory.
func checkInspection(t *testing.T, got map[string]any, inv machine.Inventory, bootMode string) {
	t.Helper()
	threads := inv.CPU.Sockets * inv.CPU.Cores * inv.CPU.Threads
	var macs []string
	for _, nic := range inv.NICs {
		macs = append(macs, strings.ToLower(nic.MAC))
	}
	nics, _ := got["nics"].(map[string]any)
	var gotMACs []string
	for mac, state := range nics {
		gotMACs = append(gotMACs, strings.ToLower(mac))
		if state != "Enabled" {
			t.Errorf("NIC %s is %v: Ironic makes ports only for Enabled NICs", mac, state)
		}
	}
	slices.Sort(macs)
	slices.Sort(gotMACs)
	var largest int64
	for _, d := range inv.Disks {
		if d.Kind == machine.DiskKindDisk {
			largest = max(largest, d.CapacityBytes)
		}
	}
	checks := []struct {
		what      string
		got, want any
	}{
		{"cpus", got["cpus"], float64(threads)},
		{"cpu_arch", got["cpu_arch"], "x86"},
		{"memory_mb", got["memory_mb"], float64(inv.MemoryMiB)},
		{"local_gb", got["local_gb"], float64(largest>>30 - 1)},
		{"boot_mode", got["boot_mode"], map[string]string{"bios": "Legacy", "uefi": "UEFI"}[bootMode]},
		{"NIC MACs", strings.Join(gotMACs, ","), strings.Join(macs, ",")},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("inspection %s = %v, want %v (inspection %v)", c.what, c.got, c.want, got)
		}
	}
	if procs, _ := got["processors"].([]any); len(procs) == 0 {
		t.Errorf("inspection read no processor: %v", got)
	}
}

// TestIronicBootModeResync is Ironic's boot-mode sync: the node says uefi,
// the machine runs Legacy: one PATCH of the mode, read back; a second sync
// finds them equal and writes nothing.
func TestIronicBootModeResync(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			bmc := startFlowBMC(t, backend, false)
			ctx := t.Context()
			if err := bmc.m.SetFirmware(ctx, machine.Firmware{Mode: machine.BootModeLegacy}); err != nil {
				t.Fatal(err)
			}
			res := runIronic(t, bmc, "syncmode", "--boot-mode", "uefi")
			if len(res.Log) != 1 || res.Log[0]["before"] != "Legacy" || res.Log[0]["after"] != "UEFI" || res.Log[0]["set"] != true {
				t.Errorf("first sync: %v, want Legacy set to UEFI", res.Log)
			}
			writes := bmc.wire.writes()
			if len(writes) != 1 || compactJSON(writes[0].Body) != `{"Boot":{"BootSourceOverrideMode":"UEFI"}}` || writes[0].IfMatch == "" {
				t.Errorf("first sync's writes: %+v, want one PATCH of the mode with If-Match", writes)
			}
			if fw, err := bmc.m.Firmware(ctx); err != nil || fw.Next.Mode != machine.BootModeUEFI {
				t.Errorf("firmware after the sync %+v, %v; want UEFI next", fw, err)
			}
			res = runIronic(t, bmc, "syncmode", "--boot-mode", "uefi")
			if len(res.Log) != 1 || res.Log[0]["set"] != false {
				t.Errorf("second sync: %v, want nothing set", res.Log)
			}
			if n := len(bmc.wire.writes()); n != 1 {
				t.Errorf("%d writes after the second sync, want still 1", n)
			}
		})
	}
}

func compactJSON(v any) string {
	data, _ := json.Marshal(v)
	return string(data)
}

// buildBmclib builds conformance/bmclib for the test (the build cache
// makes every build after the first a link).
func buildBmclib(t *testing.T) string {
	t.Helper()
	bin := t.TempDir() + "/bmclib-flow"
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = "bmclib"
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building conformance/bmclib: %v: %s", err, out)
	}
	return bin
}

type bmclibResult struct {
	Steps []struct{ Call, Result, Error string } `json:"steps"`
	Error string                                 `json:"error"`
}

func runBmclib(t *testing.T, bmc flowBMC, args ...string) bmclibResult {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), buildBmclib(t), append([]string{"--url", bmc.ts.URL, "--username", maasUser}, args...)...)
	cmd.Env = append(os.Environ(), "REDFISH_PASSWORD="+maasPass)
	var res bmclibResult
	runClient(t, cmd, &res, &res.Error)
	return res
}

// runClient runs a client program and decodes the JSON it prints into res;
// the program failing, or reporting an error in *failure, fails the test.
func runClient(t *testing.T, cmd *exec.Cmd, res any, failure *string) {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if jsonErr := json.Unmarshal(out, res); jsonErr != nil || err != nil || *failure != "" {
		t.Fatalf("%s: %v (%s)\nstdout: %s\nstderr: %s", cmd.Args[0], err, *failure, out, stderr.String())
	}
}

// TestBmclibPowerAndPXE is Tinkerbell's rufio through bmclib's redfish
// provider: a session, the system read again before every call, ForceOff,
// a one-time PXE boot in one PATCH (Target, Enabled and Mode Legacy: rufio
// asks for efiBoot=false), On.
func TestBmclibPowerAndPXE(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			bmc := startFlowBMC(t, backend, false)
			ctx := t.Context()
			bootsBefore := len(bmc.boots())
			runBmclib(t, bmc)

			var got []string
			for _, r := range bmc.wire.writes() {
				got = append(got, r.Method+" "+strings.TrimPrefix(r.Path, bmc.system)+" "+compactJSON(r.Body))
			}
			want := []string{
				`POST /Actions/ComputerSystem.Reset {"ResetType":"ForceOff"}`,
				`PATCH  {"Boot":{"BootSourceOverrideEnabled":"Once","BootSourceOverrideMode":"Legacy","BootSourceOverrideTarget":"Pxe"}}`,
				`POST /Actions/ComputerSystem.Reset {"ResetType":"On"}`,
			}
			if !slices.Equal(got, want) {
				t.Errorf("writes on the wire:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			checkBmclibSession(t, bmc)

			if p, _ := bmc.m.PowerState(ctx); p != machine.PowerOn {
				t.Errorf("power %s, want On", p)
			}
			poll.Until(t, "a boot from the network", func() error {
				if boots := bmc.boots(); len(boots) <= bootsBefore || boots[len(boots)-1] != machine.BootPxe {
					return fmt.Errorf("boots %v (%d before)", boots, bootsBefore)
				}
				return nil
			})
			if fw, err := bmc.m.Firmware(ctx); err != nil || fw.Current.Mode != machine.BootModeLegacy {
				t.Errorf("firmware %+v, %v; want booted Legacy, as bmclib asked", fw, err)
			}
		})
	}
}

// TestBmclibBootRetryWithoutMode: where Legacy firmware is refused,
// bmclib's one PATCH fails and its second, Target and Enabled only,
// succeeds: the one-time PXE boot is set and the firmware stays UEFI.
func TestBmclibBootRetryWithoutMode(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			bmc := startFlowBMC(t, backend, true)
			runBmclib(t, bmc, "--boot-only")
			var got []string
			for _, r := range bmc.wire.writes() {
				got = append(got, r.Method+" "+compactJSON(r.Body)+" "+http.StatusText(r.Status))
			}
			want := []string{
				`PATCH {"Boot":{"BootSourceOverrideEnabled":"Once","BootSourceOverrideMode":"Legacy","BootSourceOverrideTarget":"Pxe"}} Bad Request`,
				`PATCH {"Boot":{"BootSourceOverrideEnabled":"Once","BootSourceOverrideTarget":"Pxe"}} OK`,
			}
			if !slices.Equal(got, want) {
				t.Errorf("writes on the wire:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			checkBmclibSession(t, bmc)
			o, err := bmc.m.BootOverride(t.Context())
			if err != nil || o != (machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce, Mode: machine.BootModeUEFI}) {
				t.Errorf("override %+v, %v; want Pxe Once UEFI", o, err)
			}
		})
	}
}

// checkBmclibSession: every call after the login carries the session's
// token, each write follows a fresh GET of the system, and the session is
// deleted at the end.
func checkBmclibSession(t *testing.T, bmc flowBMC) {
	t.Helper()
	reqs := bmc.wire.all()
	var lastGet string
	for i, r := range reqs {
		switch {
		case r.Method == http.MethodPost && r.Path == "/redfish/v1/SessionService/Sessions":
		case !r.Token && r.Path != "/redfish/v1/":
			t.Errorf("request %d %s %s without the session's token", i, r.Method, r.Path)
		case r.Method == http.MethodGet:
			lastGet = r.Path
		case r.write() && r.Method != http.MethodDelete && lastGet != bmc.system:
			t.Errorf("request %d %s %s follows a GET of %s, want one of the system", i, r.Method, r.Path, lastGet)
		}
	}
	if last := reqs[len(reqs)-1]; last.Method != http.MethodDelete || !strings.HasPrefix(last.Path, "/redfish/v1/SessionService/Sessions/") {
		t.Errorf("last request %s %s, want the session's DELETE", last.Method, last.Path)
	}
}
