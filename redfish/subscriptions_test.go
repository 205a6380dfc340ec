package redfish_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/schemas"

	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/internal/ssetest"
	"github.com/virtmetal/virtmetal/redfish"
)

// receiver is an event destination on loopback that records what it is
// sent and answers with status; while gate is set, each request waits for
// it to close first.
type receiver struct {
	ts      *httptest.Server
	mu      sync.Mutex
	bodies  []map[string]any
	auth    []string
	headers []http.Header
	times   []time.Time
	status  int
	gate    chan struct{}
	// arrivals counts requests as they arrive, before the gate.
	arrivals atomic.Int32
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{status: http.StatusNoContent}
	r.ts = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		arrived := time.Now()
		r.arrivals.Add(1)
		r.mu.Lock()
		gate := r.gate
		r.mu.Unlock()
		if gate != nil {
			<-gate
		}
		b, _ := io.ReadAll(req.Body)
		var body map[string]any
		_ = json.Unmarshal(b, &body)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.bodies = append(r.bodies, body)
		r.auth = append(r.auth, req.Header.Get("Authorization"))
		r.headers = append(r.headers, req.Header.Clone())
		r.times = append(r.times, arrived)
		w.WriteHeader(r.status)
	}))
	t.Cleanup(r.ts.Close)
	return r
}

// records are the events received, each as its message key and the last
// segment of its origin ("ResourcePoweredOn vm-0", "Hello ").
func (r *receiver) records() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var got []string
	for _, b := range r.bodies {
		for _, e := range b["Events"].([]any) {
			e := e.(map[string]any)
			id := e["MessageId"].(string)
			origin, _ := lookup(e, "OriginOfCondition", "@odata.id").(string)
			got = append(got, id[strings.LastIndex(id, ".")+1:]+" "+origin[strings.LastIndex(origin, "/")+1:])
		}
	}
	return got
}

func (r *receiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.bodies)
}

func (r *receiver) messageKeys() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var keys []string
	for _, b := range r.bodies {
		for _, e := range b["Events"].([]any) {
			id := e.(map[string]any)["MessageId"].(string)
			keys = append(keys, id[strings.LastIndex(id, ".")+1:])
		}
	}
	return keys
}

func (r *receiver) setStatus(code int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status = code
}

func subscriptionFixture(t *testing.T, r *receiver) *eventsFixture {
	return newEventsFixture(t, func(c *redfish.Config) {
		c.EventDestinationsAllowLoopback = true
		c.EventDestinationRoots = r.ts.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
		c.EventDeliveryRetryAttempts = 2
		c.EventDeliveryRetryInterval = 20 * time.Millisecond
	})
}

// TestSubscriptionReceivesMaaSPowerSequence: MaaS's power_on, told to a
// push subscription in order, with its Context and headers.
func TestSubscriptionReceivesMaaSPowerSequence(t *testing.T) {
	r := newReceiver(t)
	f := subscriptionFixture(t, r)
	f.post(t, "/redfish/v1/EventService/Subscriptions", `{"Destination":"`+r.ts.URL+`/events","Protocol":"Redfish","Context":"rack 7",`+
		`"ResourceTypes":["ComputerSystem"],"HttpHeaders":[{"Authorization":"Bearer t0ken"}]}`)
	f.post(t, resetOf0, `{"ResetType":"ForceOff"}`)
	f.send(t, http.MethodPatch, sys0, `{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once"}}`)
	f.post(t, resetOf0, `{"ResetType":"On"}`)
	poll.True(t, "three events delivered", func() bool { return len(r.messageKeys()) >= 3 })
	keys := r.messageKeys()
	if keys[0] != "ResourceChanged" && keys[0] != "ResourcePoweredOff" {
		t.Errorf("first event %s", keys[0])
	}
	if !strings.Contains(strings.Join(keys, " "), "ResourcePoweredOn") {
		t.Errorf("events %v lack ResourcePoweredOn", keys)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bodies[0]["Context"] != "rack 7" || r.auth[0] != "Bearer t0ken" {
		t.Errorf("context %v, authorization %q", r.bodies[0]["Context"], r.auth[0])
	}
}

// TestDeadDestinationIsSuspended: a destination that fails every POST is
// tried 1+DeliveryRetryAttempts times, then the subscription is Disabled
// and sent nothing until it resumes.
func TestDeadDestinationIsSuspended(t *testing.T) {
	r := newReceiver(t)
	r.setStatus(http.StatusServiceUnavailable)
	f := subscriptionFixture(t, r)
	f.post(t, "/redfish/v1/EventService/Subscriptions", `{"Destination":"`+r.ts.URL+`/events","Protocol":"Redfish"}`)
	f.post(t, resetOf0, `{"ResetType":"On"}`)
	state := func() string {
		req, _ := http.NewRequest(http.MethodGet, f.ts.URL+"/redfish/v1/EventService/Subscriptions/1", nil)
		req.SetBasicAuth(adminUser, adminPass)
		resp, err := f.ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct{ Status struct{ State string } }
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return body.Status.State
	}
	poll.True(t, "the subscription Disabled", func() bool { return state() == "Disabled" })
	tries := len(r.messageKeys())
	if tries != 3 {
		t.Errorf("%d tries, want 1 + 2 retries", tries)
	}
	f.post(t, resetOf0, `{"ResetType":"ForceOff"}`)
	time.Sleep(100 * time.Millisecond)
	if n := len(r.messageKeys()); n != tries {
		t.Errorf("a suspended subscription was sent %d more events", n-tries)
	}
	r.setStatus(http.StatusOK)
	f.post(t, "/redfish/v1/EventService/Subscriptions/1/Actions/EventDestination.ResumeSubscription", `{}`)
	if state() != "Enabled" {
		t.Fatal("not resumed")
	}
	f.post(t, "/redfish/v1/EventService/Actions/EventService.SubmitTestEvent", `{"MessageId":"Test.1.0.Hello"}`)
	poll.True(t, "a delivery after resuming", func() bool { return len(r.messageKeys()) > tries })
	if keys := r.messageKeys(); keys[len(keys)-1] != "Hello" {
		t.Errorf("after resuming: %v, want the test event only", keys[tries:])
	}
}

const (
	subscriptionsURI = "/redfish/v1/EventService/Subscriptions"
	testEventURI     = "/redfish/v1/EventService/Actions/EventService.SubmitTestEvent"
	operator2User    = "operator2"
	operator2Pass    = "operator2-secret"
)

// answer is one response of the fixture's TLS server, its body decoded.
type answer struct {
	status int
	header http.Header
	body   map[string]any
}

// as sends a request with the given account's credentials.
func (f *eventsFixture) as(t *testing.T, user, pass, method, path, body string) answer {
	t.Helper()
	req, _ := http.NewRequest(method, f.ts.URL+path, strings.NewReader(body))
	req.SetBasicAuth(user, pass)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := f.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, header: resp.Header}
	_ = json.NewDecoder(resp.Body).Decode(&a.body)
	return a
}

