package vhost_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/internal/ssetest"
	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/internal/vhost"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
)

const (
	web1Host = "web1.team-a.bmc.example.com"
	web2Host = "web2.team-a.bmc.example.com"
)

// vmFile is the content of a VM's file.
func vmFile(user, pass string, hosts ...string) string {
	data, _ := json.Marshal(bmcspec.SharedVM{Username: user, Password: pass, Hosts: hosts})
	return string(data)
}

// secretDir lays files out as the kubelet does in a Secret volume: the
// files in a timestamped directory, ..data a link to it, swapped in one
// rename, and NAME -> ..data/NAME at the top.
type secretDir struct {
	path string
	gen  int
}

func newSecretDir(t *testing.T) *secretDir {
	return &secretDir{path: t.TempDir()}
}

func (d *secretDir) write(t *testing.T, files map[string]string) {
	t.Helper()
	d.gen++
	gen := fmt.Sprintf("..2026_01_01_00_00_%02d.%d", d.gen, d.gen)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(d.path, gen), 0o755))
	for name, content := range files {
		must(os.WriteFile(filepath.Join(d.path, gen, name), []byte(content), 0o600))
	}
	old, _ := os.Readlink(filepath.Join(d.path, "..data"))
	must(os.Symlink(gen, filepath.Join(d.path, "..data_tmp")))
	must(os.Rename(filepath.Join(d.path, "..data_tmp"), filepath.Join(d.path, "..data")))
	entries, err := os.ReadDir(d.path)
	must(err)
	for _, e := range entries {
		if _, keep := files[e.Name()]; !keep && !strings.HasPrefix(e.Name(), ".") {
			must(os.Remove(filepath.Join(d.path, e.Name())))
		}
	}
	for name := range files {
		link := filepath.Join(d.path, name)
		if _, err := os.Lstat(link); err != nil {
			must(os.Symlink(filepath.Join("..data", name), link))
		}
	}
	if old != "" {
		must(os.RemoveAll(filepath.Join(d.path, old)))
	}
}

// fakeBackend serves one machine named after its VM.
type fakeBackend struct {
	ctx      context.Context // the context the router started it with
	vm       string
	spec     bmcspec.SharedVM // the file the router started it with
	machine  machine.Machine
	notReady bool
}

// namedMachine is a memory machine under the VM's name.
type namedMachine struct {
	*memory.Machine
	id string
}

func (m namedMachine) ID() string { return m.id }

func (b *fakeBackend) Machines(context.Context) ([]string, error) { return []string{b.vm}, nil }

func (b *fakeBackend) Machine(_ context.Context, id string) (machine.Machine, error) {
	if id != b.vm {
		return nil, machine.Errorf(machine.ErrNotFound, "%q", id)
	}
	return b.machine, nil
}

func (b *fakeBackend) Ready() error {
	if b.notReady {
		return machine.Errorf(machine.ErrUnavailable, "cache of %s not synced", b.vm)
	}
	return nil
}

// fakes starts fake backends; it can be told to fail a VM's start or to
// start it not ready.
type fakes struct {
	mu       sync.Mutex
	fail     map[string]error
	notReady map[string]bool
	started  map[string]*fakeBackend // the last backend started per VM
}

func newFakes() *fakes {
	return &fakes{fail: map[string]error{}, notReady: map[string]bool{}, started: map[string]*fakeBackend{}}
}

func (f *fakes) start(ctx context.Context, vm string, spec bmcspec.SharedVM) (machine.Backend, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail[vm]; err != nil {
		return nil, err
	}
	b := &fakeBackend{ctx: ctx, vm: vm, spec: spec, machine: namedMachine{memory.New(memory.Options{}).Get("vm-0"), vm}, notReady: f.notReady[vm]}
	f.started[vm] = b
	return b, nil
}

func (f *fakes) backend(vm string) *fakeBackend {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started[vm]
}

// logBuffer collects the router's log lines.
type logBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.lines, "\n")
}

func (b *logBuffer) count(substr string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, l := range b.lines {
		if strings.Contains(l, substr) {
			n++
		}
	}
	return n
}

type fixture struct {
	router *vhost.Router
	dir    *secretDir
	fakes  *fakes
	logs   *logBuffer
}

func newFixture(t *testing.T, tweak func(*vhost.Config)) *fixture {
	t.Helper()
	f := &fixture{dir: newSecretDir(t), fakes: newFakes(), logs: &logBuffer{}}
	cfg := vhost.Config{
		Dir:          f.dir.path,
		StartBackend: f.fakes.start,
		Grace:        time.Minute,
		Logger: funcr.NewJSON(func(obj string) {
			f.logs.mu.Lock()
			defer f.logs.mu.Unlock()
			f.logs.lines = append(f.logs.lines, obj)
		}, funcr.Options{}),
	}
	if tweak != nil {
		tweak(&cfg)
	}
	r, err := vhost.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.router = r
	return f
}

