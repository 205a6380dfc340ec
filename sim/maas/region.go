package maas

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	maasclient "github.com/virtmetal/virtmetal/maas"
)

// MaaS machine status codes and the names MaaS shows for them.
const (
	StatusNew                 = 0
	StatusCommissioning       = 1
	StatusFailedCommissioning = 2
	StatusReady               = 4
	StatusDeployed            = 6
	StatusBroken              = 8
	StatusTesting             = 21
	StatusFailedTesting       = 22
)

var statusNames = map[int]string{
	StatusNew:                 "New",
	StatusCommissioning:       "Commissioning",
	StatusFailedCommissioning: "Failed commissioning",
	StatusReady:               "Ready",
	StatusDeployed:            "Deployed",
	StatusBroken:              "Broken",
	StatusTesting:             "Testing",
	StatusFailedTesting:       "Failed testing",
}

// commissionable are the statuses MaaS's Commission action accepts.
var commissionable = []int{StatusNew, StatusFailedCommissioning, StatusReady, StatusBroken}

// powerTypes are the power drivers the simulated rack controller offers.
var powerTypes = []string{"redfish", "ipmi", "manual", "virsh", "lxd", "webhook"}

// Shape is the MaaS version whose API behaviour the simulator follows where
// versions differ. The one difference modelled is the validation of
// power_address, the only one a run of the reconciler against a real MaaS
// 3.4 region found in the API calls virtmetal makes: 3.4's region parses it
// as an IP address or host name and answers HTTP 500 for an address with a
// scheme. Later versions are modelled as storing it; no region of theirs
// was run against virtmetal.
type Shape string

// The shapes the simulator knows.
const (
	Shape34     Shape = "3.4"
	Shape35     Shape = "3.5"
	Shape36     Shape = "3.6"
	ShapeMaster Shape = "master"
)

// Shapes are all shapes, oldest first.
var Shapes = []Shape{Shape34, Shape35, Shape36, ShapeMaster}

// DefaultShape is the shape of a new server: the newest.
const DefaultShape = ShapeMaster

// acceptsSchemeInAddress tells whether the region stores a power_address
// with a scheme.
func (sh Shape) acceptsSchemeInAddress() bool { return sh != Shape34 }

// Shape34AddressError is the text of MaaS 3.4's HTTP 500 for a power address
// with a scheme (netaddr's ValueError, uncaught).
const Shape34AddressError = "IPAddress() does not support netmasks or subnet prefixes!"

// chassisPowerTypes are the power types whose machines share a BMC row when
// their address and user match, as MaaS's chassis-capable drivers do.
var chassisPowerTypes = []string{"redfish", "virsh", "lxd"}

// DefaultPool is the pool every MaaS has, id 0.
const DefaultPool = "default"

// APIKey is an admin's key the server accepts; tests may use another one to
// see 401.
const APIKey = "consumerkey:tokenkey:tokensecret"

// NonAdminAPIKey is an ordinary user's key: accepted, but refused (403) what
// MaaS keeps for admins.
const NonAdminAPIKey = "userconsumer:usertoken:usersecret"

// TimestampWindow is how far an OAuth timestamp may be from the server's
// clock, as MaaS's OAuth server allows.
const TimestampWindow = 300 * time.Second

// Machine is a simulated machine.
type Machine struct {
	SystemID string
	Hostname string
	Status   int
	// PreviousStatus is the status before the last one MaaS's Commission
	// action set (its previous_status): a commissioning whose power-on
	// fails returns the machine to it.
	PreviousStatus  int
	PowerType       string
	PowerParameters map[string]string
	Pool            string // DefaultPool when empty
	// HardwareUUID is the SMBIOS system UUID commissioning found; "" shows
	// as null (never commissioned, or cleared by MaaS as a duplicate).
	HardwareUUID string
	// MACs are the machine's physical interfaces; the first is the boot
	// interface.
	MACs []string
	// BMCConfig is what the machine's bmc-config commissioning scripts
	// report. Commissioning without skip_bmc_config replaces the power
	// parameters with it when it completes, as MaaS does with the
	// BMC_CONFIG_PATH YAML.
	BMCConfig map[string]string
	// Commissioning is the machine's current commissioning script set, as
	// MaaS keeps it: one result per script, what ran in the enlistment
	// counting as one; nil when the machine has none (an enlistment
	// without commission=true), empty but not nil for a set no result
	// reached yet. An enlistment with commission=true, each commissioning
	// and a node's COMMISSIONING signal make a new one (see Signal).
	Commissioning []ScriptResult
}

// ScriptResult is what MaaS stores of one script of a script set.
type ScriptResult struct {
	Name       string
	Status     string // ScriptPending, ScriptPassed, ScriptFailed, ScriptSkipped
	ExitStatus int
	// Stdout and Stderr are what the script printed; MaaS's "output" is
	// both, as it records them. Result is the script's result YAML.
	Stdout, Stderr, Result string
}

// Script result statuses, as MaaS names them (status_name, lower case).
const (
	ScriptPending = "pending"
	ScriptPassed  = "passed"
	ScriptFailed  = "failed"
	ScriptSkipped = "skipped"
)

// machineState is a machine as the server keeps it: its Machine's
// PowerType and PowerParameters are not used, they are its BMC row's.
type machineState struct {
	Machine
	bmc           int // the BMC row's id
	skipBMCConfig bool
	// nodeID is the machine's own node_id power parameter: MaaS keeps it
	// per machine, not on the BMC row others may share.
	nodeID string
	// enlisting: enlisted with commission=true and not done, so the
	// node's final OK signal brings it back to New, not Ready.
	enlisting bool
	// passwordsHeld is every power_pass the machine's rows ever gave it,
	// so a test can tell whether a secret reached it even for a moment.
	passwordsHeld []string
}

// bmcRow is MaaS's BMC object: the power settings of one or more machines.
type bmcRow struct {
	id        int
	powerType string
	params    map[string]string
}

// sharesBy is the key under which chassis-capable rows are shared.
func (b *bmcRow) sharesBy(powerType string, params map[string]string) bool {
	return b.powerType == powerType && b.params["power_address"] == params["power_address"] &&
		b.params["power_user"] == params["power_user"]
}

// Request is one request the server received.
type Request struct {
	Method string
	Path   string // under /MAAS/api/2.0/, e.g. "machines/abc/"
	Op     string
	// Form holds the submitted form fields (values of power_pass included,
	// so tests can check them).
	Form map[string]string
	// StatusCode is what the server answered; 0 when the connection was
	// dropped before an answer.
	StatusCode int
	// Applied says the simulator carried the request out, whether or not
	// its answer reached the client.
	Applied bool
}

