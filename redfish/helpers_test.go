package redfish_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/virtmetal/virtmetal/internal/egress"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

// Credentials of the fixture's accounts, one per role.
const (
	adminUser, adminPass       = "admin", "admin-secret"
	operatorUser, operatorPass = "operator", "operator-secret"
	readerUser, readerPass     = "reader", "reader-secret"
	serviceUUID                = "0f5d4a52-6e3b-4c0e-9d3a-3c1f1d2b7a10"
)

// imageHosts resolves the tests' image host names (images.example) to a
// documentation address the policy allows, asking no DNS server; the
// memory backend fetches nothing.
var imageHosts = egress.FixedResolver{netip.MustParseAddr("192.0.2.80")}

// fakeClock is a settable clock shared by the server and the backend.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// stubBackend serves the memory backend's machines, some replaced by
// wrappers that change one behaviour.
type stubBackend struct {
	*memory.Backend
	replaced map[string]machine.Machine
}

func (b *stubBackend) Machine(ctx context.Context, id string) (machine.Machine, error) {
	if m, ok := b.replaced[id]; ok {
		return m, nil
	}
	return b.Backend.Machine(ctx, id)
}

// stubMachine wraps a memory machine: it can narrow the capabilities,
// decorate the inventory, count resets and panic on inventory reads.
type stubMachine struct {
	machine.Machine
	caps          *machine.Capabilities
	decorate      func(*machine.Inventory)
	panicOnRead   bool
	resetsCounted atomic.Int32
	// bootRefused, when set, is what SetBootOverride answers.
	bootRefused error
}

func (m *stubMachine) SetBootOverride(ctx context.Context, o machine.BootOverride) error {
	if m.bootRefused != nil {
		return m.bootRefused
	}
	return m.Machine.SetBootOverride(ctx, o)
}

func (m *stubMachine) Capabilities() machine.Capabilities {
	if m.caps != nil {
		return *m.caps
	}
	return m.Machine.Capabilities()
}

func (m *stubMachine) Inventory(ctx context.Context) (machine.Inventory, error) {
	if m.panicOnRead {
		panic("inventory exploded")
	}
	inv, err := m.Machine.Inventory(ctx)
	if err == nil && m.decorate != nil {
		m.decorate(&inv)
	}
	return inv, err
}

func (m *stubMachine) Reset(ctx context.Context, r machine.ResetType) error {
	m.resetsCounted.Add(1)
	return m.Machine.Reset(ctx, r)
}

// fixture is a server on a two-machine memory backend with a fake clock.
type fixture struct {
	t       *testing.T
	server  *redfish.Server
	backend *stubBackend
	clock   *fakeClock
}

// newFixture builds a fixture; tweak may adjust the config and replace
// machines before the server is built.
func newFixture(t *testing.T, tweak func(*redfish.Config, *stubBackend)) *fixture {
	t.Helper()
	clock := newFakeClock()
	backend := &stubBackend{
		Backend:  memory.New(memory.Options{Machines: 2, Now: clock.Now}),
		replaced: map[string]machine.Machine{},
	}
	cfg := redfish.Config{
		Backend: backend,
		Accounts: []redfish.Account{
			{Username: adminUser, Password: adminPass, Role: redfish.RoleAdministrator},
			{Username: operatorUser, Password: operatorPass, Role: redfish.RoleOperator},
			{Username: readerUser, Password: readerPass, Role: redfish.RoleReadOnly},
		},
		Logger:              testr.New(t),
		ServiceUUID:         serviceUUID,
		Now:                 clock.Now,
		DestinationResolver: imageHosts,
	}
	if tweak != nil {
		tweak(&cfg, backend)
	}
	srv, err := redfish.NewServer(cfg)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	return &fixture{t: t, server: srv, backend: backend, clock: clock}
}

// request describes one HTTP request to the fixture.
type request struct {
	method  string
	path    string
	body    string
	user    string // HTTP Basic user; "" sends no credentials
	pass    string
	headers map[string]string
	// unknownLength sends the body without Content-Length, as chunked
	// uploads arrive.
	unknownLength bool
	// remote is the client's address (default httptest's 192.0.2.1:1234).
	remote string
}

// response is a recorded answer with its body decoded when it is JSON.
type response struct {
	status int
	header http.Header
	raw    []byte
	json   map[string]any
}

func (f *fixture) do(req request) response {
	f.t.Helper()
	var body io.Reader
	if req.body != "" {
		body = strings.NewReader(req.body)
	}
	r := httptest.NewRequest(req.method, req.path, body)
	if req.unknownLength {
		r.ContentLength = -1
		r.Body = io.NopCloser(io.MultiReader(r.Body))
	}
	if req.user != "" {
		r.SetBasicAuth(req.user, req.pass)
	}
	// Bodies are JSON, as every Redfish client declares them, unless the
	// test says otherwise.
	if req.body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	for k, v := range req.headers {
		r.Header.Set(k, v)
	}
	if req.remote != "" {
		r.RemoteAddr = req.remote
	}
	rec := httptest.NewRecorder()
	f.server.ServeHTTP(rec, r)
	res := response{status: rec.Code, header: rec.Header(), raw: rec.Body.Bytes()}
	if strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") && len(res.raw) > 0 {
		if err := json.Unmarshal(res.raw, &res.json); err != nil {
			f.t.Fatalf("%s %s: body is not JSON: %v\n%s", req.method, req.path, err, res.raw)
		}
	}
	return res
}

// as is a request with the admin's credentials.
func asAdmin(method, path, body string) request {
	return request{method: method, path: path, body: body, user: adminUser, pass: adminPass}
}

// messageIDs returns the MessageIds of an error body's ExtendedInfo.
func messageIDs(t *testing.T, res response) []string {
	t.Helper()
	errObj, ok := res.json["error"].(map[string]any)
	if !ok {
		t.Fatalf("status %d: body has no error object: %s", res.status, res.raw)
	}
	return extendedIDs(errObj)
}

// extendedIDs returns the MessageIds of an object's @Message.ExtendedInfo:
// an error's, or a success body's.
func extendedIDs(obj map[string]any) []string {
	infos, _ := obj["@Message.ExtendedInfo"].([]any)
	var ids []string
	for _, info := range infos {
		m, _ := info.(map[string]any)
		id, _ := m["MessageId"].(string)
		ids = append(ids, id)
	}
	return ids
}

// lookup walks a decoded JSON body along keys.
func lookup(body map[string]any, keys ...string) any {
	var cur any = body
	for _, k := range keys {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[k]
	}
	return cur
}