func (f *fixture) reload(t *testing.T, ctx context.Context, wantVMs int) {
	t.Helper()
	n, err := f.router.Reload(ctx)
	if err != nil || n != wantVMs {
		t.Fatalf("Reload = %d, %v; want %d VMs; logs:\n%s", n, err, wantVMs, f.logs)
	}
}

// sources gives each request a client address of its own, so that the
// failures a test provokes on purpose do not throttle its other requests.
var sources atomic.Uint32

type request struct {
	host, path, user, pass string
	source                 string // default: a fresh address
}

type answer struct {
	status  int
	body    map[string]any
	members []string
}

func (f *fixture) do(t *testing.T, req request) answer {
	t.Helper()
	path := req.path
	if path == "" {
		path = "/redfish/v1/Systems"
	}
	r := httptest.NewRequest(http.MethodGet, path, nil)
	r.Host = req.host
	r.RemoteAddr = req.source
	if r.RemoteAddr == "" {
		n := sources.Add(1)
		r.RemoteAddr = fmt.Sprintf("10.%d.%d.%d:40000", n>>16&255, n>>8&255, n&255)
	}
	if req.user != "" {
		r.SetBasicAuth(req.user, req.pass)
	}
	rec := httptest.NewRecorder()
	f.router.ServeHTTP(rec, r)
	a := answer{status: rec.Code}
	if strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(rec.Body.Bytes(), &a.body); err != nil {
			t.Fatalf("body is not JSON: %v\n%s", err, rec.Body)
		}
	}
	members, _ := a.body["Members"].([]any)
	for _, m := range members {
		id, _ := m.(map[string]any)["@odata.id"].(string)
		a.members = append(a.members, id)
	}
	return a
}

func errorCode(a answer) string {
	e, _ := a.body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

func TestRouting(t *testing.T) {
	f := newFixture(t, nil)
	f.dir.write(t, map[string]string{
		"web1": vmFile("maas1", "pw1", web1Host),
		"web2": vmFile("maas2", "pw2", web2Host, "Web2-Alt.Example.com."),
	})
	f.reload(t, t.Context(), 2)
	tests := []struct {
		name        string
		req         request
		wantStatus  int
		wantMembers []string
		wantCode    string
	}{
		{name: "web1 at its host", req: request{host: web1Host, user: "maas1", pass: "pw1"}, wantStatus: 200, wantMembers: []string{"/redfish/v1/Systems/web1"}},
		{name: "web2 at its host", req: request{host: web2Host, user: "maas2", pass: "pw2"}, wantStatus: 200, wantMembers: []string{"/redfish/v1/Systems/web2"}},
		{name: "web2 at its second host", req: request{host: "web2-alt.example.com", user: "maas2", pass: "pw2"}, wantStatus: 200, wantMembers: []string{"/redfish/v1/Systems/web2"}},
		{name: "host with port, in capitals", req: request{host: "WEB1.team-a.bmc.example.com:8443", user: "maas1", pass: "pw1"}, wantStatus: 200, wantMembers: []string{"/redfish/v1/Systems/web1"}},
		{name: "host with a trailing dot", req: request{host: web1Host + ".", user: "maas1", pass: "pw1"}, wantStatus: 200, wantMembers: []string{"/redfish/v1/Systems/web1"}},
		{name: "web2's credentials at web1", req: request{host: web1Host, user: "maas2", pass: "pw2"}, wantStatus: 401},
		{name: "web1's credentials at web2", req: request{host: web2Host, user: "maas1", pass: "pw1"}, wantStatus: 401},
		{name: "web2's system at web1", req: request{host: web1Host, path: "/redfish/v1/Systems/web2", user: "maas1", pass: "pw1"}, wantStatus: 404},
		// The Manager's VirtualMedia, the system's drive where older clients look.
		{name: "web1's manager media at web1", req: request{host: web1Host, path: "/redfish/v1/Managers/web1/VirtualMedia", user: "maas1", pass: "pw1"}, wantStatus: 200, wantMembers: []string{"/redfish/v1/Managers/web1/VirtualMedia/Cd"}},
		{name: "web2's manager media at web1", req: request{host: web1Host, path: "/redfish/v1/Managers/web2/VirtualMedia/Cd", user: "maas1", pass: "pw1"}, wantStatus: 404},
		{name: "unknown host", req: request{host: "web3.team-a.bmc.example.com", user: "maas1", pass: "pw1"}, wantStatus: 404, wantCode: "Base.1.19.ResourceNotFound"},
		{name: "unknown host without credentials", req: request{host: "10.0.0.7:8443"}, wantStatus: 404, wantCode: "Base.1.19.ResourceNotFound"},
		{name: "short name of a host", req: request{host: "web1", user: "maas1", pass: "pw1"}, wantStatus: 404, wantCode: "Base.1.19.ResourceNotFound"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := f.do(t, tt.req)
			if got.status != tt.wantStatus {
				t.Fatalf("status %d, want %d; body %v", got.status, tt.wantStatus, got.body)
			}
			if tt.wantMembers != nil && !slices.Equal(got.members, tt.wantMembers) {
				t.Errorf("members %v, want %v", got.members, tt.wantMembers)
			}
			if tt.wantCode != "" && errorCode(got) != tt.wantCode {
				t.Errorf("error code %q, want %q (body %v)", errorCode(got), tt.wantCode, got.body)
			}
		})
	}
}