func (f *eventsFixture) admin(t *testing.T, method, path, body string) answer {
	t.Helper()
	return f.as(t, adminUser, adminPass, method, path, body)
}

// subscribe POSTs a subscription as the administrator and returns its URI.
func (f *eventsFixture) subscribe(t *testing.T, body string) string {
	t.Helper()
	a := f.admin(t, http.MethodPost, subscriptionsURI, body)
	if a.status != http.StatusCreated || a.header.Get("Location") == "" {
		t.Fatalf("POST subscription: %d %v", a.status, a.body)
	}
	return a.header.Get("Location")
}

// testEvent submits a test event with this MessageId and, unless "", this
// OriginOfCondition.
func (f *eventsFixture) testEvent(t *testing.T, messageID, origin string) {
	t.Helper()
	body := `{"MessageId":"` + messageID + `"`
	if origin != "" {
		body += `,"OriginOfCondition":"` + origin + `"`
	}
	f.post(t, testEventURI, body+"}")
}

// members are the Subscriptions collection's member URIs.
func (f *eventsFixture) members(t *testing.T) []string {
	t.Helper()
	a := f.admin(t, http.MethodGet, subscriptionsURI, "")
	var uris []string
	for _, m := range a.body["Members"].([]any) {
		uris = append(uris, m.(map[string]any)["@odata.id"].(string))
	}
	return uris
}

// problems are an error body's messages, each as its message key and its
// first related property ("PropertyNotWritable #/Destination").
func problems(a answer) []string {
	infos, _ := lookup(a.body, "error", "@Message.ExtendedInfo").([]any)
	var got []string
	for _, info := range infos {
		m := info.(map[string]any)
		id, _ := m["MessageId"].(string)
		p := id[strings.LastIndex(id, ".")+1:]
		if related, _ := m["RelatedProperties"].([]any); len(related) > 0 {
			p += " " + related[0].(string)
		}
		got = append(got, p)
	}
	return got
}

// waitFor is poll.True with a description of what was seen instead.
func waitFor(t *testing.T, done func() bool, describe func() string) {
	t.Helper()
	poll.Until(t, "waiting", func() error {
		if done() {
			return nil
		}
		return errors.New(describe())
	})
}

// rolesFixture is a subscription fixture with an account of each role,
// and a second operator.
func rolesFixture(t *testing.T, r *receiver) *eventsFixture {
	return newEventsFixture(t, func(c *redfish.Config) {
		c.Accounts = append(c.Accounts,
			redfish.Account{Username: operatorUser, Password: operatorPass, Role: redfish.RoleOperator},
			redfish.Account{Username: operator2User, Password: operator2Pass, Role: redfish.RoleOperator},
			redfish.Account{Username: readerUser, Password: readerPass, Role: redfish.RoleReadOnly})
		c.EventDestinationsAllowLoopback = true
		c.EventDestinationRoots = r.ts.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	})
}

