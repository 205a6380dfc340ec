package redfish_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/internal/ssetest"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

// openStream opens the SSE stream of ts as the administrator.
func openStream(t *testing.T, ts *httptest.Server, query string, header map[string]string) (*ssetest.Stream, *http.Response) {
	t.Helper()
	return ssetest.Open(t, ts.Client(), ts.URL+"/redfish/v1/EventService/SSE"+query, adminUser, adminPass, header)
}

// record is an event's MessageId and origin, space-separated.
func record(t *testing.T, e ssetest.Event) string {
	t.Helper()
	id, origin := e.Record(t)
	return id + " " + origin
}

// messageKey is an event's message key without registry and version
// ("ResourcePoweredOn") and the last segment of its origin ("vm-0").
func messageKey(t *testing.T, e ssetest.Event) (key, originLeaf string) {
	t.Helper()
	id, origin := e.Record(t)
	return id[strings.LastIndex(id, ".")+1:], origin[strings.LastIndex(origin, "/")+1:]
}

type eventsFixture struct {
	ts      *httptest.Server
	server  *redfish.Server
	backend *memory.Backend
}

func newEventsFixture(t *testing.T, tweak func(*redfish.Config)) *eventsFixture {
	t.Helper()
	backend := memory.New(memory.Options{Machines: 2})
	cfg := redfish.Config{
		Backend:             backend,
		Accounts:            []redfish.Account{{Username: adminUser, Password: adminPass, Role: redfish.RoleAdministrator}},
		Logger:              testr.New(t),
		EventPoll:           10 * time.Millisecond,
		DestinationResolver: imageHosts,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	srv, err := redfish.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Run(ctx) }()
	ts := httptest.NewTLSServer(srv)
	t.Cleanup(func() {
		srv.StopEventStreams()
		ts.Close()
		cancel()
		<-done
	})
	return &eventsFixture{ts: ts, server: srv, backend: backend}
}

func (f *eventsFixture) post(t *testing.T, path, body string) {
	t.Helper()
	f.send(t, http.MethodPost, path, body)
}

func (f *eventsFixture) send(t *testing.T, method, path, body string) {
	t.Helper()
	req, _ := http.NewRequest(method, f.ts.URL+path, strings.NewReader(body))
	req.SetBasicAuth(adminUser, adminPass)
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
}

const (
	sys0     = "/redfish/v1/Systems/vm-0"
	sys0CD   = sys0 + "/VirtualMedia/Cd"
	resetOf0 = sys0 + "/Actions/ComputerSystem.Reset"
)