// TestRunAddsAndRemovesVMs: while Run reloads, a new file is served and a
// removed one stops, its backend's context cancelled; when Run's context
// ends, every backend's does.
func TestRunAddsAndRemovesVMs(t *testing.T) {
	f := newFixture(t, nil)
	f.dir.write(t, map[string]string{"web1": vmFile("maas1", "pw1", web1Host)})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	f.reload(t, ctx, 1)
	done := make(chan struct{})
	go func() { defer close(done); f.router.Run(ctx, 10*time.Millisecond) }()
	if got := f.do(t, request{host: web2Host, user: "maas2", pass: "pw2"}).status; got != 404 {
		t.Fatalf("web2 before its file: %d, want 404", got)
	}

	f.dir.write(t, map[string]string{"web1": vmFile("maas1", "pw1", web1Host), "web2": vmFile("maas2", "pw2", web2Host)})
	poll.True(t, "web2 served after its file appeared", func() bool {
		return f.do(t, request{host: web2Host, user: "maas2", pass: "pw2"}).status == 200
	})
	web1 := f.fakes.backend("web1")

	f.dir.write(t, map[string]string{"web2": vmFile("maas2", "pw2", web2Host)})
	poll.True(t, "web1 gone after its file was removed", func() bool {
		return f.do(t, request{host: web1Host, user: "maas1", pass: "pw1"}).status == 404
	})
	if web1.ctx.Err() == nil {
		t.Error("web1's backend context still live after its file was removed")
	}
	web2 := f.fakes.backend("web2")
	if web2.ctx.Err() != nil {
		t.Error("web2's backend context ended while its file is there")
	}
	if got := f.do(t, request{host: web2Host, user: "maas2", pass: "pw2"}).status; got != 200 {
		t.Errorf("web2 after web1 left: %d, want 200", got)
	}
	cancel()
	<-done
	if web2.ctx.Err() == nil {
		t.Error("web2's backend context still live after the router's ended")
	}
}

// TestCredentialRotation: a VM's new password works at the next reload,
// the previous one for the grace only, and the other VMs are untouched.
func TestCredentialRotation(t *testing.T) {
	const grace = 500 * time.Millisecond
	f := newFixture(t, func(c *vhost.Config) { c.Grace = grace })
	f.dir.write(t, map[string]string{"web1": vmFile("maas1", "old", web1Host), "web2": vmFile("maas2", "pw2", web2Host)})
	f.reload(t, t.Context(), 2)
	web1 := f.fakes.backend("web1")

	f.dir.write(t, map[string]string{"web1": vmFile("maas1", "new", web1Host), "web2": vmFile("maas2", "pw2", web2Host)})
	f.reload(t, t.Context(), 2)
	rotated := time.Now()
	for _, tc := range []struct {
		host, user, pass string
		want             int
	}{
		{web1Host, "maas1", "new", 200},
		{web1Host, "maas1", "old", 200},
		{web2Host, "maas2", "pw2", 200},
	} {
		if got := f.do(t, request{host: tc.host, user: tc.user, pass: tc.pass}).status; got != tc.want {
			t.Errorf("%s as %s/%s in the grace: %d, want %d", tc.host, tc.user, tc.pass, got, tc.want)
		}
	}
	if time.Since(rotated) >= grace {
		t.Fatal("the checks in the grace took longer than the grace; the machine is too slow for this test")
	}
	if f.fakes.backend("web1") != web1 {
		t.Error("rotating the credentials restarted the backend")
	}
	time.Sleep(time.Until(rotated.Add(grace + 50*time.Millisecond)))
	if got := f.do(t, request{host: web1Host, user: "maas1", pass: "old"}).status; got != 401 {
		t.Errorf("old password after the grace: %d, want 401", got)
	}
	if got := f.do(t, request{host: web1Host, user: "maas1", pass: "new"}).status; got != 200 {
		t.Errorf("new password after the grace: %d, want 200", got)
	}
}

// networkProtocol is the VM's Manager's NetworkProtocol, read at host.
func (f *fixture) networkProtocol(t *testing.T, host, vm, user, pass string) map[string]any {
	t.Helper()
	a := f.do(t, request{host: host, path: "/redfish/v1/Managers/" + vm + "/NetworkProtocol", user: user, pass: pass})
	if a.status != 200 {
		t.Fatalf("NetworkProtocol of %s at %s: %d %v", vm, host, a.status, a.body)
	}
	return a.body
}