// TestSubscriptionFilters: a subscriber receives exactly the events its
// filter lets through, in the feed's order. Each case ends with a sentinel
// event its filter passes: since a subscription delivers in order, once
// the sentinel is in, every earlier event has been dealt with.
func TestSubscriptionFilters(t *testing.T) {
	const vm1 = "/redfish/v1/Systems/vm-1"
	powerOffVM1 := func(t *testing.T, f *eventsFixture) {
		f.post(t, vm1+"/Actions/ComputerSystem.Reset", `{"ResetType":"ForceOff"}`)
	}
	powerOnVM0 := func(t *testing.T, f *eventsFixture) { f.post(t, resetOf0, `{"ResetType":"On"}`) }
	eject := func(t *testing.T, f *eventsFixture) { f.post(t, sys0CD+"/Actions/VirtualMedia.EjectMedia", `{}`) }
	testEvent := func(id string) func(*testing.T, *eventsFixture) {
		return func(t *testing.T, f *eventsFixture) { f.testEvent(t, id, "") }
	}
	everything := []string{"ResourcePoweredOn vm-0", "Alpha vm-1", "ResourcePoweredOn vm-1", "Success ", "ResourceChanged Cd", "ResourcePoweredOff vm-0"}
	tests := []struct {
		name     string
		filter   string // the POST body's filter properties
		sentinel func(*testing.T, *eventsFixture)
		want     []string
	}{
		{"none", ``, powerOffVM1, append(everything, "ResourcePoweredOff vm-1")},
		{"RegistryPrefixes ResourceEvent", `"RegistryPrefixes":["ResourceEvent"]`, powerOffVM1,
			[]string{"ResourcePoweredOn vm-0", "ResourcePoweredOn vm-1", "ResourceChanged Cd", "ResourcePoweredOff vm-0", "ResourcePoweredOff vm-1"}},
		{"RegistryPrefixes Base", `"RegistryPrefixes":["Base"]`, testEvent("Base.1.19.Sentinel"), []string{"Success ", "Sentinel "}},
		{"MessageIds without version", `"MessageIds":["ResourceEvent.ResourcePoweredOn"]`, powerOnVM0,
			[]string{"ResourcePoweredOn vm-0", "ResourcePoweredOn vm-1", "ResourcePoweredOn vm-0"}},
		{"MessageIds with version", `"MessageIds":["ResourceEvent.1.3.0.ResourcePoweredOff","Test.1.0.Alpha"]`, powerOffVM1,
			[]string{"Alpha vm-1", "ResourcePoweredOff vm-0", "ResourcePoweredOff vm-1"}},
		// The schema: "the MessageId major and minor version details
		// should be ignored".
		{"MessageIds with another version", `"MessageIds":["ResourceEvent.1.3.ResourcePoweredOff","Test.1.1.Alpha"]`, powerOffVM1,
			[]string{"Alpha vm-1", "ResourcePoweredOff vm-0", "ResourcePoweredOff vm-1"}},
		{"ExcludeMessageIds with another version", `"ExcludeMessageIds":["ResourceEvent.1.0.ResourcePoweredOn","Test.2.0.0.Alpha"]`, powerOffVM1,
			[]string{"Success ", "ResourceChanged Cd", "ResourcePoweredOff vm-0", "ResourcePoweredOff vm-1"}},
		{"ResourceTypes VirtualMedia", `"ResourceTypes":["VirtualMedia"]`, eject, []string{"ResourceChanged Cd", "ResourceChanged Cd"}},
		{"ResourceTypes ComputerSystem", `"ResourceTypes":["ComputerSystem"]`, powerOffVM1,
			[]string{"ResourcePoweredOn vm-0", "ResourcePoweredOn vm-1", "ResourcePoweredOff vm-0", "ResourcePoweredOff vm-1"}},
		{"OriginResources", `"OriginResources":[{"@odata.id":"/redfish/v1/Systems/vm-1/"}]`, powerOffVM1,
			[]string{"Alpha vm-1", "ResourcePoweredOn vm-1", "ResourcePoweredOff vm-1"}},
		{"ExcludeMessageIds", `"ExcludeMessageIds":["ResourceEvent.ResourcePoweredOn","Test.1.0.Alpha"]`, powerOffVM1,
			[]string{"Success ", "ResourceChanged Cd", "ResourcePoweredOff vm-0", "ResourcePoweredOff vm-1"}},
		{"ExcludeRegistryPrefixes", `"ExcludeRegistryPrefixes":["ResourceEvent"]`, testEvent("Test.1.0.Sentinel"),
			[]string{"Alpha vm-1", "Success ", "Sentinel "}},
		{"all together", `"RegistryPrefixes":["ResourceEvent"],"ExcludeMessageIds":["ResourceEvent.1.0.0.ResourceChanged"],` +
			`"OriginResources":[{"@odata.id":"/redfish/v1/Systems/vm-0"}]`, powerOnVM0,
			[]string{"ResourcePoweredOn vm-0", "ResourcePoweredOff vm-0", "ResourcePoweredOn vm-0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newReceiver(t)
			f := subscriptionFixture(t, r)
			body := `{"Destination":"` + r.ts.URL + `","Protocol":"Redfish"`
			if tt.filter != "" {
				body += "," + tt.filter
			}
			f.subscribe(t, body+"}")
			f.post(t, resetOf0, `{"ResetType":"On"}`)
			f.testEvent(t, "Test.1.0.Alpha", vm1)
			f.post(t, vm1+"/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`)
			f.testEvent(t, "Base.1.19.Success", "")
			f.post(t, sys0CD+"/Actions/VirtualMedia.InsertMedia", `{"Image":"https://images.example/live.iso"}`)
			f.post(t, resetOf0, `{"ResetType":"ForceOff"}`)
			tt.sentinel(t, f)
			last := tt.want[len(tt.want)-1]
			waitFor(t, func() bool { got := r.records(); return len(got) >= len(tt.want) && got[len(got)-1] == last },
				func() string { return fmt.Sprintf("received %v, want %v", r.records(), tt.want) })
			if got := r.records(); strings.Join(got, ", ") != strings.Join(tt.want, ", ") {
				t.Errorf("received\n  %v\nwant\n  %v", got, tt.want)
			}
		})
	}
}

// TestSubscriptionDestinationRefused: a POST whose Destination the service
// would never send to, or cannot use, is a 400 that names Destination;
// a name (even one that resolves to loopback) is accepted, as its
// addresses are checked when a delivery connects.
func TestSubscriptionDestinationRefused(t *testing.T) {
	f := newFixture(t, func(c *redfish.Config, _ *stubBackend) {
		c.EventDestinationsDenied = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}
	})
	t.Cleanup(f.server.StopEventStreams)
	tests := []struct {
		destination string
		want        string // the message key, "" for accepted
	}{
		{"http://169.254.10.20/events", "PropertyValueNotInList"},
		{"http://[fe80::1]/events", "PropertyValueNotInList"},
		{"http://[fe80::1%25eth0]/events", "PropertyValueNotInList"},
		{"http://169.254.169.254/latest/meta-data", "PropertyValueNotInList"},
		{"http://[fd00:ec2::254]/latest", "PropertyValueNotInList"},
		{"http://100.100.100.200/latest", "PropertyValueNotInList"},
		{"https://127.0.0.1:8443/events", "PropertyValueNotInList"},
		{"https://127.9.9.9/events", "PropertyValueNotInList"},
		{"https://[::1]/events", "PropertyValueNotInList"},
		{"https://[::ffff:127.0.0.1]/events", "PropertyValueNotInList"},
		{"http://0.0.0.0/events", "PropertyValueNotInList"},
		{"http://224.0.0.1/events", "PropertyValueNotInList"},
		{"http://10.96.0.1/events", "PropertyValueNotInList"},
		{"http://10.111.255.254/events", "PropertyValueNotInList"},
		{"ftp://receiver.example/events", "PropertyValueNotInList"},
		{"gopher://receiver.example/", "PropertyValueNotInList"},
		{"file:///etc/passwd", "PropertyValueFormatError"},
		{"receiver.example/events", "PropertyValueFormatError"},
		{"https://user:secret@receiver.example/events", "PropertyValueFormatError"},
		{"https://user@receiver.example/events", "PropertyValueFormatError"},
		{"https://receiver.example/events#frag", "PropertyValueFormatError"},
		{"https://receiver.example/events", ""},
		{"http://10.112.0.1/events", ""}, // just outside the denied prefix
		{"https://localhost:8443/events", ""},
	}
	for _, tt := range tests {
		t.Run(tt.destination, func(t *testing.T) {
			res := f.do(asAdmin(http.MethodPost, subscriptionsURI, `{"Destination":"`+tt.destination+`","Protocol":"Redfish"}`))
			if tt.want == "" {
				if res.status != http.StatusCreated {
					t.Fatalf("status %d, want 201: %s", res.status, res.raw)
				}
				f.do(asAdmin(http.MethodDelete, res.header.Get("Location"), ""))
				return
			}
			got := problems(answer{status: res.status, body: res.json})
			if res.status != http.StatusBadRequest || len(got) != 1 || got[0] != tt.want+" #/Destination" {
				t.Fatalf("status %d, %v; want 400 [%s #/Destination]", res.status, got, tt.want)
			}
			if args, _ := lookup(res.json, "error", "@Message.ExtendedInfo").([]any)[0].(map[string]any)["MessageArgs"].([]any); len(args) != 2 || args[0] != tt.destination || args[1] != "Destination" {
				t.Errorf("MessageArgs %v", args)
			}
		})
	}
}

// deliveryObserver records the outcomes of deliveries.
type deliveryObserver struct {
	mu       sync.Mutex
	outcomes []string
}

func (o *deliveryObserver) ObserveRequest(string, string, int, time.Duration) {}

