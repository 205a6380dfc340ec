package redfish_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/redfish"
)

const sessionsURI = "/redfish/v1/SessionService/Sessions"

func TestOpenURIs(t *testing.T) {
	f := newFixture(t, nil)
	tests := []struct {
		path        string
		wantStatus  int
		contentType string
	}{
		{"/redfish", 200, "application/json; charset=utf-8"},
		{"/redfish/", 200, "application/json; charset=utf-8"},
		{"/redfish/v1", 200, "application/json; charset=utf-8"},
		{"/redfish/v1/", 200, "application/json; charset=utf-8"},
		{"/redfish/v1/$metadata", 200, "application/xml; charset=utf-8"},
		{"/redfish/v1/odata", 200, "application/json; charset=utf-8"},
		{"/redfish/v1/Systems", 401, "application/json; charset=utf-8"},
		{"/redfish/v1/SessionService", 401, "application/json; charset=utf-8"},
		{"/redfish/v1/SessionService/Sessions", 401, "application/json; charset=utf-8"},
		{"/redfish/v1/AccountService", 401, "application/json; charset=utf-8"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			res := f.do(request{method: "GET", path: tt.path})
			if res.status != tt.wantStatus {
				t.Fatalf("status %d, want %d", res.status, tt.wantStatus)
			}
			checkCommonHeaders(t, res, tt.contentType)
		})
	}
}

func TestBasicAuth(t *testing.T) {
	f := newFixture(t, nil)
	tests := []struct {
		name       string
		req        request
		wantStatus int
	}{
		{"right password", request{method: "GET", path: system0, user: adminUser, pass: adminPass}, 200},
		{"wrong password", request{method: "GET", path: system0, user: adminUser, pass: adminPass + "x"}, 401},
		{"password prefix", request{method: "GET", path: system0, user: adminUser, pass: adminPass[:3]}, 401},
		{"unknown user", request{method: "GET", path: system0, user: "mallory", pass: adminPass}, 401},
		{"other user's password", request{method: "GET", path: system0, user: readerUser, pass: adminPass}, 401},
		{"malformed header", request{method: "GET", path: system0, headers: map[string]string{"Authorization": "Basic !!!"}}, 401},
		{"bearer scheme", request{method: "GET", path: system0, headers: map[string]string{"Authorization": "Bearer abc"}}, 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if res := f.do(tt.req); res.status != tt.wantStatus {
				t.Errorf("status %d, want %d: %s", res.status, tt.wantStatus, res.raw)
			}
		})
	}
}

// login creates a session and returns its token and URI.
func (f *fixture) login(user, pass string) (token, location string) {
	f.t.Helper()
	res := f.do(request{method: "POST", path: sessionsURI, body: `{"UserName":"` + user + `","Password":"` + pass + `"}`})
	if res.status != http.StatusCreated {
		f.t.Fatalf("login %s: status %d: %s", user, res.status, res.raw)
	}
	return res.header.Get("X-Auth-Token"), res.header.Get("Location")
}

func withToken(method, path, token string) request {
	return request{method: method, path: path, headers: map[string]string{"X-Auth-Token": token}}
}

func TestSessionLifecycle(t *testing.T) {
	f := newFixture(t, nil)
	res := f.do(request{method: "POST", path: sessionsURI, body: `{"UserName":"admin","Password":"admin-secret"}`,
		headers: map[string]string{"Content-Type": "application/json"}})
	if res.status != http.StatusCreated {
		t.Fatalf("create: status %d: %s", res.status, res.raw)
	}
	token, location := res.header.Get("X-Auth-Token"), res.header.Get("Location")
	if len(token) < 32 {
		t.Fatalf("X-Auth-Token %q is too short to be unguessable", token)
	}
	if !strings.HasPrefix(location, sessionsURI+"/") {
		t.Fatalf("Location = %q", location)
	}
	if res.json["@odata.id"] != location || res.json["UserName"] != adminUser {
		t.Errorf("session body = %s", res.raw)
	}
	if _, leaked := res.json["Password"]; leaked || strings.Contains(string(res.raw), adminPass) {
		t.Errorf("session body shows the password: %s", res.raw)
	}

	if res := f.do(withToken("GET", system0, token)); res.status != http.StatusOK {
		t.Fatalf("GET with token: %d", res.status)
	}
	if res := f.do(withToken("GET", location, token)); res.status != http.StatusOK || res.json["Id"] == nil {
		t.Fatalf("GET own session: %d %s", res.status, res.raw)
	}
	list := f.do(withToken("GET", sessionsURI, token))
	if n := list.json["Members@odata.count"]; n != float64(1) {
		t.Errorf("Members@odata.count = %v, want 1", n)
	}
	// A token that is wrong by one character is refused.
	if res := f.do(withToken("GET", system0, token[:len(token)-1]+"x")); res.status != http.StatusUnauthorized {
		t.Errorf("altered token: status %d, want 401", res.status)
	}
	if res := f.do(withToken("DELETE", location, token)); res.status != http.StatusNoContent {
		t.Fatalf("DELETE: status %d: %s", res.status, res.raw)
	}
	if res := f.do(withToken("GET", system0, token)); res.status != http.StatusUnauthorized {
		t.Errorf("token after logout: status %d, want 401", res.status)
	}
	if res := f.do(asAdmin("GET", location, "")); res.status != http.StatusNotFound {
		t.Errorf("session after logout: status %d, want 404", res.status)
	}
}

