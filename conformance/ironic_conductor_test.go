package conformance_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/conformance"
	"github.com/virtmetal/virtmetal/internal/poll"
)

// OpenStack Ironic itself (Debian's ironic-api and ironic-conductor, apt)
// driving bmc-server the way Metal3 does: standalone on loopback, noauth,
// SQLite, JSON-RPC, no Keystone, Nova or Neutron; the redfish hardware
// type with redfish-virtual-media boot. ironicService runs it, ironicAgent
// stands in for its ramdisk agent, and TestIronicConductor drives it.

// ironicBinaries are the programs the test runs.
var ironicBinaries = []string{"ironic-api", "ironic-conductor", "ironic-dbsync"}

// requireIronic fails under CI (hack/test.sh installs the packages) and
// skips elsewhere when Ironic is not installed.
func requireIronic(t *testing.T) {
	t.Helper()
	for _, bin := range ironicBinaries {
		if _, err := exec.LookPath(bin); err != nil {
			msg := bin + " is not installed (apt-get install ironic-api ironic-conductor): " + err.Error()
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
}

// freePort is a loopback port nothing listens on now (Ironic's
// configuration wants numbers, not listeners).
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// ironicEnv is the environment Ironic runs with: requests honours
// REQUESTS_CA_BUNDLE and CURL_CA_BUNDLE over verify=False, so with either
// set redfish_verify_ca=False would still check the BMC's certificate.
func ironicEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "REQUESTS_CA_BUNDLE=") || strings.HasPrefix(kv, "CURL_CA_BUNDLE=")
	})
}