func (o *deliveryObserver) ObserveEventDelivery(outcome string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.outcomes = append(o.outcomes, outcome)
}

func (o *deliveryObserver) seen() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.outcomes...)
}

// TestLoopbackNameRefusedAtDial: a Destination named "localhost" passes
// the POST, but without EventDestinationsAllowLoopback no delivery ever
// connects to the loopback listener it names: each try is refused before
// the connection is made, and the subscription is suspended as for any
// destination that does not take its events.
func TestLoopbackNameRefusedAtDial(t *testing.T) {
	var connections atomic.Int32
	listener := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	listener.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			connections.Add(1)
		}
	}
	listener.Start()
	t.Cleanup(listener.Close)
	observer := &deliveryObserver{}
	f := newEventsFixture(t, func(c *redfish.Config) {
		c.Observer = observer
		c.EventDeliveryRetryAttempts = 1
		c.EventDeliveryRetryInterval = 10 * time.Millisecond
	})
	_, port, _ := net.SplitHostPort(listener.Listener.Addr().String())
	uri := f.subscribe(t, `{"Destination":"http://localhost:`+port+`/events","Protocol":"Redfish"}`)
	f.testEvent(t, "Test.1.0.Hello", "")
	waitFor(t, func() bool { return lookup(f.admin(t, http.MethodGet, uri, "").body, "Status", "State") == "Disabled" },
		func() string { return fmt.Sprintf("outcomes %v", observer.seen()) })
	if got := observer.seen(); strings.Join(got, " ") != "refused refused" {
		t.Errorf("outcomes %v, want two refused tries", got)
	}
	if n := connections.Load(); n != 0 {
		t.Errorf("the loopback listener got %d connections", n)
	}
}

// TestDeliveryRetryPolicies: what a destination that fails every POST does
// to the subscription, by its DeliveryRetryPolicy (SuspendRetries is
// TestDeadDestinationIsSuspended): TerminateAfterRetries deletes it after
// 1+DeliveryRetryAttempts tries; RetryForever keeps trying past them and
// stays Enabled.
func TestDeliveryRetryPolicies(t *testing.T) {
	t.Run("TerminateAfterRetries", func(t *testing.T) {
		r := newReceiver(t)
		r.setStatus(http.StatusInternalServerError)
		f := subscriptionFixture(t, r)
		uri := f.subscribe(t, `{"Destination":"`+r.ts.URL+`","Protocol":"Redfish","DeliveryRetryPolicy":"TerminateAfterRetries"}`)
		f.testEvent(t, "Test.1.0.Hello", "")
		waitFor(t, func() bool { return f.admin(t, http.MethodGet, uri, "").status == http.StatusNotFound },
			func() string { return fmt.Sprintf("%d tries and the subscription is still there", r.count()) })
		if n := r.count(); n != 3 {
			t.Errorf("%d tries, want 1 + 2 retries", n)
		}
		if members := f.members(t); len(members) != 0 {
			t.Errorf("collection still holds %v", members)
		}
		if a := f.admin(t, http.MethodDelete, uri, ""); a.status != http.StatusNotFound {
			t.Errorf("DELETE of the terminated subscription: %d", a.status)
		}
	})
	t.Run("RetryForever", func(t *testing.T) {
		r := newReceiver(t)
		r.setStatus(http.StatusInternalServerError)
		f := subscriptionFixture(t, r)
		uri := f.subscribe(t, `{"Destination":"`+r.ts.URL+`","Protocol":"Redfish","DeliveryRetryPolicy":"RetryForever"}`)
		f.testEvent(t, "Test.1.0.Hello", "")
		waitFor(t, func() bool { return r.count() >= 6 }, func() string { return fmt.Sprintf("%d tries", r.count()) })
		if state := lookup(f.admin(t, http.MethodGet, uri, "").body, "Status", "State"); state != "Enabled" {
			t.Errorf("State %v after %d tries", state, r.count())
		}
		r.setStatus(http.StatusOK)
		f.testEvent(t, "Test.1.0.Next", "")
		// The event it retried is delivered at last, then the next.
		waitFor(t, func() bool { got := r.records(); return got[len(got)-1] == "Next " },
			func() string { return fmt.Sprint(r.records()) })
		if got := r.records(); got[len(got)-2] != "Hello " {
			t.Errorf("received %v", got)
		}
	})
}

// TestDeliveryBackoff: RetryForeverWithBackoff waits longer after each
// failed try, up to 32 times DeliveryRetryIntervalSeconds. The timer starts
// after the destination answered, so each gap between two arrivals is at
// least the wait; the bounds below hold whether the first wait is one or
// two intervals, and the cap is checked as "not doubled again", which
// only a delay of a whole capped wait could upset.
func TestDeliveryBackoff(t *testing.T) {
	const interval = 10 * time.Millisecond
	const capped = 32 * interval
	r := newReceiver(t)
	r.setStatus(http.StatusServiceUnavailable)
	f := newEventsFixture(t, func(c *redfish.Config) {
		c.EventDestinationsAllowLoopback = true
		c.EventDestinationRoots = r.ts.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
		c.EventDeliveryRetryInterval = interval
	})
	f.subscribe(t, `{"Destination":"`+r.ts.URL+`","Protocol":"Redfish","DeliveryRetryPolicy":"RetryForeverWithBackoff"}`)
	f.testEvent(t, "Test.1.0.Hello", "")
	const tries = 9
	waitFor(t, func() bool { return r.count() >= tries }, func() string { return fmt.Sprintf("%d tries", r.count()) })
	r.mu.Lock()
	times := append([]time.Time(nil), r.times[:tries]...)
	r.mu.Unlock()
	var gaps []time.Duration
	for i := 1; i < len(times); i++ {
		gaps = append(gaps, times[i].Sub(times[i-1]))
	}
	for i, gap := range gaps {
		if least := min(interval<<i, capped); gap < least {
			t.Errorf("wait %d: %v, want at least %v (waits %v)", i+1, gap, least, gaps)
		}
	}
	for i, gap := range gaps[6:] {
		if gap >= 2*capped {
			t.Errorf("wait %d: %v, past the cap of %v (waits %v)", i+7, gap, capped, gaps)
		}
	}
}

