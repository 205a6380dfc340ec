package conformance_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
)

// What MaaS's redfish power driver puts on the wire, as its source has it
// (provisioningserver/drivers/power/redfish.py). The same four headers go
// with every request, a Content-Type even on a bodiless GET: today
// "application/json", in older releases "application/json; charset=utf-8".
// No OData-Version header. Bodies are Python's
// json.dumps with its default separators.
const (
	maasDriverBootBody      = `{"Boot": {"BootSourceOverrideEnabled": "Once", "BootSourceOverrideTarget": "Pxe"}}`
	maasDriverResetBody     = `{"ResetType": "%s"}`
	maasDriverMaxRetries    = 5 // redfish_request retries a failed request this often
	maasDriverStatusRetries = 7 // a "reset"/"unknown"/"null" PowerState is re-read this often
)

var errMaaSAuth = errors.New("MaaS: PowerAuthError")

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

// maasDriver replays the driver's requests over a raw TLS connection, so
// that nothing but the driver's own headers reaches the server.
type maasDriver struct {
	t           *testing.T
	host        string
	tls         *tls.Config
	auth        string
	contentType string
	nodeID      string // the node's "Node ID" power parameter; empty: the first Systems member
}

func newMaaSDriver(t *testing.T, ts *httptest.Server, contentType string) *maasDriver {
	u, err := url.Parse(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	return &maasDriver{
		t:           t,
		host:        u.Host,
		tls:         &tls.Config{InsecureSkipVerify: true}, // MaaS does not verify BMC certificates
		auth:        "Basic " + base64.StdEncoding.EncodeToString([]byte(maasUser+":"+maasPass)),
		contentType: contentType,
	}
}

// wire sends one request exactly as Twisted's Agent frames it for the
// driver and reads the answer.
func (d *maasDriver) wire(method, path, ifMatch, body string) (*http.Response, []byte) {
	d.t.Helper()
	var req bytes.Buffer
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nConnection: close\r\nHost: %s\r\n", method, path, d.host)
	fmt.Fprintf(&req, "User-Agent: MAAS\r\nAccept: application/json\r\nAuthorization: %s\r\nContent-Type: %s\r\n", d.auth, d.contentType)
	if ifMatch != "" {
		fmt.Fprintf(&req, "If-Match: %s\r\n", ifMatch)
	}
	if body != "" {
		fmt.Fprintf(&req, "Content-Length: %d\r\n", len(body))
	}
	req.WriteString("\r\n" + body)
	conn, err := tls.Dial("tcp", d.host, d.tls)
	if err != nil {
		d.t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(maasPollTimeout))
	if _, err := conn.Write(req.Bytes()); err != nil {
		d.t.Fatalf("%s %s: %v", method, path, err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		d.t.Fatalf("%s %s: reading the answer: %v", method, path, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		d.t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	if res.StatusCode/100 == 3 {
		d.t.Errorf("%s %s: %d redirect; the driver would follow Location", method, path, res.StatusCode)
	}
	return res, data
}

// request is _redfish_request: a 404 on a URI without a trailing slash is
// sent again with one (and that answer taken whatever its status); 401 and
// 403 are fatal; other errors fail the attempt. A non-empty body must be
// JSON.
func (d *maasDriver) request(method, uri, ifMatch, body string) (map[string]any, http.Header, error) {
	d.t.Helper()
	res, data := d.wire(method, uri, ifMatch, body)
	switch {
	case res.StatusCode == http.StatusNotFound && !strings.HasSuffix(uri, "/"):
		res, data = d.wire(method, uri+"/", ifMatch, body)
	case res.StatusCode == http.StatusUnauthorized || res.StatusCode == http.StatusForbidden:
		return nil, nil, fmt.Errorf("%w: %s %s: %d", errMaaSAuth, method, uri, res.StatusCode)
	case res.StatusCode >= 400:
		return nil, nil, fmt.Errorf("MaaS: PowerActionError: %s %s: %d %s", method, uri, res.StatusCode, data)
	}
	if len(data) == 0 {
		return nil, res.Header, nil
	}
	var decoded map[string]any
	if err := json.Unmarshal(data, &decoded); err != nil {
		return nil, nil, fmt.Errorf("MaaS: PowerActionError: %s %s: JSON parse error: %v", method, uri, err)
	}
	return decoded, res.Header, nil
}

// retrying is redfish_request: a failed attempt is repeated, the ETag read
// afresh each time, up to maasDriverMaxRetries times (the driver backs off
// 0.5 s, 1.5 s, ...; the replay does not wait).
func (d *maasDriver) retrying(method, uri, body string, etag func() (string, error)) (map[string]any, http.Header, error) {
	d.t.Helper()
	var err error
	for range maasDriverMaxRetries + 1 {
		ifMatch := ""
		if etag != nil {
			if ifMatch, err = etag(); err != nil {
				continue
			}
		}
		var data map[string]any
		var header http.Header
		if data, header, err = d.request(method, uri, ifMatch, body); err == nil || errors.Is(err, errMaaSAuth) {
			return data, header, err
		}
	}
	return nil, nil, err
}

func (d *maasDriver) systemURI(node string) string { return path.Join("/redfish/v1/Systems", node) }

// node is process_redfish_context: the configured node ID, else the last
// segment of the first Systems member.
func (d *maasDriver) node() (string, error) {
	if d.nodeID != "" {
		return d.nodeID, nil
	}
	systems, _, err := d.retrying("GET", "/redfish/v1/Systems", "", nil)
	if err != nil {
		return "", err
	}
	members, _ := systems["Members"].([]any)
	if len(members) == 0 {
		return "", errors.New("no Systems members")
	}
	id, _ := members[0].(map[string]any)["@odata.id"].(string)
	return path.Base(strings.TrimRight(id, "/")), nil
}

// powerQuery is _power_query with the driver's mapping of PowerState.
func (d *maasDriver) powerQuery(node string) (string, error) {
	for range maasDriverStatusRetries + 1 {
		system, _, err := d.retrying("GET", d.systemURI(node), "", nil)
		if err != nil {
			return "", err
		}
		state, _ := system["PowerState"].(string)
		switch strings.ToLower(state) {
		case "off", "poweringon":
			return "off", nil
		case "on", "paused", "poweringoff":
			return "on", nil
		case "reset", "unknown", "null", "":
			continue
		default:
			return "error", nil
		}
	}
	return "error", nil
}

func (d *maasDriver) waitFor(node, want string) error {
	for deadline := time.Now().Add(maasPollTimeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		got, err := d.powerQuery(node)
		if err != nil || got == want {
			return err
		}
	}
	return fmt.Errorf("node %s never reached %s", node, want)
}

// etag is get_etag: @odata.etag from the body, else the ETag header.
func (d *maasDriver) etag(uri string) (string, error) {
	data, header, err := d.retrying("GET", uri, "", nil)
	if err != nil {
		return "", err
	}
	if tag, ok := data["@odata.etag"].(string); ok {
		return tag, nil
	}
	return header.Get("ETag"), nil
}

// setPXEBoot is set_pxe_boot: find where Boot is written (the system, or
// its @Redfish.Settings object), then PATCH it with the ETag just read.
func (d *maasDriver) setPXEBoot(node string) error {
	target := d.systemURI(node)
	if system, _, err := d.retrying("GET", target, "", nil); err == nil {
		if settings, ok := system["@Redfish.Settings"].(map[string]any); ok {
			if id, _ := settings["SettingsObject"].(map[string]any)["@odata.id"].(string); id != "" {
				target = "/" + strings.TrimLeft(id, "/")
			}
		}
	}
	_, _, err := d.retrying("PATCH", target, maasDriverBootBody, func() (string, error) { return d.etag(target) })
	return err
}

// power is power(): POST the reset, then wait for On or Off.
func (d *maasDriver) power(node, change string) error {
	if _, _, err := d.retrying("POST", d.systemURI(node)+"/Actions/ComputerSystem.Reset", fmt.Sprintf(maasDriverResetBody, change), nil); err != nil {
		return err
	}
	switch change {
	case "ForceOff":
		return d.waitFor(node, "off")
	case "On":
		return d.waitFor(node, "on")
	}
	return nil
}

func (d *maasDriver) powerOn() error {
	node, err := d.node()
	if err != nil {
		return err
	}
	if state, err := d.powerQuery(node); err != nil {
		return err
	} else if state == "on" {
		if err := d.power(node, "ForceOff"); err != nil {
			return err
		}
	}
	if err := d.setPXEBoot(node); err != nil {
		return err
	}
	return d.power(node, "On")
}

func (d *maasDriver) powerOff() error {
	node, err := d.node()
	if err != nil {
		return err
	}
	if state, err := d.powerQuery(node); err != nil {
		return err
	} else if state != "off" {
		if err := d.power(node, "ForceOff"); err != nil {
			return err
		}
	}
	return d.setPXEBoot(node)
}

func (d *maasDriver) powerReset() error {
	node, err := d.node()
	if err != nil {
		return err
	}
	if err := d.setPXEBoot(node); err != nil {
		return err
	}
	return d.power(node, "GracefulRestart")
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
		run         func(*maasDriver) error
		want        []string // collapsed: "METHOD path status"
		wantPower   machine.PowerState
		wantLastPxe bool // the last boot was from the network
	}{
		{
			name: "power_on, current headers, node from Systems", contentType: "application/json",
			run: (*maasDriver).powerOn,
			want: []string{
				"GET /redfish/v1/Systems 200", "GET " + sys + " 200", "POST " + reset + " 204", "GET " + sys + " 200",
				"PATCH " + sys + " 200", "POST " + reset + " 204", "GET " + sys + " 200",
			},
			wantPower: machine.PowerOn, wantLastPxe: true,
		},
		{
			name: "power_on, older Content-Type, node configured", contentType: "application/json; charset=utf-8", nodeID: "vm-0",
			run: (*maasDriver).powerOn,
			want: []string{
				"GET " + sys + " 200", "POST " + reset + " 204", "GET " + sys + " 200",
				"PATCH " + sys + " 200", "POST " + reset + " 204", "GET " + sys + " 200",
			},
			wantPower: machine.PowerOn, wantLastPxe: true,
		},
		{
			name: "power_off", contentType: "application/json", nodeID: "vm-0",
			run:       (*maasDriver).powerOff,
			want:      []string{"GET " + sys + " 200", "POST " + reset + " 204", "GET " + sys + " 200", "PATCH " + sys + " 200"},
			wantPower: machine.PowerOff,
		},
		{
			name: "power_reset", contentType: "application/json", nodeID: "vm-0",
			run:       (*maasDriver).powerReset,
			want:      []string{"GET " + sys + " 200", "PATCH " + sys + " 200", "POST " + reset + " 204"},
			wantPower: machine.PowerOn, wantLastPxe: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts, backend, log := startMaaSDriverBMC(t)
			driver := newMaaSDriver(t, ts, tt.contentType)
			driver.nodeID = tt.nodeID
			if err := tt.run(driver); err != nil {
				t.Fatalf("driver: %v", err)
			}
			exchanges := log.exchanges()
			if got := collapsed(exchanges); !slices.Equal(got, tt.want) {
				t.Fatalf("requests:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
			for i, e := range exchanges {
				for name, want := range map[string]string{"User-Agent": "MAAS", "Accept": "application/json", "Authorization": driver.auth, "Content-Type": tt.contentType, "Connection": "close"} {
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
					if e.body != maasDriverBootBody {
						t.Errorf("PATCH body %q, want %q", e.body, maasDriverBootBody)
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
			for deadline := time.Now().Add(maasPollTimeout); ; time.Sleep(10 * time.Millisecond) {
				p, _ := vm.PowerState(t.Context())
				if p == tt.wantPower {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("power %s, want %s", p, tt.wantPower)
				}
			}
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
	driver.nodeID = "vm-0"
	if err := driver.setPXEBoot("vm-0"); err != nil {
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
	if _, _, err := driver.request("GET", "/redfish/v1/Systems/vm-9", "", ""); err != nil {
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
	if state, err := func() (string, error) { driver.nodeID = "vm-9"; return driver.powerQuery("vm-9") }(); err != nil || state != "error" {
		t.Errorf("power_query of an unknown node = %q, %v; want error after its retries", state, err)
	}

	driver.auth = "Basic " + base64.StdEncoding.EncodeToString([]byte(maasUser+":wrong"))
	before := len(log.exchanges())
	if _, _, err := driver.retrying("GET", "/redfish/v1/Systems/vm-0", "", nil); !errors.Is(err, errMaaSAuth) {
		t.Errorf("wrong password: %v, want the driver's fatal auth error", err)
	}
	if n := len(log.exchanges()) - before; n != 1 {
		t.Errorf("wrong password made %d requests, want 1 (auth errors are not retried)", n)
	}
}