// TestHostsChange: a VM's changed hosts are routed at the next reload, and
// its Manager's FQDN and HostName follow: they name the VM's one host, and
// nothing when it has several.
func TestHostsChange(t *testing.T) {
	const moved = "web1.team-b.bmc.example.com"
	f := newFixture(t, nil)
	f.dir.write(t, map[string]string{"web1": vmFile("maas1", "pw1", web1Host), "web2": vmFile("maas2", "pw2", web2Host, "web2-alt.example.com")})
	f.reload(t, t.Context(), 2)
	if p := f.networkProtocol(t, web1Host, "web1", "maas1", "pw1"); p["FQDN"] != web1Host || p["HostName"] != "web1" {
		t.Errorf("web1's FQDN %v, HostName %v; want %s, web1", p["FQDN"], p["HostName"], web1Host)
	}
	if p := f.networkProtocol(t, web2Host, "web2", "maas2", "pw2"); p["FQDN"] != nil || p["HostName"] != nil {
		t.Errorf("web2, at two hosts, says FQDN %v, HostName %v; want neither", p["FQDN"], p["HostName"])
	}
	web1, web2 := f.fakes.backend("web1"), f.fakes.backend("web2")

	f.dir.write(t, map[string]string{"web1": vmFile("maas1", "pw1", moved), "web2": vmFile("maas2", "pw2", web2Host, "web2-other.example.com")})
	f.reload(t, t.Context(), 2)
	if got := f.do(t, request{host: web1Host, user: "maas1", pass: "pw1"}).status; got != 404 {
		t.Errorf("old host: %d, want 404", got)
	}
	if got := f.do(t, request{host: moved, user: "maas1", pass: "pw1"}).status; got != 200 {
		t.Errorf("new host: %d, want 200", got)
	}
	if p := f.networkProtocol(t, moved, "web1", "maas1", "pw1"); p["FQDN"] != moved || p["HostName"] != "web1" {
		t.Errorf("web1's FQDN %v, HostName %v after the move; want %s, web1", p["FQDN"], p["HostName"], moved)
	}
	if web1.ctx.Err() == nil {
		t.Error("web1's previous service still runs after its name changed")
	}
	if f.fakes.backend("web2") != web2 {
		t.Error("web2's hosts changed but not its name: its service restarted all the same")
	}
}

// TestStateSecretChange: a VM's backend is started with the StateSecret
// its file names; when the file names another, the VM's service restarts
// with a backend started with it (the service reads its kept subscriptions
// as it starts), and the other VMs' services stay.
func TestStateSecretChange(t *testing.T) {
	file := func(stateSecret string) string {
		data, _ := json.Marshal(bmcspec.SharedVM{Username: "maas1", Password: "pw1", Hosts: []string{web1Host}, StateSecret: stateSecret})
		return string(data)
	}
	tests := []struct {
		name, before, after string
		wantRestart         bool
	}{
		{"to the namespace's Secret", "", bmcspec.SharedStateSecret, true},
		{"back to the VM's own", bmcspec.SharedStateSecret, "", true},
		{"to another Secret", bmcspec.SharedStateSecret, "elsewhere", true},
		{"unchanged", bmcspec.SharedStateSecret, bmcspec.SharedStateSecret, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, nil)
			f.dir.write(t, map[string]string{"web1": file(tt.before), "web2": vmFile("maas2", "pw2", web2Host)})
			f.reload(t, t.Context(), 2)
			web1, web2 := f.fakes.backend("web1"), f.fakes.backend("web2")
			if web1.spec.StateSecret != tt.before {
				t.Fatalf("web1's backend started with StateSecret %q, want %q", web1.spec.StateSecret, tt.before)
			}

			f.dir.write(t, map[string]string{"web1": file(tt.after), "web2": vmFile("maas2", "pw2", web2Host)})
			f.reload(t, t.Context(), 2)
			now := f.fakes.backend("web1")
			if restarted := now != web1; restarted != tt.wantRestart {
				t.Errorf("web1 restarted: %v, want %v", restarted, tt.wantRestart)
			}
			if now.spec.StateSecret != tt.after {
				t.Errorf("web1's backend has StateSecret %q, want %q", now.spec.StateSecret, tt.after)
			}
			if stopped := web1.ctx.Err() != nil; stopped != tt.wantRestart {
				t.Errorf("web1's first backend stopped: %v, want %v", stopped, tt.wantRestart)
			}
			if f.fakes.backend("web2") != web2 || web2.ctx.Err() != nil {
				t.Error("web2's file did not change, but its service restarted")
			}
			if got := f.do(t, request{host: web1Host, user: "maas1", pass: "pw1"}).status; got != 200 {
				t.Errorf("web1 after the change: %d, want 200", got)
			}
		})
	}
}

