package schemacheck_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/virtmetal/virtmetal/conformance/schemacheck"
)

// fixtureBodies is a tiny valid Redfish service: root, one system with a
// reset action (whose target must not be fetched) and its ActionInfo, and an
// empty session collection.
func fixtureBodies() map[string]string {
	return map[string]string{
		"/redfish": `{"v1": "/redfish/v1/"}`,
		"/redfish/v1/": `{"@odata.id": "/redfish/v1/", "@odata.type": "#ServiceRoot.v1_20_0.ServiceRoot",
			"Id": "RootService", "Name": "Root Service",
			"Systems": {"@odata.id": "/redfish/v1/Systems"},
			"Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}}}`,
		"/redfish/v1/Systems": `{"@odata.id": "/redfish/v1/Systems", "@odata.type": "#ComputerSystemCollection.ComputerSystemCollection",
			"Name": "Systems", "Members": [{"@odata.id": "/redfish/v1/Systems/vm-0"}], "Members@odata.count": 1}`,
		"/redfish/v1/Systems/vm-0": `{"@odata.id": "/redfish/v1/Systems/vm-0", "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem",
			"Id": "vm-0", "Name": "vm-0", "PowerState": "On",
			"Actions": {"#ComputerSystem.Reset": {"target": "/redfish/v1/Systems/vm-0/Actions/ComputerSystem.Reset",
				"@Redfish.ActionInfo": "/redfish/v1/Systems/vm-0/ResetActionInfo"}}}`,
		"/redfish/v1/Systems/vm-0/ResetActionInfo": `{"@odata.id": "/redfish/v1/Systems/vm-0/ResetActionInfo", "@odata.type": "#ActionInfo.v1_4_0.ActionInfo",
			"Id": "ResetActionInfo", "Name": "Reset Action Info",
			"Parameters": [{"Name": "ResetType", "Required": true, "DataType": "String", "AllowableValues": ["On", "ForceOff"]}]}`,
		"/redfish/v1/SessionService/Sessions": `{"@odata.id": "/redfish/v1/SessionService/Sessions", "@odata.type": "#SessionCollection.SessionCollection",
			"Name": "Sessions", "Members": [], "Members@odata.count": 0}`,
	}
}

var fixtureCrawlOrder = []string{
	"/redfish", "/redfish/v1/", "/redfish/v1/SessionService/Sessions", "/redfish/v1/Systems",
	"/redfish/v1/Systems/vm-0", "/redfish/v1/Systems/vm-0/ResetActionInfo",
}

// fixtureService serves bodies with correct headers, except that headers
// lists per path the headers to set instead ("" deletes one). It requires
// Basic auth admin/password.
func fixtureService(t *testing.T, bodies map[string]string, headers map[string]map[string]string) *httptest.Server {
	t.Helper()
	service := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if user, pass, ok := r.BasicAuth(); !ok || user != "admin" || pass != "password" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		body, ok := bodies[r.URL.Path]
		if !ok || r.Method != http.MethodGet {
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "application/json; charset=utf-8")
		h.Set("OData-Version", "4.0")
		h.Set("ETag", `W/"1"`)
		for key, value := range headers[r.URL.Path] {
			if value == "" {
				h.Del(key)
			} else {
				h.Set(key, value)
			}
		}
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(service.Close)
	return service
}

