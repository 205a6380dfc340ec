package redfish_test

import (
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/redfish"
)

const (
	attacker = "198.51.100.66:40000"
	maas     = "192.0.2.10:50000"
)

// throttledFixture has a limiter on the fixture's clock: 2 free failures,
// then 1 s doubling, blocked for a minute after 5.
func throttledFixture(t *testing.T, tweak func(*redfish.Config)) *fixture {
	var f *fixture
	f = newFixture(t, func(c *redfish.Config, _ *stubBackend) {
		c.Limiter = throttle.New(throttle.Policy{
			FreeFailures: 2, BaseDelay: time.Second, MaxDelay: 4 * time.Second,
			BlockAfter: 5, BlockDuration: time.Minute,
			Now: c.Now,
		})
		if tweak != nil {
			tweak(c)
		}
	})
	return f
}

// TestFailedLoginsThrottleTheSourceNotTheAccount: guessing from one address
// slows and then refuses that address, while the account's owner, from
// another address, keeps working throughout; nothing is ever locked.
func TestFailedLoginsThrottleTheSourceNotTheAccount(t *testing.T) {
	f := throttledFixture(t, nil)
	from := func(remote, user, pass string) int {
		return f.do(request{method: "GET", path: system0, user: user, pass: pass, remote: remote}).status
	}
	for i := range 5 {
		if got := from(attacker, adminUser, "guess"); got != http.StatusUnauthorized {
			t.Fatalf("guess %d: status %d, want 401", i+1, got)
		}
		if got := from(maas, adminUser, adminPass); got != http.StatusOK {
			t.Fatalf("owner after %d guesses: status %d, want 200", i+1, got)
		}
	}
	// Blocked: even the right password from the attacker's address is
	// refused without being checked.
	if got := from(attacker, adminUser, adminPass); got != http.StatusUnauthorized {
		t.Fatalf("blocked source with the right password: %d, want 401", got)
	}
	// Unknown usernames are slowed in a count of their own, which holds
	// back no real account, even from the same source.
	other := "203.0.113.7:1"
	for range 6 {
		from(other, "nobody", "x")
	}
	if got := from(other, adminUser, adminPass); got != http.StatusOK {
		t.Fatalf("right password right after 6 unknown-user guesses from its source: %d, want 200", got)
	}
	// Sessions are throttled by the same rule.
	res := f.do(request{method: "POST", path: sessionsURI, remote: attacker, body: `{"UserName":"admin","Password":"admin-secret"}`})
	if res.status != http.StatusUnauthorized {
		t.Errorf("login from the blocked source: %d, want 401", res.status)
	}
	f.clock.Advance(time.Minute)
	if got := from(attacker, adminUser, adminPass); got != http.StatusOK {
		t.Fatalf("after the block: %d, want 200", got)
	}
	if got := f.do(asAdmin("GET", "/redfish/v1/AccountService/Accounts/1", "")).json["Locked"]; got != false {
		t.Errorf("Locked = %v, want false", got)
	}
}

// TestForwardedForFromTrustedProxiesOnly: behind an Ingress, clients are
// told apart by X-Forwarded-For; anyone else's X-Forwarded-For is ignored,
// so an attacker cannot rotate a forged address to escape throttling.
func TestForwardedForFromTrustedProxiesOnly(t *testing.T) {
	const ingress = "10.0.0.5:3000"
	f := throttledFixture(t, func(c *redfish.Config) {
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}
	})
	via := func(remote, forwarded, pass string) int {
		return f.do(request{method: "GET", path: system0, user: adminUser, pass: pass, remote: remote,
			headers: map[string]string{"X-Forwarded-For": forwarded}}).status
	}
	for range 5 {
		via(ingress, "198.51.100.66, 10.0.0.4", "guess")
	}
	if got := via(ingress, "198.51.100.66", adminPass); got != http.StatusUnauthorized {
		t.Errorf("attacker behind the ingress: %d, want 401", got)
	}
	if got := via(ingress, "192.0.2.10", adminPass); got != http.StatusOK {
		t.Errorf("MaaS behind the same ingress: %d, want 200", got)
	}
	// Not a trusted proxy: the forged header changes nothing.
	for i := range 5 {
		via(attacker, "203.0.113."+string(rune('1'+i)), "guess")
	}
	if got := via(attacker, "203.0.113.99", adminPass); got != http.StatusUnauthorized {
		t.Errorf("forged X-Forwarded-For from an untrusted peer escaped throttling: %d", got)
	}
}