// TestBadFiles: a file that is not a VM description, or whose name is not
// a VM name, is skipped and logged by name; the others are served.
func TestBadFiles(t *testing.T) {
	tests := []struct {
		name, file, content string
	}{
		{"not JSON", "web3", "username=maas"},
		{"truncated JSON", "web3", `{"username": "maas", "pass`},
		{"no hosts", "web3", `{"username": "maas", "password": "pw"}`},
		{"no username", "web3", vmFile("", "pw", "web3.example.com")},
		{"no password", "web3", vmFile("maas", "", "web3.example.com")},
		{"host not a DNS name", "web3", vmFile("maas", "pw", "web3_example.com")},
		{"host with a port", "web3", vmFile("maas", "pw", "web3.example.com:8443")},
		{"hosts not a list", "web3", `{"username": "maas", "password": "pw", "hosts": "web3.example.com"}`},
		{"stateSecret not a Secret name", "web3", `{"username": "maas", "password": "pw", "hosts": ["web3.example.com"], "stateSecret": "../state"}`},
		{"file name not a VM name", "Web3", vmFile("maas", "pw", "web3.example.com")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, nil)
			f.dir.write(t, map[string]string{"web1": vmFile("maas1", "pw1", web1Host), tt.file: tt.content})
			f.reload(t, t.Context(), 1)
			f.reload(t, t.Context(), 1)
			if got := f.do(t, request{host: web1Host, user: "maas1", pass: "pw1"}).status; got != 200 {
				t.Errorf("web1 beside a bad file: %d, want 200", got)
			}
			if got := f.do(t, request{host: "web3.example.com", user: "maas", pass: "pw"}).status; got != 404 {
				t.Errorf("the bad file's host: %d, want 404", got)
			}
			if n := f.logs.count(filepath.Join(f.dir.path, tt.file)); n != 1 {
				t.Errorf("%d log lines name the bad file, want 1 over two reloads:\n%s", n, f.logs)
			}
			if f.fakes.backend(strings.ToLower(tt.file)) != nil {
				t.Error("a backend was started for the bad file")
			}
		})
	}
}

// TestServedVMFileTurnsBad: a served VM whose file stops parsing keeps its
// last good credentials and hosts; when the file is good again, it applies.
func TestServedVMFileTurnsBad(t *testing.T) {
	f := newFixture(t, nil)
	f.dir.write(t, map[string]string{"web1": vmFile("maas1", "pw1", web1Host)})
	f.reload(t, t.Context(), 1)
	f.dir.write(t, map[string]string{"web1": `{"username": "maas1", "password": "pw2", "hosts": [`})
	f.reload(t, t.Context(), 1)
	if got := f.do(t, request{host: web1Host, user: "maas1", pass: "pw1"}).status; got != 200 {
		t.Errorf("web1 with its file corrupt: %d, want 200 with its last credentials", got)
	}
	if !strings.Contains(f.logs.String(), filepath.Join(f.dir.path, "web1")) {
		t.Errorf("no log line names the corrupt file:\n%s", f.logs)
	}
	f.dir.write(t, map[string]string{"web1": vmFile("maas1", "pw2", web1Host)})
	f.reload(t, t.Context(), 1)
	if got := f.do(t, request{host: web1Host, user: "maas1", pass: "pw2"}).status; got != 200 {
		t.Errorf("web1's new password once the file is good: %d, want 200", got)
	}
}

// TestDuplicateHost: a host two files claim is served by neither, and
// logged; their other hosts are served, and the host is again once one
// file lets it go.
func TestDuplicateHost(t *testing.T) {
	const shared = "shared.team-a.bmc.example.com"
	f := newFixture(t, nil)
	f.dir.write(t, map[string]string{
		"web1": vmFile("maas1", "pw1", web1Host, shared),
		"web2": vmFile("maas2", "pw2", web2Host, shared),
	})
	f.reload(t, t.Context(), 2)
	for _, creds := range [][2]string{{"maas1", "pw1"}, {"maas2", "pw2"}} {
		if got := f.do(t, request{host: shared, user: creds[0], pass: creds[1]}).status; got != 404 {
			t.Errorf("shared host as %s: %d, want 404", creds[0], got)
		}
	}
	if got := f.do(t, request{host: web1Host, user: "maas1", pass: "pw1"}).status; got != 200 {
		t.Errorf("web1's own host: %d, want 200", got)
	}
	if got := f.do(t, request{host: web2Host, user: "maas2", pass: "pw2"}).status; got != 200 {
		t.Errorf("web2's own host: %d, want 200", got)
	}
	f.reload(t, t.Context(), 2)
	if n := f.logs.count(`"host":"` + shared + `"`); n != 1 {
		t.Errorf("%d log lines name the shared host over two reloads, want 1:\n%s", n, f.logs)
	}
	f.dir.write(t, map[string]string{
		"web1": vmFile("maas1", "pw1", web1Host, shared),
		"web2": vmFile("maas2", "pw2", web2Host),
	})
	f.reload(t, t.Context(), 2)
	if got := f.do(t, request{host: shared, user: "maas1", pass: "pw1"}).status; got != 200 {
		t.Errorf("shared host once only web1 claims it: %d, want 200", got)
	}
}