func TestSessionIdleTimeout(t *testing.T) {
	f := newFixture(t, func(c *redfish.Config, _ *stubBackend) { c.SessionTimeout = time.Minute })
	if res := f.do(asAdmin("GET", "/redfish/v1/SessionService", "")); res.json["SessionTimeout"] != float64(60) {
		t.Errorf("SessionTimeout = %v, want 60", res.json["SessionTimeout"])
	}
	token, _ := f.login(adminUser, adminPass)
	// Each use restarts the idle clock.
	for range 3 {
		f.clock.Advance(59 * time.Second)
		if res := f.do(withToken("GET", system0, token)); res.status != http.StatusOK {
			t.Fatalf("after 59 s idle: status %d, want 200", res.status)
		}
	}
	f.clock.Advance(time.Minute)
	if res := f.do(withToken("GET", system0, token)); res.status != http.StatusUnauthorized {
		t.Fatalf("after 60 s idle: status %d, want 401", res.status)
	}
	if n := f.do(asAdmin("GET", sessionsURI, "")).json["Members@odata.count"]; n != float64(0) {
		t.Errorf("expired session still listed: count %v", n)
	}
}

func TestSessionLimit(t *testing.T) {
	f := newFixture(t, func(c *redfish.Config, _ *stubBackend) {
		c.MaxSessions = 2
		c.SessionTimeout = time.Minute
	})
	f.login(adminUser, adminPass)
	f.login(readerUser, readerPass)
	res := f.do(request{method: "POST", path: sessionsURI, body: `{"UserName":"admin","Password":"admin-secret"}`})
	if res.status != http.StatusServiceUnavailable {
		t.Fatalf("third session: status %d, want 503", res.status)
	}
	if ids := messageIDs(t, res); !slices.Equal(ids, []string{"Base.1.19.SessionLimitExceeded"}) {
		t.Errorf("MessageIds = %v", ids)
	}
	f.clock.Advance(time.Minute)
	f.login(adminUser, adminPass) // the idle ones expired and made room
}

// TestRolePrivileges checks the standard roles against the route table.
func TestRolePrivileges(t *testing.T) {
	type op struct {
		name   string
		method string
		path   string
		body   string
	}
	ops := []op{
		{"read system", "GET", system0, ""},
		{"reset", "POST", reset0, `{"ResetType":"On"}`},
		{"patch boot", "PATCH", system0, `{"Boot":{"BootSourceOverrideTarget":"Pxe"}}`},
		{"insert media", "POST", sysInsert0, `{"Image":"` + image + `"}`},
		{"eject media", "POST", sysEject0, ``},
		{"reset manager", "POST", manager0 + "/Actions/Manager.Reset", `{"ResetType":"GracefulRestart"}`},
		{"read own account", "GET", "", ""}, // path filled per user below
		{"read admin account", "GET", "/redfish/v1/AccountService/Accounts/1", ""},
		{"list accounts", "GET", "/redfish/v1/AccountService/Accounts", ""},
	}
	ownAccount := map[string]string{adminUser: "1", operatorUser: "2", readerUser: "3"}
	want := map[string][]int{
		adminUser:    {200, 204, 200, 204, 204, 204, 200, 200, 200},
		operatorUser: {200, 204, 200, 204, 204, 403, 200, 403, 200},
		readerUser:   {200, 403, 403, 403, 403, 403, 200, 403, 200},
	}
	pass := map[string]string{adminUser: adminPass, operatorUser: operatorPass, readerUser: readerPass}
	for user, statuses := range want {
		for i, o := range ops {
			t.Run(user+"/"+o.name, func(t *testing.T) {
				f := newFixture(t, nil)
				path := o.path
				if path == "" {
					path = "/redfish/v1/AccountService/Accounts/" + ownAccount[user]
				}
				res := f.do(request{method: o.method, path: path, body: o.body, user: user, pass: pass[user]})
				if res.status != statuses[i] {
					t.Errorf("status %d, want %d: %s", res.status, statuses[i], res.raw)
				}
				if res.status == http.StatusForbidden {
					if ids := messageIDs(t, res); !slices.Equal(ids, []string{"Base.1.19.InsufficientPrivilege"}) {
						t.Errorf("MessageIds = %v", ids)
					}
				}
			})
		}
	}
}

