package conformance_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/conformance/maasdriver"
	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
)

// maasExchange is one request the driver sent and the answer it got.
type maasExchange struct {
	method, path string
	header       http.Header // as the server received it
	body         string
	status       int
	answerHeader http.Header
	answer       []byte
}

func (e maasExchange) String() string { return e.method + " " + e.path }

// newMaaSDriver is MaaS's Redfish power driver aimed at ts, without the
// waits between its retries.
func newMaaSDriver(t *testing.T, ts *httptest.Server, contentType string) *maasdriver.RedfishDriver {
	u, err := url.Parse(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	return &maasdriver.RedfishDriver{
		Address: u.Host, Username: maasUser, Password: maasPass, ContentType: contentType,
		RetryDelay:   func(int) time.Duration { return 0 },
		PollInterval: 20 * time.Millisecond, PowerTimeout: maasPollTimeout, RequestTimeout: maasPollTimeout,
	}
}

// maasWireLog records every request as the server received it, with the
// answer's status; before passes each request to a hook first.
type maasWireLog struct {
	next   http.Handler
	before func(r *http.Request)
	mu     sync.Mutex
	seen   []maasExchange
}

func (l *maasWireLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	if l.before != nil {
		l.before(r)
	}
	rec := httptest.NewRecorder()
	l.next.ServeHTTP(rec, r)
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
	l.mu.Lock()
	l.seen = append(l.seen, maasExchange{method: r.Method, path: r.URL.Path, header: r.Header.Clone(), body: string(body), status: rec.Code, answerHeader: rec.Header().Clone(), answer: rec.Body.Bytes()})
	l.mu.Unlock()
}

func (l *maasWireLog) exchanges() []maasExchange {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.seen)
}

// collapsed lists the requests, runs of the same one (status polls) once.
func collapsed(exchanges []maasExchange) []string {
	var out []string
	for _, e := range exchanges {
		s := fmt.Sprintf("%s %s %d", e.method, e.path, e.status)
		if len(out) == 0 || out[len(out)-1] != s {
			out = append(out, s)
		}
	}
	return out
}

// startMaaSDriverBMC serves the memory backend, vm-0 on, behind a wire log.
func startMaaSDriverBMC(t *testing.T) (*httptest.Server, *memory.Backend, *maasWireLog) {
	t.Helper()
	server, backend := newMaaSServer(t)
	log := &maasWireLog{next: server}
	ts := httptest.NewUnstartedServer(log)
	ts.StartTLS()
	t.Cleanup(ts.Close)
	return ts, backend, log
}

