package redfish_test

import (
	"net/http"
	"slices"
	"testing"
)

// TestHeadAnswersLikeGet: HEAD on every GET-able URI gives GET's status and
// headers (ETag, Link, Allow, Content-Length) without a body, and
// If-None-Match works as on GET.
func TestHeadAnswersLikeGet(t *testing.T) {
	f := newFixture(t, nil)
	for _, path := range []string{"/redfish", "/redfish/v1/", "/redfish/v1/odata", "/redfish/v1/$metadata", system0, sysCD0, manager0, "/redfish/v1/AccountService/Accounts/1", "/redfish/v1/Systems/vm-9"} {
		t.Run(path, func(t *testing.T) {
			get := f.do(asAdmin("GET", path, ""))
			head := f.do(asAdmin("HEAD", path, ""))
			if head.status != get.status {
				t.Fatalf("HEAD %d, GET %d", head.status, get.status)
			}
			if len(head.raw) != 0 {
				t.Errorf("HEAD sent a body: %q", head.raw)
			}
			for _, h := range []string{"Content-Type", "Content-Length", "ETag", "Link", "Allow", "OData-Version", "Cache-Control"} {
				if head.header.Get(h) != get.header.Get(h) {
					t.Errorf("%s: HEAD %q, GET %q", h, head.header.Get(h), get.header.Get(h))
				}
			}
			if etag := get.header.Get("ETag"); etag != "" {
				res := f.do(request{method: "HEAD", path: path, user: adminUser, pass: adminPass, headers: map[string]string{"If-None-Match": etag}})
				if res.status != http.StatusNotModified {
					t.Errorf("HEAD with If-None-Match of the current tag: %d, want 304", res.status)
				}
			}
		})
	}
}

// TestAllowHeader: GET, HEAD and OPTIONS name the URI's methods, straight
// from the route table; OPTIONS needs a login where every method does.
func TestAllowHeader(t *testing.T) {
	tests := []struct {
		path, want       string
		optionsAnonymous int // status of OPTIONS without credentials
	}{
		{"/redfish/v1/", "GET, HEAD, OPTIONS", http.StatusNoContent},
		{system0, "GET, HEAD, PATCH, OPTIONS", http.StatusUnauthorized},
		{reset0, "POST, OPTIONS", http.StatusUnauthorized},
		{"/redfish/v1/SessionService/Sessions", "GET, HEAD, POST, OPTIONS", http.StatusNoContent},
		{"/redfish/v1/AccountService/Accounts", "GET, HEAD, OPTIONS", http.StatusUnauthorized},
		{"/redfish/v1/AccountService/Accounts/1", "GET, HEAD, OPTIONS", http.StatusUnauthorized},
	}
	f := newFixture(t, nil)
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			for _, method := range []string{"GET", "HEAD", "OPTIONS"} {
				if method == "GET" && tt.path == reset0 {
					continue // an action answers GET with 405, whose Allow TestErrorResponses checks
				}
				res := f.do(asAdmin(method, tt.path, ""))
				if got := res.header.Get("Allow"); got != tt.want {
					t.Errorf("%s: status %d, Allow %q, want %q", method, res.status, got, tt.want)
				}
			}
			if res := f.do(asAdmin("OPTIONS", tt.path, "")); res.status != http.StatusNoContent || len(res.raw) != 0 {
				t.Errorf("OPTIONS: %d %q, want 204 without body", res.status, res.raw)
			}
			if res := f.do(request{method: "OPTIONS", path: tt.path}); res.status != tt.optionsAnonymous {
				t.Errorf("OPTIONS without credentials: %d, want %d", res.status, tt.optionsAnonymous)
			}
		})
	}
}

// TestProtocolRefusals: what the service cannot honour is refused with the
// status DSP0266 names and a Base message, and changes nothing.
func TestProtocolRefusals(t *testing.T) {
	tests := []struct {
		name       string
		req        request
		wantStatus int
		wantIDs    []string
	}{
		{"OData-Version 4.1", request{method: "GET", path: "/redfish/v1/", headers: map[string]string{"OData-Version": "4.1"}}, 412, []string{"Base.1.19.HeaderInvalid"}},
		{"OData-Version 4.1 on a PATCH", request{method: "PATCH", path: system0, user: adminUser, pass: adminPass, body: `{"Boot":{"BootSourceOverrideTarget":"Pxe"}}`, headers: map[string]string{"OData-Version": "4.1"}}, 412, []string{"Base.1.19.HeaderInvalid"}},
		{"unknown $ parameter", asAdmin("GET", "/redfish/v1/?$rpvunknown", ""), 501, []string{"Base.1.19.QueryParameterUnsupported"}},
		{"$expand and $select", asAdmin("GET", "/redfish/v1/Systems?$select=Name&$expand=.", ""), 501, []string{"Base.1.19.QueryParameterUnsupported", "Base.1.19.QueryParameterUnsupported"}},
		{"$ parameter on a PATCH", request{method: "PATCH", path: system0 + "?$select=Boot", user: adminUser, pass: adminPass, body: `{"Boot":{"BootSourceOverrideTarget":"Pxe"}}`}, 501, []string{"Base.1.19.QueryParameterUnsupported"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, nil)
			res := f.do(tt.req)
			if res.status != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", res.status, tt.wantStatus, res.raw)
			}
			if ids := messageIDs(t, res); !slices.Equal(ids, tt.wantIDs) {
				t.Errorf("MessageIds = %v, want %v", ids, tt.wantIDs)
			}
			if o, _ := f.backend.Get("vm-0").BootOverride(t.Context()); o.Target != "None" {
				t.Errorf("a refused request changed the boot override to %+v", o)
			}
		})
	}
	// Parameters without a $ are ignored, and OData-Version 4.0 is fine.
	f := newFixture(t, nil)
	if res := f.do(request{method: "GET", path: "/redfish/v1/?rpvunknown=1", headers: map[string]string{"OData-Version": "4.0"}}); res.status != http.StatusOK {
		t.Errorf("plain parameter and OData-Version 4.0: %d, want 200", res.status)
	}
}

// TestLoginThroughMembers: a POST to the Sessions collection's Members is a
// login too (DSP0266 "POST (create)").
func TestLoginThroughMembers(t *testing.T) {
	f := newFixture(t, nil)
	res := f.do(request{method: "POST", path: "/redfish/v1/SessionService/Sessions/Members", body: `{"UserName":"` + adminUser + `","Password":"` + adminPass + `"}`})
	if res.status != http.StatusCreated || res.header.Get("X-Auth-Token") == "" {
		t.Fatalf("%d, token %q: %s", res.status, res.header.Get("X-Auth-Token"), res.raw)
	}
	location := res.header.Get("Location")
	if got := f.do(request{method: "GET", path: location, headers: map[string]string{"X-Auth-Token": res.header.Get("X-Auth-Token")}}); got.status != http.StatusOK {
		t.Errorf("GET %s with the new token: %d", location, got.status)
	}
}