// sushyWithRegistries works around Debian 12's python3-sushy, which lacks
// its standard_registries folder: every sushy call that reads a registry
// (Ironic's BIOS attribute registry among them) then fails listing it. It
// returns a folder for PYTHONPATH holding a sushy package made of links to
// the installed one's files, with that folder there (empty: sushy then
// knows no DMTF message registry but those the BMC serves); or "" where
// the installed sushy has it.
func sushyWithRegistries(t *testing.T, dir string) string {
	t.Helper()
	out, err := exec.Command("/usr/bin/python3", "-c", "import os, sushy; print(os.path.dirname(sushy.__file__))").Output()
	if err != nil {
		t.Fatalf("finding sushy: %v", err)
	}
	installed := strings.TrimSpace(string(out))
	if _, err := os.Stat(filepath.Join(installed, "standard_registries")); err == nil {
		return ""
	}
	overlay := filepath.Join(dir, "python")
	pkg := filepath.Join(overlay, "sushy")
	if err := os.MkdirAll(filepath.Join(pkg, "standard_registries"), 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(installed)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.Symlink(filepath.Join(installed, e.Name()), filepath.Join(pkg, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	return overlay
}

// startProcess runs a program until the test ends; it dies with the test
// binary (Pdeathsig), and its output goes to logPath. It returns the
// program's process ID.
func startProcess(t testing.TB, logPath string, env []string, name string, args ...string) int {
	t.Helper()
	out, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		out.Close()
	})
	return cmd.Process.Pid
}

// ironicService is one Ironic, API and conductor, with its own
// configuration, database and logs under the test's temporary folder.
type ironicService struct {
	api     string // http://127.0.0.1:PORT/v1
	logFile string // the conductor's log
	client  *http.Client
}

// ironicConfig is Metal3's standalone Ironic, cut to what the test uses.
// Automated cleaning is off (provide goes straight to available);
// ramdisk_image_download_source=http hands the deploy ISO's URL to the
// BMC as it is rather than rebuilding the ISO.
const ironicConfig = `[DEFAULT]
auth_strategy = noauth
enabled_hardware_types = redfish
enabled_bios_interfaces = redfish
enabled_boot_interfaces = redfish-virtual-media
enabled_console_interfaces = no-console
enabled_deploy_interfaces = direct
enabled_inspect_interfaces = redfish
enabled_management_interfaces = redfish
enabled_network_interfaces = noop
enabled_power_interfaces = redfish
enabled_raid_interfaces = no-raid
enabled_vendor_interfaces = no-vendor
default_network_interface = noop
rpc_transport = json-rpc
host = 127.0.0.1
my_ip = 127.0.0.1
state_path = {{dir}}/state
log_dir = {{dir}}/log
use_stderr = false
debug = true
[api]
host_ip = 127.0.0.1
port = {{apiPort}}
[conductor]
automated_clean = false
heartbeat_interval = 2
sync_power_state_interval = -1
[database]
connection = sqlite:///{{dir}}/state/ironic.sqlite
[deploy]
http_url = http://127.0.0.1:{{httpPort}}
http_root = {{dir}}/httpboot
ramdisk_image_download_source = http
[dhcp]
dhcp_provider = none
[json_rpc]
auth_strategy = noauth
host_ip = 127.0.0.1
port = {{rpcPort}}
[oslo_concurrency]
lock_path = {{dir}}/state
[redfish]
use_swift = false
[service_catalog]
endpoint_override = http://127.0.0.1:{{apiPort}}
`

func startIronic(t *testing.T) *ironicService {
	t.Helper()
	dir := t.TempDir()
	for _, sub := range []string{"state", "log", "httpboot"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	apiPort := freePort(t)
	conf := strings.NewReplacer("{{dir}}", dir, "{{apiPort}}", fmt.Sprint(apiPort),
		"{{httpPort}}", fmt.Sprint(freePort(t)), "{{rpcPort}}", fmt.Sprint(freePort(t))).Replace(ironicConfig)
	confPath := filepath.Join(dir, "ironic.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(ironicEnv(), "PYTHONPATH="+sushyWithRegistries(t, dir))
	dbsync := exec.Command("ironic-dbsync", "--config-file", confPath, "create_schema")
	dbsync.Env = env
	if out, err := dbsync.CombinedOutput(); err != nil {
		t.Fatalf("ironic-dbsync: %v\n%s", err, out)
	}
	startProcess(t, filepath.Join(dir, "api.out"), env, "ironic-api", "--config-file", confPath)
	startProcess(t, filepath.Join(dir, "conductor.out"), env, "ironic-conductor", "--config-file", confPath)
	s := &ironicService{api: fmt.Sprintf("http://127.0.0.1:%d/v1", apiPort), logFile: filepath.Join(dir, "log", "ironic-conductor.log"),
		client: &http.Client{Timeout: 60 * time.Second}}
	t.Cleanup(func() {
		if t.Failed() {
			data, _ := os.ReadFile(s.logFile)
			t.Logf("conductor log (WARNING and above):\n%s", strings.Join(logLinesAtLeastWarning(string(data)), "\n"))
		}
	})
	// The conductor has registered once the API lists the driver with a host.
	waitFor(t, 3*time.Minute, "Ironic's API and conductor", func() error {
		var drivers struct {
			Drivers []struct {
				Name  string   `json:"name"`
				Hosts []string `json:"hosts"`
			} `json:"drivers"`
		}
		if err := s.call(http.MethodGet, "/drivers", nil, &drivers); err != nil {
			return err
		}
		for _, d := range drivers.Drivers {
			if d.Name == "redfish" && len(d.Hosts) > 0 {
				return nil
			}
		}
		return fmt.Errorf("no conductor serves the redfish driver: %+v", drivers)
	})
	return s
}

// ironicAPIVersion is Ironic 21.4's newest microversion, as Metal3 asks
// for its own newest.
const ironicAPIVersion = "1.82"

// call sends one request to Ironic's API and decodes its JSON answer into
// out; a status of 400 or more is an error with Ironic's fault string.
func (s *ironicService) call(method, path string, body, out any) error {
	var reader io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		reader = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, s.api+path, reader)
	if err != nil {
		return err
	}
	req.Header.Set("X-OpenStack-Ironic-API-Version", ironicAPIVersion)
	req.Header.Set("Content-Type", "application/json")
	res, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	if res.StatusCode >= 400 {
		return fmt.Errorf("%s %s: %d %s", method, path, res.StatusCode, data)
	}
	if out != nil && len(data) > 0 {
		return json.Unmarshal(data, out)
	}
	return nil
}

func (s *ironicService) must(t *testing.T, method, path string, body, out any) {
	t.Helper()
	if err := s.call(method, path, body, out); err != nil {
		t.Fatal(err)
	}
}

// ironicNode is what the test reads of a node.
type ironicNode struct {
	UUID                 string         `json:"uuid"`
	ProvisionState       string         `json:"provision_state"`
	TargetProvisionState *string        `json:"target_provision_state"`
	PowerState           *string        `json:"power_state"`
	TargetPowerState     *string        `json:"target_power_state"`
	LastError            *string        `json:"last_error"`
	Properties           map[string]any `json:"properties"`
	BootMode             *string        `json:"boot_mode"`
	SecureBoot           *bool          `json:"secure_boot"`
	Reservation          *string        `json:"reservation"` // the conductor holding the node
}

func (s *ironicService) node(t *testing.T, name string) ironicNode {
	t.Helper()
	var n ironicNode
	s.must(t, http.MethodGet, "/nodes/"+name, nil, &n)
	return n
}

// provision asks for a provision state change and waits for the node to
// settle in want (a state the node rests in, or one it waits in).
func (s *ironicService) provision(t *testing.T, name string, target map[string]any, want string, patience time.Duration) ironicNode {
	t.Helper()
	s.must(t, http.MethodPut, "/nodes/"+name+"/states/provision", target, nil)
	return s.waitProvision(t, name, want, patience)
}

func (s *ironicService) waitProvision(t *testing.T, name, want string, patience time.Duration) ironicNode {
	t.Helper()
	var n ironicNode
	waitFor(t, patience, "node "+name+" "+want, func() error {
		n = s.node(t, name)
		if n.ProvisionState == want && (n.TargetProvisionState == nil || want == "wait call-back" || want == "clean wait") {
			return nil
		}
		if strings.HasSuffix(n.ProvisionState, "failed") || n.ProvisionState == "error" {
			t.Fatalf("node %s: %s: %s", name, n.ProvisionState, deref(n.LastError))
		}
		return fmt.Errorf("%s (target %s), last error %q", n.ProvisionState, deref(n.TargetProvisionState), deref(n.LastError))
	})
	return n
}

// power asks for a power action and waits for Ironic to report want.
func (s *ironicService) power(t *testing.T, name string, target map[string]any, want string) {
	t.Helper()
	s.must(t, http.MethodPut, "/nodes/"+name+"/states/power", target, nil)
	waitFor(t, 2*time.Minute, fmt.Sprintf("node %s %v", name, target), func() error {
		n := s.node(t, name)
		if n.TargetPowerState == nil && deref(n.LastError) != "" {
			// Failed: Ironic does not try again.
			t.Fatalf("node %s after %v: power %s, last error %s", name, target, deref(n.PowerState), *n.LastError)
		}
		if n.TargetPowerState == nil && deref(n.PowerState) == want {
			return nil
		}
		return fmt.Errorf("power %s (target %s), last error %q", deref(n.PowerState), deref(n.TargetPowerState), deref(n.LastError))
	})
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// waitFor polls check every half second (Ironic's API is slow to ask)
// until it holds, and fails t after patience.
func waitFor(t testing.TB, patience time.Duration, what string, check func() error) {
	t.Helper()
	poll.UntilEvery(t, patience, 500*time.Millisecond, what, check)
}

// logLinesAtLeastWarning are the log's records at WARNING, ERROR or
// CRITICAL, each with the lines (a traceback) that follow it.
func logLinesAtLeastWarning(log string) []string {
	var out []string
	keep := false
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		// oslo.log: DATE TIME PID LEVEL LOGGER [...] message
		if len(fields) >= 4 && strings.HasPrefix(line, "20") {
			keep = fields[3] == "WARNING" || fields[3] == "ERROR" || fields[3] == "CRITICAL"
			if keep {
				out = append(out, line)
			}
			continue
		}
		if keep && len(out) > 0 {
			out[len(out)-1] += "\n" + line
		}
	}
	return out
}

// ironicAgent stands in for ironic-python-agent, which cannot run here (it
// is the deploy ramdisk's, booted in the machine): while heartbeating, it
// looks the node up, heartbeats every second with its token, and answers
// the two calls Ironic makes of an agent during an out-of-band clean step
// that reboots (get_clean_steps, with no in-band steps, and the command
// status of a freshly booted agent).
type ironicAgent struct {
	ironic *ironicService
	node   string
	url    string
	mu     sync.Mutex
	ran    []map[string]any // the commands Ironic asked for
}

func startIronicAgent(t *testing.T, ironic *ironicService, nodeUUID string) *ironicAgent {
	t.Helper()
	a := &ironicAgent{ironic: ironic, node: nodeUUID}
	ts := httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(ts.Close)
	a.url = ts.URL
	return a
}

func (a *ironicAgent) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path != "/v1/commands/" && r.URL.Path != "/v1/commands" {
		http.NotFound(w, r)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.Method == http.MethodGet {
		_ = json.NewEncoder(w).Encode(map[string]any{"commands": a.ran})
		return
	}
	var cmd struct {
		Name string `json:"name"`
	}
	_ = json.NewDecoder(r.Body).Decode(&cmd)
	result := map[string]any{"id": fmt.Sprint(len(a.ran) + 1), "command_status": "SUCCEEDED", "command_error": nil}
	switch cmd.Name {
	case "clean.get_clean_steps":
		result["command_name"] = "get_clean_steps"
		result["command_result"] = map[string]any{
			"clean_steps":              map[string]any{"GenericHardwareManager": []any{}},
			"hardware_manager_version": map[string]any{"generic_hardware_manager": "1.1"},
		}
	default:
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]any{"faultstring": "the stand-in agent does not run " + cmd.Name})
		return
	}
	a.ran = append(a.ran, result)
	_ = json.NewEncoder(w).Encode(result)
}