// TestEventStreamTellsMaaSPowerSequence: the requests of MaaS's power_on
// (ForceOff, PXE once, On) arrive on the stream as events, in order, with
// the boot override's use by the power-on, each once; and a change made
// beside the service (straight on the machine) is reported too.
func TestEventStreamTellsMaaSPowerSequence(t *testing.T) {
	f := newEventsFixture(t, nil)
	f.post(t, resetOf0, `{"ResetType":"On"}`)
	stream, resp := openStream(t, f.ts, "", nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	f.post(t, resetOf0, `{"ResetType":"ForceOff"}`)
	f.send(t, http.MethodPatch, sys0, `{"Boot":{"BootSourceOverrideEnabled":"Once","BootSourceOverrideTarget":"Pxe"}}`)
	f.post(t, resetOf0, `{"ResetType":"On"}`)
	f.post(t, resetOf0, `{"ResetType":"On"}`) // already on: no event
	want := []string{
		"ResourceEvent.1.3.0.ResourcePoweredOff " + sys0,
		"ResourceEvent.1.0.0.ResourceChanged " + sys0, // PXE once set
		"ResourceEvent.1.3.0.ResourcePoweredOn " + sys0,
		"ResourceEvent.1.0.0.ResourceChanged " + sys0, // the override used up
	}
	var ids []string
	for i, w := range want {
		e := stream.Next(t, 5*time.Second)
		if got := record(t, e); got != w {
			t.Errorf("event %d: %s, want %s", i, got, w)
		}
		ids = append(ids, e.ID)
	}
	stream.Quiet(t, 200*time.Millisecond)
	if fmt.Sprint(ids) != "[2 3 4 5]" {
		t.Errorf("ids %v, want 2 to 5 (1 was before the stream opened)", ids)
	}
	// Beside the service: another BMC client or the cluster.
	if err := f.backend.Get("vm-1").InsertMedia(context.Background(), "https://images.example/live.iso"); err != nil {
		t.Fatal(err)
	}
	if got, want := record(t, stream.Next(t, 5*time.Second)), "ResourceEvent.1.0.0.ResourceChanged /redfish/v1/Systems/vm-1/VirtualMedia/Cd"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// TestEventStreamResumes: a client that comes back with Last-Event-ID gets
// what it missed, and is told when the history no longer holds it.
func TestEventStreamResumes(t *testing.T) {
	f := newEventsFixture(t, nil)
	f.post(t, resetOf0, `{"ResetType":"On"}`)       // 1
	f.post(t, resetOf0, `{"ResetType":"ForceOff"}`) // 2
	f.post(t, resetOf0, `{"ResetType":"On"}`)       // 3
	tests := []struct {
		name, lastEventID string
		want              []string
	}{
		{"missed two", "1", []string{"2 ResourcePoweredOff", "3 ResourcePoweredOn"}},
		{"missed none", "3", nil},
		{"unknown ID: told events were lost", "42", []string{" EventBufferExceeded"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stream, _ := openStream(t, f.ts, "", map[string]string{"Last-Event-ID": tt.lastEventID})
			var got []string
			for range tt.want {
				e := stream.Next(t, 5*time.Second)
				key, _ := messageKey(t, e)
				got = append(got, e.ID+" "+key)
			}
			stream.Quiet(t, 200*time.Millisecond)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// TestEventStreamFilters: $filter as DSP0266 writes it selects events;
// what it cannot parse is a 400 that names it.
func TestEventStreamFilters(t *testing.T) {
	tests := []struct {
		filter string
		want   []string // message keys and origins of the events passed
	}{
		{"MessageId eq 'ResourceEvent.1.3.0.ResourcePoweredOn'", []string{"ResourcePoweredOn vm-0", "ResourcePoweredOn vm-1"}},
		{"MessageId eq 'ResourceEvent.ResourcePoweredOff'", []string{"ResourcePoweredOff vm-0"}},
		{"OriginResource eq '/redfish/v1/Systems/vm-1'", []string{"ResourcePoweredOn vm-1"}},
		{"ResourceType eq 'VirtualMedia'", []string{"ResourceChanged Cd"}},
		{"RegistryPrefix eq 'ResourceEvent' and OriginResource eq '/redfish/v1/Systems/vm-1' or ResourceType eq VirtualMedia", []string{"ResourcePoweredOn vm-1", "ResourceChanged Cd"}},
		{"EventFormatType eq 'Event' and MessageId eq 'ResourceEvent.1.3.0.ResourcePoweredOff'", []string{"ResourcePoweredOff vm-0"}},
		{"EventFormatType eq MetricReport", nil},
	}
	for _, tt := range tests {
		t.Run(tt.filter, func(t *testing.T) {
			f := newEventsFixture(t, nil)
			stream, resp := openStream(t, f.ts, "?$filter="+url.QueryEscape(tt.filter), nil)
			if stream == nil {
				t.Fatalf("status %d", resp.StatusCode)
			}
			f.post(t, resetOf0, `{"ResetType":"On"}`)
			f.post(t, "/redfish/v1/Systems/vm-1/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`)
			f.post(t, resetOf0, `{"ResetType":"ForceOff"}`)
			f.post(t, sys0CD+"/Actions/VirtualMedia.InsertMedia", `{"Image":"https://images.example/live.iso"}`)
			var got []string
			for range tt.want {
				key, origin := messageKey(t, stream.Next(t, 5*time.Second))
				got = append(got, key+" "+origin)
			}
			stream.Quiet(t, 200*time.Millisecond)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}

	f := newEventsFixture(t, nil)
	for _, bad := range []string{"MessageId ne 'x'", "Severity eq 'OK'", "MessageId eq", "MessageId eq ''", "(MessageId eq 'x')"} {
		t.Run("refused "+bad, func(t *testing.T) {
			_, resp := openStream(t, f.ts, "?$filter="+url.QueryEscape(bad), nil)
			body := errorBody(t, resp)
			if resp.StatusCode != http.StatusBadRequest || !strings.HasSuffix(body.MessageID, ".QueryParameterValueFormatError") || body.Args[0] != bad {
				t.Errorf("status %d, %+v; want 400 QueryParameterValueFormatError naming the filter", resp.StatusCode, body)
			}
		})
	}
	t.Run("other query options stay unsupported", func(t *testing.T) {
		_, resp := openStream(t, f.ts, "?$top=1", nil)
		if body := errorBody(t, resp); resp.StatusCode != http.StatusNotImplemented || !strings.HasSuffix(body.MessageID, ".QueryParameterUnsupported") {
			t.Errorf("status %d, %+v", resp.StatusCode, body)
		}
	})
	for _, accept := range []string{"application/json", "text/html, application/json;q=0.9", "text/event-stream;q=0"} {
		t.Run("Accept "+accept, func(t *testing.T) {
			_, resp := openStream(t, f.ts, "", map[string]string{"Accept": accept})
			if body := errorBody(t, resp); resp.StatusCode != http.StatusNotAcceptable || !strings.HasSuffix(body.MessageID, ".HeaderInvalid") {
				t.Errorf("status %d, %+v; want 406 HeaderInvalid", resp.StatusCode, body)
			}
		})
	}
	for _, accept := range []string{"*/*", "text/*", "application/json, text/event-stream"} {
		t.Run("Accept "+accept, func(t *testing.T) {
			if stream, resp := openStream(t, f.ts, "", map[string]string{"Accept": accept}); stream == nil {
				t.Errorf("status %d, want a stream", resp.StatusCode)
			}
		})
	}
	t.Run("bad Last-Event-ID", func(t *testing.T) {
		_, resp := openStream(t, f.ts, "", map[string]string{"Last-Event-ID": "yesterday"})
		if body := errorBody(t, resp); resp.StatusCode != http.StatusBadRequest || !strings.HasSuffix(body.MessageID, ".HeaderInvalid") {
			t.Errorf("status %d, %+v", resp.StatusCode, body)
		}
	})
}

type extendedInfo struct {
	MessageID string
	Args      []string
}

func errorBody(t *testing.T, resp *http.Response) extendedInfo {
	t.Helper()
	defer resp.Body.Close()
	var body struct {
		Error struct {
			Info []struct {
				MessageId   string
				MessageArgs []string
			} `json:"@Message.ExtendedInfo"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || len(body.Error.Info) == 0 {
		t.Fatalf("status %d: no Redfish error body: %v", resp.StatusCode, err)
	}
	return extendedInfo{body.Error.Info[0].MessageId, append(body.Error.Info[0].MessageArgs, "")}
}

// TestEventStreamLimits: streams are bounded per client and in all, the
// refusal says so and when to retry, and a closed stream frees its place;
// without credentials there is no stream; an idle stream gets keep-alives;
// stopping the streams ends them.
func TestEventStreamLimits(t *testing.T) {
	f := newEventsFixture(t, func(c *redfish.Config) {
		c.MaxEventStreams, c.MaxEventStreamsPerSource = 3, 2
		c.EventKeepAlive = 20 * time.Millisecond
	})
	first, _ := openStream(t, f.ts, "", nil)
	second, _ := openStream(t, f.ts, "", nil)
	_, refused := openStream(t, f.ts, "", nil)
	body := errorBody(t, refused)
	if refused.StatusCode != http.StatusServiceUnavailable || refused.Header.Get("Retry-After") == "" || !strings.HasSuffix(body.MessageID, ".EventSubscriptionLimitExceeded") {
		t.Errorf("third stream of one client: %d %+v Retry-After %q", refused.StatusCode, body, refused.Header.Get("Retry-After"))
	}
	if f.server.EventStreams() != 2 {
		t.Errorf("%d streams open, want 2", f.server.EventStreams())
	}
	first.Response.Body.Close()
	poll.True(t, "one stream left", func() bool { return f.server.EventStreams() == 1 })
	if again, resp := openStream(t, f.ts, "", nil); again == nil {
		t.Errorf("a closed stream's place is not free: %d", resp.StatusCode)
	}

	// Keep-alives on an idle stream.
	comments := 0
	timeout := time.After(5 * time.Second)
	for comments < 3 {
		select {
		case e := <-second.Events:
			if e.Comment {
				comments++
			}
		case <-timeout:
			t.Fatalf("%d keep-alives in 5 s", comments)
		}
	}

	req, _ := http.NewRequest(http.MethodGet, f.ts.URL+"/redfish/v1/EventService/SSE", nil)
	resp, err := f.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("without credentials: %d, want 401", resp.StatusCode)
	}

	f.server.StopEventStreams()
	poll.True(t, "no stream left", func() bool { return f.server.EventStreams() == 0 })
	for range second.Events {
	}
}

// TestEventStreamsLoseNothingUnderResets: 100 clients stream while resets
// run; every client receives every event, in order.
func TestEventStreamsLoseNothingUnderResets(t *testing.T) {
	const clients, resets = 100, 40
	f := newEventsFixture(t, func(c *redfish.Config) { c.MaxEventStreams, c.MaxEventStreamsPerSource = clients, clients })
	streams := make([]*ssetest.Stream, clients)
	for i := range streams {
		streams[i], _ = openStream(t, f.ts, "", nil)
		if streams[i] == nil {
			t.Fatalf("stream %d refused", i)
		}
	}
	poll.True(t, "every client streaming", func() bool { return f.server.EventStreams() == clients })
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range resets {
			f.post(t, resetOf0, fmt.Sprintf(`{"ResetType":"%s"}`, []machine.ResetType{machine.ResetOn, machine.ResetForceOff}[i%2]))
		}
	})
	wg.Wait()
	for i, s := range streams {
		for n := 1; n <= resets; n++ {
			if e := s.Next(t, 5*time.Second); e.ID != fmt.Sprint(n) {
				t.Fatalf("client %d: event %q where %d was due", i, e.ID, n)
			}
		}
	}
}

// TestEventStreamEndsWithItsCredentials: a stream lasts only while what
// opened it would still be let in: a password rotated out (after its
// grace) or a deleted session ends it.
func TestEventStreamEndsWithItsCredentials(t *testing.T) {
	f := newEventsFixture(t, func(c *redfish.Config) { c.EventKeepAlive = 20 * time.Millisecond })
	// ended tells whether the stream ends within a second (keep-alives
	// arrive meanwhile).
	ended := func(s *ssetest.Stream) bool {
		timeout := time.After(time.Second)
		for {
			select {
			case _, open := <-s.Events:
				if !open {
					return true
				}
			case <-timeout:
				return false
			}
		}
	}

	t.Run("password rotated", func(t *testing.T) {
		stream, _ := openStream(t, f.ts, "", nil)
		if err := f.server.SetAccounts([]redfish.Account{{Username: adminUser, Password: "rotated-" + adminPass, Role: redfish.RoleAdministrator}}, time.Hour); err != nil {
			t.Fatal(err)
		}
		if ended(stream) {
			t.Fatal("the stream ended within the rotation's grace")
		}
		if err := f.server.SetAccounts([]redfish.Account{{Username: adminUser, Password: adminPass, Role: redfish.RoleAdministrator}}, 0); err != nil {
			t.Fatal(err)
		}
		again, _ := openStream(t, f.ts, "", nil) // with the password now current
		if err := f.server.SetAccounts([]redfish.Account{{Username: adminUser, Password: "other-" + adminPass, Role: redfish.RoleAdministrator}}, 0); err != nil {
			t.Fatal(err)
		}
		if !ended(again) {
			t.Error("a stream opened with a rotated-out password goes on")
		}
		if err := f.server.SetAccounts([]redfish.Account{{Username: adminUser, Password: adminPass, Role: redfish.RoleAdministrator}}, 0); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("session deleted", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, f.ts.URL+"/redfish/v1/SessionService/Sessions", strings.NewReader(`{"UserName":"`+adminUser+`","Password":"`+adminPass+`"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := f.ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		token, location := resp.Header.Get("X-Auth-Token"), resp.Header.Get("Location")
		if resp.StatusCode != http.StatusCreated || token == "" {
			t.Fatalf("session: %d", resp.StatusCode)
		}
		stream, resp := ssetest.Open(t, f.ts.Client(), f.ts.URL+"/redfish/v1/EventService/SSE", "", "", map[string]string{"X-Auth-Token": token})
		if stream == nil {
			t.Fatalf("stream with a session: %d", resp.StatusCode)
		}
		if ended(stream) {
			t.Fatal("the stream ended while its session lives")
		}
		f.send(t, http.MethodDelete, strings.TrimPrefix(location, f.ts.URL), "")
		if !ended(stream) {
			t.Error("the stream of a deleted session goes on")
		}
	})
}