// TestUnauthenticatedWrongMethodGets401: without credentials, a wrong
// method on a real path answers exactly as an unknown path does, so probes
// cannot map the service.
func TestUnauthenticatedWrongMethodGets401(t *testing.T) {
	f := newFixture(t, nil)
	for _, tt := range []struct{ method, path string }{
		{"DELETE", system0},
		{"PUT", reset0},
		{"DELETE", "/redfish/v1/AccountService"},
		{"PATCH", "/redfish/v1/SessionService/Sessions"},
		{"PUT", "/redfish/v1/SessionService/Sessions/x"},
		{"GET", "/redfish/v1/NoSuchThing"},
	} {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			res := f.do(request{method: tt.method, path: tt.path})
			if res.status != http.StatusUnauthorized || res.header.Get("Allow") != "" {
				t.Fatalf("status %d, Allow %q; want 401 without Allow", res.status, res.header.Get("Allow"))
			}
			authed := f.do(asAdmin(tt.method, tt.path, ""))
			if authed.status == http.StatusUnauthorized {
				t.Fatalf("with credentials: still 401")
			}
		})
	}
	if res := f.do(asAdmin("DELETE", system0, "")); res.status != http.StatusMethodNotAllowed || res.header.Get("Allow") == "" {
		t.Errorf("authenticated wrong method: %d, Allow %q; want 405 with Allow", res.status, res.header.Get("Allow"))
	}
}

// TestNonJSONBodiesGet415: a browser can post text/plain and forms to any
// site; such bodies must not reach the handlers.
func TestNonJSONBodiesGet415(t *testing.T) {
	tests := []struct {
		name        string
		method      string
		path        string
		contentType string // "-" sends none
		body        string
		want        int
		wantID      string
	}{
		{"text/plain reset", "POST", reset0, "text/plain", `{"ResetType":"On"}`, 415, "Base.1.19.HeaderInvalid"},
		{"form reset", "POST", reset0, "application/x-www-form-urlencoded", `{"ResetType":"On"}`, 415, "Base.1.19.HeaderInvalid"},
		{"multipart patch", "PATCH", system0, "multipart/form-data; boundary=x", `{"PowerState":"On"}`, 415, "Base.1.19.HeaderInvalid"},
		{"no type", "POST", reset0, "-", `{"ResetType":"On"}`, 415, "Base.1.19.HeaderMissing"},
		{"garbage type", "POST", reset0, ";;", `{"ResetType":"On"}`, 415, "Base.1.19.HeaderInvalid"},
		{"form login", "POST", sessionsURI, "text/plain", `{"UserName":"admin","Password":"admin-secret"}`, 415, "Base.1.19.HeaderInvalid"},
		{"json with charset", "POST", reset0, "application/json; charset=utf-8", `{"ResetType":"On"}`, 204, ""},
		{"bare eject", "POST", sysEject0, "-", ``, 204, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, nil)
			req := asAdmin(tt.method, tt.path, tt.body)
			if tt.contentType != "-" {
				req.headers = map[string]string{"Content-Type": tt.contentType}
			} else {
				req.headers = map[string]string{"Content-Type": ""}
			}
			res := f.do(req)
			if res.status != tt.want {
				t.Fatalf("status %d, want %d: %s", res.status, tt.want, res.raw)
			}
			if tt.wantID != "" {
				if ids := messageIDs(t, res); !slices.Equal(ids, []string{tt.wantID}) {
					t.Errorf("MessageIds = %v, want %s", ids, tt.wantID)
				}
				if power := f.do(asAdmin("GET", system0, "")).json["PowerState"]; power != "Off" {
					t.Errorf("PowerState = %v after a refused request, want Off as before", power)
				}
			}
		})
	}
}

// TestSessionQuotaPerAccount: one account cannot take every session slot.
func TestSessionQuotaPerAccount(t *testing.T) {
	f := newFixture(t, func(c *redfish.Config, _ *stubBackend) {
		c.MaxSessions = 8
		c.MaxSessionsPerAccount = 3
	})
	for range 3 {
		f.login(readerUser, readerPass)
	}
	res := f.do(request{method: "POST", path: sessionsURI, body: `{"UserName":"reader","Password":"reader-secret"}`})
	if res.status != http.StatusServiceUnavailable {
		t.Fatalf("fourth reader session: %d, want 503", res.status)
	}
	if ids := messageIDs(t, res); !slices.Equal(ids, []string{"Base.1.19.SessionLimitExceeded"}) {
		t.Errorf("MessageIds = %v", ids)
	}
	f.login(adminUser, adminPass) // other accounts still get in
}

