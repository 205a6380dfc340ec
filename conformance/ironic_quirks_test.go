package conformance_test

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/conformance/schemacheck"
)

// The quirks of Ironic's that a BMC must not trigger (issue 36): a missing
// PowerState while Ironic polls a transition, a refusal (409) of an action
// during one, and an answer slow enough to eat Ironic's time budgets.
// ironicRecorder sits between Ironic and bmc-server and keeps every
// exchange; checkIronicExchanges judges the whole run, and
// driveIronicThroughTransitions aims actions at the transition window.

// bmcExchange is one request Ironic made of the BMC and its answer.
type bmcExchange struct {
	Method   string
	Path     string
	Status   int
	Duration time.Duration // from the request reaching the recorder to the answer's last byte
	Body     []byte        // the answer, for GETs of the ComputerSystem only
}

func (e bmcExchange) String() string {
	return fmt.Sprintf("%s %s %d (%s)", e.Method, e.Path, e.Status, e.Duration.Round(time.Millisecond))
}

// ironicRecorder is a TLS-terminating reverse proxy on loopback that Ironic
// is given as redfish_address (Ironic does not check the certificate, as
// with the BMC's own, redfish_verify_ca false).
type ironicRecorder struct {
	url    string
	system string // the ComputerSystem's path, whose bodies are kept
	mu     sync.Mutex
	seen   []bmcExchange
}

func startIronicRecorder(t *testing.T, bmcURL, system string) *ironicRecorder {
	t.Helper()
	target, err := url.Parse(bmcURL)
	if err != nil {
		t.Fatal(err)
	}
	rec := &ironicRecorder{system: system}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) },
		// The BMC's certificate is self-signed, as Ironic is told.
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
	}
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keep := r.Method == http.MethodGet && strings.TrimSuffix(r.URL.Path, "/") == rec.system
		rw := &recordingWriter{ResponseWriter: w, status: http.StatusOK, keep: keep}
		start := time.Now()
		proxy.ServeHTTP(rw, r)
		rec.mu.Lock()
		defer rec.mu.Unlock()
		rec.seen = append(rec.seen, bmcExchange{Method: r.Method, Path: r.URL.Path, Status: rw.status, Duration: time.Since(start), Body: rw.body.Bytes()})
	}))
	t.Cleanup(ts.Close)
	rec.url = ts.URL
	return rec
}

// exchanges are the exchanges so far, oldest first.
func (rec *ironicRecorder) exchanges() []bmcExchange {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return slices.Clone(rec.seen)
}

// recordingWriter notes the status and, when told to keep it, the body.
type recordingWriter struct {
	http.ResponseWriter
	status int
	keep   bool
	body   bytes.Buffer
}