func TestCrawlerReportsViolations(t *testing.T) {
	tests := []struct {
		name     string
		bodies   func(map[string]string) // edits the fixture
		headers  map[string]map[string]string
		password string
		// want holds one substring per expected violation, in crawl order.
		want []string
	}{
		{name: "valid service"},
		{
			name:    "missing ETag",
			headers: map[string]map[string]string{"/redfish/v1/Systems": {"ETag": ""}},
			want:    []string{"/redfish/v1/Systems (body): no ETag header [header ETag]"},
		},
		{
			name:    "wrong OData-Version",
			headers: map[string]map[string]string{"/redfish/v1/": {"OData-Version": "4.01"}},
			want:    []string{`/redfish/v1/ (body): OData-Version is "4.01", want "4.0" [header OData-Version]`},
		},
		{
			name:    "not JSON content type",
			headers: map[string]map[string]string{"/redfish/v1/Systems/vm-0": {"Content-Type": "text/html"}},
			want:    []string{`/redfish/v1/Systems/vm-0 (body): Content-Type is "text/html", want application/json`},
		},
		{
			name:    "version object without ETag is fine, but it must point at v1",
			headers: map[string]map[string]string{"/redfish": {"ETag": ""}},
			bodies:  func(b map[string]string) { b["/redfish"] = `{"v1": "/redfish/v2/"}` },
			want:    []string{`/redfish /v1: body must be a JSON object with "v1": "/redfish/v1/"`},
		},
		{
			name: "@odata.id is not the URI fetched",
			bodies: func(b map[string]string) {
				b["/redfish/v1/Systems/vm-0"] = strings.Replace(b["/redfish/v1/Systems/vm-0"], `"@odata.id": "/redfish/v1/Systems/vm-0"`, `"@odata.id": "/redfish/v1/Systems/vm-1"`, 1)
			},
			want: []string{
				`/redfish/v1/Systems/vm-0 /@odata.id: is "/redfish/v1/Systems/vm-1", want the URI fetched`,
				"/redfish/v1/Systems/vm-1 (body): GET answered 404 Not Found, want 200 OK (linked from /redfish/v1/Systems/vm-0 at /@odata.id)",
			},
		},
		{
			name: "broken link",
			bodies: func(b map[string]string) {
				b["/redfish/v1/Systems"] = strings.Replace(b["/redfish/v1/Systems"], `/redfish/v1/Systems/vm-0"}]`, `/redfish/v1/Systems/vm-9"}]`, 1)
			},
			want: []string{"/redfish/v1/Systems/vm-9 (body): GET answered 404 Not Found, want 200 OK (linked from /redfish/v1/Systems at /Members/0/@odata.id)"},
		},
		{
			name: "link outside the service",
			bodies: func(b map[string]string) {
				b["/redfish/v1/Systems"] = strings.Replace(b["/redfish/v1/Systems"], `"/redfish/v1/Systems/vm-0"`, `"https://127.0.0.1:1/redfish/v1/Systems/vm-0"`, 1)
			},
			want: []string{`/redfish/v1/Systems /Members/0/@odata.id: "https://127.0.0.1:1/redfish/v1/Systems/vm-0" is not a path under /redfish/v1/ [link]`},
		},
		{
			name: "schema violation",
			bodies: func(b map[string]string) {
				b["/redfish/v1/Systems/vm-0"] = strings.Replace(b["/redfish/v1/Systems/vm-0"], `"PowerState": "On"`, `"PowerState": "Of"`, 1)
			},
			want: []string{"/redfish/v1/Systems/vm-0 /PowerState: value must be one of 'On'"},
		},
		{
			name: "missing @odata.id",
			bodies: func(b map[string]string) {
				b["/redfish/v1/Systems/vm-0"] = strings.Replace(b["/redfish/v1/Systems/vm-0"], `"@odata.id": "/redfish/v1/Systems/vm-0",`, ``, 1)
			},
			want: []string{
				"/redfish/v1/Systems/vm-0 (body): missing property '@odata.id'",
				"/redfish/v1/Systems/vm-0 /@odata.id: missing or not a string",
			},
		},
		{
			name:     "wrong credentials",
			password: "wrong",
			want: []string{
				"/redfish (body): GET answered 401 Unauthorized",
				"/redfish/v1/ (body): GET answered 401 Unauthorized",
			},
		},
	}
	validator := bundleValidator(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bodies := fixtureBodies()
			if tt.bodies != nil {
				tt.bodies(bodies)
			}
			service := fixtureService(t, bodies, tt.headers)
			password := "password"
			if tt.password != "" {
				password = tt.password
			}
			crawler := &schemacheck.Crawler{Client: service.Client(), BaseURL: service.URL, Username: "admin", Password: password, Validator: validator}
			report, err := crawler.Crawl(t.Context())
			if err != nil {
				t.Fatalf("Crawl: %v", err)
			}
			if len(report.Violations) != len(tt.want) {
				t.Fatalf("got %d violations, want %d:\n%s", len(report.Violations), len(tt.want), joinViolations(report.Violations))
			}
			for i, want := range tt.want {
				if s := report.Violations[i].String(); !strings.Contains(s, want) {
					t.Errorf("violation %d = %s\nwant it to contain %s", i, s, want)
				}
			}
		})
	}
}

