package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/internal/promtest"
)

// eventReceiver is an event destination on loopback: it records the
// MessageIds it is sent and answers with status.
type eventReceiver struct {
	ts     *httptest.Server
	mu     sync.Mutex
	ids    []string
	status int
}

func newEventReceiver(t *testing.T) *eventReceiver {
	t.Helper()
	r := &eventReceiver{status: http.StatusNoContent}
	r.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var body struct {
			Events []struct {
				MessageID string `json:"MessageId"`
			}
		}
		_ = json.NewDecoder(req.Body).Decode(&body)
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, e := range body.Events {
			r.ids = append(r.ids, e.MessageID)
		}
		w.WriteHeader(r.status)
	}))
	t.Cleanup(r.ts.Close)
	return r
}

func (r *eventReceiver) received() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ids)
}

func (r *eventReceiver) answer(status int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status = status
}

var bmcEnv = map[string]string{"BMC_USERNAME": "maas", "BMC_PASSWORD": "s3cret"}

// subscribe POSTs a push subscription to destination, with the filter's
// properties added to the body.
func subscribe(t *testing.T, s *started, host, user, pass, destination, filter string) hostResponse {
	t.Helper()
	body := `{"Destination":"` + destination + `","Protocol":"Redfish"` + filter + `}`
	return doAtHost(t, insecureClient(), "POST", s.base+"/redfish/v1/EventService/Subscriptions", host, user, pass, body)
}

// eventMetrics reads the event metrics of a server run with
// --metrics-listen, through Prometheus's parser.
func eventMetrics(t *testing.T, s *started) (deliveries, subscriptions func(string) float64) {
	t.Helper()
	m := regexp.MustCompile(`Metrics at (http://\S+/metrics)`).FindStringSubmatch(s.stdout.String())
	if m == nil {
		t.Fatalf("no metrics address in %q", s.stdout.String())
	}
	scrape := func(name string, labels map[string]string) float64 {
		t.Helper()
		res, err := http.Get(m[1])
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		v, ok := promtest.Parse(t, strings.NewReader(string(body))).Value(name, labels)
		if !ok {
			t.Fatalf("no %s%v in\n%s", name, labels, body)
		}
		return v
	}
	deliveries = func(outcome string) float64 {
		return scrape("virtmetal_bmc_event_deliveries_total", map[string]string{"outcome": outcome})
	}
	subscriptions = func(state string) float64 {
		return scrape("virtmetal_bmc_event_subscriptions", map[string]string{"state": state})
	}
	return deliveries, subscriptions
}

func submitTestEvent(t *testing.T, s *started, host, user, pass, id string) {
	t.Helper()
	res := doAtHost(t, insecureClient(), "POST", s.base+"/redfish/v1/EventService/Actions/EventService.SubmitTestEvent", host, user, pass,
		`{"MessageId":"`+id+`"}`)
	if res.status/100 != 2 {
		t.Fatalf("SubmitTestEvent at %q: %d %s", host, res.status, res.body)
	}
}

// TestEventDestinationFlagsReachTheServer: what a subscription may name
// as its Destination follows --event-destinations-allow-loopback and
// --event-destinations-denied. Only loopback is ever sent anything: the
// one subscription to another address matches no event and is deleted at
// once.
func TestEventDestinationFlagsReachTheServer(t *testing.T) {
	r := newEventReceiver(t)
	const testNet = "http://192.0.2.7/events" // TEST-NET-1
	tests := []struct {
		name        string
		flags       []string
		destination string
		wantStatus  int
	}{
		{"loopback refused by default", nil, r.ts.URL, http.StatusBadRequest},
		{"loopback allowed", []string{"--event-destinations-allow-loopback"}, r.ts.URL, http.StatusCreated},
		{"loopback allowed=false", []string{"--event-destinations-allow-loopback=false"}, r.ts.URL, http.StatusBadRequest},
		{"a denied network", []string{"--event-destinations-denied", "10.244.0.0/16,192.0.2.0/24"}, testNet, http.StatusBadRequest},
		{"the same address, not denied", nil, testNet, http.StatusCreated},
		{"a denied network, loopback allowed", []string{"--event-destinations-allow-loopback", "--event-destinations-denied", "192.0.2.0/24"}, testNet, http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startServer(t, append([]string{"--listen", "127.0.0.1:0", "--insecure-http"}, tt.flags...), bmcEnv, fastTuning)
			res := subscribe(t, s, "", "maas", "s3cret", tt.destination, `,"MessageIds":["Test.1.0.NeverSent"]`)
			if res.status != tt.wantStatus {
				t.Fatalf("POST a subscription to %s: %d %s, want %d", tt.destination, res.status, res.body, tt.wantStatus)
			}
			if res.status == http.StatusBadRequest && !strings.Contains(string(res.body), "Destination") {
				t.Errorf("the refusal %s does not name the Destination", res.body)
			}
			if loc := res.header.Get("Location"); loc != "" {
				if del := doAtHost(t, insecureClient(), "DELETE", s.base+loc, "", "maas", "s3cret", ""); del.status/100 != 2 {
					t.Errorf("DELETE %s: %d %s", loc, del.status, del.body)
				}
			}
		})
	}
	if got := r.received(); len(got) != 0 {
		t.Errorf("the receiver was sent %v; no subscription asked for an event that was sent", got)
	}
}