// TestSlowDestinationIsToldItLostEvents: while a destination holds one
// delivery, the feed goes on; the subscription falls behind, is dropped by
// the feed rather than queueing what it has not sent, and resumes from
// the feed's bounded history, telling the destination with
// EventBufferExceeded that events were lost before the ones it then gets.
// What the destination receives is bounded by the history, not by how
// many events happened meanwhile.
func TestSlowDestinationIsToldItLostEvents(t *testing.T) {
	const published = 1000
	r := newReceiver(t)
	gate := make(chan struct{})
	r.gate = gate
	release := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release) // before the receiver closes, which waits for its handlers
	f := subscriptionFixture(t, r)
	f.subscribe(t, `{"Destination":"`+r.ts.URL+`","Protocol":"Redfish","Context":"slow"}`)
	// Straight to the handler: a thousand requests over TLS would be slow.
	submit := func(i int) {
		req := httptest.NewRequest(http.MethodPost, testEventURI, strings.NewReader(fmt.Sprintf(`{"MessageId":"Test.1.0.E%d"}`, i)))
		req.SetBasicAuth(adminUser, adminPass)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		f.server.ServeHTTP(rec, req)
		if rec.Code != http.StatusNoContent {
			t.Fatalf("SubmitTestEvent: %d %s", rec.Code, rec.Body)
		}
	}
	submit(1)
	// The first delivery is held at the destination before the others come.
	waitFor(t, func() bool { return r.arrivals.Load() == 1 }, func() string { return "the first delivery did not arrive" })
	for i := 2; i <= published; i++ {
		submit(i)
	}
	release()
	last := fmt.Sprintf("E%d ", published)
	waitFor(t, func() bool { got := r.records(); return len(got) > 0 && got[len(got)-1] == last },
		func() string { return fmt.Sprintf("%d received", r.count()) })
	got := r.records()
	t.Logf("%d of %d events delivered, notice at %d", len(got), published, slices.Index(got, "EventBufferExceeded "))
	lost := slices.Index(got, "EventBufferExceeded ")
	if lost < 0 || slices.Contains(got[lost+1:], "EventBufferExceeded ") {
		t.Fatalf("%d received; EventBufferExceeded at %d, want once", len(got), lost)
	}
	// Before the notice, what was sent before the subscription was dropped;
	// after it, the history from some later event on: each run in order.
	number := func(rec string) int {
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(rec, "E"), " "))
		if err != nil {
			t.Fatalf("record %q", rec)
		}
		return n
	}
	for _, run := range [][]string{got[:lost], got[lost+1:]} {
		for i := 1; i < len(run); i++ {
			if number(run[i]) != number(run[i-1])+1 {
				t.Fatalf("%s follows %s: %v", run[i], run[i-1], got)
			}
		}
	}
	if number(got[0]) != 1 || number(got[lost+1]) <= number(got[lost-1])+1 {
		t.Errorf("no events lost where the notice is: %v", got)
	}
	// The feed keeps 256 events and lets a subscriber fall 64 behind.
	if len(got) > 1+64+1+256 {
		t.Errorf("%d of %d events delivered: deliveries were queued", len(got), published)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if body := r.bodies[lost]; body["Context"] != "slow" || body["Id"] == nil {
		t.Errorf("the notice %v lacks the subscription's Context", body)
	}
}

