package redfish_test

import (
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/redfish"
)

const (
	system1     = "/redfish/v1/Systems/vm-1"
	systemLog0  = system0 + "/LogServices/Log"
	managerLog0 = manager0 + "/LogServices/Log"
)

// messages are the Messages of a log's entries, newest first.
func messages(t *testing.T, f *fixture, logPath string) []string {
	t.Helper()
	res := f.do(asAdmin("GET", logPath+"/Entries", ""))
	if res.status != http.StatusOK {
		t.Fatalf("GET %s/Entries: %d", logPath, res.status)
	}
	var out []string
	for _, m := range res.json["Members"].([]any) {
		entry := f.do(asAdmin("GET", m.(map[string]any)["@odata.id"].(string), ""))
		out = append(out, entry.json["Message"].(string))
	}
	return out
}

// TestLogRecordsWhoDidWhat: every write through Redfish is logged under the
// system and its manager, with the account, the client (behind a trusted
// proxy, the forwarded one) and the outcome; reads are not; failed logins
// come in bursts.
func TestLogRecordsWhoDidWhat(t *testing.T) {
	f := newFixture(t, func(c *redfish.Config, _ *stubBackend) {
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}
	})
	viaIngress := asAdmin("POST", system0+"/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`)
	viaIngress.remote, viaIngress.headers = "10.0.0.3:5000", map[string]string{"X-Forwarded-For": "198.51.100.4"}
	f.do(viaIngress)
	f.do(asAdmin("PATCH", system0, `{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once"}}`))
	f.do(asAdmin("GET", system0, ""))
	f.backend.Get("vm-0").SetFault(machine.ErrUnavailable)
	f.do(asAdmin("POST", system0+"/Actions/ComputerSystem.Reset", `{"ResetType":"ForceOff"}`))
	f.backend.Get("vm-0").SetFault(nil)
	f.do(asAdmin("POST", system1+"/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`))
	for range 3 {
		f.do(request{method: "GET", path: system0, user: "root", pass: "guess", remote: "192.0.2.8:1"})
	}

	want := []string{
		"3 failed logins as root from 192.0.2.8 via Redfish",
		"Reset ForceOff by admin from 192.0.2.1 via Redfish: failed: backend unavailable",
		"SetBootOverride Pxe Once UEFI by admin from 192.0.2.1 via Redfish: done",
		"Reset On by admin from 198.51.100.4 via Redfish: done",
	}
	for _, logPath := range []string{systemLog0, managerLog0} {
		t.Run(logPath, func(t *testing.T) {
			got := messages(t, f, logPath)
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("entries\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
	// vm-1's entry is vm-1's: not readable through vm-0.
	if got := messages(t, f, system1+"/LogServices/Log"); len(got) != 2 || !strings.HasPrefix(got[1], "Reset On by admin") {
		t.Errorf("vm-1's log = %q", got)
	}
	if res := f.do(asAdmin("GET", systemLog0+"/Entries/4", "")); res.status != http.StatusNotFound {
		t.Errorf("vm-1's entry through vm-0: %d, want 404", res.status)
	}
}

// TestLogRefusals: reading needs a login, clearing the privilege of its
// owner, and bad input gets the Base registry's messages.
func TestLogRefusals(t *testing.T) {
	tests := []struct {
		name      string
		req       request
		status    int
		messageID string
	}{
		{"entries without a login", request{method: "GET", path: systemLog0 + "/Entries"}, http.StatusUnauthorized, "NoValidSession"},
		{"a reader reads", request{method: "GET", path: managerLog0, user: readerUser, pass: readerPass}, http.StatusOK, ""},
		{"a reader cannot clear", request{method: "POST", path: systemLog0 + "/Actions/LogService.ClearLog", body: `{}`, user: readerUser, pass: readerPass}, http.StatusForbidden, "InsufficientPrivilege"},
		{"an operator clears the system's", request{method: "POST", path: systemLog0 + "/Actions/LogService.ClearLog", body: `{}`, user: operatorUser, pass: operatorPass}, http.StatusNoContent, ""},
		{"an operator cannot clear the manager's", request{method: "POST", path: managerLog0 + "/Actions/LogService.ClearLog", body: `{}`, user: operatorUser, pass: operatorPass}, http.StatusForbidden, "InsufficientPrivilege"},
		{"unknown parameter", asAdmin("POST", managerLog0+"/Actions/LogService.ClearLog", `{"Everything":true}`), http.StatusBadRequest, "ActionParameterUnknown"},
		{"stale ETag", asAdmin("POST", managerLog0+"/Actions/LogService.ClearLog", `{"LogEntriesETag":"W/\"1-1-0\""}`), http.StatusPreconditionFailed, "PreconditionFailed"},
		{"ETag of the wrong type", asAdmin("POST", managerLog0+"/Actions/LogService.ClearLog", `{"LogEntriesETag":7}`), http.StatusBadRequest, "ActionParameterValueTypeError"},
		{"no such entry", asAdmin("GET", managerLog0+"/Entries/999", ""), http.StatusNotFound, "ResourceNotFound"},
		{"not an entry ID", asAdmin("GET", managerLog0+"/Entries/abc", ""), http.StatusNotFound, "ResourceNotFound"},
		{"no such system", asAdmin("GET", "/redfish/v1/Systems/nope/LogServices/Log/Entries", ""), http.StatusNotFound, "ResourceNotFound"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, nil)
			f.do(asAdmin("POST", system0+"/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`))
			res := f.do(tt.req)
			if res.status != tt.status {
				t.Fatalf("status %d, want %d: %s", res.status, tt.status, res.raw)
			}
			if tt.messageID != "" {
				if ids := messageIDs(t, res); len(ids) == 0 || !strings.HasSuffix(ids[0], "."+tt.messageID) {
					t.Errorf("messages %v, want %s", ids, tt.messageID)
				}
			}
			if tt.status >= 400 && len(messages(t, f, managerLog0)) != 1 {
				t.Error("a refused request changed the log")
			}
		})
	}
}

// TestClearLog: ClearLog with the collection's ETag, or none, empties the
// log; IDs go on from where they were.
func TestClearLog(t *testing.T) {
	f := newFixture(t, nil)
	f.do(asAdmin("POST", system0+"/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`))
	etag := f.do(asAdmin("GET", managerLog0+"/Entries", "")).header.Get("ETag")
	if res := f.do(asAdmin("POST", managerLog0+"/Actions/LogService.ClearLog", `{"LogEntriesETag":`+strconv.Quote(etag)+`}`)); res.status != http.StatusNoContent {
		t.Fatalf("ClearLog with the current ETag: %d %s", res.status, res.raw)
	}
	if got := messages(t, f, systemLog0); len(got) != 0 {
		t.Fatalf("after ClearLog: %q", got)
	}
	f.do(asAdmin("POST", system0+"/Actions/ComputerSystem.Reset", `{"ResetType":"ForceOff"}`))
	res := f.do(asAdmin("GET", managerLog0+"/Entries", ""))
	if members := res.json["Members"].([]any); len(members) != 1 || !strings.HasSuffix(members[0].(map[string]any)["@odata.id"].(string), "/Entries/2") {
		t.Errorf("after ClearLog, members %v, want entry 2", members)
	}
}
