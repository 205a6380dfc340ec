package conformance_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/virtmetal/virtmetal/conformance"
	"github.com/virtmetal/virtmetal/conformance/schemacheck"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

const suiteUser, suitePass = "admin", "suite-secret"

// startSuiteBMC serves a two-machine memory backend over TLS, vm-0 running
// with a one-time PXE override and media inserted, behind wrap.
func startSuiteBMC(t *testing.T, wrap func(http.Handler) http.Handler) *httptest.Server {
	t.Helper()
	return startSuiteBMCWith(t, wrap, nil)
}

// startSuiteBMCWith is startSuiteBMC with edit applied to the
// configuration.
func startSuiteBMCWith(t *testing.T, wrap func(http.Handler) http.Handler, edit func(*redfish.Config)) *httptest.Server {
	t.Helper()
	backend := memory.New(memory.Options{Machines: 2})
	vm0 := backend.Get("vm-0")
	if err := vm0.Reset(t.Context(), machine.ResetOn); err != nil {
		t.Fatal(err)
	}
	if err := vm0.SetBootOverride(t.Context(), machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce, Mode: machine.BootModeUEFI}); err != nil {
		t.Fatal(err)
	}
	if err := vm0.InsertMedia(t.Context(), "http://127.0.0.1:8080/boot.iso"); err != nil {
		t.Fatal(err)
	}
	cfg := redfish.Config{
		Backend:  backend,
		Accounts: []redfish.Account{{Username: suiteUser, Password: suitePass, Role: redfish.RoleAdministrator}},
		Logger:   logr.Discard(),
		// The suite's push subscription POSTs to its receiver on 127.0.0.1.
		EventDestinationsAllowLoopback: true,
	}
	if edit != nil {
		edit(&cfg)
	}
	server, err := redfish.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var handler http.Handler = server
	if wrap != nil {
		handler = wrap(server)
	}
	ts := httptest.NewTLSServer(handler)
	t.Cleanup(ts.Close)
	return ts
}

// suiteValidator is shared by every run of the package, so that the
// schemas are compiled once.
var suiteValidator struct {
	once      sync.Once
	validator *schemacheck.Validator
	err       error
}

// sharedValidator is the package's validator of the bundle's JSON schemas.
func sharedValidator(t *testing.T) *schemacheck.Validator {
	t.Helper()
	dir := schemacheck.RequireBundle(t)
	suiteValidator.once.Do(func() {
		suiteValidator.validator, suiteValidator.err = schemacheck.NewValidator(filepath.Join(dir, "json-schema"))
	})
	if suiteValidator.err != nil {
		t.Fatal(suiteValidator.err)
	}
	return suiteValidator.validator
}

func runSuite(t *testing.T, ts *httptest.Server, username, password string) *conformance.Report {
	t.Helper()
	dir := schemacheck.RequireBundle(t)
	sharedValidator(t)
	report, err := conformance.Run(t.Context(), conformance.Target{
		BaseURL:   ts.URL,
		Client:    ts.Client(),
		Username:  username,
		Password:  password,
		SchemaDir: dir,
		Writes:    true,
		Validator: suiteValidator.validator,
		// A delivery takes milliseconds here; the broken services that
		// drop test events should not hold each run for long.
		EventTimeout: 3 * time.Second,
	})
	if err != nil {
		t.Fatalf("conformance run: %v", err)
	}
	return report
}

// requireClean fails the test on any warning or failure, and guards
// against a run that passes because it checked nothing: every rule ran,
// and the crawl reached at least minResources resources.
func requireClean(t *testing.T, report *conformance.Report, minResources int) {
	t.Helper()
	pass, warn, fail := report.Counts()
	t.Logf("%d passed, %d warnings, %d failed", pass, warn, fail)
	for _, res := range report.Results {
		if res.Outcome != conformance.Pass {
			t.Errorf("%s %s %s: %s", res.Outcome, res.Rule, res.URI, res.Reason)
		}
	}
	rules := map[string]int{}
	for _, res := range report.Results {
		rules[res.Rule]++
	}
	for _, rule := range []string{"schema", "$metadata", "service document", "HEAD", "OPTIONS", "annotations", "Members@odata.count",
		"allowable values", "required properties", "error body", "authentication", "OData-Version", "query parameters",
		"405 and Allow", "roles", "account ETag", "account management", "session life cycle", "patch", "subscriptions", "event delivery"} {
		if rules[rule] == 0 {
			t.Errorf("rule %q never ran", rule)
		}
	}
	if rules["schema"] < minResources {
		t.Errorf("the crawl checked %d resources, want at least %d", rules["schema"], minResources)
	}
	if len(report.NotRun) != 0 {
		t.Errorf("rules not run: %v", report.NotRun)
	}
	// The crawl walked both kinds of subscription the suite held open:
	// the collection, the push member and the SSE stream's member.
	walked := map[string]bool{}
	for _, res := range report.Results {
		if res.Rule == "schema" && strings.HasPrefix(res.URI, "/redfish/v1/EventService/Subscriptions") {
			walked[res.URI] = true
		}
	}
	if len(walked) < 3 {
		t.Errorf("the crawl checked the schema of %v under Subscriptions, want the collection and two members", walked)
	}
}