// Fault is a failure the server can be told to produce.
type Fault int

const (
	// FaultServerError answers 503 without handling the request.
	FaultServerError Fault = iota + 1
	// FaultConflict answers 409 without handling the request.
	FaultConflict
	// FaultMalformedJSON answers 200 with a cut-off JSON body, unhandled.
	FaultMalformedJSON
	// FaultDropConnection closes the connection before handling.
	FaultDropConnection
	// FaultDropResponse handles the request, then closes the connection
	// without answering: the change is made but the client cannot know.
	FaultDropResponse
	// FaultAddressRejected answers 500 with the 3.4 region's text for a
	// power address it cannot parse (Shape34AddressError), unhandled: a
	// region refusing an address the simulator's own rules accept.
	FaultAddressRejected
)

// Match selects requests; empty fields match anything.
type Match struct {
	Method, Path, Op string
}

func (m Match) matches(method, path, op string) bool {
	return (m.Method == "" || m.Method == method) && (m.Path == "" || m.Path == path) && (m.Op == "" || m.Op == op)
}

type faultRule struct {
	match     Match
	remaining int // < 0: until ClearFaults
	fault     Fault
}

// TB is the part of testing.TB that New and the With* helpers use: the
// package does not import testing, so the lab, which uses Start, links none
// of it.
type TB interface {
	Helper()
	Cleanup(func())
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// Server is a simulated MaaS region API on a loopback httptest server.
type Server struct {
	t   TB
	srv *httptest.Server

	mu       sync.Mutex
	shape    Shape
	noImages bool
	// noEnlistCommissioning is MaaS's enlist_commissioning=false.
	noEnlistCommissioning bool
	machines              map[string]*machineState
	bmcs                  map[int]*bmcRow
	nextBMCID             int
	devices               []string // hostnames of non-machine nodes
	pools                 []poolState
	nextPoolID            int
	nonces                map[string]bool
	requests              []Request
	faults                []*faultRule
	holds                 []*hold
	hooks                 []requestHook
	latency               time.Duration // before each request is handled
	inFlight              int           // requests being handled now
	maxFlight             int           // the most at once since the last ResetRequests
	// onCommission is told of every commission MaaS accepted.
	onCommission func(systemID string)
}

type poolState struct {
	ID          int    `json:"id"`
	Name        string `json:"name"`
	Description string `json:"description"`
	ResourceURI string `json:"resource_uri"`
}

// New starts a simulator with only the default pool; it stops when the test
// ends.
func New(t TB) *Server {
	t.Helper()
	s := Start()
	s.t = t
	t.Cleanup(s.Close)
	return s
}

// Start starts a simulator outside a test (a lab): the With* helpers, which
// fail a test, must not be used on it; Enlist and Update report errors
// instead. Close stops it.
func Start() *Server {
	s := &Server{
		shape:      DefaultShape,
		machines:   map[string]*machineState{},
		bmcs:       map[int]*bmcRow{},
		nextBMCID:  1,
		nonces:     map[string]bool{},
		nextPoolID: 1,
	}
	s.pools = []poolState{newPool(0, DefaultPool, "Default pool")}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// WithShape makes the server follow a MaaS version's behaviour.
func (s *Server) WithShape(shape Shape) *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shape = shape
	return s
}

// WithoutBootImages makes the region have no boot image (or, with false,
// have them again): commission is refused with 400.
func (s *Server) WithoutBootImages(missing bool) *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noImages = missing
	return s
}

// WithEnlistCommissioning sets MaaS's enlist_commissioning (true unless
// told otherwise, as in MaaS): with it, enlistment runs MaaS's built-in
// commissioning scripts and the scripts tagged "enlisting"; without it,
// only those tagged "bmc-config" (docs/maas-region.md, 1).
func (s *Server) WithEnlistCommissioning(on bool) *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noEnlistCommissioning = !on
	return s
}

// RunsAtEnlistment says whether a commissioning script with these tags
// runs in an enlistment, by enlist_commissioning.
func (s *Server) RunsAtEnlistment(tags []string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.noEnlistCommissioning {
		return slices.Contains(tags, "bmc-config")
	}
	return slices.Contains(tags, "enlisting")
}

// BMCID is the id of the BMC row holding the machine's power settings; 0
// when the machine is unknown.
func (s *Server) BMCID(systemID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.machines[systemID]; ok {
		return m.bmc
	}
	return 0
}

// setPower gives a machine power settings as MaaS's Node.set_power_config
// does: a chassis-capable type joins the row whose type, address and user
// match, or else changes its own row in place, whoever shares it; any other
// type changes its own row if no other machine shares it, else gets a
// fresh one. s.mu is held.
func (s *Server) setPower(m *machineState, powerType string, params map[string]string) {
	defer s.notePasswordsHeld(m)
	params = maps.Clone(params)
	if params == nil {
		params = map[string]string{}
	}
	if nodeID, ok := params[nodeIDParam]; ok {
		m.nodeID = nodeID
		delete(params, nodeIDParam)
	}
	current := s.bmcs[m.bmc]
	chassis := slices.Contains(chassisPowerTypes, powerType)
	if chassis {
		for _, row := range s.sortedBMCs() {
			if row != current && row.sharesBy(powerType, params) {
				m.bmc = row.id
				row.params = params
				s.dropUnusedBMC(current)
				return
			}
		}
	}
	if current != nil && ((chassis && current.powerType == powerType) || !s.bmcShared(current, m)) {
		current.powerType, current.params = powerType, params
		return
	}
	row := &bmcRow{id: s.nextBMCID, powerType: powerType, params: params}
	s.nextBMCID++
	s.bmcs[row.id] = row
	m.bmc = row.id
	s.dropUnusedBMC(current)
}

// notePasswordsHeld records the password of m's row as held by every
// machine on that row: a row changed in place changes it for all of them.
// s.mu is held.
func (s *Server) notePasswordsHeld(m *machineState) {
	row := s.bmcs[m.bmc]
	if row == nil || row.params["power_pass"] == "" {
		return
	}
	for _, other := range s.machines {
		if other.bmc == row.id && !slices.Contains(other.passwordsHeld, row.params["power_pass"]) {
			other.passwordsHeld = append(other.passwordsHeld, row.params["power_pass"])
		}
	}
}