// heartbeat looks the node up and heartbeats, as the agent does once its
// ramdisk booted, until stop is called. Ironic wipes the node's token when
// it reboots the machine, and a lookup hands out a new one only then (else
// "******"): a fresh token is the stand-in's sign of a fresh boot. It
// heartbeats only while the node waits for it and no conductor holds it,
// as a heartbeat at another time is refused (and logged) by Ironic.
func (a *ironicAgent) heartbeat(t *testing.T) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		token := ""
		for ctx.Err() == nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			var n ironicNode
			if err := a.ironic.call(http.MethodGet, "/nodes/"+a.node, nil, &n); err != nil || n.ProvisionState != "clean wait" || n.Reservation != nil {
				continue
			}
			var found struct {
				Config struct {
					AgentToken string `json:"agent_token"`
				} `json:"config"`
			}
			if a.ironic.call(http.MethodGet, "/lookup?node_uuid="+a.node, nil, &found) == nil && found.Config.AgentToken != "" && found.Config.AgentToken != "******" {
				token = found.Config.AgentToken
			}
			if token != "" {
				if err := a.ironic.call(http.MethodPost, "/heartbeat/"+a.node, map[string]any{
					"callback_url": a.url, "agent_version": "9.4.0", "agent_token": token}, nil); err != nil {
					t.Logf("the stand-in agent's heartbeat: %v", err)
				}
			}
		}
	}()
	// Stopped by the test, or at its end if it fails before.
	stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	return stop
}