// TestReadiness: the router is ready once the directory has been read,
// whatever its VMs' backends say; a VM whose backend is not ready answers
// 503 on its own host; a directory that cannot be read later changes
// nothing.
func TestReadiness(t *testing.T) {
	f := newFixture(t, nil)
	if err := f.router.Ready(); !errors.Is(err, machine.ErrUnavailable) {
		t.Errorf("Ready before any reload: %v, want ErrUnavailable", err)
	}
	ctx := t.Context()
	if err := os.RemoveAll(f.dir.path); err != nil {
		t.Fatal(err)
	}
	if _, err := f.router.Reload(ctx); err == nil {
		t.Fatal("Reload of a missing directory: no error")
	}
	if err := f.router.Ready(); err == nil {
		t.Error("Ready after a failed first read: nil, want an error")
	}
	if err := os.Mkdir(f.dir.path, 0o755); err != nil {
		t.Fatal(err)
	}
	f.fakes.notReady["web1"] = true
	f.dir.write(t, map[string]string{"web1": vmFile("maas1", "pw1", web1Host), "web2": vmFile("maas2", "pw2", web2Host)})
	f.reload(t, ctx, 2)
	if err := f.router.Ready(); err != nil {
		t.Errorf("Ready with one VM not synced: %v, want nil", err)
	}
	if got := f.do(t, request{host: web1Host, user: "maas1", pass: "pw1"}).status; got != 503 {
		t.Errorf("web1 not synced: %d, want 503", got)
	}
	if got := f.do(t, request{host: web2Host, user: "maas2", pass: "pw2"}).status; got != 200 {
		t.Errorf("web2 beside an unsynced VM: %d, want 200", got)
	}
	if err := os.RemoveAll(f.dir.path); err != nil {
		t.Fatal(err)
	}
	if n, err := f.router.Reload(ctx); err == nil || n != 2 {
		t.Errorf("Reload of a vanished directory = %d, %v; want an error and the 2 VMs kept", n, err)
	}
	if err := f.router.Ready(); err != nil {
		t.Errorf("Ready after a failed reload: %v, want nil", err)
	}
	if got := f.do(t, request{host: web2Host, user: "maas2", pass: "pw2"}).status; got != 200 {
		t.Errorf("web2 after a failed reload: %d, want 200", got)
	}
}

// TestBackendStartFails: a VM whose backend does not start is not served
// and is tried again at the next reload; the others are served.
func TestBackendStartFails(t *testing.T) {
	f := newFixture(t, nil)
	f.fakes.fail["web2"] = errors.New("no kubeconfig today")
	f.dir.write(t, map[string]string{"web1": vmFile("maas1", "pw1", web1Host), "web2": vmFile("maas2", "pw2", web2Host)})
	f.reload(t, t.Context(), 1)
	if got := f.do(t, request{host: web2Host, user: "maas2", pass: "pw2"}).status; got != 404 {
		t.Errorf("web2 whose backend failed: %d, want 404", got)
	}
	if got := f.do(t, request{host: web1Host, user: "maas1", pass: "pw1"}).status; got != 200 {
		t.Errorf("web1: %d, want 200", got)
	}
	if !strings.Contains(f.logs.String(), "no kubeconfig today") {
		t.Errorf("the failure is not logged:\n%s", f.logs)
	}
	f.fakes.mu.Lock()
	delete(f.fakes.fail, "web2")
	f.fakes.mu.Unlock()
	f.reload(t, t.Context(), 2)
	if got := f.do(t, request{host: web2Host, user: "maas2", pass: "pw2"}).status; got != 200 {
		t.Errorf("web2 once its backend starts: %d, want 200", got)
	}
}