// TestEventDeliveryMetrics: with loopback allowed, a SubmitTestEvent
// reaches a subscription's receiver, and --metrics-listen counts the
// delivery, then the failure when the receiver answers 503, and the
// subscription.
func TestEventDeliveryMetrics(t *testing.T) {
	r := newEventReceiver(t)
	s := startServer(t, []string{"--listen", "127.0.0.1:0", "--insecure-http", "--event-destinations-allow-loopback",
		"--metrics-listen", "127.0.0.1:0"}, bmcEnv, fastTuning)
	deliveries, subscriptions := eventMetrics(t, s)
	if d, f, e := deliveries("delivered"), deliveries("failed"), subscriptions("enabled"); d != 0 || f != 0 || e != 0 {
		t.Fatalf("before any subscription: %v delivered, %v failed, %v subscriptions", d, f, e)
	}
	if res := subscribe(t, s, "", "maas", "s3cret", r.ts.URL+"/events", ""); res.status != http.StatusCreated {
		t.Fatalf("POST a subscription to loopback: %d %s", res.status, res.body)
	}
	if got := subscriptions("enabled"); got != 1 {
		t.Errorf("subscriptions = %v, want 1", got)
	}
	submit := func(id string) { submitTestEvent(t, s, "", "maas", "s3cret", id) }
	submit("Test.1.0.Hello")
	poll.True(t, "the test event delivered", func() bool { return slices.Contains(r.received(), "Test.1.0.Hello") })
	poll.True(t, "the delivery counted", func() bool { return deliveries("delivered") == 1 })

	r.answer(http.StatusServiceUnavailable)
	submit("Test.1.0.Again")
	// The first try fails; the next waits for the default retry interval.
	poll.True(t, "the failed delivery counted", func() bool { return deliveries("failed") == 1 })
	if got := deliveries("delivered"); got != 1 {
		t.Errorf("delivered = %v after a failure, want still 1", got)
	}
	if got := deliveries("refused"); got != 0 {
		t.Errorf("refused = %v, want 0: loopback is allowed", got)
	}
}

// TestSharedEventSubscriptions: serving --vms-dir, the event destination
// flags reach every VM's service, and the metrics count the deliveries and
// the subscriptions of all the VMs.
func TestSharedEventSubscriptions(t *testing.T) {
	env := useAPIServer(t)
	// The package's API server outlives a run: -count=N must not meet the
	// previous run's namespace.
	namespace := "team-events-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := env.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		t.Fatal(err)
	}
	createVM(t, env.Client, namespace, "web1", "1f6c2a3e-1b2d-4c5e-8f90-a1b2c3d4e5f1", "02:00:00:00:02:01")
	createVM(t, env.Client, namespace, "web2", "1f6c2a3e-1b2d-4c5e-8f90-a1b2c3d4e5f2", "02:00:00:00:02:02")
	dir := t.TempDir()
	web1Host, web2Host := "web1."+namespace+".bmc.example.com", "web2."+namespace+".bmc.example.com"
	writeVMFile(t, dir, "web1", "maas-web1", "pw-web1", web1Host)
	writeVMFile(t, dir, "web2", "maas-web2", "pw-web2", web2Host)
	r := newEventReceiver(t)
	s := startServer(t, []string{"--backend", "kubevirt", "--namespace", namespace, "--vms-dir", dir, "--listen", "127.0.0.1:0", "--insecure-http",
		"--event-destinations-allow-loopback", "--event-destinations-denied", "192.0.2.0/24", "--metrics-listen", "127.0.0.1:0"}, nil, fastTuning)
	deliveries, subscriptions := eventMetrics(t, s)
	vms := []struct{ name, host, user, pass string }{
		{"web1", web1Host, "maas-web1", "pw-web1"},
		{"web2", web2Host, "maas-web2", "pw-web2"},
	}
	for _, vm := range vms {
		// Its test event only, whatever the VM's watcher tells meanwhile.
		filter := `,"MessageIds":["Test.1.0.` + vm.name + `"]`
		// 503 until the VM's cache has synced; a test event tells when.
		before := func() int {
			return doAtHost(t, insecureClient(), "POST", s.base+"/redfish/v1/EventService/Actions/EventService.SubmitTestEvent", vm.host, vm.user, vm.pass,
				`{"MessageId":"Test.1.0.Synced"}`).status
		}
		var status int
		poll.True(t, vm.name+"'s cache synced", func() bool {
			status = before()
			return status != http.StatusServiceUnavailable
		})
		if status/100 != 2 {
			t.Fatalf("SubmitTestEvent at %s's host: %d; stderr %s", vm.name, status, s.stderr.String())
		}
		res := subscribe(t, s, vm.host, vm.user, vm.pass, r.ts.URL+"/"+vm.name, filter)
		if res.status != http.StatusCreated {
			t.Fatalf("subscribing to loopback at %s's host: %d %s; stderr %s", vm.name, res.status, res.body, s.stderr.String())
		}
		if res := subscribe(t, s, vm.host, vm.user, vm.pass, "http://192.0.2.7/events", ""); res.status != http.StatusBadRequest {
			t.Errorf("subscribing to a denied network at %s's host: %d %s, want 400", vm.name, res.status, res.body)
		}
	}
	if got := subscriptions("enabled"); got != 2 {
		t.Errorf("subscriptions = %v, want 2, one per VM", got)
	}
	for i, vm := range vms {
		submitTestEvent(t, s, vm.host, vm.user, vm.pass, "Test.1.0."+vm.name)
		poll.True(t, vm.name+"'s test event delivered", func() bool { return slices.Contains(r.received(), "Test.1.0."+vm.name) })
		poll.True(t, vm.name+"'s delivery counted", func() bool { return deliveries("delivered") == float64(i+1) })
	}
	if got := r.received(); len(got) != 2 {
		t.Errorf("the receiver was sent %v, want each VM's test event once", got)
	}
}