func (w *recordingWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *recordingWriter) Write(p []byte) (int, error) {
	if w.keep {
		w.body.Write(p)
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets the reverse proxy flush through the recorder.
func (w *recordingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// schemaPowerStates are the values Resource.json's PowerState enum allows.
func schemaPowerStates(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(schemacheck.RequireBundle(t), "json-schema", "Resource.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Definitions struct {
			PowerState struct {
				Enum []string `json:"enum"`
			} `json:"PowerState"`
		} `json:"definitions"`
	}
	if err := json.Unmarshal(data, &doc); err != nil || len(doc.Definitions.PowerState.Enum) == 0 {
		t.Fatalf("Resource.json's PowerState enum: %v", err)
	}
	return doc.Definitions.PowerState.Enum
}

// ironicPowerStates are the PowerState values Ironic 21.4's redfish power
// interface maps (GET_POWER_STATE_MAP): any other (Paused, or none) makes
// its power state None, and a wait for a power state never ends.
var ironicPowerStates = []string{"On", "Off", "PoweringOn", "PoweringOff"}

// missingPowerState lists the ComputerSystem GETs answered without a
// PowerState of the schema's enum that Ironic understands.
func missingPowerState(seen []bmcExchange, system string, enum []string) []string {
	var problems []string
	for _, e := range seen {
		if e.Method != http.MethodGet || strings.TrimSuffix(e.Path, "/") != system || e.Status != http.StatusOK {
			continue
		}
		var body map[string]any
		if err := json.Unmarshal(e.Body, &body); err != nil {
			problems = append(problems, fmt.Sprintf("%s: the body is not JSON: %v", e, err))
			continue
		}
		state, _ := body["PowerState"].(string)
		if !slices.Contains(enum, state) || !slices.Contains(ironicPowerStates, state) {
			problems = append(problems, fmt.Sprintf("%s: PowerState %v, want one of %v that Ironic maps", e, body["PowerState"], enum))
		}
	}
	return problems
}

// expectedRefusal is an error answer Ironic's run gets by design.
type expectedRefusal struct {
	method, path string // path relative to the ComputerSystem, "" for any
	status       int
	why          string
}

// expectedIronicRefusals are the only 4xx and 5xx answers Ironic may get:
// none of a power, boot override, virtual media or BIOS request. (The NMI
// Ironic is asked for on KubeVirt never reaches the BMC: sushy refuses it
// first, as ResetType.NMI is not among the values the BMC offers.)
var expectedIronicRefusals = []expectedRefusal{}

// refusedRequests lists the answers of 400 or more not in expected.
func refusedRequests(seen []bmcExchange, system string, expected []expectedRefusal) []string {
	var problems []string
	for _, e := range seen {
		if e.Status < 400 {
			continue
		}
		if !slices.ContainsFunc(expected, func(x expectedRefusal) bool {
			return x.method == e.Method && x.status == e.Status && (x.path == "" || e.Path == system+x.path)
		}) {
			problems = append(problems, e.String())
		}
	}
	return problems
}

// The slowest answers Ironic tolerates by far. sushy 4.3 sets no timeout
// on its requests, so a slow answer does not fail by itself; it eats the
// conductor's budgets: a power action's wait (power_state_change_timeout,
// 60 s, polled from 1 s with a back-off: a 5 s GET still leaves a dozen
// polls), and the API's synchronous calls (validate, boot device, NMI),
// which wait for the conductor over JSON-RPC for 120 s across the ten or
// more BMC requests each makes. An action (POST, PATCH) may do more (a
// KubeVirt write and a read back), so it gets twice a GET's bound.
const (
	slowGET    = 5 * time.Second
	slowAction = 10 * time.Second
)

// slowAnswers lists the answers slower than the bounds.
func slowAnswers(seen []bmcExchange) []string {
	var problems []string
	for _, e := range seen {
		bound := slowAction
		if e.Method == http.MethodGet || e.Method == http.MethodHead {
			bound = slowGET
		}
		if e.Duration > bound {
			problems = append(problems, fmt.Sprintf("%s: slower than %s", e, bound))
		}
	}
	return problems
}

// checkIronicExchanges judges Ironic's whole run against the BMC.
func checkIronicExchanges(t *testing.T, rec *ironicRecorder, enum []string) {
	t.Helper()
	seen := rec.exchanges()
	for _, p := range missingPowerState(seen, rec.system, enum) {
		t.Errorf("missing PowerState: %s", p)
	}
	for _, p := range refusedRequests(seen, rec.system, expectedIronicRefusals) {
		t.Errorf("Ironic's request refused: %s", p)
	}
	for _, p := range slowAnswers(seen) {
		t.Errorf("slow answer: %s", p)
	}
	var slowest bmcExchange
	systemGETs := map[string]int{}
	for _, e := range seen {
		if e.Duration > slowest.Duration {
			slowest = e
		}
		if e.Body != nil {
			var body struct{ PowerState string }
			_ = json.Unmarshal(e.Body, &body)
			systemGETs[body.PowerState]++
		}
	}
	t.Logf("the recorder saw %d requests of Ironic's, the slowest %s; the System's PowerState as Ironic read it: %v", len(seen), slowest, systemGETs)
}

// TestIronicExchangeChecksFail shows each check failing on the answer it
// is there to catch, so that a clean run proves something.
func TestIronicExchangeChecksFail(t *testing.T) {
	const system = "/redfish/v1/Systems/vm-0"
	enum := []string{"On", "Off", "PoweringOn", "PoweringOff", "Paused"}
	get := func(body string) bmcExchange {
		return bmcExchange{Method: http.MethodGet, Path: system, Status: http.StatusOK, Duration: time.Millisecond, Body: []byte(body)}
	}
	reset := bmcExchange{Method: http.MethodPost, Path: system + "/Actions/ComputerSystem.Reset", Status: http.StatusNoContent, Duration: time.Millisecond}
	powerState := func(s []bmcExchange) []string { return missingPowerState(s, system, enum) }
	refused := func(s []bmcExchange) []string { return refusedRequests(s, system, nil) }
	refusedButExpected := func(s []bmcExchange) []string {
		return refusedRequests(s, system, []expectedRefusal{{method: http.MethodPatch, status: http.StatusConflict, why: "test"}})
	}
	for _, tc := range []struct {
		name  string
		seen  []bmcExchange
		check func([]bmcExchange) []string
		fails bool
	}{
		{"PowerState present", []bmcExchange{get(`{"PowerState":"PoweringOn"}`), reset}, powerState, false},
		{"PowerState missing", []bmcExchange{get(`{"PowerState":"On"}`), get(`{"Id":"vm-0"}`)}, powerState, true},
		{"PowerState null", []bmcExchange{get(`{"PowerState":null}`)}, powerState, true},
		{"PowerState Ironic cannot map", []bmcExchange{get(`{"PowerState":"Paused"}`)}, powerState, true},
		{"PowerState off the enum", []bmcExchange{get(`{"PowerState":"Resetting"}`)}, powerState, true},
		{"no refusal", []bmcExchange{reset}, refused, false},
		{"a reset refused during a transition", []bmcExchange{{Method: http.MethodPost, Path: reset.Path, Status: http.StatusConflict}}, refused, true},
		{"a GET failing", []bmcExchange{{Method: http.MethodGet, Path: system, Status: http.StatusServiceUnavailable}}, refused, true},
		{"an expected refusal", []bmcExchange{{Method: http.MethodPatch, Path: system, Status: http.StatusConflict}}, refusedButExpected, false},
		{"an unexpected refusal beside it", []bmcExchange{{Method: http.MethodPost, Path: reset.Path, Status: http.StatusConflict}}, refusedButExpected, true},
		{"quick answers", []bmcExchange{get(`{}`), reset}, slowAnswers, false},
		{"a slow GET", []bmcExchange{{Method: http.MethodGet, Path: system, Duration: 6 * time.Second}}, slowAnswers, true},
		{"a slow reset", []bmcExchange{{Method: http.MethodPost, Path: reset.Path, Duration: 11 * time.Second}}, slowAnswers, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.check(tc.seen); (len(got) > 0) != tc.fails {
				t.Errorf("problems %q, want some: %v", got, tc.fails)
			}
		})
	}
}

// holdVMStart keeps the VM's next VMI from running (KubeVirt's VM caught
// Starting) while hold, as a guest that takes long to come up.
func holdVMStart(t *testing.T, namespace, name string, hold bool) {
	t.Helper()
	vm := &kubevirtv1.VirtualMachine{}
	if err := cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, vm); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(vm.DeepCopy())
	if hold {
		if vm.Annotations == nil {
			vm.Annotations = map[string]string{}
		}
		vm.Annotations[cluster.HoldStartAnnotation()] = "ironic-quirks"
	} else {
		delete(vm.Annotations, cluster.HoldStartAnnotation())
	}
	if err := cluster.Client.Patch(t.Context(), vm, patch); err != nil {
		t.Fatal(err)
	}
}