// TestMaaSDriverRequestsByteForByte replays MaaS's redfish power driver's
// own requests (power_on, power_off, power_reset, with and without a
// configured node ID, under both Content-Type spellings) and checks each
// answer the driver relies on: the sequence of requests and statuses, the
// headers and bodies as they arrived, If-Match only on the PATCH and equal
// to the ETag just read, JSON wherever there is a body, and the machine
// booting from the network afterwards.
func TestMaaSDriverRequestsByteForByte(t *testing.T) {
	const sys = "/redfish/v1/Systems/vm-0"
	const reset = sys + "/Actions/ComputerSystem.Reset"
	tests := []struct {
		name        string
		contentType string
		nodeID      string
		run         func(*maasdriver.RedfishDriver, context.Context) error
		want        []string // collapsed: "METHOD path status"
		wantPower   machine.PowerState
		wantLastPxe bool // the last boot was from the network
	}{
		{
			name: "power_on, current headers, node from Systems", contentType: "application/json",
			run: (*maasdriver.RedfishDriver).PowerOn,
			want: []string{
				"GET /redfish/v1/Systems 200", "GET " + sys + " 200", "POST " + reset + " 204", "GET " + sys + " 200",
				"PATCH " + sys + " 200", "POST " + reset + " 204", "GET " + sys + " 200",
			},
			wantPower: machine.PowerOn, wantLastPxe: true,
		},
		{
			name: "power_on, older Content-Type, node configured", contentType: "application/json; charset=utf-8", nodeID: "vm-0",
			run: (*maasdriver.RedfishDriver).PowerOn,
			want: []string{
				"GET " + sys + " 200", "POST " + reset + " 204", "GET " + sys + " 200",
				"PATCH " + sys + " 200", "POST " + reset + " 204", "GET " + sys + " 200",
			},
			wantPower: machine.PowerOn, wantLastPxe: true,
		},
		{
			name: "power_off", contentType: "application/json", nodeID: "vm-0",
			run:       (*maasdriver.RedfishDriver).PowerOff,
			want:      []string{"GET " + sys + " 200", "POST " + reset + " 204", "GET " + sys + " 200", "PATCH " + sys + " 200"},
			wantPower: machine.PowerOff,
		},
		{
			name: "power_reset", contentType: "application/json", nodeID: "vm-0",
			run:       (*maasdriver.RedfishDriver).PowerReset,
			want:      []string{"GET " + sys + " 200", "PATCH " + sys + " 200", "POST " + reset + " 204"},
			wantPower: machine.PowerOn, wantLastPxe: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts, backend, log := startMaaSDriverBMC(t)
			driver := newMaaSDriver(t, ts, tt.contentType)
			driver.NodeID = tt.nodeID
			if err := tt.run(driver, t.Context()); err != nil {
				t.Fatalf("driver: %v", err)
			}
			exchanges := log.exchanges()
			if got := collapsed(exchanges); !slices.Equal(got, tt.want) {
				t.Fatalf("requests:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
			for i, e := range exchanges {
				for name, want := range map[string]string{"User-Agent": "MAAS", "Accept": "application/json", "Authorization": driver.Authorization(), "Content-Type": tt.contentType, "Connection": "close"} {
					if got := e.header.Get(name); got != want {
						t.Errorf("%s arrived with %s %q, want %q", e, name, got, want)
					}
				}
				if got := e.header.Get("OData-Version"); got != "" {
					t.Errorf("%s carries OData-Version %q; the driver sends none", e, got)
				}
				if len(e.answer) > 0 && !json.Valid(e.answer) {
					t.Errorf("%s answered %d with a body that is not JSON; the driver fails on it: %q", e, e.status, e.answer)
				}
				switch e.method {
				case "GET":
					if e.body != "" || e.header.Get("If-Match") != "" {
						t.Errorf("%s carries a body %q or If-Match %q", e, e.body, e.header.Get("If-Match"))
					}
				case "PATCH":
					if e.body != maasdriver.RedfishBootBody {
						t.Errorf("PATCH body %q, want %q", e.body, maasdriver.RedfishBootBody)
					}
					// get_etag's GET of the same URI comes just before: its
					// @odata.etag, else its ETag header.
					read := exchanges[i-1]
					var body map[string]any
					_ = json.Unmarshal(read.answer, &body)
					want, inBody := body["@odata.etag"].(string)
					if !inBody {
						want = read.answerHeader.Get("ETag")
					}
					if got := e.header.Get("If-Match"); read.method != "GET" || read.path != e.path || want == "" || got != want {
						t.Errorf("PATCH If-Match %q after %s; want the entity tag it answered (%q)", got, read, want)
					}
				case "POST":
					if e.header.Get("If-Match") != "" {
						t.Errorf("%s carries If-Match; the driver clears it", e)
					}
					if !strings.HasPrefix(e.body, `{"ResetType": "`) {
						t.Errorf("%s body %q", e, e.body)
					}
					if e.status == http.StatusNoContent && len(e.answer) != 0 {
						t.Errorf("%s: 204 with a body", e)
					}
				}
			}
			// power_reset does not wait; the transition settles on its own.
			vm := backend.Get("vm-0")
			poll.Until(t, "the power state", func() error {
				if p, _ := vm.PowerState(t.Context()); p != tt.wantPower {
					return fmt.Errorf("power %s, want %s", p, tt.wantPower)
				}
				return nil
			})
			boots := vm.Boots()
			if tt.wantLastPxe && (len(boots) == 0 || boots[len(boots)-1] != machine.BootPxe) {
				t.Errorf("boots %v, want the last from Pxe", boots)
			}
			if !tt.wantLastPxe {
				if o, _ := vm.BootOverride(t.Context()); o.Target != machine.BootPxe || o.Enabled != machine.BootOnce {
					t.Errorf("override %+v, want Pxe/Once waiting for the next power on", o)
				}
			}
		})
	}
}

// TestMaaSDriverStaleETagIsRetried: when the system changes between the
// driver's GET and its PATCH, the PATCH answers 412, a failure the driver
// retries with an ETag read afresh, and the retry succeeds.
func TestMaaSDriverStaleETagIsRetried(t *testing.T) {
	ts, backend, log := startMaaSDriverBMC(t)
	var once sync.Once
	log.before = func(r *http.Request) {
		if r.Method == http.MethodPatch {
			once.Do(func() {
				_ = backend.Get("vm-0").SetBootOverride(r.Context(), machine.BootOverride{Target: machine.BootHdd, Enabled: machine.BootContinuous, Mode: machine.BootModeUEFI})
			})
		}
	}
	driver := newMaaSDriver(t, ts, "application/json")
	driver.NodeID = "vm-0"
	if err := driver.SetPXEBoot(t.Context(), "vm-0"); err != nil {
		t.Fatalf("set_pxe_boot: %v", err)
	}
	var patches []maasExchange
	for _, e := range log.exchanges() {
		if e.method == "PATCH" {
			patches = append(patches, e)
		}
	}
	if len(patches) != 2 || patches[0].status != http.StatusPreconditionFailed || patches[1].status != http.StatusOK {
		t.Fatalf("PATCHes %v, want 412 then 200", collapsed(patches))
	}
	if patches[0].header.Get("If-Match") == patches[1].header.Get("If-Match") {
		t.Errorf("the retry sent the stale ETag %q again", patches[1].header.Get("If-Match"))
	}
	if !json.Valid(patches[0].answer) {
		t.Errorf("412 body is not JSON: %q", patches[0].answer)
	}
	if o, _ := backend.Get("vm-0").BootOverride(t.Context()); o.Target != machine.BootPxe || o.Enabled != machine.BootOnce {
		t.Errorf("override %+v, want Pxe/Once", o)
	}
}

// TestMaaSDriverTrailingSlashRetry: a 404 on a URI without a trailing
// slash is sent again with one; the server answers the retry the same way,
// with a JSON error body the driver can decode (and finds no PowerState
// in), and it answers 401, which the driver treats as fatal, to wrong
// credentials on either spelling.
func TestMaaSDriverTrailingSlashRetry(t *testing.T) {
	ts, _, log := startMaaSDriverBMC(t)
	driver := newMaaSDriver(t, ts, "application/json")
	if _, _, err := driver.Request(t.Context(), "GET", "/redfish/v1/Systems/vm-9", "", ""); err != nil {
		t.Fatalf("the driver takes the retry's answer whatever its status, got %v", err)
	}
	if got, want := collapsed(log.exchanges()), []string{"GET /redfish/v1/Systems/vm-9 404", "GET /redfish/v1/Systems/vm-9/ 404"}; !slices.Equal(got, want) {
		t.Fatalf("requests %v, want %v", got, want)
	}
	for _, e := range log.exchanges() {
		var body map[string]any
		if err := json.Unmarshal(e.answer, &body); err != nil || body["error"] == nil || body["PowerState"] != nil {
			t.Errorf("%s answer %q: want a Redfish error body", e, e.answer)
		}
	}
	if state, err := func() (string, error) { driver.NodeID = "vm-9"; return driver.PowerQuery(t.Context(), "vm-9") }(); err != nil || state != "error" {
		t.Errorf("power_query of an unknown node = %q, %v; want error after its retries", state, err)
	}

	driver.Password = "wrong"
	before := len(log.exchanges())
	if _, _, err := driver.RedfishRequest(t.Context(), "GET", "/redfish/v1/Systems/vm-0", "", nil); !errors.Is(err, maasdriver.ErrPowerAuth) {
		t.Errorf("wrong password: %v, want the driver's fatal auth error", err)
	}
	if n := len(log.exchanges()) - before; n != 1 {
		t.Errorf("wrong password made %d requests, want 1 (auth errors are not retried)", n)
	}
}