func TestCrawlerVisitsEveryLinkOnceAndNoActionTarget(t *testing.T) {
	bodies := fixtureBodies()
	// A second, trailing-slash spelling of a known link must not be fetched twice.
	bodies["/redfish/v1/Systems/vm-0"] = strings.Replace(bodies["/redfish/v1/Systems/vm-0"], `"PowerState": "On",`,
		`"PowerState": "On", "Links": {"Chassis": [{"@odata.id": "/redfish/v1/Systems/"}]},`, 1)
	service := fixtureService(t, bodies, nil)
	crawler := &schemacheck.Crawler{Client: service.Client(), BaseURL: service.URL, Username: "admin", Password: "password", Validator: bundleValidator(t)}
	report, err := crawler.Crawl(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(report.Visited, fixtureCrawlOrder) {
		t.Errorf("visited %v\nwant %v", report.Visited, fixtureCrawlOrder)
	}
	wantTypes := []string{
		"#ActionInfo.v1_4_0.ActionInfo", "#ComputerSystem.v1_20_0.ComputerSystem",
		"#ComputerSystemCollection.ComputerSystemCollection", "#ServiceRoot.v1_20_0.ServiceRoot", "#SessionCollection.SessionCollection",
	}
	if !slices.Equal(report.ODataTypes, wantTypes) {
		t.Errorf("ODataTypes = %v\nwant %v", report.ODataTypes, wantTypes)
	}
}

func TestCrawlerErrors(t *testing.T) {
	tests := []struct {
		name         string
		bodies       func(map[string]string)
		maxResources int
		wantErr      error
		wantMsg      string
	}{
		{
			name: "schema missing from the bundle",
			bodies: func(b map[string]string) {
				b["/redfish/v1/Systems/vm-0"] = strings.Replace(b["/redfish/v1/Systems/vm-0"], "#ComputerSystem.v1_20_0.ComputerSystem", "#Bogus.v1_0_0.Bogus", 1)
			},
			wantErr: schemacheck.ErrSchemaNotFound,
			wantMsg: "/redfish/v1/Systems/vm-0",
		},
		{name: "too many resources", maxResources: 3, wantMsg: "crawl stopped after 3 resources"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bodies := fixtureBodies()
			if tt.bodies != nil {
				tt.bodies(bodies)
			}
			service := fixtureService(t, bodies, nil)
			crawler := &schemacheck.Crawler{Client: service.Client(), BaseURL: service.URL, Username: "admin", Password: "password",
				Validator: bundleValidator(t), MaxResources: tt.maxResources}
			report, err := crawler.Crawl(t.Context())
			if err == nil {
				t.Fatalf("Crawl succeeded with %d violations; want an error", len(report.Violations))
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("error = %v; want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error = %v; want it to mention %q", err, tt.wantMsg)
			}
		})
	}
}

func TestCrawlerFailsWhenServiceIsDown(t *testing.T) {
	service := fixtureService(t, fixtureBodies(), nil)
	service.Close()
	crawler := &schemacheck.Crawler{Client: service.Client(), BaseURL: service.URL, Username: "admin", Password: "password", Validator: bundleValidator(t)}
	if _, err := crawler.Crawl(t.Context()); err == nil || !strings.Contains(err.Error(), "GET /redfish") {
		t.Fatalf("Crawl of a closed service: error = %v; want a GET /redfish error", err)
	}
}