// driveIronicThroughTransitions aims Ironic's power actions at the window
// in which the KubeVirt VM is still starting: Ironic counts PoweringOn as
// on, so its power on ends while the VM starts, and the next action (as
// `baremetal node power off` right after `power on`) lands in the middle
// of it. Each must converge with no error, Ironic's reads of the System
// during the window saying PoweringOn (a PowerState it maps).
func driveIronicThroughTransitions(t *testing.T, ironic *ironicService, bmc ironicBMC, rec *ironicRecorder, name string) {
	powerState := func() string { return bmc.must(t, bmc.system)["PowerState"].(string) }
	waitBMC := func(want string) {
		t.Helper()
		waitFor(t, time.Minute, "the BMC's power "+want, func() error {
			if got := powerState(); got != want {
				return fmt.Errorf("the BMC says %s", got)
			}
			return nil
		})
	}
	before := len(rec.exchanges())
	bmc.holdStart(t, true)
	// On, then off during the start.
	ironic.power(t, name, map[string]any{"target": "power on"}, "power on")
	waitBMC("PoweringOn")
	ironic.power(t, name, map[string]any{"target": "power off"}, "power off")
	waitBMC("Off")
	// On, then a reboot (Ironic: ForceOff, On) and a soft reboot
	// (GracefulRestart) during the start.
	ironic.power(t, name, map[string]any{"target": "power on"}, "power on")
	waitBMC("PoweringOn")
	ironic.power(t, name, map[string]any{"target": "rebooting"}, "power on")
	if got := powerState(); got != "PoweringOn" {
		t.Errorf("after Ironic's reboot during the start the BMC says %s, want PoweringOn (still held)", got)
	}
	ironic.power(t, name, map[string]any{"target": "soft rebooting", "timeout": 60}, "power on")
	// The guest comes up; then off again, as driveIronic left it.
	bmc.holdStart(t, false)
	waitBMC("On")
	ironic.power(t, name, map[string]any{"target": "power off"}, "power off")
	waitBMC("Off")

	// Ironic read the System during the window, and was told PoweringOn;
	// none of its power actions was refused.
	window := rec.exchanges()[before:]
	sawStarting := slices.ContainsFunc(window, func(e bmcExchange) bool {
		return e.Body != nil && bytes.Contains(e.Body, []byte(`"PowerState":"PoweringOn"`))
	})
	if !sawStarting {
		t.Error("Ironic never read the System while the VM was starting: the window was missed")
	}
	resets := 0
	for _, e := range window {
		if strings.HasSuffix(e.Path, "/Actions/ComputerSystem.Reset") {
			resets++
			if e.Status != http.StatusNoContent && e.Status != http.StatusOK {
				t.Errorf("during the start Ironic's %s", e)
			}
		}
	}
	// On, Off, On, ForceOff, On, GracefulRestart, Off.
	if resets < 7 {
		t.Errorf("Ironic sent %d resets during the window, want at least 7", resets)
	}
}