// TestSecretVolumeReadWhenSwapped: the files of a Secret volume are read
// again when the kubelet swaps its ..data link, not while the link stays
// (a file changed behind it, which the kubelet never does, goes unseen);
// a directory without the link is read at every reload.
func TestSecretVolumeReadWhenSwapped(t *testing.T) {
	f := newFixture(t, nil)
	f.dir.write(t, map[string]string{"web1": vmFile("maas1", "pw1", web1Host)})
	f.reload(t, t.Context(), 1)
	current, err := os.Readlink(filepath.Join(f.dir.path, "..data"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.dir.path, current, "web2"), []byte(vmFile("maas2", "pw2", web2Host)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", "web2"), filepath.Join(f.dir.path, "web2")); err != nil {
		t.Fatal(err)
	}
	f.reload(t, t.Context(), 1) // the link is the one read: not read again
	f.dir.write(t, map[string]string{"web1": vmFile("maas1", "pw1", web1Host), "web2": vmFile("maas2", "pw2", web2Host)})
	f.reload(t, t.Context(), 2)

	plain := newFixture(t, nil)
	for i, vm := range []struct{ name, host string }{{"web1", web1Host}, {"web2", web2Host}} {
		if err := os.WriteFile(filepath.Join(plain.dir.path, vm.name), []byte(vmFile("u-"+vm.name, "pw", vm.host)), 0o600); err != nil {
			t.Fatal(err)
		}
		plain.reload(t, t.Context(), i+1)
	}
}

// TestThrottlePerVM: one source's failed logins at one VM hold back no
// other VM's logins from it, and a success at another VM clears none of
// them, so guessing at y between logins to x gains nothing (issue 35 item
// 7); the owner from another source is never held back.
func TestThrottlePerVM(t *testing.T) {
	f := newFixture(t, func(c *vhost.Config) {
		c.Limiter = throttle.New(throttle.Policy{FreeFailures: 2, BaseDelay: time.Hour, MaxDelay: time.Hour})
	})
	f.dir.write(t, map[string]string{"web1": vmFile("maas1", "pw1", web1Host), "web2": vmFile("maas2", "pw2", web2Host)})
	f.reload(t, t.Context(), 2)
	const tenant = "192.0.2.66:40000" // knows web1's password, guesses web2's
	for round := range 3 {
		for range 2 {
			f.do(t, request{host: web2Host, user: "maas2", pass: "guess", source: tenant})
		}
		if got := f.do(t, request{host: web1Host, user: "maas1", pass: "pw1", source: tenant}).status; got != 200 {
			t.Fatalf("round %d: the guessing source at the VM it owns: %d, want 200", round+1, got)
		}
	}
	if got := f.do(t, request{host: web2Host, user: "maas2", pass: "pw2", source: tenant}).status; got != 401 {
		t.Errorf("web2 after 6 failures from the source, cleared by logins to web1: %d, want 401 (throttled)", got)
	}
	if got := f.do(t, request{host: web2Host, user: "maas2", pass: "pw2"}).status; got != 200 {
		t.Errorf("web2's owner from another source: %d, want 200", got)
	}
}

func TestNewRefusesIncompleteConfig(t *testing.T) {
	start := func(context.Context, string, bmcspec.SharedVM) (machine.Backend, error) { return nil, nil }
	tests := []struct {
		name string
		cfg  vhost.Config
		want string
	}{
		{"no directory", vhost.Config{StartBackend: start}, "Dir"},
		{"no backend starter", vhost.Config{Dir: t.TempDir()}, "StartBackend"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := vhost.New(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one naming %s", err, tt.want)
			}
		})
	}
}

// TestEventStreamsStayWithTheirVM: each VM's EventService tells its own
// VM's changes only: a stream opened at web1's host hears web1's power-on
// and credentials rotation, never web2's, and web2's credentials open no
// stream at web1's host.
func TestEventStreamsStayWithTheirVM(t *testing.T) {
	f := newFixture(t, nil)
	f.dir.write(t, map[string]string{
		"web1": vmFile("maas1", "pw1", web1Host),
		"web2": vmFile("maas2", "pw2", web2Host),
	})
	f.reload(t, t.Context(), 2)
	ts := httptest.NewTLSServer(f.router)
	t.Cleanup(ts.Close)
	t.Cleanup(f.router.StopEventStreams) // before Close, which waits for them
	sse := ts.URL + "/redfish/v1/EventService/SSE"
	if _, resp := ssetest.Open(t, ts.Client(), sse, "maas2", "pw2", map[string]string{"Host": web1Host}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("web2's credentials at web1's stream: %d, want 401", resp.StatusCode)
	}
	stream, resp := ssetest.Open(t, ts.Client(), sse, "maas1", "pw1", map[string]string{"Host": web1Host})
	if stream == nil {
		t.Fatalf("web1's stream: %d", resp.StatusCode)
	}
	if n := f.router.EventStreams(); n != 1 {
		t.Errorf("%d streams open, want 1", n)
	}
	reset := func(host, user, pass, vm string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, ts.URL+"/redfish/v1/Systems/"+vm+"/Actions/ComputerSystem.Reset", strings.NewReader(`{"ResetType":"On"}`))
		req.Host = host
		req.SetBasicAuth(user, pass)
		req.Header.Set("Content-Type", "application/json")
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
			t.Fatalf("reset %s: %d", vm, resp.StatusCode)
		}
	}
	reset(web2Host, "maas2", "pw2", "web2")
	reset(web1Host, "maas1", "pw1", "web1")
	if id, origin := stream.Next(t, 5*time.Second).Record(t); id != "ResourceEvent.1.3.0.ResourcePoweredOn" || origin != "/redfish/v1/Systems/web1" {
		t.Errorf("first event %s from %s, want web1's power-on", id, origin)
	}
	f.dir.write(t, map[string]string{
		"web1": vmFile("maas1", "pw1", web1Host),
		"web2": vmFile("maas2", "rotated", web2Host),
	})
	f.reload(t, t.Context(), 2)
	stream.Quiet(t, 300*time.Millisecond) // web2's rotation is web2's
	f.dir.write(t, map[string]string{
		"web1": vmFile("maas1", "rotated", web1Host),
		"web2": vmFile("maas2", "rotated", web2Host),
	})
	f.reload(t, t.Context(), 2)
	if id, origin := stream.Next(t, 5*time.Second).Record(t); id != "ResourceEvent.1.0.0.ResourceChanged" || origin != "/redfish/v1/AccountService" {
		t.Errorf("after web1's rotation: %s from %s, want ResourceChanged of the AccountService", id, origin)
	}
}

