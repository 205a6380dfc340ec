package conformance_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/virtmetal/virtmetal/conformance/schemacheck"
	"github.com/virtmetal/virtmetal/internal/ssetest"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

// TestRedfishSchemaConformance crawls every resource of a redfish.Server
// over HTTPS with Basic auth and requires zero violations of the DMTF JSON
// schemas, the response rules and the $metadata rules.
func TestRedfishSchemaConformance(t *testing.T) {
	bundle := schemacheck.RequireBundle(t)
	validator, err := schemacheck.NewValidator(filepath.Join(bundle, "json-schema"))
	if err != nil {
		t.Fatal(err)
	}
	// Images import for an hour, as a CDI import can: inserts answer with
	// a Task, and the crawl finds it running.
	backend := memory.New(memory.Options{Machines: 3, MediaImportTime: time.Hour})
	// vm-0 runs with a one-time PXE override and media inserted (its
	// import's Task running); vm-1 keeps the defaults (off, no override,
	// empty drive); vm-2's import failed (its Task ended in Exception):
	// every shape gets crawled.
	vm0 := backend.Get("vm-0")
	if err := vm0.Reset(t.Context(), machine.ResetOn); err != nil {
		t.Fatal(err)
	}
	if err := vm0.SetBootOverride(t.Context(), machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce, Mode: machine.BootModeUEFI}); err != nil {
		t.Fatal(err)
	}
	server, err := redfish.NewServer(redfish.Config{
		Backend:  backend,
		Accounts: []redfish.Account{{Username: "admin", Password: "password", Role: redfish.RoleAdministrator}},
		Logger:   logr.Discard(),
		// The inserts' images are on loopback; nothing fetches them.
		EventDestinationsAllowLoopback: true,
		// The name bmc-controller's Ingress gives, so that HostName and
		// FQDN are crawled too.
		NetworkProtocol: redfish.NetworkProtocol{FQDN: "vm.team-a.bmc.example.org"},
	})
	if err != nil {
		t.Fatal(err)
	}
	service := httptest.NewTLSServer(server)
	defer service.Close()
	defer server.StopEventStreams() // Close waits for them
	createSession(t, service)       // so that a Session resource exists to crawl
	sse := service.URL + "/redfish/v1/EventService/SSE"
	stream, _ := ssetest.Open(t, service.Client(), sse, "admin", "password", nil)
	// A client resuming from an ID the service never gave is told events
	// were lost, in an Event of its own.
	resumed, _ := ssetest.Open(t, service.Client(), sse, "admin", "password", map[string]string{"Last-Event-ID": "99"})
	if stream == nil || resumed == nil {
		t.Fatal("no SSE stream")
	}
	// An action and a failed login, so that both kinds of LogEntry exist,
	// and the inserts whose Tasks are crawled.
	const insert = "/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia"
	for _, req := range []struct{ method, path, body, password string }{
		{http.MethodPost, "/redfish/v1/Systems/vm-1/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`, "password"},
		{http.MethodGet, "/redfish/v1/Systems", "", "wrong"},
		{http.MethodPost, "/redfish/v1/Systems/vm-0" + insert, `{"Image":"http://127.0.0.1:8080/boot.iso"}`, "password"},
		{http.MethodPost, "/redfish/v1/Systems/vm-2" + insert, `{"Image":"http://127.0.0.1:8080/missing.iso"}`, "password"},
	} {
		r, _ := http.NewRequest(req.method, service.URL+req.path, strings.NewReader(req.body))
		r.SetBasicAuth("admin", req.password)
		r.Header.Set("Content-Type", "application/json")
		res, err := service.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	if !backend.Get("vm-2").FailMediaImport("HTTP 404 Not Found") {
		t.Fatal("vm-2 has no import under way")
	}
	// The task monitors are no resources the crawl finds: the running
	// import's answers 202 with its Task, the failed one's with an error.
	for _, monitor := range []struct {
		path, schema string // schema "" is the @odata.type's
		status       int
	}{
		{"/redfish/v1/TaskService/TaskMonitors/1", "", http.StatusAccepted},
		{"/redfish/v1/TaskService/TaskMonitors/2", "redfish-error.v1_0_2.json", http.StatusInternalServerError},
	} {
		r, _ := http.NewRequest(http.MethodGet, service.URL+monitor.path, nil)
		r.SetBasicAuth("admin", "password")
		res, err := service.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || res.StatusCode != monitor.status {
			t.Fatalf("GET %s: %d %s (%v), want %d", monitor.path, res.StatusCode, body, err, monitor.status)
		}
		violations, err := validator.Validate(monitor.path, body)
		if monitor.schema != "" {
			violations, err = validator.ValidateAgainst(monitor.path, body, monitor.schema)
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range violations {
			t.Errorf("%s", v)
		}
	}

	// The Events the stream carries: the power-on of vm-1, the lost ones.
	for _, e := range []ssetest.Event{stream.Next(t, 5*time.Second), resumed.Next(t, 5*time.Second)} {
		violations, err := validator.Validate("SSE "+e.ID, []byte(e.Data))
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range violations {
			t.Errorf("%s", v)
		}
	}

	crawler := &schemacheck.Crawler{
		Client:    service.Client(),
		BaseURL:   service.URL,
		Username:  "admin",
		Password:  "password",
		Validator: validator,
	}
	report, err := crawler.Crawl(t.Context())
	if err != nil {
		t.Fatalf("crawl: %v", err)
	}
	t.Logf("crawled %d resources, %d @odata.type values", len(report.Visited), len(report.ODataTypes))

	// Guard against a crawl that "passes" because it found nothing.
	for _, want := range []string{"/redfish/v1/Systems", "/redfish/v1/Managers", "/redfish/v1/Chassis", "/redfish/v1/SessionService/Sessions", "/redfish/v1/AccountService", "/redfish/v1/EventService",
		"/redfish/v1/Systems/vm-1/LogServices/Log/Entries/1", "/redfish/v1/Managers/vm-1/LogServices/Log/Entries/2",
		"/redfish/v1/Systems/vm-0/Processors/1", "/redfish/v1/Systems/vm-0/Memory/1", "/redfish/v1/Chassis/vm-0/Drives/1",
		"/redfish/v1/Systems/vm-0/Storage/1/Volumes/1", "/redfish/v1/Systems/vm-0/Storage/1/Controllers/virtio",
		"/redfish/v1/Registries/BiosAttributeRegistry.1.0.0/BiosAttributeRegistry.1.0.0",
		"/redfish/v1/TaskService/Tasks/1", "/redfish/v1/TaskService/Tasks/2",
		"/redfish/v1/Systems/vm-0/ResetActionInfo", "/redfish/v1/Systems/vm-0/VirtualMedia/Cd/InsertMediaActionInfo",
		// The same drive under the Manager, where older clients look.
		"/redfish/v1/Managers/vm-0/VirtualMedia/Cd", "/redfish/v1/Managers/vm-0/VirtualMedia/Cd/InsertMediaActionInfo"} {
		if !visitedUnder(report.Visited, want) {
			t.Errorf("crawl never reached %s; visited %v", want, report.Visited)
		}
	}
	// Each open stream is a member of Subscriptions, crawled as an
	// EventDestination.
	streamMembers := 0
	for _, path := range report.Visited {
		if strings.HasPrefix(path, "/redfish/v1/EventService/Subscriptions/") {
			streamMembers++
		}
	}
	if streamMembers != 2 {
		t.Errorf("the crawl reached %d members of Subscriptions, want one per open stream (2); visited %v", streamMembers, report.Visited)
	}
	for _, v := range report.Violations {
		t.Errorf("%s", v)
	}

	metadataViolations, err := crawler.CheckMetadata(t.Context(), filepath.Join(bundle, "csdl"), report.ODataTypes)
	if err != nil {
		t.Fatalf("$metadata: %v", err)
	}
	for _, v := range metadataViolations {
		t.Errorf("%s", v)
	}
}

func createSession(t *testing.T, service *httptest.Server) {
	t.Helper()
	resp, err := service.Client().Post(service.URL+"/redfish/v1/SessionService/Sessions", "application/json",
		strings.NewReader(`{"UserName": "admin", "Password": "password"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("creating a session: %s", resp.Status)
	}
}

func visitedUnder(visited []string, prefix string) bool {
	for _, path := range visited {
		if strings.HasPrefix(path, prefix+"/") || path == prefix {
			return true
		}
	}
	return false
}
