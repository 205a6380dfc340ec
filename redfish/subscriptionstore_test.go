package redfish_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

// bmcProcess is one run of a Redfish service on a backend that outlives
// it, as a bmc-server pod on its VM: stop it and start another on the same
// backend to restart the BMC.
type bmcProcess struct {
	ts   *httptest.Server
	stop func()
}

func startBMCProcess(t *testing.T, backend machine.Backend, r *receiver, allowLoopback bool) *bmcProcess {
	t.Helper()
	srv, err := redfish.NewServer(redfish.Config{
		Backend:                        backend,
		Accounts:                       []redfish.Account{{Username: adminUser, Password: adminPass, Role: redfish.RoleAdministrator}},
		Logger:                         testr.New(t),
		EventPoll:                      10 * time.Millisecond,
		RetryAfter:                     time.Second,
		EventDestinationsAllowLoopback: allowLoopback,
		EventDestinationRoots:          r.ts.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs,
		EventDeliveryRetryAttempts:     1,
		EventDeliveryRetryInterval:     20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Run(ctx) }()
	p := &bmcProcess{ts: httptest.NewTLSServer(srv)}
	stopped := false
	p.stop = func() {
		if stopped {
			return
		}
		stopped = true
		srv.StopEventStreams()
		p.ts.Close()
		cancel()
		<-done
	}
	t.Cleanup(p.stop)
	return p
}

// do sends a request and returns the status and the decoded body.
func (p *bmcProcess) do(t *testing.T, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, p.ts.URL+path, strings.NewReader(body))
	req.SetBasicAuth(adminUser, adminPass)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var decoded map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&decoded)
	return resp.StatusCode, decoded
}

func (p *bmcProcess) must(t *testing.T, want int, method, path, body string) map[string]any {
	t.Helper()
	got, decoded := p.do(t, method, path, body)
	if got != want {
		t.Fatalf("%s %s: %d, want %d: %v", method, path, got, want, decoded)
	}
	return decoded
}

func memberIDs(body map[string]any) []string {
	var ids []string
	members, _ := body["Members"].([]any)
	for _, m := range members {
		id := m.(map[string]any)["@odata.id"].(string)
		ids = append(ids, id[strings.LastIndex(id, "/")+1:])
	}
	return ids
}