// post sends a JSON body to host with the given credentials.
func (f *fixture) post(t *testing.T, host, path, user, pass, body string) int {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	r.Host = host
	n := sources.Add(1)
	r.RemoteAddr = fmt.Sprintf("10.%d.%d.%d:40000", n>>16&255, n>>8&255, n&255)
	r.Header.Set("Content-Type", "application/json")
	r.SetBasicAuth(user, pass)
	rec := httptest.NewRecorder()
	f.router.ServeHTTP(rec, r)
	return rec.Code
}

// TestEventDestinationsReachEveryVM: every VM's service takes the
// Config's event destination rules, and its push subscriptions hear its
// own VM's events only; EventSubscriptions sums over the VMs. Only
// loopback is ever sent anything.
func TestEventDestinationsReachEveryVM(t *testing.T) {
	var mu sync.Mutex
	var contexts []string
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var body struct{ Context string }
		_ = json.NewDecoder(req.Body).Decode(&body)
		mu.Lock()
		defer mu.Unlock()
		contexts = append(contexts, body.Context)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(receiver.Close)
	received := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(contexts)
	}
	tests := []struct {
		name        string
		tweak       func(*vhost.Config)
		destination string
		wantStatus  int
		wantEnabled int // EventSubscriptions, over both VMs
	}{
		{"loopback allowed", func(c *vhost.Config) { c.EventDestinationsAllowLoopback = true }, receiver.URL, http.StatusCreated, 2},
		{"loopback refused by default", nil, receiver.URL, http.StatusBadRequest, 0},
		{"a denied network", func(c *vhost.Config) {
			c.EventDestinationsAllowLoopback = true
			c.EventDestinationsDenied = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
		}, "http://192.0.2.7/events", http.StatusBadRequest, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.tweak)
			f.dir.write(t, map[string]string{
				"web1": vmFile("maas1", "pw1", web1Host),
				"web2": vmFile("maas2", "pw2", web2Host),
			})
			f.reload(t, t.Context(), 2)
			t.Cleanup(f.router.StopEventStreams) // ends push deliveries too
			for _, vm := range []struct{ name, host, user, pass string }{
				{"web1", web1Host, "maas1", "pw1"},
				{"web2", web2Host, "maas2", "pw2"},
			} {
				code := f.post(t, vm.host, "/redfish/v1/EventService/Subscriptions", vm.user, vm.pass,
					`{"Destination":"`+tt.destination+`","Protocol":"Redfish","Context":"`+vm.name+`"}`)
				if code != tt.wantStatus {
					t.Fatalf("subscribing at %s's host: %d, want %d", vm.name, code, tt.wantStatus)
				}
			}
			enabled, suspended := f.router.EventSubscriptions()
			if enabled != tt.wantEnabled || suspended != 0 {
				t.Errorf("EventSubscriptions = %d enabled, %d suspended; want %d, 0", enabled, suspended, tt.wantEnabled)
			}
			if tt.wantStatus != http.StatusCreated {
				return
			}
			before := len(received())
			if code := f.post(t, web1Host, "/redfish/v1/EventService/Actions/EventService.SubmitTestEvent", "maas1", "pw1",
				`{"MessageId":"Test.1.0.Hello"}`); code/100 != 2 {
				t.Fatalf("SubmitTestEvent at web1: %d", code)
			}
			poll.True(t, "web1's subscription sent the test event", func() bool { return len(received()) > before })
			time.Sleep(100 * time.Millisecond) // would web2's subscription hear it too?
			if got := received()[before:]; !slices.Equal(got, []string{"web1"}) {
				t.Errorf("the test event at web1 reached the subscriptions %v, want web1's only", got)
			}
		})
	}
}
