package redfish_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/redfish"
)

// receiver is an event destination on loopback that records what it is
// sent and answers with status.
type receiver struct {
	ts     *httptest.Server
	mu     sync.Mutex
	bodies []map[string]any
	auth   []string
	status int
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{status: http.StatusNoContent}
	r.ts = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		var body map[string]any
		_ = json.Unmarshal(b, &body)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.bodies = append(r.bodies, body)
		r.auth = append(r.auth, req.Header.Get("Authorization"))
		w.WriteHeader(r.status)
	}))
	t.Cleanup(r.ts.Close)
	return r
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
	waitUntil(t, func() bool { return len(r.messageKeys()) >= 3 })
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
	waitUntil(t, func() bool { return state() == "Disabled" })
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
	waitUntil(t, func() bool { return len(r.messageKeys()) > tries })
	if keys := r.messageKeys(); keys[len(keys)-1] != "Hello" {
		t.Errorf("after resuming: %v, want the test event only", keys[tries:])
	}
}