// PasswordsHeld is every power_pass the machine ever had, in the order it
// got them, through its own writes or a BMC row it shared.
func (s *Server) PasswordsHeld(systemID string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.machines[systemID]; ok {
		return slices.Clone(m.passwordsHeld)
	}
	return nil
}

func (s *Server) sortedBMCs() []*bmcRow {
	return slices.SortedFunc(maps.Values(s.bmcs), func(a, b *bmcRow) int { return cmp.Compare(a.id, b.id) })
}

// bmcShared tells whether a machine other than m uses row.
func (s *Server) bmcShared(row *bmcRow, m *machineState) bool {
	for _, other := range s.machines {
		if other != m && other.bmc == row.id {
			return true
		}
	}
	return false
}

func (s *Server) dropUnusedBMC(row *bmcRow) {
	if row != nil && !s.bmcShared(row, nil) {
		delete(s.bmcs, row.id)
	}
}

// view is a copy of the machine with its row's power settings. s.mu is
// held.
func (s *Server) view(state *machineState) Machine {
	m := state.Machine
	if row := s.bmcs[state.bmc]; row != nil {
		m.PowerType, m.PowerParameters = row.powerType, maps.Clone(row.params)
		if state.nodeID != "" {
			m.PowerParameters[nodeIDParam] = state.nodeID
		}
	}
	m.BMCConfig = maps.Clone(m.BMCConfig)
	m.MACs = slices.Clone(m.MACs)
	m.Commissioning = slices.Clone(m.Commissioning)
	return m
}

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

func newPool(id int, name, description string) poolState {
	return poolState{ID: id, Name: name, Description: description, ResourceURI: fmt.Sprintf("/MAAS/api/2.0/resourcepool/%d/", id)}
}

// URL is the MaaS base URL, ending in /MAAS.
func (s *Server) URL() string { return s.srv.URL + "/MAAS" }

// WithMachine adds a machine. An empty SystemID gets one; an empty Pool is
// DefaultPool. It fails the test on a duplicate system_id or hostname.
func (s *Server) WithMachine(m Machine) *Server {
	s.t.Helper()
	if _, err := s.Enlist(m); err != nil {
		s.t.Fatal(err)
	}
	return s
}

// Enlist adds a machine, as MaaS does when an unknown machine PXE boots, and
// returns its system_id. An empty SystemID gets one; an empty Pool is
// DefaultPool. A duplicate system_id or hostname, or an unknown pool, is an
// error.
func (s *Server) Enlist(m Machine) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m.SystemID == "" {
		m.SystemID = s.newSystemID()
	}
	if m.Pool == "" {
		m.Pool = DefaultPool
	}
	if _, dup := s.machines[m.SystemID]; dup {
		return "", fmt.Errorf("maassim: duplicate system_id %q", m.SystemID)
	}
	if m.Hostname != "" && s.hostnameHolder(m.Hostname) != "" {
		return "", fmt.Errorf("maassim: duplicate hostname %q", m.Hostname)
	}
	if s.pool(m.Pool) == nil {
		return "", fmt.Errorf("maassim: machine %s in unknown pool %q", m.SystemID, m.Pool)
	}
	powerType, params := m.PowerType, m.PowerParameters
	m.PowerType, m.PowerParameters = "", nil
	m.BMCConfig = maps.Clone(m.BMCConfig)
	m.MACs = slices.Clone(m.MACs)
	m.Commissioning = slices.Clone(m.Commissioning)
	state := &machineState{Machine: m}
	s.machines[m.SystemID] = state
	s.setPower(state, powerType, params)
	return m.SystemID, nil
}

// Update changes a machine's state under the server's lock, as MaaS's own
// processes do (power drivers, commissioning results); it reports whether
// the machine exists. The machine's maps may be changed in place; changed
// power settings are stored as a PUT stores them (see setPower).
func (s *Server) Update(systemID string, change func(m *Machine)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	state, ok := s.machines[systemID]
	if !ok {
		return false
	}
	m := s.view(state)
	change(&m)
	powerType, params := m.PowerType, m.PowerParameters
	old := s.view(state)
	m.PowerType, m.PowerParameters = "", nil
	state.Machine = m
	if powerType != old.PowerType || !maps.Equal(params, old.PowerParameters) {
		s.setPower(state, powerType, params)
	}
	return true
}

// Delete removes a machine, as an admin deleting it in MaaS does; it
// reports whether the machine existed.
func (s *Server) Delete(systemID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.machines[systemID]
	if ok {
		delete(s.machines, systemID)
		s.dropUnusedBMC(s.bmcs[m.bmc])
	}
	return ok
}

// OnCommission makes the server call commissioned with the system_id of
// every machine whose commissioning it accepted, after accepting it, as
// MaaS's region hands the machine to a rack controller. The machine stays
// Commissioning until someone (Step, or commissioned via Update) ends it.
func (s *Server) OnCommission(commissioned func(systemID string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onCommission = commissioned
}

// Machines returns a copy of every machine, by system_id.
func (s *Server) Machines() []Machine {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Machine
	for _, state := range s.sortedMachines() {
		out = append(out, s.view(state))
	}
	return out
}

// SkipsBMCConfig says whether the machine's current or last commissioning
// was started with skip_bmc_config.
func (s *Server) SkipsBMCConfig(systemID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	state, ok := s.machines[systemID]
	return ok && state.skipBMCConfig
}

// WithDevice adds a node that is not a machine (a device or controller):
// GET machines/ does not list it, but its hostname is taken all the same.
func (s *Server) WithDevice(hostname string) *Server {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hostnameHolder(hostname) != "" {
		s.t.Fatalf("maassim: duplicate hostname %q", hostname)
	}
	s.devices = append(s.devices, hostname)
	return s
}

// WithPool adds a resource pool.
func (s *Server) WithPool(name string) *Server {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pool(name) != nil {
		s.t.Fatalf("maassim: duplicate pool %q", name)
	}
	s.pools = append(s.pools, newPool(s.nextPoolID, name, ""))
	s.nextPoolID++
	return s
}

// FailNext makes the next n requests fail with fault.
func (s *Server) FailNext(n int, fault Fault) *Server {
	return s.FailMatching(Match{}, n, fault)
}

// FailMatching makes the next n requests that match fail with fault; n < 0
// fails every matching request until ClearFaults.
func (s *Server) FailMatching(match Match, n int, fault Fault) *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &faultRule{match: match, remaining: n, fault: fault})
	return s
}

// requestHook is a change made to the region just before a matching
// request is handled.
type requestHook struct {
	match  Match
	before func()
}