// TestSubscriptionsSurviveARestart: push subscriptions, with what PATCH
// and SuspendSubscription made of them, are there again after the BMC
// restarts on the same backend, still deliver with their headers, and ids
// are never given twice.
func TestSubscriptionsSurviveARestart(t *testing.T) {
	r := newReceiver(t)
	backend := memory.New(memory.Options{})
	first := startBMCProcess(t, backend, r, true)
	create := func(p *bmcProcess, extra string) string {
		body := p.must(t, http.StatusCreated, http.MethodPost, subscriptionsURI,
			`{"Destination":"`+r.ts.URL+`/events","Protocol":"Redfish"`+extra+`}`)
		return body["Id"].(string)
	}
	kept := create(first, `,"Context":"rack 7","HttpHeaders":[{"Authorization":"Bearer t0ken"}],"ResourceTypes":["ComputerSystem"],"OriginResources":[{"@odata.id":"/redfish/v1/Systems/vm-0"}]`)
	suspended := create(first, `,"Context":"paused"`)
	deleted := create(first, "")
	first.must(t, http.StatusOK, http.MethodPatch, subscriptionsURI+"/"+kept, `{"Context":"rack 8","DeliveryRetryPolicy":"RetryForever"}`)
	first.must(t, http.StatusNoContent, http.MethodPost, subscriptionsURI+"/"+suspended+"/Actions/EventDestination.SuspendSubscription", `{}`)
	first.must(t, http.StatusNoContent, http.MethodDelete, subscriptionsURI+"/"+deleted, "")
	before := map[string]map[string]any{}
	for _, id := range []string{kept, suspended} {
		before[id] = first.must(t, http.StatusOK, http.MethodGet, subscriptionsURI+"/"+id, "")
	}
	first.stop()

	second := startBMCProcess(t, backend, r, true)
	if ids := memberIDs(second.must(t, http.StatusOK, http.MethodGet, subscriptionsURI, "")); strings.Join(ids, ",") != kept+","+suspended {
		t.Fatalf("after the restart the members are %v, want [%s %s]", ids, kept, suspended)
	}
	for id, want := range before {
		got := second.must(t, http.StatusOK, http.MethodGet, subscriptionsURI+"/"+id, "")
		delete(got, "@odata.etag")
		delete(want, "@odata.etag")
		if g, w := mustJSON(t, got), mustJSON(t, want); g != w {
			t.Errorf("subscription %s after the restart:\n%s\nbefore:\n%s", id, g, w)
		}
	}
	second.must(t, http.StatusNoContent, http.MethodPost, "/redfish/v1/Systems/vm-0/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`)
	poll.True(t, "an event delivered", func() bool { return len(r.messageKeys()) > 0 })
	r.mu.Lock()
	if r.bodies[0]["Context"] != "rack 8" || r.auth[0] != "Bearer t0ken" {
		t.Errorf("delivered after the restart with Context %v and Authorization %q, want rack 8 and the kept header", r.bodies[0]["Context"], r.auth[0])
	}
	r.mu.Unlock()
	if got := len(r.messageKeys()); got != 1 {
		// The suspended one would have made it 2.
		t.Errorf("%d deliveries of one reset, want 1: the suspended subscription must stay suspended", got)
	}
	if id := create(second, ""); id == kept || id == suspended || id == deleted {
		t.Errorf("a new subscription got id %s, which an earlier one had", id)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestKeptSubscriptionsMeetTodaysRules: a kept subscription whose
// destination the restarted BMC refuses (loopback no longer allowed) is
// dropped, not delivered to.
func TestKeptSubscriptionsMeetTodaysRules(t *testing.T) {
	r := newReceiver(t)
	backend := memory.New(memory.Options{})
	first := startBMCProcess(t, backend, r, true)
	first.must(t, http.StatusCreated, http.MethodPost, subscriptionsURI, `{"Destination":"`+r.ts.URL+`/events","Protocol":"Redfish"}`)
	first.stop()

	second := startBMCProcess(t, backend, r, false)
	if ids := memberIDs(second.must(t, http.StatusOK, http.MethodGet, subscriptionsURI, "")); len(ids) != 0 {
		t.Errorf("members %v, want none: loopback destinations are refused now", ids)
	}
}

// TestSubscriptionStoreFailures: while the store cannot be read the
// collection answers 503 (rather than an empty list that the next save
// would make true); a save that fails is retried until it is kept; a
// record of an unknown format is neither read nor overwritten.
func TestSubscriptionStoreFailures(t *testing.T) {
	r := newReceiver(t)
	unreachable := machine.Errorf(machine.ErrUnavailable, "store down")

	t.Run("unreadable store", func(t *testing.T) {
		backend := memory.New(memory.Options{})
		backend.SetStateFault(unreachable)
		p := startBMCProcess(t, backend, r, true)
		body := p.must(t, http.StatusServiceUnavailable, http.MethodGet, subscriptionsURI, "")
		if !strings.Contains(mustJSON(t, body), "ServiceTemporarilyUnavailable") {
			t.Errorf("503 body %v lacks ServiceTemporarilyUnavailable", body)
		}
		p.must(t, http.StatusServiceUnavailable, http.MethodPost, subscriptionsURI, `{"Destination":"`+r.ts.URL+`","Protocol":"Redfish"}`)
		backend.SetStateFault(nil)
		p.must(t, http.StatusOK, http.MethodGet, subscriptionsURI, "")
	})

	t.Run("failed save retried", func(t *testing.T) {
		backend := memory.New(memory.Options{})
		p := startBMCProcess(t, backend, r, true)
		p.must(t, http.StatusOK, http.MethodGet, subscriptionsURI, "")
		// The retries end with a save that succeeds; a later failure
		// starts them again.
		for _, context := range []string{"late", "later"} {
			backend.SetStateFault(unreachable)
			p.must(t, http.StatusCreated, http.MethodPost, subscriptionsURI, `{"Destination":"`+r.ts.URL+`","Protocol":"Redfish","Context":"`+context+`"}`)
			backend.SetStateFault(nil)
			poll.True(t, "subscription "+context+" saved once the store is back", func() bool {
				data, err := backend.LoadState(t.Context(), "redfish-subscriptions")
				return err == nil && strings.Contains(string(data), `"`+context+`"`)
			})
		}
	})

	t.Run("unknown format kept", func(t *testing.T) {
		backend := memory.New(memory.Options{})
		future := []byte(`{"version":99,"subscriptions":[{"id":"1"}]}`)
		if err := backend.SaveState(t.Context(), "redfish-subscriptions", future); err != nil {
			t.Fatal(err)
		}
		p := startBMCProcess(t, backend, r, true)
		p.must(t, http.StatusCreated, http.MethodPost, subscriptionsURI, `{"Destination":"`+r.ts.URL+`","Protocol":"Redfish"}`)
		data, err := backend.LoadState(t.Context(), "redfish-subscriptions")
		if err != nil || string(data) != string(future) {
			t.Errorf("the store holds %s, %v; want the record of the unknown format untouched", data, err)
		}
	})

	t.Run("backend without a store", func(t *testing.T) {
		p := startBMCProcess(t, statelessMemory{memory.New(memory.Options{})}, r, true)
		p.must(t, http.StatusCreated, http.MethodPost, subscriptionsURI, `{"Destination":"`+r.ts.URL+`","Protocol":"Redfish"}`)
		if ids := memberIDs(p.must(t, http.StatusOK, http.MethodGet, subscriptionsURI, "")); len(ids) != 1 {
			t.Errorf("members %v, want the one made: subscriptions work without a store, for the process's life", ids)
		}
	})
}

// statelessMemory is a memory backend that keeps no state.
type statelessMemory struct{ machine.Backend }
