package conformance_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/schemas"

	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

const (
	maasUser, maasPass  = "maas", "maas-secret"
	maasTransitionDelay = 150 * time.Millisecond
	maasPollTimeout     = 5 * time.Second
)

// maasPatchRecorder remembers the If-Match header of every PATCH, to prove the
// client sent the ETag it was given.
type maasPatchRecorder struct {
	next http.Handler
	mu   sync.Mutex
	seen []string
}

func (p *maasPatchRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPatch {
		p.mu.Lock()
		p.seen = append(p.seen, r.Header.Get("If-Match"))
		p.mu.Unlock()
	}
	p.next.ServeHTTP(w, r)
}

func (p *maasPatchRecorder) ifMatches() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.seen)
}

// newMaaSServer builds the Redfish service on a two-machine memory backend
// with vm-0 already running (booted from disk), as MaaS usually finds a
// machine it takes over, and an Operator account for MaaS.
func newMaaSServer(t *testing.T) (*redfish.Server, *memory.Backend) {
	t.Helper()
	backend := memory.New(memory.Options{Machines: 2, TransitionDelay: maasTransitionDelay})
	vm := backend.Get("vm-0")
	if err := vm.Reset(t.Context(), machine.ResetOn); err != nil {
		t.Fatal(err)
	}
	poll.True(t, "vm-0 powered on", func() bool { p, _ := vm.PowerState(t.Context()); return p == machine.PowerOn })
	srv, err := redfish.NewServer(redfish.Config{
		Backend:  backend,
		Accounts: []redfish.Account{{Username: maasUser, Password: maasPass, Role: redfish.RoleOperator}},
		Logger:   testr.New(t),
		// Metal3's image is on loopback; nothing fetches it.
		EventDestinationsAllowLoopback: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	return srv, backend
}

// startMaaSBMC serves newMaaSServer over TLS behind a PATCH recorder.
func startMaaSBMC(t *testing.T) (*httptest.Server, *memory.Backend, *maasPatchRecorder) {
	t.Helper()
	srv, backend := newMaaSServer(t)
	recorder := &maasPatchRecorder{next: srv}
	ts := httptest.NewUnstartedServer(recorder)
	ts.StartTLS()
	t.Cleanup(ts.Close)
	return ts, backend, recorder
}

// maasWaitForPower re-reads the system until it reports want, and returns the
// states seen on the way.
func maasWaitForPower(t *testing.T, client *gofish.APIClient, uri string, want schemas.PowerState) []schemas.PowerState {
	t.Helper()
	var seen []schemas.PowerState
	poll.Until(t, uri+" reaching "+string(want), func() error {
		sys, err := schemas.GetComputerSystem(client, uri)
		if err != nil {
			t.Fatalf("GET %s: %v", uri, err)
		}
		if len(seen) == 0 || seen[len(seen)-1] != sys.PowerState {
			seen = append(seen, sys.PowerState)
		}
		if sys.PowerState != want {
			return fmt.Errorf("saw %v", seen)
		}
		return nil
	})
	return seen
}

// TestMaaSPowerSequenceWithGofish drives MaaS's Redfish power driver
// sequence through gofish: find the system, set a one-time PXE boot with
// If-Match, force it off, power it on, and check it booted from the
// network exactly once.
func TestMaaSPowerSequenceWithGofish(t *testing.T) {
	ts, backend, recorder := startMaaSBMC(t)
	client, err := gofish.Connect(gofish.ClientConfig{
		Endpoint:   ts.URL,
		Username:   maasUser,
		Password:   maasPass,
		Insecure:   true,
		BasicAuth:  true,
		HTTPClient: ts.Client(),
	})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer client.Logout()

	systems, err := client.Service.Systems()
	if err != nil {
		t.Fatalf("GET Systems: %v", err)
	}
	if len(systems) != 2 {
		t.Fatalf("%d systems, want 2", len(systems))
	}
	i := slices.IndexFunc(systems, func(s *schemas.ComputerSystem) bool { return s.ID == "vm-0" })
	if i < 0 {
		t.Fatal("vm-0 not listed")
	}
	uri := systems[i].ODataID
	system, err := schemas.GetComputerSystem(client, uri)
	if err != nil {
		t.Fatalf("GET %s: %v", uri, err)
	}
	if system.PowerState != schemas.OnPowerState {
		t.Fatalf("PowerState = %s, want On", system.PowerState)
	}
	etag := system.ODataEtag
	if etag == "" {
		t.Fatal("gofish saw no ETag on the system")
	}

	// MaaS's set_pxe_boot.
	if err := system.SetBoot(&schemas.Boot{
		BootSourceOverrideEnabled: schemas.OnceBootSourceOverrideEnabled,
		BootSourceOverrideTarget:  schemas.PxeBootSource,
	}); err != nil {
		t.Fatalf("PATCH Boot: %v", err)
	}
	if got := recorder.ifMatches(); !slices.Equal(got, []string{etag}) {
		t.Errorf("PATCH If-Match headers = %q, want [%q]", got, etag)
	}
	if o, _ := backend.Get("vm-0").BootOverride(t.Context()); o.Target != machine.BootPxe || o.Enabled != machine.BootOnce {
		t.Fatalf("override after PATCH = %+v", o)
	}

	// power_off, then power_on; gofish sends the old ETag with actions,
	// which must not matter.
	if _, err := system.Reset(schemas.ForceOffResetType); err != nil {
		t.Fatalf("ForceOff: %v", err)
	}
	offStates := maasWaitForPower(t, client, uri, schemas.OffPowerState)
	if _, err := system.Reset(schemas.OnResetType); err != nil {
		t.Fatalf("On: %v", err)
	}
	onStates := maasWaitForPower(t, client, uri, schemas.OnPowerState)
	for _, states := range [][]schemas.PowerState{offStates, onStates} {
		for _, s := range states {
			if !slices.Contains([]schemas.PowerState{schemas.OnPowerState, schemas.OffPowerState, schemas.PoweringOnPowerState, schemas.PoweringOffPowerState}, s) {
				t.Errorf("unexpected PowerState %q during the sequence", s)
			}
		}
	}

	boots := backend.Get("vm-0").Boots()
	if !slices.Equal(boots, []machine.BootTarget{machine.BootHdd, machine.BootPxe}) {
		t.Fatalf("boots = %v, want [Hdd Pxe]: the power on must boot from PXE", boots)
	}
	after, err := schemas.GetComputerSystem(client, uri)
	if err != nil {
		t.Fatal(err)
	}
	if after.Boot.BootSourceOverrideEnabled != schemas.DisabledBootSourceOverrideEnabled || after.Boot.BootSourceOverrideTarget != schemas.NoneBootSource {
		t.Errorf("override after the PXE boot = %s/%s, want None/Disabled (Once is consumed)",
			after.Boot.BootSourceOverrideTarget, after.Boot.BootSourceOverrideEnabled)
	}
	if _, err := after.Reset(schemas.ForceRestartResetType); err != nil {
		t.Fatalf("ForceRestart: %v", err)
	}
	if boots := backend.Get("vm-0").Boots(); boots[len(boots)-1] != machine.BootHdd {
		t.Errorf("boot after the consumed override = %s, want Hdd", boots[len(boots)-1])
	}
	if other := backend.Get("vm-1").Boots(); len(other) != 0 {
		t.Errorf("vm-1 booted %v; only vm-0 was driven", other)
	}
}

// maasRequest sends a request the way MaaS's Twisted client does: Basic
// auth, JSON Accept and Content-Type even on a bodiless GET.
func maasRequest(t *testing.T, ts *httptest.Server, method, path string, body string, extra map[string]string) (*http.Response, map[string]any) {
	t.Helper()
	var reader io.Reader
	if body != "" {
		reader = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, ts.URL+path, reader)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth(maasUser, maasPass)
	req.Header.Set("User-Agent", "MAAS")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	for k, v := range extra {
		req.Header.Set(k, v)
	}
	res, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	var decoded map[string]any
	if len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, &decoded); err != nil {
			t.Fatalf("%s %s: %d, body is not JSON: %q", method, path, res.StatusCode, data)
		}
	}
	return res, decoded
}