// bmcProcess is bmc-server run as its deployment runs it.
type bmcProcess struct {
	pid    int
	url    string // https://127.0.0.1:PORT
	system string // /redfish/v1/Systems/ID
	log    string // its log file (-v 1: every request)
	client *http.Client
}

// buildBMCServer builds cmd/bmc-server for the test, before anything
// waits with a deadline (the build cache makes every build after the
// first a link). Built as the image builds it (static, stripped), its
// memory figures are the BMC pod's.
func buildBMCServer(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "bmc-server")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "../cmd/bmc-server")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building bmc-server: %v: %s", err, out)
	}
	return bin
}

const (
	ironicBMCUser = "metal3"
	ironicBMCPass = "ironic-drives-it"
)

// startBMCProcess runs bmc-server with args on a loopback port and waits
// for it to serve.
func startBMCProcess(t testing.TB, bin, systemID string, env []string, args ...string) *bmcProcess {
	t.Helper()
	dir := t.TempDir()
	p := &bmcProcess{system: "/redfish/v1/Systems/" + systemID, log: filepath.Join(dir, "bmc.log"),
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}}
	port := freePort(t)
	p.url = fmt.Sprintf("https://127.0.0.1:%d", port)
	env = append(env, "BMC_USERNAME="+ironicBMCUser, "BMC_PASSWORD="+ironicBMCPass)
	// The test serves Ironic's images on loopback, a destination the BMC
	// refuses unless told (an image is fetched on the BMC's behalf).
	p.pid = startProcess(t, p.log, env, bin, append(args, "--listen", fmt.Sprintf("127.0.0.1:%d", port), "-v", "1", "--event-destinations-allow-loopback")...)
	waitFor(t, time.Minute, "bmc-server serving", func() error {
		_, err := p.get(p.system)
		return err
	})
	return p
}

// get reads a resource from the BMC, as the test checks what Ironic did.
func (p *bmcProcess) get(path string) (map[string]any, error) {
	req, _ := http.NewRequest(http.MethodGet, p.url+path, nil)
	req.SetBasicAuth(ironicBMCUser, ironicBMCPass)
	res, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d", path, res.StatusCode)
	}
	var body map[string]any
	return body, json.NewDecoder(res.Body).Decode(&body)
}