// Before makes before run, without the server's lock, each time a request
// that matches arrives, just before it is handled: what another client
// changes between the reconciler's reads and its writes. before may call
// Update.
func (s *Server) Before(match Match, before func()) *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hooks = append(s.hooks, requestHook{match: match, before: before})
	return s
}

// hold keeps the requests that match waiting until released: a MaaS that
// is slow for one machine.
type hold struct {
	match    Match
	released chan struct{}
	waiting  int
}

// Hold makes every request that matches wait, before it is handled, until
// release is called; waiting says how many wait now.
func (s *Server) Hold(match Match) (release func(), waiting func() int) {
	h := &hold{match: match, released: make(chan struct{})}
	s.mu.Lock()
	s.holds = append(s.holds, h)
	s.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			s.mu.Lock()
			s.holds = slices.DeleteFunc(s.holds, func(x *hold) bool { return x == h })
			s.mu.Unlock()
			close(h.released)
		})
	}
	waiting = func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return h.waiting
	}
	return release, waiting
}

// WithLatency makes every request wait d before it is handled: a region
// across a network, whose round trips a reconciler's cycle pays.
func (s *Server) WithLatency(d time.Duration) *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latency = d
	return s
}

// MaxInFlight is the most requests the server handled at once since it
// started or ResetRequests.
func (s *Server) MaxInFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxFlight
}

// ClearFaults removes all pending faults.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

// Step completes every commissioning: Commissioning machines become Ready,
// taking their BMCConfig as power parameters unless skip_bmc_config was set
// or the region's validation refuses its address (then the power settings
// stay as they were, as MaaS fails to store them).
func (s *Server) Step() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.sortedMachines() {
		if m.Status != StatusCommissioning {
			continue
		}
		if !m.skipBMCConfig && m.BMCConfig != nil && s.addressError(m.BMCConfig["power_type"], m.BMCConfig) == "" {
			params := maps.Clone(m.BMCConfig)
			delete(params, "power_type")
			s.setPower(m, m.BMCConfig["power_type"], params)
		}
		s.endCommissioning(m)
	}
}

// powerRefused is the region's answer to power settings given through the
// API (a PUT, an anonymous enlistment) that it does not store, validated
// merged with what is stored: empty Redfish credentials (400), an address
// its version cannot store (500), a machine already on a row of its own
// type moved onto another row's address and user (409; MaaS's unique
// index on BMC rows, where a machine of another type would join the row).
// m is nil for a new machine. s.mu is held.
func (s *Server) powerRefused(m *machineState, powerType string, params map[string]string) (reply, bool) {
	if powerType == "redfish" {
		var missing []string
		if params["power_user"] == "" {
			missing = append(missing, RedfishUserRequired)
		}
		if params["power_pass"] == "" {
			missing = append(missing, RedfishPasswordRequired)
		}
		if len(missing) > 0 {
			return reply{status: http.StatusBadRequest, json: map[string][]string{"power_parameters": missing}}, true
		}
	}
	if text := s.addressError(powerType, params); text != "" {
		return textError(http.StatusInternalServerError, text), true
	}
	if m == nil || !slices.Contains(chassisPowerTypes, powerType) {
		return reply{}, false
	}
	if current := s.bmcs[m.bmc]; current != nil && current.powerType == powerType {
		for _, row := range s.bmcs {
			if row != current && row.sharesBy(powerType, params) {
				return textError(http.StatusConflict, BMCConflictError), true
			}
		}
	}
	return reply{}, false
}

// The region's texts for refused power settings.
const (
	RedfishUserRequired     = "Redfish user: This field is required."
	RedfishPasswordRequired = "Redfish password: This field is required."
	// BMCConflictError stands for the HTML page of the region's 409: the
	// BMC rows' unique index refused the move.
	BMCConflictError = "Conflict: another BMC has this power type, address and user"
)

// nodeIDParam is the power parameter MaaS keeps per machine.
const nodeIDParam = "node_id"

// addressError is the region's HTTP 500 text for power settings whose
// address its version cannot store, "" when it can. s.mu is held.
func (s *Server) addressError(powerType string, params map[string]string) string {
	if powerType != "manual" && !s.shape.acceptsSchemeInAddress() && strings.Contains(params["power_address"], "://") {
		return Shape34AddressError
	}
	return ""
}

// StoreBMCConfig stores the power settings a commissioning script wrote to
// BMC_CONFIG_PATH ("power_type" and the parameters), as the region does at
// the end of enlistment: through its power-address validation, so the 3.4
// shape refuses an address with a scheme and keeps what it had. The error
// is the region's text.
func (s *Server) StoreBMCConfig(systemID string, config map[string]string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.machines[systemID]
	if !ok {
		return fmt.Errorf("maassim: no machine %q", systemID)
	}
	if text := s.addressError(config["power_type"], config); text != "" {
		return fmt.Errorf("maassim: storing the BMC config of %s: %s", systemID, text)
	}
	m.BMCConfig = maps.Clone(config)
	params := maps.Clone(config)
	delete(params, "power_type")
	s.setPower(m, config["power_type"], params)
	return nil
}

// Machine returns a copy of a machine's state; ok is false when unknown.
func (s *Server) Machine(systemID string) (m Machine, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	state, ok := s.machines[systemID]
	if !ok {
		return Machine{}, false
	}
	return s.view(state), true
}

// Pools returns the pool names in creation order.
func (s *Server) Pools() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, len(s.pools))
	for i, p := range s.pools {
		names[i] = p.Name
	}
	return names
}

// Requests returns the requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// Count is how many received requests match.
func (s *Server) Count(match Match) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.requests {
		if match.matches(r.Method, r.Path, r.Op) {
			n++
		}
	}
	return n
}

// ResetRequests forgets the recorded requests.
func (s *Server) ResetRequests() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = nil
	s.maxFlight = s.inFlight
}

// reply is a handler's answer: a status and a JSON value or a plain text.
type reply struct {
	status  int
	json    any
	text    string
	applied bool
}

func jsonReply(v any) reply { return reply{status: http.StatusOK, json: v} }

func textError(status int, text string) reply { return reply{status: status, text: text} }

// formError is MaaS's answer to an invalid form: 400 with field → messages.
func formError(field, message string) reply {
	return reply{status: http.StatusBadRequest, json: map[string][]string{field: {message}}}
}

