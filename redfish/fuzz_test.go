package redfish_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

// fuzzServer is a server on a fresh memory backend; throttling is off so
// every input reaches the handlers.
func fuzzServer(f *testing.F) (*redfish.Server, *memory.Backend) {
	backend := memory.New(memory.Options{Machines: 2})
	srv, err := redfish.NewServer(redfish.Config{
		Backend:  backend,
		Accounts: []redfish.Account{{Username: adminUser, Password: adminPass, Role: redfish.RoleAdministrator}, {Username: readerUser, Password: readerPass, Role: redfish.RoleReadOnly}},
		Limiter:  throttle.Unlimited,
		// Whatever host a fuzzed image names, no DNS server is asked.
		DestinationResolver: imageHosts,
	})
	if err != nil {
		f.Fatal(err)
	}
	return srv, backend
}

// machineState is what a request could change.
func machineState(b *memory.Backend) string {
	m := b.Get("vm-0")
	ctx := context.Background()
	power, _ := m.PowerState(ctx)
	boot, _ := m.BootOverride(ctx)
	media, _ := m.VirtualMedia(ctx)
	data, _ := json.Marshal([]any{power, boot, media})
	return string(data)
}

var publicPaths = map[string]bool{"/redfish": true, "/redfish/v1": true, "/redfish/v1/$metadata": true, "/redfish/v1/odata": true}

var fuzzMethods = []string{"GET", "POST", "PATCH", "DELETE", "PUT", "HEAD", "OPTIONS"}

// checkAnswer holds for every answer: no internal error, and every error
// is a Redfish error body with at least one message.
func checkAnswer(t *testing.T, rec *httptest.ResponseRecorder, what string) {
	t.Helper()
	if rec.Code >= 500 && rec.Code != http.StatusServiceUnavailable && rec.Code != http.StatusNotImplemented {
		t.Fatalf("%s: status %d: %s", what, rec.Code, rec.Body.Bytes())
	}
	if rec.Code >= 400 && rec.Body.Len() > 0 {
		var body struct {
			Error struct {
				Info []map[string]any `json:"@Message.ExtendedInfo"`
			} `json:"error"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || len(body.Error.Info) == 0 {
			t.Fatalf("%s: status %d without a Redfish error body: %s", what, rec.Code, rec.Body.Bytes())
		}
	}
}

// FuzzRequest sends arbitrary methods, paths, headers and bodies, as an
// unauthenticated, a read-only or an administrator client. No input makes
// the service fail, and without valid credentials no input changes the
// machine or reaches a protected handler.
func FuzzRequest(f *testing.F) {
	seeds := []struct {
		method      byte
		path        string
		contentType string
		header      string
		body        string
		who         byte
	}{
		{1, system0 + "/Actions/ComputerSystem.Reset", "application/json", "", `{"ResetType":"ForceOff"}`, 2},
		{2, system0, "application/json", "If-Match: *", `{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once"}}`, 2},
		{1, sessionsURI, "application/json", "", `{"UserName":"admin","Password":"admin-secret"}`, 0},
		{1, sysInsert0, "application/json", "", `{"Image":"http://example.invalid/a.iso","Inserted":true}`, 1},
		{1, manager0 + "/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia", "application/json", "", `{"Image":"http://example.invalid/a.iso"}`, 1},
		{2, system0 + "/Bios/Settings", "application/json", "", `{"Attributes":{"SecureBoot":"Enabled"},"@Redfish.SettingsApplyTime":{"ApplyTime":"OnReset"}}`, 2},
		{3, system0, "", "", "", 0},
		{0, "/redfish/v1/Systems/vm-0/../../v1", "", "X-Auth-Token: x", "", 0},
		{0, "/redfish/v1/%2e%2e/Systems", "", "", "", 2},
		{1, system0 + "/Actions/ComputerSystem.Reset", "text/plain", "", `{"ResetType":"On"}`, 2},
		{4, "/redfish/v1/", "application/json", "", `[]`, 0},
		{0, "/redfish/v1/Systems?$expand=*", "", "Accept: application/xml", "", 2},
	}
	for _, s := range seeds {
		f.Add(s.method, s.path, s.contentType, s.header, []byte(s.body), s.who)
	}
	srv, backend := fuzzServer(f)
	f.Fuzz(func(t *testing.T, methodIndex byte, path, contentType, header string, body []byte, who byte) {
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		method := fuzzMethods[int(methodIndex)%len(fuzzMethods)]
		req, err := http.NewRequest(method, "http://bmc"+path, strings.NewReader(string(body)))
		if err != nil {
			return // not a request a server could receive
		}
		req.RequestURI = req.URL.RequestURI()
		req.RemoteAddr = "192.0.2.1:1234"
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		if name, value, ok := strings.Cut(header, ":"); ok && name != "" && !strings.ContainsAny(name, " \r\n") {
			req.Header.Set(name, strings.TrimSpace(value))
		}
		switch who % 3 {
		case 1:
			req.SetBasicAuth(readerUser, readerPass)
		case 2:
			req.SetBasicAuth(adminUser, adminPass)
		default:
			req.Header.Del("Authorization")
			req.Header.Del("X-Auth-Token")
		}
		before := machineState(backend)
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		checkAnswer(t, rec, method+" "+path)
		if who%3 != 2 && machineState(backend) != before {
			t.Fatalf("%s %s as a client without ConfigureComponents changed the machine: %s -> %s", method, path, before, machineState(backend))
		}
		// Without credentials only the public documents say which
		// methods they allow.
		if who%3 == 0 && rec.Code == http.StatusMethodNotAllowed && !publicPaths[strings.TrimRight(req.URL.Path, "/")] {
			t.Fatalf("%s %s without credentials answered 405", method, path)
		}
	})
}

// FuzzActionBody posts arbitrary JSON to every action and PATCH target as
// the administrator: bad bodies get a 4xx with messages, never a failure,
// and a refused request leaves the machine as it was.
func FuzzActionBody(f *testing.F) {
	targets := []struct{ method, path string }{
		{"POST", system0 + "/Actions/ComputerSystem.Reset"},
		{"PATCH", system0},
		{"POST", sysInsert0},
		{"POST", sysEject0},
		{"POST", sysInsert0},
		{"POST", manager0 + "/Actions/Manager.Reset"},
		{"POST", sessionsURI},
	}
	for i, body := range []string{
		`{"ResetType":"On"}`, `{"Boot":{"BootSourceOverrideTarget":"Cd","BootSourceOverrideMode":"UEFI"}}`,
		`{"Image":"https://example.invalid/x.iso","WriteProtected":true}`, `{}`, `{"Image":1}`,
		`{"ResetType":"GracefulRestart"}`, `{"UserName":"admin","Password":"admin-secret"}`, `{"a":`, `null`, `"\u0000"`,
	} {
		f.Add(byte(i), []byte(body))
	}
	srv, backend := fuzzServer(f)
	f.Fuzz(func(t *testing.T, target byte, body []byte) {
		tg := targets[int(target)%len(targets)]
		req := httptest.NewRequest(tg.method, tg.path, strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/json")
		req.SetBasicAuth(adminUser, adminPass)
		before := machineState(backend)
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		checkAnswer(t, rec, tg.method+" "+tg.path)
		if rec.Code >= 400 && machineState(backend) != before {
			t.Fatalf("refused %s %s (%d) changed the machine", tg.method, tg.path, rec.Code)
		}
	})
}