// TestPatchSubscription: PATCH changes Context, DeliveryRetryPolicy and
// VerifyCertificate; the rest of the subscription is fixed at creation
// (PropertyNotWritable), unknown properties and an empty body are refused,
// and a refused body changes nothing, even its valid parts.
func TestPatchSubscription(t *testing.T) {
	r := newReceiver(t)
	f := subscriptionFixture(t, r)
	uri := f.subscribe(t, `{"Destination":"`+r.ts.URL+`","Protocol":"Redfish","Context":"before"}`)
	tests := []struct {
		body string
		want []string       // problems; nil for 200
		then map[string]any // properties the GET after shows
	}{
		{`{"Context":"after"}`, nil, map[string]any{"Context": "after"}},
		{`{"DeliveryRetryPolicy":"RetryForever"}`, nil, map[string]any{"DeliveryRetryPolicy": "RetryForever"}},
		{`{"VerifyCertificate":false}`, nil, map[string]any{"VerifyCertificate": false}},
		{`{"Context":null,"VerifyCertificate":true,"DeliveryRetryPolicy":"TerminateAfterRetries"}`, nil,
			map[string]any{"Context": "", "VerifyCertificate": true, "DeliveryRetryPolicy": "TerminateAfterRetries"}},
		{`{"Destination":"https://other.example/","Context":"lost"}`, []string{"PropertyNotWritable #/Destination"}, map[string]any{"Context": "", "Destination": r.ts.URL}},
		{`{"HttpHeaders":[{"X-Token":"t"}]}`, []string{"PropertyNotWritable #/HttpHeaders"}, nil},
		{`{"RegistryPrefixes":["Base"]}`, []string{"PropertyNotWritable #/RegistryPrefixes"}, map[string]any{"RegistryPrefixes": []any{}}},
		{`{"MessageIds":["Test.1.0.Hello"]}`, []string{"PropertyNotWritable #/MessageIds"}, nil},
		{`{"ResourceTypes":["ComputerSystem"]}`, []string{"PropertyNotWritable #/ResourceTypes"}, nil},
		{`{"OriginResources":[{"@odata.id":"/redfish/v1/Systems/vm-0"}]}`, []string{"PropertyNotWritable #/OriginResources"}, nil},
		{`{"ExcludeMessageIds":["Test.1.0.Hello"]}`, []string{"PropertyNotWritable #/ExcludeMessageIds"}, nil},
		{`{"ExcludeRegistryPrefixes":["Base"]}`, []string{"PropertyNotWritable #/ExcludeRegistryPrefixes"}, nil},
		{`{"Protocol":"Redfish","SubscriptionType":"RedfishEvent"}`, []string{"PropertyNotWritable #/Protocol", "PropertyNotWritable #/SubscriptionType"}, nil},
		{`{"Id":"9","Status":{"State":"Disabled"}}`, []string{"PropertyNotWritable #/Id", "PropertyNotWritable #/Status"}, map[string]any{"Id": "1"}},
		{`{"Colour":"red"}`, []string{"PropertyUnknown #/Colour"}, nil},
		{`{"DeliveryRetryPolicy":"Sometimes"}`, []string{"PropertyValueNotInList #/DeliveryRetryPolicy"}, nil},
		{`{"VerifyCertificate":"no"}`, []string{"PropertyValueTypeError #/VerifyCertificate"}, map[string]any{"VerifyCertificate": true}},
		{`{}`, []string{"EmptyJSON"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.body, func(t *testing.T) {
			a := f.admin(t, http.MethodPatch, uri, tt.body)
			switch {
			case tt.want == nil && a.status != http.StatusOK:
				t.Fatalf("status %d: %v", a.status, a.body)
			case tt.want != nil && (a.status != http.StatusBadRequest || fmt.Sprint(problems(a)) != fmt.Sprint(tt.want)):
				t.Fatalf("status %d, %v; want 400 %v", a.status, problems(a), tt.want)
			}
			got := f.admin(t, http.MethodGet, uri, "").body
			for property, want := range tt.then {
				if fmt.Sprint(got[property]) != fmt.Sprint(want) {
					t.Errorf("%s is %v, want %v", property, got[property], want)
				}
			}
		})
	}
	t.Run("the Context patched is the one delivered", func(t *testing.T) {
		f.admin(t, http.MethodPatch, uri, `{"Context":"patched"}`)
		f.testEvent(t, "Test.1.0.Hello", "")
		waitFor(t, func() bool { return r.count() == 1 }, func() string { return fmt.Sprintf("%d received", r.count()) })
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.bodies[0]["Context"] != "patched" {
			t.Errorf("Context %v", r.bodies[0]["Context"])
		}
	})
	t.Run("an SSE member", func(t *testing.T) {
		stream, _ := openStream(t, f.ts, "", nil)
		if stream == nil {
			t.Fatal("no stream")
		}
		sse := sseMember(t, f)
		a := f.admin(t, http.MethodPatch, sse, `{"Context":"mine"}`)
		if a.status != http.StatusBadRequest || fmt.Sprint(problems(a)) != "[PropertyNotWritable #/Context]" {
			t.Errorf("status %d, %v", a.status, problems(a))
		}
	})
}

// sseMember waits for the one member of SubscriptionType SSE and returns
// its URI.
func sseMember(t *testing.T, f *eventsFixture) string {
	t.Helper()
	var found []string
	waitFor(t, func() bool {
		found = nil
		for _, m := range f.members(t) {
			if f.admin(t, http.MethodGet, m, "").body["SubscriptionType"] == "SSE" {
				found = append(found, m)
			}
		}
		return len(found) == 1
	}, func() string { return fmt.Sprintf("SSE members %v", found) })
	return found[0]
}

// TestSubscriptionOwners: creating a subscription takes
// ConfigureComponents; changing or deleting one takes ConfigureManager,
// except for the account that made it (the privilege registry's
// ConfigureSelf on EventDestination); anyone logged in may read them. An
// SSE stream's member belongs to the account that opened the stream.
func TestSubscriptionOwners(t *testing.T) {
	r := newReceiver(t)
	f := rolesFixture(t, r)
	create := func(user, pass string) string {
		t.Helper()
		a := f.as(t, user, pass, http.MethodPost, subscriptionsURI, `{"Destination":"`+r.ts.URL+`","Protocol":"Redfish"}`)
		if a.status != http.StatusCreated {
			t.Fatalf("%s: POST %d %v", user, a.status, a.body)
		}
		return a.header.Get("Location")
	}
	if a := f.as(t, readerUser, readerPass, http.MethodPost, subscriptionsURI, `{"Destination":"`+r.ts.URL+`","Protocol":"Redfish"}`); a.status != http.StatusForbidden ||
		fmt.Sprint(problems(a)) != "[InsufficientPrivilege]" {
		t.Errorf("reader's POST: %d %v, want 403 InsufficientPrivilege", a.status, problems(a))
	}
	admins, operators := create(adminUser, adminPass), create(operatorUser, operatorPass)
	stream, _ := ssetest.Open(t, f.ts.Client(), f.ts.URL+"/redfish/v1/EventService/SSE", readerUser, readerPass, nil)
	if stream == nil {
		t.Fatal("reader's stream refused")
	}
	readers := sseMember(t, f)
	type attempt struct {
		user, pass string
		method     string
		path       string
		body       string
		want       int
	}
	suspend := "/Actions/EventDestination.SuspendSubscription"
	resume := "/Actions/EventDestination.ResumeSubscription"
	// In order: the successful DELETEs come last.
	for _, tt := range []attempt{
		{readerUser, readerPass, http.MethodGet, operators, "", http.StatusOK},
		{readerUser, readerPass, http.MethodPatch, operators, `{"Context":"x"}`, http.StatusForbidden},
		{readerUser, readerPass, http.MethodDelete, operators, "", http.StatusForbidden},
		{readerUser, readerPass, http.MethodPost, operators + suspend, `{}`, http.StatusForbidden},
		{readerUser, readerPass, http.MethodPatch, admins, `{"Context":"x"}`, http.StatusForbidden},
		{readerUser, readerPass, http.MethodDelete, admins, "", http.StatusForbidden},
		{operator2User, operator2Pass, http.MethodPatch, operators, `{"Context":"x"}`, http.StatusForbidden},
		{operator2User, operator2Pass, http.MethodDelete, operators, "", http.StatusForbidden},
		{operator2User, operator2Pass, http.MethodPost, operators + resume, `{}`, http.StatusForbidden},
		{operatorUser, operatorPass, http.MethodPatch, admins, `{"Context":"x"}`, http.StatusForbidden},
		{operatorUser, operatorPass, http.MethodDelete, admins, "", http.StatusForbidden},
		{operatorUser, operatorPass, http.MethodDelete, readers, "", http.StatusForbidden},
		{operatorUser, operatorPass, http.MethodPatch, operators, `{"Context":"mine"}`, http.StatusOK},
		{operatorUser, operatorPass, http.MethodPost, operators + suspend, `{}`, http.StatusNoContent},
		{operatorUser, operatorPass, http.MethodPost, operators + resume, `{}`, http.StatusNoContent},
		{adminUser, adminPass, http.MethodPatch, operators, `{"Context":"admin's"}`, http.StatusOK},
		{operatorUser, operatorPass, http.MethodDelete, operators, "", http.StatusNoContent},
		{readerUser, readerPass, http.MethodDelete, readers, "", http.StatusNoContent},
		{adminUser, adminPass, http.MethodDelete, create(operator2User, operator2Pass), "", http.StatusNoContent},
		{adminUser, adminPass, http.MethodDelete, admins, "", http.StatusNoContent},
	} {
		a := f.as(t, tt.user, tt.pass, tt.method, tt.path, tt.body)
		if a.status != tt.want {
			t.Errorf("%s %s %s: %d %v, want %d", tt.user, tt.method, tt.path, a.status, problems(a), tt.want)
		}
		if tt.want == http.StatusForbidden && fmt.Sprint(problems(a)) != "[InsufficientPrivilege]" {
			t.Errorf("%s %s %s: %v, want InsufficientPrivilege", tt.user, tt.method, tt.path, problems(a))
		}
	}
	if members := f.members(t); len(members) != 0 {
		t.Errorf("members left: %v", members)
	}
}

// TestSubscriptionLimit: the MaxEventSubscriptions+1-th push subscription
// is a 503 EventSubscriptionLimitExceeded with Retry-After; SSE streams,
// members too, do not count; a deleted subscription frees its place.
func TestSubscriptionLimit(t *testing.T) {
	r := newReceiver(t)
	f := newEventsFixture(t, func(c *redfish.Config) {
		c.EventDestinationsAllowLoopback = true
		c.MaxEventSubscriptions = 2
		c.RetryAfter = 7 * time.Second
	})
	for range 2 {
		if stream, resp := openStream(t, f.ts, "", nil); stream == nil {
			t.Fatalf("stream: %d", resp.StatusCode)
		}
	}
	waitFor(t, func() bool { return len(f.members(t)) == 2 }, func() string { return fmt.Sprint(f.members(t)) })
	body := `{"Destination":"` + r.ts.URL + `","Protocol":"Redfish"}`
	first := f.subscribe(t, body)
	f.subscribe(t, body)
	for _, path := range []string{subscriptionsURI, subscriptionsURI + "/Members"} {
		a := f.admin(t, http.MethodPost, path, body)
		if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") != "7" || fmt.Sprint(problems(a)) != "[EventSubscriptionLimitExceeded]" {
			t.Errorf("POST %s past the limit: %d, Retry-After %q, %v", path, a.status, a.header.Get("Retry-After"), problems(a))
		}
	}
	if n := len(f.members(t)); n != 4 {
		t.Errorf("%d members, want 2 streams and 2 subscriptions", n)
	}
	// Another stream still opens: the limit is the push subscriptions'.
	if stream, resp := openStream(t, f.ts, "", nil); stream == nil {
		t.Errorf("a stream at the subscription limit: %d", resp.StatusCode)
	}
	f.send(t, http.MethodDelete, first, "")
	f.subscribe(t, body)
}