func (p *bmcProcess) must(t *testing.T, path string) map[string]any {
	t.Helper()
	body, err := p.get(path)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// requests are the requests the BMC logged, as "METHOD PATH STATUS".
func (p *bmcProcess) requests(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(p.log)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for line := range strings.Lines(string(data)) {
		var rec struct {
			Method string `json:"method"`
			Path   string `json:"path"`
			Status int    `json:"status"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Method != "" {
			out = append(out, fmt.Sprintf("%s %s %d", rec.Method, rec.Path, rec.Status))
		}
	}
	return out
}

// ironicBMC is the BMC Ironic drives, with what the test knows of its
// machine.
type ironicBMC struct {
	*bmcProcess
	// address is the redfish_address Ironic is given: the recorder in
	// front of the BMC.
	address string
	macs    []string
	// nmi: the machine can take an NMI (KubeVirt has no API for one, and
	// its BMC does not offer it).
	nmi bool
	// cdWithoutMedia: the machine boots from its CD with no media in it.
	// A KubeVirt VM has its CD-ROM only while media is inserted, so there
	// the BMC refuses Cd without media (409 PropertyValueResourceConflict
	// naming the drive) and the deploy sets it, once inserted.
	cdWithoutMedia bool
	// checkMedia checks the backend's own view of the inserted image
	// (KubeVirt: the CDI DataVolume and the VM's CD-ROM).
	checkMedia func(t *testing.T, image string)
	// holdStart keeps the machine starting while hold (KubeVirt only:
	// the memory backend's transitions are instant).
	holdStart func(t *testing.T, hold bool)
}

func startIronicBMC(t *testing.T, bin, backend string) ironicBMC {
	t.Helper()
	if backend == "memory" {
		p := startBMCProcess(t, bin, "vm-0", os.Environ(), "--backend", "memory", "--machines", "1")
		return ironicBMC{bmcProcess: p, macs: p.macs(t), nmi: true, cdWithoutMedia: true, checkMedia: func(*testing.T, string) {}}
	}
	ns, name := cluster.NewNamespace(t), "ironic-node"
	const mac = "02:00:00:00:36:01"
	vm := pxeVM(ns, name, mac)
	vm.Spec.RunStrategy = ptr.To(kubevirtv1.RunStrategyHalted)
	createRunning(t, vm)
	importMedia(t, ns, name)
	guestHonoursACPI(t, ns, name)
	kubeconfig, err := cluster.Real.KubeConfigFor("ironic-bmc-server", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	p := startBMCProcess(t, bin, name, append(os.Environ(), "KUBECONFIG="+path), "--backend", "kubevirt", "--namespace", ns, "--vm", name)
	checkMedia := func(t *testing.T, image string) {
		t.Helper()
		dv := &cdiv1beta1.DataVolume{}
		if err := cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name + "-virtmetal-media"}, dv); err != nil {
			t.Fatalf("the media DataVolume: %v", err)
		}
		if dv.Spec.Source == nil || dv.Spec.Source.HTTP == nil || dv.Spec.Source.HTTP.URL != image {
			t.Errorf("the media DataVolume imports %+v, want %s", dv.Spec.Source, image)
		}
		got := &kubevirtv1.VirtualMachine{}
		if err := cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, got); err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(got.Spec.Template.Spec.Domain.Devices.Disks, func(d kubevirtv1.Disk) bool { return d.CDRom != nil }) {
			t.Errorf("the VM has no CD-ROM: %+v", got.Spec.Template.Spec.Domain.Devices.Disks)
		}
	}
	return ironicBMC{bmcProcess: p, macs: []string{mac}, checkMedia: checkMedia,
		holdStart: func(t *testing.T, hold bool) { holdVMStart(t, ns, name, hold) }}
}

// guestHonoursACPI stands in for the guest's side of a graceful stop
// (Ironic's soft power off): while the VMI runs and is being deleted with
// its grace period, the guest powers itself off, as a guest that handles
// KubeVirt's ACPI shutdown does.
func guestHonoursACPI(t *testing.T, namespace, name string) {
	inBackground(t, 200*time.Millisecond, func(ctx context.Context) {
		vmi := &kubevirtv1.VirtualMachineInstance{}
		if err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, vmi); err == nil &&
			vmi.DeletionTimestamp != nil && vmi.Status.Phase == kubevirtv1.Running {
			cluster.Node.ShutdownGuest(namespace, name)
		}
	})
}

// macs are the MACs of the system's NICs, as the BMC serves them.
func (p *bmcProcess) macs(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, m := range p.must(t, p.system+"/EthernetInterfaces")["Members"].([]any) {
		out = append(out, strings.ToLower(p.must(t, m.(map[string]any)["@odata.id"].(string))["MACAddress"].(string)))
	}
	return out
}

// fakeImages serves the deploy ISO and the instance image Ironic is given,
// on loopback; nothing boots them.
func fakeImages(t *testing.T) *httptest.Server {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("not really an image: " + r.URL.Path))
	}))
	t.Cleanup(ts.Close)
	return ts
}

// TestIronicConductor: Ironic 21.4's own conductor, standalone as Metal3
// runs it, drives bmc-server (built and run as deployed) on each backend
// from enrolment to a virtual-media deploy and its tear-down; its
// conductor log must have no warning about the BMC.
func TestIronicConductor(t *testing.T) {
	requireIronic(t)
	bin := buildBMCServer(t)
	powerStates := schemaPowerStates(t)
	ironic := startIronic(t)
	images := fakeImages(t)
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			bmc := startIronicBMC(t, bin, backend)
			rec := startIronicRecorder(t, bmc.url, bmc.system)
			bmc.address = rec.url
			// Judged however far the run got.
			t.Cleanup(func() { checkIronicExchanges(t, rec, powerStates) })
			name := backend + "-node"
			driveIronic(t, ironic, bmc, name, images.URL)
			if bmc.holdStart != nil {
				t.Run("transition window", func(t *testing.T) { driveIronicThroughTransitions(t, ironic, bmc, rec, name) })
			}
			for _, r := range bmc.requests(t) {
				if strings.HasSuffix(r, " 500") || strings.HasSuffix(r, " 503") {
					t.Errorf("the BMC answered %s", r)
				}
			}
		})
	}
	data, err := os.ReadFile(ironic.logFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range logLinesAtLeastWarning(string(data)) {
		if !expectedIronicWarning(rec) {
			t.Errorf("Ironic's conductor warns: %s", rec)
		}
	}
}

// expectedIronicWarnings are the conductor's warnings that say nothing
// wrong of the BMC, each with why it is logged.
var expectedIronicWarnings = []string{
	// The redfish inspect interface has no way to tell PXE NICs
	// (_get_pxe_port_macs is None in Ironic's base class).
	"No PXE enabled NIC was found for node",
	// The NMI the test asks of the KubeVirt machine, which the BMC
	// rightly does not offer: sushy refuses it without a request.
	`Error: The parameter "value" value "ResetType.NMI" is invalid.`,
	// A heartbeat of the stand-in agent that met a conductor holding the
	// node, or a token a reboot wiped meanwhile (the stand-in checks both
	// just before, as narrowly as an agent can): Ironic drops it and the
	// next one goes through. Neither is about the BMC.
	"skipping heartbeat processing (will retry on the next heartbeat)",
	"Invalid or missing agent_token received for node",
}

func expectedIronicWarning(rec string) bool {
	return slices.ContainsFunc(expectedIronicWarnings, func(s string) bool { return strings.Contains(rec, s) })
}

// driveIronic is Metal3's use of Ironic on one node.
func driveIronic(t *testing.T, ironic *ironicService, bmc ironicBMC, name, images string) {
	deployISO := images + "/deploy.iso"
	// Enrol, as Metal3's baremetal-operator does.
	var created ironicNode
	ironic.must(t, http.MethodPost, "/nodes", map[string]any{
		"name": name, "driver": "redfish",
		"boot_interface": "redfish-virtual-media", "deploy_interface": "direct", "bios_interface": "redfish",
		"inspect_interface": "redfish", "management_interface": "redfish", "power_interface": "redfish",
		"driver_info": map[string]any{
			"redfish_address": bmc.address, "redfish_system_id": bmc.system,
			"redfish_username": ironicBMCUser, "redfish_password": ironicBMCPass, "redfish_verify_ca": false,
			"deploy_iso": deployISO,
		},
	}, &created)

	var validation map[string]struct {
		Result *bool  `json:"result"`
		Reason string `json:"reason"`
	}
	ironic.must(t, http.MethodGet, "/nodes/"+name+"/validate", nil, &validation)
	for _, iface := range []string{"power", "management", "boot", "bios", "inspect"} {
		if v := validation[iface]; v.Result == nil || !*v.Result {
			t.Errorf("validate %s: %+v", iface, v)
		}
	}

	ironic.provision(t, name, map[string]any{"target": "manage"}, "manageable", 2*time.Minute)

	// Inspection: the machine as the BMC describes it.
	n := ironic.provision(t, name, map[string]any{"target": "inspect"}, "manageable", 3*time.Minute)
	sys := bmc.must(t, bmc.system)
	wantCPUs := lookupFloat(sys, "ProcessorSummary", "LogicalProcessorCount")
	wantMiB := lookupFloat(sys, "MemorySummary", "TotalSystemMemoryGiB") * 1024
	props := n.Properties
	if fmt.Sprint(props["cpus"]) != fmt.Sprint(wantCPUs) || fmt.Sprint(props["memory_mb"]) != fmt.Sprint(wantMiB) ||
		props["cpu_arch"] != "x86_64" || !strings.Contains(fmt.Sprint(props["capabilities"]), "boot_mode:uefi") || props["local_gb"] == nil {
		t.Errorf("inspected properties %v; want %v CPUs, %v MiB, x86_64, boot_mode:uefi, local_gb", props, wantCPUs, wantMiB)
	}
	var ports struct {
		Ports []struct {
			Address string `json:"address"`
		} `json:"ports"`
	}
	ironic.must(t, http.MethodGet, "/ports?node="+name, nil, &ports)
	var portMACs []string
	for _, p := range ports.Ports {
		portMACs = append(portMACs, strings.ToLower(p.Address))
	}
	slices.Sort(portMACs)
	if wantMACs := slices.Sorted(slices.Values(bmc.macs)); !slices.Equal(portMACs, wantMACs) {
		t.Errorf("ports %v, want the BMC's MACs %v", portMACs, wantMACs)
	}

	// Every power action, checked on the BMC.
	powerState := func() string { return bmc.must(t, bmc.system)["PowerState"].(string) }
	for _, step := range []struct {
		target map[string]any
		ironic string
		bmc    string
	}{
		{map[string]any{"target": "power on"}, "power on", "On"},
		{map[string]any{"target": "rebooting"}, "power on", "On"},
		{map[string]any{"target": "soft rebooting", "timeout": 60}, "power on", "On"},
		{map[string]any{"target": "soft power off", "timeout": 60}, "power off", "Off"},
		{map[string]any{"target": "power on"}, "power on", "On"},
		{map[string]any{"target": "power off"}, "power off", "Off"},
	} {
		ironic.power(t, name, step.target, step.ironic)
		// Ironic counts PoweringOn as on; KubeVirt's VM gets there first.
		waitFor(t, time.Minute, fmt.Sprintf("the BMC's power after %v", step.target), func() error {
			if got := powerState(); got != step.bmc {
				return fmt.Errorf("the BMC says %s, want %s", got, step.bmc)
			}
			return nil
		})
	}
	ironic.power(t, name, map[string]any{"target": "power on"}, "power on")
	err := ironic.call(http.MethodPut, "/nodes/"+name+"/management/inject_nmi", map[string]any{}, nil)
	switch {
	case bmc.nmi && err != nil:
		t.Errorf("NMI: %v", err)
	case !bmc.nmi && (err == nil || !strings.Contains(err.Error(), "ResetType.NMI")):
		// sushy refuses it before asking: Nmi is not among the
		// ResetType values the BMC offers.
		t.Errorf("NMI on a machine without it: %v, want sushy's refusal naming ResetType.NMI", err)
	}
	ironic.power(t, name, map[string]any{"target": "power off"}, "power off")

	// Boot devices, once and persistent, read back through Ironic and on
	// the BMC.
	bootSteps := []struct {
		device     string
		persistent bool
		target     string
		enabled    string
	}{
		{"pxe", false, "Pxe", "Once"},
		{"disk", true, "Hdd", "Continuous"},
	}
	if bmc.cdWithoutMedia {
		bootSteps = append(bootSteps, bootSteps[0])
		bootSteps[2].device, bootSteps[2].target = "cdrom", "Cd"
	}
	for _, step := range bootSteps {
		ironic.must(t, http.MethodPut, "/nodes/"+name+"/management/boot_device", map[string]any{"boot_device": step.device, "persistent": step.persistent}, nil)
		var got struct {
			BootDevice string `json:"boot_device"`
			Persistent *bool  `json:"persistent"`
		}
		ironic.must(t, http.MethodGet, "/nodes/"+name+"/management/boot_device", nil, &got)
		if got.BootDevice != step.device || got.Persistent == nil || *got.Persistent != step.persistent {
			t.Errorf("boot device %+v, want %s persistent=%v", got, step.device, step.persistent)
		}
		boot := bmc.must(t, bmc.system)["Boot"].(map[string]any)
		if boot["BootSourceOverrideTarget"] != step.target || boot["BootSourceOverrideEnabled"] != step.enabled {
			t.Errorf("after %s persistent=%v the BMC's override is %v %v", step.device, step.persistent, boot["BootSourceOverrideTarget"], boot["BootSourceOverrideEnabled"])
		}
	}

	// Boot mode and Secure Boot, out of band, each read back through Ironic
	// and on the BMC.
	bmcBootMode := func() any { return conformance.Lookup(bmc.must(t, bmc.system), "Boot", "BootSourceOverrideMode") }
	bmcSecureBoot := func() any { return bmc.must(t, bmc.system+"/SecureBoot")["SecureBootEnable"] }
	for _, step := range []struct {
		path   string
		target any
		check  func(ironicNode) bool
		onBMC  func() any
		want   any
	}{
		{"boot_mode", "bios", func(n ironicNode) bool { return deref(n.BootMode) == "bios" }, bmcBootMode, "Legacy"},
		{"boot_mode", "uefi", func(n ironicNode) bool { return deref(n.BootMode) == "uefi" }, bmcBootMode, "UEFI"},
		{"secure_boot", true, func(n ironicNode) bool { return deref(n.SecureBoot) }, bmcSecureBoot, true},
		{"secure_boot", false, func(n ironicNode) bool { return n.SecureBoot != nil && !*n.SecureBoot }, bmcSecureBoot, false},
	} {
		ironic.must(t, http.MethodPut, "/nodes/"+name+"/states/"+step.path, map[string]any{"target": step.target}, nil)
		waitFor(t, time.Minute, fmt.Sprintf("%s %v", step.path, step.target), func() error {
			if n := ironic.node(t, name); !step.check(n) {
				return fmt.Errorf("boot mode %s, secure boot %v, last error %q", deref(n.BootMode), deref(n.SecureBoot), deref(n.LastError))
			}
			return nil
		})
		if got := step.onBMC(); got != step.want {
			t.Errorf("after %s %v the BMC has %v, want %v", step.path, step.target, got, step.want)
		}
	}

	// BIOS: the settings with their registry, then a manual clean that
	// applies one. The step reboots the machine into the agent's ramdisk
	// and waits for it, so the stand-in agent heartbeats meanwhile.
	biosSetting := func(attr string) map[string]any {
		var got struct {
			Settings []map[string]any `json:"bios"`
		}
		ironic.must(t, http.MethodGet, "/nodes/"+name+"/bios?detail=True", nil, &got)
		i := slices.IndexFunc(got.Settings, func(s map[string]any) bool { return s["name"] == attr })
		if i < 0 {
			t.Fatalf("Ironic's BIOS settings lack %s: %v", attr, got.Settings)
		}
		return got.Settings[i]
	}
	if s := biosSetting("SecureBoot"); s["value"] != "Disabled" || !slices.Contains(toStrings(s["allowable_values"]), "Enabled") {
		t.Errorf("Ironic's SecureBoot setting %v; want Disabled, with Enabled allowed (from the registry)", s)
	}
	stopHeartbeats := startIronicAgent(t, ironic, created.UUID).heartbeat(t)
	ironic.provision(t, name, map[string]any{"target": "clean", "clean_steps": []any{map[string]any{
		"interface": "bios", "step": "apply_configuration",
		"args": map[string]any{"settings": []any{map[string]any{"name": "SecureBoot", "value": "Enabled"}}},
	}}}, "manageable", 3*time.Minute)
	stopHeartbeats()
	if s := biosSetting("SecureBoot"); s["value"] != "Enabled" {
		t.Errorf("after the clean Ironic reads SecureBoot %v, want Enabled", s["value"])
	}
	if got := conformance.Lookup(bmc.must(t, bmc.system+"/Bios"), "Attributes", "SecureBoot"); got != "Enabled" {
		t.Errorf("after the clean the BMC's current SecureBoot is %v, want Enabled", got)
	}

	ironic.provision(t, name, map[string]any{"target": "provide"}, "available", 2*time.Minute)

	// Deploy with virtual media, as far as Ironic goes without its agent:
	// the deploy ISO inserted, a one-time boot from the CD, power on.
	ironic.must(t, http.MethodPatch, "/nodes/"+name, []any{
		map[string]any{"op": "add", "path": "/instance_info/image_source", "value": images + "/instance.qcow2"},
		map[string]any{"op": "add", "path": "/instance_info/image_checksum", "value": "0123456789abcdef0123456789abcdef"},
		map[string]any{"op": "add", "path": "/instance_info/root_gb", "value": 10},
	}, nil)
	ironic.provision(t, name, map[string]any{"target": "active"}, "wait call-back", 3*time.Minute)
	cd := bmc.must(t, "/redfish/v1/Managers/"+path.Base(bmc.system)+"/VirtualMedia/Cd")
	if cd["Inserted"] != true || cd["Image"] != deployISO {
		t.Errorf("during the deploy the CD has %v (inserted %v), want %s", cd["Image"], cd["Inserted"], deployISO)
	}
	bmc.checkMedia(t, deployISO)
	sys = bmc.must(t, bmc.system)
	if sys["PowerState"] != "On" {
		t.Errorf("during the deploy the machine is %v, want On", sys["PowerState"])
	}
	requests := bmc.requests(t)
	if !slices.Contains(requests, "POST "+bmc.system+"/Actions/ComputerSystem.Reset 204") {
		t.Error("Ironic never reset the machine")
	}
	// sushy 4.3 finds virtual media only under the Manager.
	insertedAt := "POST /redfish/v1/Managers/" + path.Base(bmc.system) + "/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia 20"
	if !slices.ContainsFunc(requests, func(r string) bool { return strings.HasPrefix(r, insertedAt) }) {
		t.Errorf("no %s* among the BMC's requests", insertedAt)
	}

	// Tear it down while Ironic waits for its agent: the ISO ejected, the
	// machine off, the node available again.
	ironic.provision(t, name, map[string]any{"target": "deleted"}, "available", 3*time.Minute)
	cd = bmc.must(t, bmc.system+"/VirtualMedia/Cd")
	if cd["Inserted"] != false {
		t.Errorf("after the tear-down the CD has %v, want it ejected", cd["Image"])
	}
	if got := powerState(); got != "Off" {
		t.Errorf("after the tear-down the machine is %s, want Off", got)
	}
}

func lookupFloat(body map[string]any, keys ...string) float64 {
	f, _ := conformance.Lookup(body, keys...).(float64)
	return f
}

func toStrings(v any) []string {
	list, _ := v.([]any)
	out := make([]string, 0, len(list))
	for _, x := range list {
		out = append(out, fmt.Sprint(x))
	}
	return out
}