// TestSuiteOnMemoryBackend runs the whole suite, writes included, against
// the memory backend: no warning, no failure.
func TestSuiteOnMemoryBackend(t *testing.T) {
	ts := startSuiteBMC(t, nil)
	requireClean(t, runSuite(t, ts, suiteUser, suitePass), 32)
}

// TestSuiteWithLoopbackRefused: a service that refuses loopback
// destinations, as virtmetal does by default, refuses the suite's push
// subscription with a 400 naming Destination; that is a warning (the
// deliveries could not be checked), and the SSE stream is still checked.
func TestSuiteWithLoopbackRefused(t *testing.T) {
	ts := startSuiteBMCWith(t, nil, func(cfg *redfish.Config) { cfg.EventDestinationsAllowLoopback = false })
	report := runSuite(t, ts, suiteUser, suitePass)
	var warned, streamChecked bool
	for _, res := range report.Results {
		switch {
		case res.Outcome == conformance.Warn && res.Rule == "subscriptions" && strings.Contains(res.Reason, "refused the destination"):
			warned = true
		case res.Outcome == conformance.Pass && res.Rule == "event delivery" && strings.HasPrefix(res.URI, "SSE "):
			streamChecked = true
		case res.Outcome != conformance.Pass:
			t.Errorf("%s %s %s: %s", res.Outcome, res.Rule, res.URI, res.Reason)
		}
	}
	if !warned || !streamChecked {
		t.Errorf("warned of the refused destination: %t; checked the test event on the SSE stream: %t", warned, streamChecked)
	}
}

// TestSuiteCatchesBrokenServices: each rule fails when the service breaks
// what it checks, so a clean run means something.
func TestSuiteCatchesBrokenServices(t *testing.T) {
	tests := []struct {
		name     string
		wrap     func(http.Handler) http.Handler
		wantRule string
	}{
		{"no Allow on GET", dropHeader("Allow", http.MethodGet), "response headers"},
		{"no Cache-Control", dropHeader("Cache-Control", ""), "response headers"},
		{"no HEAD", refuseMethod(http.MethodHead), "HEAD"},
		{"OPTIONS without Allow", dropHeader("Allow", http.MethodOptions), "OPTIONS"},
		{"OData-Version ignored", stripRequestHeader("OData-Version"), "OData-Version"},
		{"$ parameters ignored", stripQuery, "query parameters"},
		{"wrong Members@odata.count", rewriteJSON(func(body map[string]any) {
			if _, ok := body["Members@odata.count"]; ok {
				body["Members@odata.count"] = 99
			}
		}), "Members@odata.count"},
		{"an allowable value the schema refuses", rewriteJSON(func(body map[string]any) {
			if boot, ok := body["Boot"].(map[string]any); ok {
				boot["BootSourceOverrideTarget@Redfish.AllowableValues"] = []any{"None", "Pxe", "Hdd", "Cd", "Teleport"}
			}
		}), "allowable values"},
		{"a reset type the schema refuses", rewriteJSON(func(body map[string]any) {
			actions, _ := body["Actions"].(map[string]any)
			if reset, ok := actions["#ComputerSystem.Reset"].(map[string]any); ok {
				reset["ResetType@Redfish.AllowableValues"] = []any{"On", "Explode"}
			}
		}), "allowable values"},
		{"an annotation about nothing", rewriteJSON(func(body map[string]any) {
			if _, ok := body["PowerState"]; ok {
				body["Colour@Redfish.AllowableValues"] = []any{"Red"}
			}
		}), "annotations"},
		{"a resource without Id", rewriteJSON(func(body map[string]any) {
			if _, ok := body["PowerState"]; ok {
				delete(body, "Id")
			}
		}), "required properties"},
		{"an error body without ExtendedInfo", rewriteJSON(func(body map[string]any) {
			if e, ok := body["error"].(map[string]any); ok {
				delete(e, "@Message.ExtendedInfo")
			}
		}), "error body"},
		{"ReadOnly with ConfigureUsers", rewriteJSON(func(body map[string]any) {
			if body["RoleId"] == "ReadOnly" {
				body["AssignedPrivileges"] = []any{"Login", "ConfigureSelf", "ConfigureUsers"}
			}
		}), "roles"},
		{"no ETag on accounts", dropHeaderOn("ETag", "/AccountService/Accounts/"), "account ETag"},
		{"logout that keeps the token", ignoreMethodOn(http.MethodDelete, "/SessionService/Sessions/"), "session life cycle"},
		{"stale If-Match accepted", stripRequestHeader("If-Match"), "patch"},
		{"protected URI open to all", openSystems, "authentication"},
		{"wrong method answered before authentication", wrongMethodBeforeAuth, "authentication"},
		{"form bodies taken as JSON", setRequestHeader("Content-Type", "application/json"), "415 for non-JSON bodies"},
		{"a subscription DELETE that keeps it", ignoreMethodOn(http.MethodDelete, "/EventService/Subscriptions/"), "subscriptions"},
		{"a subscription that forgets its Context", rewriteJSON(func(body map[string]any) {
			if body["SubscriptionType"] == "RedfishEvent" {
				delete(body, "Context")
			}
		}), "subscriptions"},
		{"a bad subscription POST taken", ignoreBadSubscriptionPosts, "subscriptions"},
		{"test events dropped", ignoreMethodOn(http.MethodPost, "/EventService.SubmitTestEvent"), "event delivery"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			report := runSuite(t, startSuiteBMC(t, tt.wrap), suiteUser, suitePass)
			var failedRules []string
			for _, res := range report.Failures() {
				failedRules = append(failedRules, res.Rule)
				if res.Rule == tt.wantRule {
					return
				}
			}
			t.Errorf("rule %q did not fail; failures: %v", tt.wantRule, failedRules)
		})
	}
}