// TestSSEMember: an open SSE stream is a member of SubscriptionType SSE
// that says nothing of its client; closing the stream removes it, and
// deleting it ends the stream.
func TestSSEMember(t *testing.T) {
	f := newEventsFixture(t, nil)
	stream, _ := openStream(t, f.ts, "", nil)
	uri := sseMember(t, f)
	body := f.admin(t, http.MethodGet, uri, "").body
	if body["SubscriptionType"] != "SSE" || body["Protocol"] != "Redfish" || len(body["Context"].(string)) != 32 || body["Destination"] != nil {
		t.Errorf("SSE member %v", body)
	}
	if a := f.admin(t, http.MethodPost, uri+"/Actions/EventDestination.SuspendSubscription", `{}`); a.status != http.StatusBadRequest ||
		fmt.Sprint(problems(a)) != "[ActionNotSupported]" {
		t.Errorf("suspending an SSE member: %d %v", a.status, problems(a))
	}
	stream.Response.Body.Close()
	waitFor(t, func() bool { return len(f.members(t)) == 0 }, func() string { return fmt.Sprintf("members %v after the stream closed", f.members(t)) })
	if a := f.admin(t, http.MethodGet, uri, ""); a.status != http.StatusNotFound {
		t.Errorf("GET of a closed stream's member: %d", a.status)
	}

	stream, _ = openStream(t, f.ts, "", nil)
	uri = sseMember(t, f)
	if a := f.admin(t, http.MethodDelete, uri, ""); a.status != http.StatusNoContent {
		t.Fatalf("DELETE: %d %v", a.status, a.body)
	}
	timeout := time.After(10 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-stream.Events:
		case <-timeout:
			t.Fatal("the stream goes on after its member was deleted")
		}
	}
	waitFor(t, func() bool { return f.server.EventStreams() == 0 }, func() string { return "the stream is still counted" })
	if members := f.members(t); len(members) != 0 {
		t.Errorf("members %v", members)
	}
}