// TestMaaSRawHTTPQuirks replays MaaS's requests byte for byte in spirit:
// node id from the first Systems member, URIs with and without a trailing
// slash, the ETag read from the header, and 204 answers to actions.
func TestMaaSRawHTTPQuirks(t *testing.T) {
	ts, backend, _ := startMaaSBMC(t)

	res, systems := maasRequest(t, ts, "GET", "/redfish/v1/Systems", "", nil)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET Systems: %d", res.StatusCode)
	}
	members, _ := systems["Members"].([]any)
	if len(members) == 0 {
		t.Fatal("no members")
	}
	memberURI := members[0].(map[string]any)["@odata.id"].(string)
	nodeID := memberURI[strings.LastIndex(strings.TrimRight(memberURI, "/"), "/")+1:]
	if nodeID != "vm-0" {
		t.Fatalf("node id %q, want vm-0", nodeID)
	}

	for _, path := range []string{"/redfish/v1/Systems/" + nodeID, "/redfish/v1/Systems/" + nodeID + "/", "/redfish/v1/Systems/"} {
		if res, _ := maasRequest(t, ts, "GET", path, "", nil); res.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d, want 200", path, res.StatusCode)
		}
	}

	res, system := maasRequest(t, ts, "GET", "/redfish/v1/Systems/"+nodeID, "", nil)
	if state := strings.ToLower(system["PowerState"].(string)); state != "on" {
		t.Fatalf("power_query = %q, want on", state)
	}
	etag := res.Header.Get("ETag")
	if etag == "" {
		t.Fatal("no ETag header; MaaS would PATCH without If-Match")
	}
	pxe := `{"Boot": {"BootSourceOverrideEnabled": "Once", "BootSourceOverrideTarget": "Pxe"}}`
	if res, body := maasRequest(t, ts, "PATCH", "/redfish/v1/Systems/"+nodeID, pxe, map[string]string{"If-Match": etag}); res.StatusCode != http.StatusOK {
		t.Fatalf("PATCH: %d %v", res.StatusCode, body)
	}
	resetPath := "/redfish/v1/Systems/" + nodeID + "/Actions/ComputerSystem.Reset"
	for _, rt := range []string{"ForceOff", "On"} {
		res, body := maasRequest(t, ts, "POST", resetPath, `{"ResetType": "`+rt+`"}`, nil)
		if res.StatusCode != http.StatusNoContent || body != nil {
			t.Fatalf("POST %s: %d %v, want 204 without body", rt, res.StatusCode, body)
		}
	}
	if boots := backend.Get("vm-0").Boots(); boots[len(boots)-1] != machine.BootPxe {
		t.Errorf("last boot = %s, want Pxe", boots[len(boots)-1])
	}
	// The same action with a trailing slash, as the retry would send it.
	if res, _ := maasRequest(t, ts, "POST", resetPath+"/", `{"ResetType": "ForceOff"}`, nil); res.StatusCode != http.StatusNoContent {
		t.Errorf("POST with trailing slash: %d, want 204", res.StatusCode)
	}
}