// TestSessionOwnership: users manage their own sessions; only
// ConfigureManager reaches other people's.
func TestSessionOwnership(t *testing.T) {
	f := newFixture(t, nil)
	adminToken, adminSession := f.login(adminUser, adminPass)
	readerToken, readerSession := f.login(readerUser, readerPass)

	if res := f.do(withToken("GET", adminSession, readerToken)); res.status != http.StatusForbidden {
		t.Errorf("reader reads admin's session: %d, want 403", res.status)
	}
	if res := f.do(withToken("DELETE", adminSession, readerToken)); res.status != http.StatusForbidden {
		t.Errorf("reader deletes admin's session: %d, want 403", res.status)
	}
	if res := f.do(withToken("GET", readerSession, adminToken)); res.status != http.StatusOK {
		t.Errorf("admin reads reader's session: %d, want 200", res.status)
	}
	if res := f.do(withToken("DELETE", readerSession, readerToken)); res.status != http.StatusNoContent {
		t.Errorf("reader deletes own session: %d, want 204", res.status)
	}
	if res := f.do(withToken("GET", system0, adminToken)); res.status != http.StatusOK {
		t.Errorf("admin's session survived: %d, want 200", res.status)
	}
}

func TestNewServerRejectsBadConfig(t *testing.T) {
	good := func() redfish.Config {
		return redfish.Config{
			Backend:  newFixture(t, nil).backend,
			Accounts: []redfish.Account{{Username: "a", Password: "p", Role: redfish.RoleAdministrator}},
		}
	}
	tests := []struct {
		name   string
		modify func(*redfish.Config)
		want   string
	}{
		{"no backend", func(c *redfish.Config) { c.Backend = nil }, "Backend"},
		{"no accounts", func(c *redfish.Config) { c.Accounts = nil }, "Accounts"},
		{"empty username", func(c *redfish.Config) { c.Accounts[0].Username = "" }, "empty username"},
		{"empty password", func(c *redfish.Config) { c.Accounts[0].Password = "" }, "empty password"},
		{"unknown role", func(c *redfish.Config) { c.Accounts[0].Role = "Root" }, "unknown role"},
		{"duplicate user", func(c *redfish.Config) { c.Accounts = append(c.Accounts, c.Accounts[0]) }, "twice"},
		{"short session timeout", func(c *redfish.Config) { c.SessionTimeout = time.Second }, "SessionTimeout"},
		{"negative MaxSessionsPerAccount", func(c *redfish.Config) { c.MaxSessionsPerAccount = -1 }, "MaxSessionsPerAccount"},
		{"bad service UUID", func(c *redfish.Config) { c.ServiceUUID = "not-a-uuid" }, "UUID"},
		{"negative MaxSessions", func(c *redfish.Config) { c.MaxSessions = -1 }, "MaxSessions"},
		{"negative MaxBodyBytes", func(c *redfish.Config) { c.MaxBodyBytes = -1 }, "MaxBodyBytes"},
		{"sub-second RetryAfter", func(c *redfish.Config) { c.RetryAfter = time.Millisecond }, "RetryAfter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good()
			tt.modify(&cfg)
			_, err := redfish.NewServer(cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
	if _, err := redfish.NewServer(good()); err != nil {
		t.Errorf("good config: %v", err)
	}
}