// TestSubscriptionHttpHeaders: HttpHeaders, as the schema's array or as
// gofish's single object, go with every event and are never shown; the
// headers that frame or route the request are refused, as are malformed
// names and values.
func TestSubscriptionHttpHeaders(t *testing.T) {
	for _, tt := range []struct{ name, headers string }{
		{"array", `[{"X-Api-Key":"k1"},{"Authorization":"Bearer b"}]`},
		{"object", `{"X-Api-Key":"k1","Authorization":"Bearer b"}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newReceiver(t)
			f := subscriptionFixture(t, r)
			uri := f.subscribe(t, `{"Destination":"`+r.ts.URL+`","Protocol":"Redfish","HttpHeaders":`+tt.headers+`}`)
			if shown := f.admin(t, http.MethodGet, uri, "").body["HttpHeaders"]; fmt.Sprint(shown) != "[]" {
				t.Errorf("GET shows HttpHeaders %v", shown)
			}
			f.testEvent(t, "Test.1.0.Hello", "")
			waitFor(t, func() bool { return r.count() == 1 }, func() string { return fmt.Sprintf("%d received", r.count()) })
			r.mu.Lock()
			defer r.mu.Unlock()
			h := r.headers[0]
			if h.Get("X-Api-Key") != "k1" || h.Get("Authorization") != "Bearer b" || h.Get("Content-Type") != "application/json" {
				t.Errorf("headers sent %v", h)
			}
		})
	}

	f := newEventsFixture(t, nil)
	many := make([]string, 17)
	for i := range many {
		many[i] = fmt.Sprintf(`{"X-H%d":"v"}`, i)
	}
	for _, tt := range []struct{ headers, want string }{
		{`[{"Host":"internal.example"}]`, "PropertyValueNotInList #/HttpHeaders/0/Host"},
		{`[{"X-Ok":"1"},{"content-length":"5"}]`, "PropertyValueNotInList #/HttpHeaders/1/content-length"},
		{`{"Content-Type":"text/plain"}`, "PropertyValueNotInList #/HttpHeaders/0/Content-Type"},
		{`[{"Transfer-Encoding":"chunked"}]`, "PropertyValueNotInList #/HttpHeaders/0/Transfer-Encoding"},
		{`[{"Connection":"close"}]`, "PropertyValueNotInList #/HttpHeaders/0/Connection"},
		{`[{"TE":"trailers"}]`, "PropertyValueNotInList #/HttpHeaders/0/TE"},
		{`[{"Upgrade":"h2c"}]`, "PropertyValueNotInList #/HttpHeaders/0/Upgrade"},
		{`[{"Trailer":"X"}]`, "PropertyValueNotInList #/HttpHeaders/0/Trailer"},
		{`[{"Bad Name":"v"}]`, "PropertyValueFormatError #/HttpHeaders/0/Bad Name"},
		{`[{"X-Split":"a\r\nHost: evil"}]`, "PropertyValueFormatError #/HttpHeaders/0/X-Split"},
		{`[{"X-Number":5}]`, "PropertyValueTypeError #/HttpHeaders/0/X-Number"},
		{`"Authorization: x"`, "PropertyValueTypeError #/HttpHeaders"},
		{"[" + strings.Join(many, ",") + "]", "PropertyValueTypeError #/HttpHeaders"},
	} {
		t.Run(tt.headers, func(t *testing.T) {
			a := f.admin(t, http.MethodPost, subscriptionsURI, `{"Destination":"https://receiver.example/","Protocol":"Redfish","HttpHeaders":`+tt.headers+`}`)
			if a.status != http.StatusBadRequest || fmt.Sprint(problems(a)) != "["+tt.want+"]" {
				t.Errorf("status %d, %v; want 400 [%s]", a.status, problems(a), tt.want)
			}
		})
	}
	if members := f.members(t); len(members) != 0 {
		t.Errorf("refused POSTs made %v", members)
	}
}

// TestResumeDeliversBufferedEvents: ResumeSubscription with
// DeliverBufferedEventDuration delivers the events of the suspension
// newer than that duration, then the new ones; without it, only the new.
func TestResumeDeliversBufferedEvents(t *testing.T) {
	for _, tt := range []struct {
		params string
		want   []string
	}{
		{`{"DeliverBufferedEventDuration":"PT5M"}`, []string{"Recent ", "After "}},
		{`{"DeliverBufferedEventDuration":"PT1H"}`, []string{"Old ", "Recent ", "After "}},
		{`{"DeliverBufferedEventDuration":"P0D"}`, []string{"After "}},
		{`{}`, []string{"After "}},
	} {
		t.Run(tt.params, func(t *testing.T) {
			clock := newFakeClock()
			r := newReceiver(t)
			f := newEventsFixture(t, func(c *redfish.Config) {
				c.EventDestinationsAllowLoopback = true
				c.EventDestinationRoots = r.ts.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
				c.Now = clock.Now
			})
			uri := f.subscribe(t, `{"Destination":"`+r.ts.URL+`","Protocol":"Redfish"}`)
			f.post(t, uri+"/Actions/EventDestination.SuspendSubscription", `{}`)
			f.testEvent(t, "Test.1.0.Old", "")
			clock.Advance(10 * time.Minute)
			f.testEvent(t, "Test.1.0.Recent", "")
			clock.Advance(time.Minute)
			f.post(t, uri+"/Actions/EventDestination.ResumeSubscription", tt.params)
			f.testEvent(t, "Test.1.0.After", "")
			waitFor(t, func() bool { got := r.records(); return len(got) > 0 && got[len(got)-1] == "After " },
				func() string { return fmt.Sprint(r.records()) })
			if got := r.records(); fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("received %v, want %v", got, tt.want)
			}
		})
	}
	t.Run("malformed duration", func(t *testing.T) {
		f := newEventsFixture(t, nil)
		uri := f.subscribe(t, `{"Destination":"https://receiver.example/","Protocol":"Redfish"}`)
		for body, want := range map[string]string{
			`{"DeliverBufferedEventDuration":"5 minutes"}`: "ActionParameterValueFormatError",
			`{"DeliverBufferedEventDuration":"PT"}`:        "ActionParameterValueFormatError",
			`{"DeliverBufferedEventDuration":300}`:         "ActionParameterValueTypeError",
		} {
			if a := f.admin(t, http.MethodPost, uri+"/Actions/EventDestination.ResumeSubscription", body); a.status != http.StatusBadRequest || fmt.Sprint(problems(a)) != "["+want+"]" {
				t.Errorf("%s: %d %v, want 400 %s", body, a.status, problems(a), want)
			}
		}
	})
}

// TestGofishSubscription: gofish, as a client would use it, subscribes
// (its HttpHeaders are an object), lists the subscription, submits a
// test event that reaches the destination, and deletes the subscription.
func TestGofishSubscription(t *testing.T) {
	r := newReceiver(t)
	f := subscriptionFixture(t, r)
	client, err := gofish.Connect(gofish.ClientConfig{Endpoint: f.ts.URL, Username: adminUser, Password: adminPass, HTTPClient: f.ts.Client(), BasicAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Logout()
	service, err := client.Service.EventService()
	if err != nil {
		t.Fatal(err)
	}
	uri, err := service.CreateEventSubscriptionInstance(r.ts.URL+"/gofish", nil, nil, map[string]string{"X-Gofish": "yes"},
		schemas.RedfishEventDestinationProtocol, "from gofish", schemas.RetryForeverDeliveryRetryPolicy, nil)
	if err != nil {
		t.Fatal(err)
	}
	subscriptions, err := service.Subscriptions()
	if err != nil || len(subscriptions) != 1 || subscriptions[0].ODataID != uri {
		t.Fatalf("subscriptions %v, %v; want %s", subscriptions, err, uri)
	}
	sub := subscriptions[0]
	if sub.Destination != r.ts.URL+"/gofish" || sub.Context != "from gofish" || sub.DeliveryRetryPolicy != schemas.RetryForeverDeliveryRetryPolicy ||
		sub.SubscriptionType != schemas.RedfishEventSubscriptionType {
		t.Errorf("subscription %+v", sub)
	}
	if _, err := service.SubmitTestEvent(&schemas.EventServiceSubmitTestEventParameters{MessageID: "Gofish.1.0.Hello", Message: "hi"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return r.count() == 1 }, func() string { return fmt.Sprintf("%d received", r.count()) })
	r.mu.Lock()
	event, header := r.bodies[0], r.headers[0]
	r.mu.Unlock()
	if got := lookup(event, "Context"); got != "from gofish" || header.Get("X-Gofish") != "yes" {
		t.Errorf("Context %v, X-Gofish %q", got, header.Get("X-Gofish"))
	}
	if id := event["Events"].([]any)[0].(map[string]any)["MessageId"]; id != "Gofish.1.0.Hello" {
		t.Errorf("MessageId %v", id)
	}
	if err := service.DeleteEventSubscription(uri); err != nil {
		t.Fatal(err)
	}
	if subscriptions, err := service.Subscriptions(); err != nil || len(subscriptions) != 0 {
		t.Errorf("after DELETE: %v, %v", subscriptions, err)
	}
	if _, err := service.GetEventSubscription(uri); err == nil {
		t.Error("the deleted subscription is still there")
	}
}