const apiPrefix = "/MAAS/api/2.0/"

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	path, underAPI := strings.CutPrefix(r.URL.Path, apiPrefix)
	if err := parseForm(r); err != nil {
		s.write(w, r, path, "", textError(http.StatusBadRequest, "malformed form: "+err.Error()))
		return
	}
	op := r.URL.Query().Get("op")
	if op == "" {
		op = r.PostForm.Get("op")
	}
	if !underAPI {
		s.write(w, r, path, op, textError(http.StatusNotFound, "Not Found"))
		return
	}
	if r.Header.Get("Authorization") == "" && r.Method == http.MethodPost && path == "machines/" && op == "" {
		// MaaS's anonymous machines handler: enlistment needs no key.
		s.mu.Lock()
		rep := s.enlistAnonymously(r.PostForm)
		s.mu.Unlock()
		rep.applied = rep.status == http.StatusOK
		s.write(w, r, path, op, rep)
		return
	}
	admin, rep, ok := s.authenticate(r)
	if !ok {
		s.write(w, r, path, op, rep)
		return
	}
	if op == "power_parameters" && !admin {
		s.write(w, r, path, op, textError(http.StatusForbidden, "You do not have permission to perform this action."))
		return
	}

	s.mu.Lock()
	s.inFlight++
	s.maxFlight = max(s.maxFlight, s.inFlight)
	latency := s.latency
	var held *hold
	for _, h := range s.holds {
		if h.match.matches(r.Method, path, op) {
			held = h
			h.waiting++
			break
		}
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight--
		s.mu.Unlock()
	}()
	time.Sleep(latency)
	if held != nil {
		<-held.released
		s.mu.Lock()
		held.waiting--
		s.mu.Unlock()
	}
	s.mu.Lock()
	var hooks []func()
	for _, h := range s.hooks {
		if h.match.matches(r.Method, path, op) {
			hooks = append(hooks, h.before)
		}
	}
	s.mu.Unlock()
	for _, before := range hooks {
		before()
	}
	s.mu.Lock()
	fault := s.takeFault(r.Method, path, op)
	s.mu.Unlock()
	switch fault {
	case FaultServerError:
		s.write(w, r, path, op, textError(http.StatusServiceUnavailable, "Service Unavailable"))
		return
	case FaultConflict:
		s.write(w, r, path, op, textError(http.StatusConflict, "conflict injected by the simulator"))
		return
	case FaultAddressRejected:
		s.write(w, r, path, op, textError(http.StatusInternalServerError, Shape34AddressError))
		return
	case FaultMalformedJSON:
		s.record(r, path, op, http.StatusOK, false)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`[{"system_id": "`))
		return
	case FaultDropConnection:
		s.record(r, path, op, 0, false)
		drop(w)
		return
	}

	s.mu.Lock()
	rep = s.route(r, path, op)
	onCommission := s.onCommission
	s.mu.Unlock()
	rep.applied = rep.status >= 200 && rep.status <= 299
	if rep.applied && op == "commission" && onCommission != nil {
		onCommission(machinePath.FindStringSubmatch(path)[1])
	}
	if fault == FaultDropResponse {
		s.record(r, path, op, 0, rep.applied)
		drop(w)
		return
	}
	s.write(w, r, path, op, rep)
}

// parseForm reads a multipart or urlencoded body, as MaaS accepts both.
func parseForm(r *http.Request) error {
	if strings.HasPrefix(r.Header.Get("Content-Type"), "multipart/form-data") {
		return r.ParseMultipartForm(1 << 20)
	}
	return r.ParseForm()
}

func drop(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}

func (s *Server) takeFault(method, path, op string) Fault {
	for i, rule := range s.faults {
		if !rule.match.matches(method, path, op) {
			continue
		}
		if rule.remaining > 0 {
			rule.remaining--
			if rule.remaining == 0 {
				s.faults = slices.Delete(s.faults, i, i+1)
			}
		}
		return rule.fault
	}
	return 0
}

func (s *Server) record(r *http.Request, path, op string, status int, applied bool) {
	form := map[string]string{}
	for key, values := range r.PostForm {
		form[key] = values[0]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, Request{Method: r.Method, Path: path, Op: op, Form: form, StatusCode: status, Applied: applied})
}