// recorder buffers an answer so that a wrapper can change it.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) WriteHeader(status int)      { r.status = status }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }

// rewrite serves the request into a buffer, lets change edit it, and sends
// the result.
func rewrite(next http.Handler, change func(r *http.Request, rec *recorder)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &recorder{header: http.Header{}, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		change(r, rec)
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		if r.Method != http.MethodHead {
			w.Header().Set("Content-Length", strconv.Itoa(rec.body.Len()))
		}
		w.WriteHeader(rec.status)
		_, _ = w.Write(rec.body.Bytes())
	})
}

func dropHeader(name, method string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return rewrite(next, func(r *http.Request, rec *recorder) {
			if method == "" || r.Method == method {
				rec.header.Del(name)
			}
		})
	}
}

func dropHeaderOn(name, pathPart string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return rewrite(next, func(r *http.Request, rec *recorder) {
			if strings.Contains(r.URL.Path, pathPart) {
				rec.header.Del(name)
			}
		})
	}
}

// refuseMethod answers method with 405 everywhere, as services without
// HEAD do.
func refuseMethod(method string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == method {
				w.WriteHeader(http.StatusMethodNotAllowed)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

func stripRequestHeader(name string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Header.Del(name)
			next.ServeHTTP(w, r)
		})
	}
}

func setRequestHeader(name, value string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Body != http.NoBody && r.ContentLength != 0 {
				r.Header.Set(name, value)
			}
			next.ServeHTTP(w, r)
		})
	}
}

// wrongMethodBeforeAuth answers a PUT with 405 whatever its credentials, as
// a router that matches methods before it authenticates does.
func wrongMethodBeforeAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, `{"error":{"code":"Base.1.19.OperationNotAllowed","message":"no"}}`, http.StatusMethodNotAllowed)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func stripQuery(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.URL.RawQuery = ""
		next.ServeHTTP(w, r)
	})
}

func rewriteJSON(edit func(map[string]any)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return rewrite(next, func(r *http.Request, rec *recorder) {
			var body map[string]any
			if json.Unmarshal(rec.body.Bytes(), &body) != nil {
				return
			}
			edit(body)
			data, _ := json.Marshal(body)
			rec.body.Reset()
			rec.body.Write(data)
		})
	}
}

func ignoreMethodOn(method, pathPart string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == method && strings.Contains(r.URL.Path, pathPart) {
				w.WriteHeader(http.StatusNoContent)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// ignoreBadSubscriptionPosts answers 201 to a subscription POST without a
// Destination, as a service that checks nothing would.
func ignoreBadSubscriptionPosts(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/EventService/Subscriptions") {
			body, _ := io.ReadAll(r.Body)
			if !bytes.Contains(body, []byte(`"Destination"`)) {
				w.WriteHeader(http.StatusCreated)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		next.ServeHTTP(w, r)
	})
}

// openSystems answers an unauthenticated GET of the Systems collection as
// if the admin had sent it.
func openSystems(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, ok := r.BasicAuth(); !ok && r.Header.Get("X-Auth-Token") == "" && r.URL.Path == "/redfish/v1/Systems" {
			r.SetBasicAuth(suiteUser, suitePass)
		}
		next.ServeHTTP(w, r)
	})
}