// TestManagerResetEndsSessions: a BMC reset logs everyone out.
func TestManagerResetEndsSessions(t *testing.T) {
	f := newFixture(t, nil)
	adminToken, _ := f.login(adminUser, adminPass)
	readerToken, _ := f.login(readerUser, readerPass)
	res := f.do(request{method: "POST", path: manager0 + "/Actions/Manager.Reset", body: `{"ResetType":"GracefulRestart"}`,
		headers: map[string]string{"X-Auth-Token": adminToken}})
	if res.status != http.StatusNoContent {
		t.Fatalf("reset: %d: %s", res.status, res.raw)
	}
	for _, token := range []string{adminToken, readerToken} {
		if res := f.do(withToken("GET", system0, token)); res.status != http.StatusUnauthorized {
			t.Errorf("session survived the manager reset: %d", res.status)
		}
	}
	if res := f.do(asAdmin("GET", system0, "")); res.status != http.StatusOK {
		t.Errorf("Basic auth after the reset: %d", res.status)
	}
}

// TestSetAccountsGraceWindow: a rotated password keeps working for the
// grace window, and sessions it opened end with the window.
func TestSetAccountsGraceWindow(t *testing.T) {
	f := newFixture(t, nil)
	oldToken, _ := f.login(adminUser, adminPass)
	const newPass = "rotated-secret"
	accounts := []redfish.Account{
		{Username: adminUser, Password: newPass, Role: redfish.RoleAdministrator},
		{Username: readerUser, Password: readerPass, Role: redfish.RoleReadOnly},
	}
	if err := f.server.SetAccounts(accounts, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	basic := func(user, pass string) int {
		return f.do(request{method: "GET", path: system0, user: user, pass: pass}).status
	}
	if got := basic(adminUser, newPass); got != http.StatusOK {
		t.Errorf("new password: %d", got)
	}
	if got := basic(adminUser, adminPass); got != http.StatusOK {
		t.Errorf("old password within the window: %d", got)
	}
	graceToken, _ := f.login(adminUser, adminPass)
	newToken, _ := f.login(adminUser, newPass)
	if got := basic(operatorUser, operatorPass); got != http.StatusUnauthorized {
		t.Errorf("removed account: %d, want 401", got)
	}
	f.clock.Advance(10 * time.Minute)
	if got := basic(adminUser, adminPass); got != http.StatusUnauthorized {
		t.Errorf("old password after the window: %d, want 401", got)
	}
	if res := f.do(withToken("GET", system0, graceToken)); res.status != http.StatusUnauthorized {
		t.Errorf("session opened with the old password outlived the window: %d", res.status)
	}
	if res := f.do(withToken("GET", system0, oldToken)); res.status != http.StatusUnauthorized {
		t.Errorf("session opened before the rotation outlived the window: %d", res.status)
	}
	if res := f.do(withToken("GET", system0, newToken)); res.status != http.StatusOK {
		t.Errorf("session opened with the new password: %d, want 200", res.status)
	}
	if err := f.server.SetAccounts(nil, 0); err == nil || !strings.Contains(err.Error(), "at least one") {
		t.Errorf("SetAccounts(nil) = %v", err)
	}
}

// readinessBackend is not ready until told.
type readinessBackend struct {
	*stubBackend
	err error
}

func (b *readinessBackend) Ready() error { return b.err }

// TestNotReadyAnswers503: until the backend is ready, resources answer 503
// with Retry-After, never 404 or a partial view; the service root works.
func TestNotReadyAnswers503(t *testing.T) {
	var rb *readinessBackend
	f := newFixture(t, func(c *redfish.Config, b *stubBackend) {
		rb = &readinessBackend{stubBackend: b, err: machine.Errorf(machine.ErrUnavailable, "cache not synced")}
		c.Backend = rb
	})
	for _, path := range []string{system0, "/redfish/v1/Systems", "/redfish/v1/Systems/no-such-vm", manager0} {
		res := f.do(asAdmin("GET", path, ""))
		if res.status != http.StatusServiceUnavailable || res.header.Get("Retry-After") == "" {
			t.Errorf("GET %s before ready: %d, Retry-After %q; want 503 with Retry-After", path, res.status, res.header.Get("Retry-After"))
		}
	}
	if res := f.do(request{method: "GET", path: "/redfish/v1/"}); res.status != http.StatusOK {
		t.Errorf("service root before ready: %d", res.status)
	}
	rb.err = nil
	if res := f.do(asAdmin("GET", system0, "")); res.status != http.StatusOK {
		t.Errorf("after ready: %d", res.status)
	}
}