// TestImageDestinationFlagsReachTheServer: InsertMedia's Image follows
// the same flags as event destinations, under their names and their
// former ones: the metadata service in any form, loopback unless allowed
// and a denied network are refused with a 400 before the backend is
// asked. Nothing is ever fetched: the memory backend fetches no image, and
// the loopback receiver is told of none.
func TestImageDestinationFlagsReachTheServer(t *testing.T) {
	r := newEventReceiver(t)
	const testNet = "http://192.0.2.7/boot.iso" // TEST-NET-1
	tests := []struct {
		name       string
		flags      []string
		image      string
		wantStatus int
	}{
		{"metadata", nil, "http://169.254.169.254/latest/meta-data/", http.StatusBadRequest},
		{"metadata through NAT64", nil, "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/", http.StatusBadRequest},
		{"metadata IPv4-mapped", nil, "http://[::ffff:169.254.169.254]/latest/meta-data/", http.StatusBadRequest},
		{"metadata 6to4", nil, "http://[2002:a9fe:a9fe::]/latest/meta-data/", http.StatusBadRequest},
		{"loopback refused by default", nil, r.ts.URL + "/boot.iso", http.StatusBadRequest},
		{"loopback allowed", []string{"--destinations-allow-loopback"}, r.ts.URL + "/boot.iso", http.StatusNoContent},
		{"a denied network", []string{"--destinations-denied", "10.244.0.0/16,192.0.2.0/24"}, testNet, http.StatusBadRequest},
		{"a denied network, former flag name", []string{"--event-destinations-denied", "192.0.2.0/24"}, testNet, http.StatusBadRequest},
		{"a denied network through NAT64", []string{"--destinations-denied", "192.0.2.0/24"}, "http://[64:ff9b::c000:207]/boot.iso", http.StatusBadRequest},
		{"the same address, not denied", nil, testNet, http.StatusNoContent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startServer(t, append([]string{"--listen", "127.0.0.1:0", "--insecure-http"}, tt.flags...), bmcEnv, fastTuning)
			res := doAtHost(t, insecureClient(), "POST", s.base+"/redfish/v1/Systems/vm-0/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia", "", "maas", "s3cret",
				`{"Image":"`+tt.image+`"}`)
			if res.status != tt.wantStatus {
				t.Fatalf("InsertMedia %s: %d %s, want %d", tt.image, res.status, res.body, tt.wantStatus)
			}
			if res.status == http.StatusBadRequest && !strings.Contains(string(res.body), "ActionParameterValueNotInList") {
				t.Errorf("the refusal %s is not ActionParameterValueNotInList", res.body)
			}
			cd := doAtHost(t, insecureClient(), "GET", s.base+"/redfish/v1/Systems/vm-0/VirtualMedia/Cd", "", "maas", "s3cret", "")
			if inserted := strings.Contains(string(cd.body), `"Inserted":true`); inserted != (tt.wantStatus == http.StatusNoContent) {
				t.Errorf("after InsertMedia %s: %s", tt.image, cd.body)
			}
		})
	}
	if got := r.received(); len(got) != 0 {
		t.Errorf("the receiver was sent %v", got)
	}
}