func (s *Server) write(w http.ResponseWriter, r *http.Request, path, op string, rep reply) {
	s.record(r, path, op, rep.status, rep.applied)
	if rep.json != nil {
		body, err := json.Marshal(rep.json)
		if err != nil {
			rep = textError(http.StatusInternalServerError, "maassim: encoding reply: "+err.Error())
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(rep.status)
			_, _ = w.Write([]byte(rep.text))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rep.status)
		_, _ = w.Write(body)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(rep.status)
	_, _ = w.Write([]byte(rep.text))
}

// authenticate checks the OAuth 1.0 PLAINTEXT header as MaaS (piston) does,
// and tells whether the key is an admin's.
func (s *Server) authenticate(r *http.Request) (admin bool, rep reply, ok bool) {
	unauthorized := func(why string) (bool, reply, bool) {
		return false, textError(http.StatusUnauthorized, "Authorization Error: "+why), false
	}
	header, ok := strings.CutPrefix(r.Header.Get("Authorization"), "OAuth ")
	if !ok {
		return unauthorized("missing starting 'OAuth' from 'Authentication' header")
	}
	params := parseOAuthHeader(header)
	for _, name := range []string{"oauth_consumer_key", "oauth_token", "oauth_signature", "oauth_signature_method", "oauth_timestamp", "oauth_nonce"} {
		if params[name] == "" {
			return unauthorized(name + " is missing")
		}
	}
	timestamp, err := strconv.ParseInt(params["oauth_timestamp"], 10, 64)
	if err != nil {
		return false, textError(http.StatusBadRequest, "Bad Request: oauth_timestamp has an unexpected type"), false
	}
	if v := params["oauth_version"]; v != "" && v != "1.0" {
		return unauthorized("OAuth version " + v + " not supported")
	}
	if params["oauth_signature_method"] != "PLAINTEXT" {
		return unauthorized("Signature method " + params["oauth_signature_method"] + " not supported")
	}
	var key []string
	for _, candidate := range []string{APIKey, NonAdminAPIKey} {
		parts := strings.SplitN(candidate, ":", 3)
		if params["oauth_consumer_key"] == parts[0] && params["oauth_token"] == parts[1] {
			key, admin = parts, candidate == APIKey
		}
	}
	if key == nil {
		return unauthorized("Invalid API key.")
	}
	if params["oauth_signature"] != "&"+key[2] {
		return unauthorized("Invalid signature.")
	}
	now := time.Now().Unix()
	if lapsed := now - timestamp; lapsed > int64(TimestampWindow/time.Second) || -lapsed > int64(TimestampWindow/time.Second) {
		return unauthorized(fmt.Sprintf("Expired timestamp: given %d and now %d has a greater difference than threshold %d",
			timestamp, now, int64(TimestampWindow/time.Second)))
	}
	nonce := params["oauth_consumer_key"] + ":" + params["oauth_token"] + ":" + params["oauth_nonce"]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nonces[nonce] {
		return unauthorized("Nonce already used: " + params["oauth_nonce"])
	}
	s.nonces[nonce] = true
	return admin, reply{}, true
}

var oauthParam = regexp.MustCompile(`^\s*([a-z_]+)="([^"]*)"\s*$`)

// parseOAuthHeader reads `k="v", ...` pairs, percent-decoding the values.
func parseOAuthHeader(header string) map[string]string {
	params := map[string]string{}
	for part := range strings.SplitSeq(header, ",") {
		m := oauthParam.FindStringSubmatch(part)
		if m == nil {
			continue
		}
		value, err := percentDecode(m[2])
		if err != nil {
			continue
		}
		params[m[1]] = value
	}
	return params
}

func percentDecode(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("bad escape in %q", s)
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", err
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}

var (
	resultsPath = regexp.MustCompile(`^nodes/([^/]+)/results/current-commissioning/$`)
	machinePath = regexp.MustCompile(`^machines/([^/]+)/$`)
	poolPath    = regexp.MustCompile(`^resourcepool/([0-9]+)/$`)
)

// route dispatches like MaaS's OperationsHandler: by path, method and op.
// s.mu is held.
func (s *Server) route(r *http.Request, path, op string) reply {
	unrecognised := textError(http.StatusBadRequest, fmt.Sprintf("Unrecognised signature: method=%s op=%s", r.Method, opOrNone(op)))
	switch {
	case path == "machines/":
		switch {
		case r.Method == http.MethodGet && op == "":
			return jsonReply(s.machineList())
		case r.Method == http.MethodGet && op == "power_parameters":
			return jsonReply(s.bulkPowerParameters(r.URL.Query()["id"]))
		}
		return unrecognised
	case machinePath.MatchString(path):
		m, ok := s.machines[machinePath.FindStringSubmatch(path)[1]]
		if !ok {
			return textError(http.StatusNotFound, "No Machine matches the given query.")
		}
		switch {
		case r.Method == http.MethodGet && op == "":
			return jsonReply(s.machineJSON(m))
		case r.Method == http.MethodGet && op == "power_parameters":
			return jsonReply(s.view(m).PowerParameters)
		case r.Method == http.MethodPut && op == "":
			return s.updateMachine(m, r)
		case r.Method == http.MethodPost && op == "commission":
			return s.commission(m, r)
		}
		return unrecognised
	case resultsPath.MatchString(path) && r.Method == http.MethodGet && op == "":
		m, ok := s.machines[resultsPath.FindStringSubmatch(path)[1]]
		if !ok {
			return textError(http.StatusNotFound, "No Node matches the given query.")
		}
		return s.currentCommissioning(m, r.URL.Query())
	case path == "resourcepools/":
		switch {
		case r.Method == http.MethodGet && op == "":
			return jsonReply(slices.Clone(s.pools))
		case r.Method == http.MethodPost && op == "":
			return s.createPool(r)
		}
		return unrecognised
	case poolPath.MatchString(path):
		id, _ := strconv.Atoi(poolPath.FindStringSubmatch(path)[1])
		for _, p := range s.pools {
			if p.ID == id && r.Method == http.MethodGet && op == "" {
				return jsonReply(p)
			}
			if p.ID == id {
				return unrecognised
			}
		}
		return textError(http.StatusNotFound, "No ResourcePool matches the given query.")
	}
	return textError(http.StatusNotFound, "Not Found")
}

func opOrNone(op string) string {
	if op == "" {
		return "None"
	}
	return op
}

func (s *Server) sortedMachines() []*machineState {
	return slices.SortedFunc(maps.Values(s.machines), func(a, b *machineState) int { return cmp.Compare(a.SystemID, b.SystemID) })
}

func (s *Server) machineList() []map[string]any {
	list := []map[string]any{}
	for _, m := range s.sortedMachines() {
		list = append(list, s.machineJSON(m))
	}
	return list
}

// machineJSON renders a machine with the fields MaaS's machine handler
// shows that matter here; like MaaS, no power parameters.
func (s *Server) machineJSON(m *machineState) map[string]any {
	var hardwareUUID, bootInterface any
	if m.HardwareUUID != "" {
		hardwareUUID = m.HardwareUUID
	}
	interfaces := []map[string]any{}
	for i, mac := range m.MACs {
		iface := map[string]any{
			"id":           i + 1,
			"name":         fmt.Sprintf("eth%d", i),
			"type":         "physical",
			"enabled":      true,
			"mac_address":  mac,
			"resource_uri": fmt.Sprintf("/MAAS/api/2.0/nodes/%s/interfaces/%d/", m.SystemID, i+1),
		}
		interfaces = append(interfaces, iface)
		if i == 0 {
			bootInterface = iface
		}
	}
	return map[string]any{
		"hardware_uuid":  hardwareUUID,
		"interface_set":  interfaces,
		"boot_interface": bootInterface,
		"system_id":      m.SystemID,
		"hostname":       m.Hostname,
		"fqdn":           m.Hostname + ".maas",
		"status":         m.Status,
		"status_name":    statusName(m.Status),
		"power_type":     s.view(m).PowerType,
		"pool":           *s.pool(m.Pool),
		"resource_uri":   "/MAAS/api/2.0/machines/" + m.SystemID + "/",
	}
}

func statusName(status int) string {
	if name, ok := statusNames[status]; ok {
		return name
	}
	return "Status " + strconv.Itoa(status)
}

func (s *Server) bulkPowerParameters(ids []string) map[string]map[string]string {
	params := map[string]map[string]string{}
	for _, m := range s.machines {
		if len(ids) == 0 || slices.Contains(ids, m.SystemID) {
			params[m.SystemID] = s.view(m).PowerParameters
		}
	}
	return params
}

func (s *Server) pool(name string) *poolState {
	for i := range s.pools {
		if s.pools[i].Name == name {
			return &s.pools[i]
		}
	}
	return nil
}

// hostnameHolder is the system_id of the machine with that hostname, "device"
// for a device, "" when free. Hostnames are unique across all nodes.
func (s *Server) hostnameHolder(hostname string) string {
	for _, m := range s.machines {
		if m.Hostname == hostname {
			return m.SystemID
		}
	}
	if slices.Contains(s.devices, hostname) {
		return "device"
	}
	return ""
}

var hostLabel = regexp.MustCompile(`^[a-zA-Z0-9]([-a-zA-Z0-9]{0,61}[a-zA-Z0-9])?$`)

// validHostname applies MaaS's rule: a DNS name of labels of at most 63
// letters, digits and inner hyphens, 255 in all.
func validHostname(hostname string) bool {
	if len(hostname) > 255 {
		return false
	}
	for label := range strings.SplitSeq(hostname, ".") {
		if !hostLabel.MatchString(label) {
			return false
		}
	}
	return true
}

// updateMachine validates the whole form first and changes nothing unless
// all of it is valid, as a Django form does.
func (s *Server) updateMachine(m *machineState, r *http.Request) reply {
	form := r.PostForm
	hostname := form.Get("hostname")
	if form.Has("hostname") {
		if !validHostname(hostname) {
			return formError("hostname", fmt.Sprintf("Label contains disallowed characters: %q.", hostname))
		}
		if holder := s.hostnameHolder(hostname); holder != "" && holder != m.SystemID {
			return formError("hostname", "Node with this Hostname already exists.")
		}
	}
	if form.Has("pool") && s.pool(form.Get("pool")) == nil {
		return formError("pool", "Select a valid choice. That choice is not one of the available choices.")
	}
	if form.Has("power_type") && !slices.Contains(powerTypes, form.Get("power_type")) {
		return formError("power_type", fmt.Sprintf("Select a valid choice. %s is not one of the available choices.", form.Get("power_type")))
	}
	// A new power type takes only the form's parameters; the same type
	// merges them into the row's.
	current := s.view(m)
	powerType, params, powerChanged := current.PowerType, current.PowerParameters, false
	if form.Has("power_type") && form.Get("power_type") != powerType {
		powerType, params, powerChanged = form.Get("power_type"), map[string]string{}, true
	}
	for key, values := range form {
		if param, ok := strings.CutPrefix(key, "power_parameters_"); ok && param != "skip_check" {
			params[param], powerChanged = values[0], true
		}
	}
	if powerChanged {
		if rep, refused := s.powerRefused(m, powerType, params); refused {
			return rep
		}
	}

	if form.Has("hostname") {
		m.Hostname = hostname
	}
	if form.Has("pool") {
		m.Pool = form.Get("pool")
	}
	if powerChanged {
		s.setPower(m, powerType, params)
	}
	return jsonReply(s.machineJSON(m))
}

// NoImageError is the region's 400 text for a commission while it has no
// boot image.
const NoImageError = "No commissioning image is available: import boot images first."

func (s *Server) commission(m *machineState, r *http.Request) reply {
	if !slices.Contains(commissionable, m.Status) {
		return formError("__all__", "Commission is not available because of the current state of the node.")
	}
	if s.noImages {
		return formError("__all__", NoImageError)
	}
	skip := r.PostForm.Get("skip_bmc_config")
	m.skipBMCConfig = skip == "1" || strings.EqualFold(skip, "true")
	m.PreviousStatus, m.Status, m.enlisting = m.Status, StatusCommissioning, false
	// A new script set replaces the current one; MaaS marks the bmc-config
	// scripts of a commissioning with skip_bmc_config skipped at once,
	// so nothing can be posted for them in this set.
	m.Commissioning = []ScriptResult{}
	for _, name := range bmcConfigScripts {
		result := ScriptResult{Name: name, Status: ScriptPending}
		if m.skipBMCConfig {
			result = ScriptResult{Name: name, Status: ScriptSkipped, Stdout: SkippedBMCConfigOutput, Result: "status: skipped\n"}
		}
		m.Commissioning = append(m.Commissioning, result)
	}
	return jsonReply(s.machineJSON(m))
}

// bmcConfigScripts are the commissioning scripts tagged bmc-config: MaaS's
// own and virtmetal's.
var bmcConfigScripts = []string{maasBMCConfigScript, maasclient.BMCConfigScript}

// maasBMCConfigScript is MaaS's own bmc-config script (it skips VMs).
const maasBMCConfigScript = "30-maas-01-bmc-config"

// SkippedBMCConfigOutput is the stdout MaaS stores for a bmc-config script
// of a commissioning started with skip_bmc_config (its spelling).
const SkippedBMCConfigOutput = "INFO: User admin (1) has choosen to skip BMC configuration during commissioning\n"

// currentCommissioning answers GET nodes/{id}/results/current-commissioning/
// as MaaS 3.4 does (docs/maas-region.md, 2): 400 with the region's "Unknown
// id" text when the machine has no current commissioning set; else the set
// with its results, filtered (filters=a,b: a result's name, a tag of its
// script, or its id), each with its output base64 when include_output is
// given, whatever its value.
func (s *Server) currentCommissioning(m *machineState, query map[string][]string) reply {
	if m.Commissioning == nil {
		return textError(http.StatusBadRequest, fmt.Sprintf(UnknownSetError, "current-commissioning"))
	}
	var filters []string
	for _, f := range query["filters"] {
		filters = append(filters, strings.Split(f, ",")...)
	}
	_, withOutput := query["include_output"]
	results := []map[string]any{}
	setStatus := ScriptPassed
	for i, sr := range m.Commissioning {
		id := strconv.Itoa(i + 1)
		if sr.Status == ScriptPending || (sr.Status == ScriptFailed && setStatus != ScriptPending) {
			setStatus = sr.Status
		}
		if len(filters) > 0 && !slices.ContainsFunc(filters, func(f string) bool {
			return f == sr.Name || f == id || slices.Contains(scriptTags[sr.Name], f)
		}) {
			continue
		}
		result := map[string]any{
			"id": i + 1, "name": sr.Name, "status_name": scriptStatusNames[sr.Status],
			"status": scriptStatusCodes[sr.Status], "exit_status": sr.ExitStatus,
		}
		if withOutput {
			encode := func(text string) string { return base64.StdEncoding.EncodeToString([]byte(text)) }
			result["output"], result["stdout"], result["stderr"] = encode(sr.Stdout+sr.Stderr), encode(sr.Stdout), encode(sr.Stderr)
			result["result"] = encode(sr.Result)
		}
		results = append(results, result)
	}
	return jsonReply(map[string]any{
		"system_id": m.SystemID, "type": 0, "type_name": "Commissioning",
		"status": scriptStatusCodes[setStatus], "status_name": scriptStatusNames[setStatus],
		"results": results,
	})
}

// UnknownSetError is the region's 400 text for a script set id it does not
// know, which it also answers for a machine without a current set (%s is
// the id asked for).
const UnknownSetError = `Unknown id "%s" must be current-commissioning, current-testing, current-installation, or the id number of a specific result.`

// scriptStatusCodes are MaaS's SCRIPT_STATUS values, scriptStatusNames
// the names MaaS shows for them.
var (
	scriptStatusCodes = map[string]int{ScriptPending: 0, ScriptPassed: 2, ScriptFailed: 3, ScriptSkipped: 9}
	scriptStatusNames = map[string]string{ScriptPending: "Pending", ScriptPassed: "Passed", ScriptFailed: "Failed", ScriptSkipped: "Skipped"}
)

// scriptTags are the tags of the scripts the simulated region has, as
// filters match them; virtmetal's as deploy/maas uploads it.
var scriptTags = map[string][]string{
	maasBMCConfigScript:        {"bmc-config", "node"},
	maasclient.BMCConfigScript: {"bmc-config", "enlisting", "node"},
}

// enlistAnonymously is POST machines/ without a key, as MaaS's anonymous
// handler takes it from a booting machine's enlistment (docs/maas-region.md,
// 1): hostname, mac_addresses, power_type and power_parameters (JSON) are
// the caller's, validated as a PUT's are (empty Redfish credentials: 400);
// commission=true makes the machine Commissioning, enlisting, with a new
// current commissioning set, else it is New with none. Anything else
// (hardware_uuid, status, pool...) is ignored. A MAC of an existing
// machine that is New or Commissioning updates that machine's hostname and
// power settings instead (the parameters not given kept) and answers its
// system_id; of a machine in any other status, 400. s.mu is held.
func (s *Server) enlistAnonymously(form url.Values) reply {
	var macs []string
	for _, mac := range form["mac_addresses"] {
		if mac = maasclient.NormalizeMAC(mac); mac == "" {
			return formError("mac_addresses", "One or more MAC addresses is invalid.")
		}
		macs = append(macs, mac)
	}
	if len(macs) == 0 {
		return formError("mac_addresses", "This field is required.")
	}
	existing := s.machineWithMAC(macs)
	if existing != nil && existing.Status != StatusNew && existing.Status != StatusCommissioning {
		return formError("mac_addresses", fmt.Sprintf("MAC address %s already in use on %s.", macs[0], existing.Hostname))
	}
	hostname := form.Get("hostname")
	if hostname == "" && existing == nil {
		hostname = petname()
	}
	if hostname != "" {
		if !validHostname(hostname) {
			return formError("hostname", fmt.Sprintf("Label contains disallowed characters: %q.", hostname))
		}
		if holder := s.hostnameHolder(hostname); holder != "" && (existing == nil || holder != existing.SystemID) {
			return formError("hostname", "Node with this Hostname already exists.")
		}
	}
	powerType := cmp.Or(form.Get("power_type"), "manual")
	if !slices.Contains(powerTypes, powerType) {
		return formError("power_type", fmt.Sprintf("Select a valid choice. %s is not one of the available choices.", powerType))
	}
	params := map[string]string{}
	if raw := form.Get("power_parameters"); raw != "" {
		if err := json.Unmarshal([]byte(raw), &params); err != nil {
			return formError("power_parameters", "Enter a valid JSON object of strings.")
		}
	}
	if existing != nil {
		// The parameters not given are the machine's, as MaaS's power
		// form fills them in for a machine it updates. Seen for a PUT;
		// for this update by MAC only with every parameter given, so the
		// simulator takes the case that leaves the most behind.
		if current := s.view(existing); current.PowerType == powerType {
			for key, value := range current.PowerParameters {
				if _, given := params[key]; !given {
					params[key] = value
				}
			}
		}
	}
	if rep, refused := s.powerRefused(existing, powerType, params); refused {
		return rep
	}
	state := existing
	if state == nil {
		state = &machineState{Machine: Machine{SystemID: s.newSystemID(), Status: StatusNew, Pool: DefaultPool, MACs: macs}}
		if commission := form.Get("commission"); commission == "1" || strings.EqualFold(commission, "true") {
			state.Status, state.enlisting, state.Commissioning = StatusCommissioning, true, []ScriptResult{}
		}
		s.machines[state.SystemID] = state
	}
	if hostname != "" {
		state.Hostname = hostname
	}
	s.setPower(state, powerType, params)
	return jsonReply(s.machineJSON(state))
}

// machineWithMAC is the machine that has one of macs, nil when none has.
// s.mu is held.
func (s *Server) machineWithMAC(macs []string) *machineState {
	for _, m := range s.sortedMachines() {
		if slices.ContainsFunc(m.MACs, func(mac string) bool { return slices.Contains(macs, maasclient.NormalizeMAC(mac)) }) {
			return m
		}
	}
	return nil
}

// EnlistAnonymously is the anonymous POST machines/ (see enlistAnonymously)
// for a simulated enlistment runner in this process: the system_id, or
// the region's answer as an error.
func (s *Server) EnlistAnonymously(form url.Values) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rep := s.enlistAnonymously(form)
	if rep.status != http.StatusOK {
		body, _ := json.Marshal(rep.json)
		return "", &maasclient.APIError{Method: http.MethodPost, Path: "machines/", StatusCode: rep.status, Message: cmp.Or(rep.text, string(body))}
	}
	return rep.json.(map[string]any)["system_id"].(string), nil
}

// newSystemID is a system_id no machine has. s.mu is held.
func (s *Server) newSystemID() string {
	for n := len(s.machines) + 1; ; n++ {
		if id := fmt.Sprintf("m%05d", n); s.machines[id] == nil {
			return id
		}
	}
}

func (s *Server) createPool(r *http.Request) reply {
	name := r.PostForm.Get("name")
	if name == "" {
		return formError("name", "This field is required.")
	}
	if s.pool(name) != nil {
		return formError("name", "Resource pool with this Name already exists.")
	}
	p := newPool(s.nextPoolID, name, r.PostForm.Get("description"))
	s.nextPoolID++
	s.pools = append(s.pools, p)
	return jsonReply(p)
}

// Client returns a maas.Client for this server, authenticated with APIKey.
func (s *Server) Client(t TB) *maasclient.Client {
	t.Helper()
	key, err := maasclient.ParseAPIKey(APIKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := maasclient.NewClient(s.URL(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
