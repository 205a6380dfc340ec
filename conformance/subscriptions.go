package conformance

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

// Event subscriptions (DSP0266 "Eventing"): with writes allowed, the suite
// opens an SSE stream and POSTs a push subscription to a receiver of its
// own before the crawl, so that both members of Subscriptions are walked
// and checked like every other resource; checkSubscriptions then reads the
// push member back, PATCHes its Context, submits a test event that both
// the receiver and the stream must get (each delivered body validated
// against its Event schema), refuses bad POSTs and unknown members with
// error bodies, and deletes the member.

const (
	defaultEventTimeout = 10 * time.Second
	// testMessageID is versioned, as the Event schema's MessageId pattern
	// and SubmitTestEvent's parameter pattern want.
	testMessageID = "Conformance.1.0.TestEvent"
	// noSuchSubscription names a member no service has.
	noSuchSubscription = "conformance-no-such-subscription"
)

// eventSources is what openEventSources set up, for the later steps.
type eventSources struct {
	subscriptionsPath string
	testEventTarget   string
	receiver          *eventReceiver
	// pushPath is the push subscription the suite made; "" when none was.
	pushPath string
	context  string
	// stream is the open SSE stream, nil when none could be opened, and
	// membersBefore the members before it opened.
	stream        *sseStream
	membersBefore []string
}

// openEventSources finds the EventService, opens its SSE stream and
// creates a push subscription to the suite's receiver, before the crawl.
func (s *session) openEventSources(ctx context.Context) error {
	root, err := s.get(ctx, serviceRootPath)
	if err != nil {
		return err
	}
	servicePath := odataID(root.json, "EventService")
	if servicePath == "" {
		s.report.NotRun = append(s.report.NotRun, "subscriptions: the service root links no EventService")
		return nil
	}
	service, err := s.get(ctx, servicePath)
	if err != nil {
		return err
	}
	subscriptions := odataID(service.json, "Subscriptions")
	if subscriptions == "" {
		s.report.NotRun = append(s.report.NotRun, "subscriptions: the EventService links no Subscriptions")
		return nil
	}
	src := &eventSources{subscriptionsPath: subscriptions, context: "conformance-" + nonce()}
	s.events = src
	if target, ok := lookup(service.json, "Actions", "#EventService.SubmitTestEvent", "target").(string); ok {
		src.testEventTarget = target
	} else {
		s.fail(ruleEventDelivery, servicePath, "the EventService has no #EventService.SubmitTestEvent action; deliveries cannot be checked")
	}
	if sse, _ := service.json["ServerSentEventUri"].(string); sse != "" {
		// The members before, to tell the stream's own from other
		// clients'.
		before, err := s.get(ctx, subscriptions)
		if err != nil {
			return err
		}
		src.membersBefore = members(before.json)
		if err := s.openStream(ctx, src, sse); err != nil {
			return err
		}
	}
	address := s.target.EventListenAddress
	if address == "" {
		if !onLoopback(s.target.BaseURL) {
			s.report.NotRun = append(s.report.NotRun, "push subscription: the service is not on loopback; set EventListenAddress to an address it can reach")
			return nil
		}
		address = "127.0.0.1:0"
	}
	if src.receiver, err = startEventReceiver(address); err != nil {
		return fmt.Errorf("subscriptions: %w", err)
	}
	posted := map[string]any{
		"Destination":      src.receiver.url,
		"Protocol":         "Redfish",
		"SubscriptionType": "RedfishEvent",
		"EventFormatType":  "Event",
		"Context":          src.context,
	}
	created, err := s.request(ctx, http.MethodPost, subscriptions, posted, withBasic, nil)
	if err != nil {
		return err
	}
	where := "POST " + subscriptions
	if created.status == http.StatusBadRequest && strings.Contains(string(created.body), "Destination") {
		// A service may refuse loopback destinations, as it should by
		// default: nothing is wrong, but deliveries cannot be seen.
		s.add(ruleSubscriptions, where, Warn, fmt.Sprintf("the service refused the destination %s (%.200s); push deliveries not checked", src.receiver.url, created.body))
		problems, err := s.errorBodyProblems(where+" (loopback destination)", created)
		if err != nil {
			return err
		}
		s.check(ruleErrorBody, where+" (loopback destination)", problems)
		return nil
	}
	location := pathOf(created.header.Get("Location"))
	if created.status != http.StatusCreated || location == "" {
		s.fail(ruleSubscriptions, where, "answered %d with Location %q, want 201 and the member's URI: %.200s", created.status, location, created.body)
		return nil
	}
	src.pushPath = location
	problems, err := s.createdProblems(where, created, location)
	if err != nil {
		return err
	}
	problems = append(problems, propertiesDiffer("201 body", created.json, posted, "Destination", "Protocol", "SubscriptionType", "Context")...)
	s.check(ruleSubscriptions, where, problems)
	return nil
}

// openStream opens the SSE stream, which the service must list as a
// member of type SSE while it is open.
func (s *session) openStream(ctx context.Context, src *eventSources, uri string) error {
	// The stream outlives any per-request timeout the client has.
	client := *s.target.Client
	client.Timeout = 0
	stream, err := openSSE(ctx, &client, s.target, uri)
	if err != nil {
		s.fail(ruleSubscriptions, "GET "+uri, "%v", err)
		return nil
	}
	src.stream = stream
	return nil
}

// closeEventSources deletes what openEventSources made; it runs whatever
// happened before.
func (s *session) closeEventSources(ctx context.Context) {
	src := s.events
	if src == nil {
		return
	}
	if src.pushPath != "" {
		_, _ = s.request(ctx, http.MethodDelete, src.pushPath, nil, withBasic, nil)
	}
	if src.stream != nil {
		src.stream.close()
	}
	if src.receiver != nil {
		src.receiver.close()
	}
}

// checkSubscriptions runs after the crawl has walked the members.
func (s *session) checkSubscriptions(ctx context.Context) error {
	src := s.events
	if src == nil {
		return nil
	}
	if err := s.checkSubscriptionErrors(ctx, src); err != nil {
		return err
	}
	if src.stream != nil {
		if err := s.checkStreamMember(ctx, src); err != nil {
			return err
		}
	}
	if src.pushPath != "" {
		if err := s.checkPushMember(ctx, src); err != nil {
			return err
		}
	}
	if src.testEventTarget == "" || (src.pushPath == "" && src.stream == nil) {
		return nil
	}
	text := "Conformance test event " + nonce()
	submitted, err := s.request(ctx, http.MethodPost, src.testEventTarget, map[string]any{
		"MessageId":         testMessageID,
		"Message":           text,
		"MessageSeverity":   "OK",
		"EventTimestamp":    time.Now().UTC().Format(time.RFC3339),
		"OriginOfCondition": serviceRootPath,
	}, withBasic, nil)
	if err != nil {
		return err
	}
	where := "POST " + src.testEventTarget
	if submitted.status/100 != 2 {
		s.fail(ruleEventDelivery, where, "SubmitTestEvent answered %d, want 2xx: %.200s", submitted.status, submitted.body)
		return nil
	}
	s.pass(ruleEventDelivery, where)
	isTest := func(body map[string]any) bool {
		list, _ := body["Events"].([]any)
		for _, item := range list {
			if e, _ := item.(map[string]any); e["MessageId"] == testMessageID && e["Message"] == text {
				return true
			}
		}
		return false
	}
	timeout := s.target.EventTimeout
	if timeout <= 0 {
		timeout = defaultEventTimeout
	}
	if src.pushPath != "" {
		where := "receiver " + src.receiver.url
		var problems []string
		if body, ok := src.receiver.wait(ctx, timeout, isTest); !ok {
			problems = append(problems, fmt.Sprintf("the test event did not reach the destination within %s", timeout))
		} else if body["Context"] != src.context {
			problems = append(problems, fmt.Sprintf("the event's Context is %v, want the subscription's %q", body["Context"], src.context))
		}
		for _, got := range src.receiver.all() {
			if !strings.HasPrefix(got.contentType, "application/json") {
				problems = append(problems, fmt.Sprintf("an event was POSTed with Content-Type %q, want application/json", got.contentType))
			}
			more, err := s.validator.Validate(where, got.body)
			if err != nil {
				return err
			}
			for _, v := range more {
				problems = append(problems, v.String())
			}
		}
		s.check(ruleEventDelivery, where, problems)
	}
	if src.stream != nil {
		where := "SSE " + src.stream.uri
		var problems []string
		if _, ok := src.stream.wait(ctx, timeout, isTest); !ok {
			problems = append(problems, fmt.Sprintf("the test event did not come on the stream within %s (stream ended: %v)", timeout, src.stream.err()))
		}
		for _, e := range src.stream.all() {
			more, err := s.validator.Validate(where+" id "+e.id, []byte(e.data))
			if err != nil {
				return err
			}
			for _, v := range more {
				problems = append(problems, v.String())
			}
		}
		s.check(ruleEventDelivery, where, problems)
	}
	if src.pushPath != "" {
		if err := s.deletePushMember(ctx, src); err != nil {
			return err
		}
	}
	if src.stream != nil && src.stream.member != "" {
		return s.checkStreamMemberGone(ctx, src, timeout)
	}
	return nil
}

// checkStreamMemberGone closes the stream: its member must go.
func (s *session) checkStreamMemberGone(ctx context.Context, src *eventSources, timeout time.Duration) error {
	src.stream.close()
	member := src.stream.member
	status := 0
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		r, err := s.get(ctx, member)
		if err != nil {
			return err
		}
		if status = r.status; status == http.StatusNotFound {
			s.pass(ruleSubscriptions, member+" (stream closed)")
			return nil
		}
	}
	s.fail(ruleSubscriptions, member+" (stream closed)", "the SSE member still answers %d %s after its stream closed", status, timeout)
	return nil
}

// checkSubscriptionErrors: an unknown member answers 404 and a POST that
// is missing what a subscription needs 400, both with error bodies.
func (s *session) checkSubscriptionErrors(ctx context.Context, src *eventSources) error {
	destination := "http://127.0.0.1:9/conformance"
	if src.receiver != nil {
		destination = src.receiver.url
	}
	cases := []errorCase{
		{rule: ruleNotFound, method: http.MethodGet, path: src.subscriptionsPath + "/" + noSuchSubscription, status: http.StatusNotFound},
		{rule: ruleNotFound, method: http.MethodDelete, path: src.subscriptionsPath + "/" + noSuchSubscription, status: http.StatusNotFound},
		// Neither creates anything: the first lacks Destination, the
		// second names a Protocol the schema does not have.
		{rule: ruleSubscriptions, method: http.MethodPost, path: src.subscriptionsPath, status: http.StatusBadRequest,
			body: map[string]any{"Protocol": "Redfish", "Context": src.context}},
		{rule: ruleSubscriptions, method: http.MethodPost, path: src.subscriptionsPath, status: http.StatusBadRequest,
			body: map[string]any{"Destination": destination, "Protocol": "ConformancePigeon", "Context": src.context}},
	}
	for _, c := range cases {
		r, err := s.request(ctx, c.method, c.path, c.body, withBasic, nil)
		if err != nil {
			return err
		}
		where := c.method + " " + c.path
		if r.status != c.status {
			s.fail(c.rule, where, "answered %d, want %d: %.200s", r.status, c.status, r.body)
			if r.status == http.StatusCreated {
				// Do not leave what the service wrongly made.
				if location := pathOf(r.header.Get("Location")); location != "" {
					_, _ = s.request(ctx, http.MethodDelete, location, nil, withBasic, nil)
				}
			}
			continue
		}
		s.pass(c.rule, where)
		problems, err := s.errorBodyProblems(where, r)
		if err != nil {
			return err
		}
		s.check(ruleErrorBody, where, problems)
	}
	return nil
}

// checkStreamMember: the open stream is a new member of type SSE.
func (s *session) checkStreamMember(ctx context.Context, src *eventSources) error {
	collection, err := s.get(ctx, src.subscriptionsPath)
	if err != nil {
		return err
	}
	for _, member := range members(collection.json) {
		if slices.Contains(src.membersBefore, member) {
			continue
		}
		r, err := s.get(ctx, member)
		if err != nil {
			return err
		}
		if r.json["SubscriptionType"] == "SSE" {
			src.stream.member = member
			s.pass(ruleSubscriptions, member)
			return nil
		}
	}
	s.fail(ruleSubscriptions, src.subscriptionsPath, "no new member has SubscriptionType SSE while an SSE stream is open; members: %v", members(collection.json))
	return nil
}

// checkPushMember reads the push subscription back and PATCHes its
// Context; the test event must then carry the new one.
func (s *session) checkPushMember(ctx context.Context, src *eventSources) error {
	var problems []string
	collection, err := s.get(ctx, src.subscriptionsPath)
	if err != nil {
		return err
	}
	listed := false
	for _, m := range members(collection.json) {
		listed = listed || strings.TrimSuffix(m, "/") == strings.TrimSuffix(src.pushPath, "/")
	}
	if !listed {
		problems = append(problems, fmt.Sprintf("%s does not list it", src.subscriptionsPath))
	}
	read, err := s.get(ctx, src.pushPath)
	if err != nil {
		return err
	}
	if read.status != http.StatusOK {
		s.fail(ruleSubscriptions, src.pushPath, "GET answered %d", read.status)
		return nil
	}
	problems = append(problems, propertiesDiffer("GET", read.json, map[string]any{
		"Destination": src.receiver.url, "Protocol": "Redfish", "SubscriptionType": "RedfishEvent", "Context": src.context,
	}, "Destination", "Protocol", "SubscriptionType", "Context")...)
	s.check(ruleSubscriptions, src.pushPath, problems)

	problems = nil
	src.context = "conformance-patched-" + nonce()
	headers := map[string]string{}
	if etag := read.header.Get("ETag"); etag != "" {
		headers["If-Match"] = etag
	}
	patched, err := s.request(ctx, http.MethodPatch, src.pushPath, map[string]any{"Context": src.context}, withBasic, headers)
	if err != nil {
		return err
	}
	where := "PATCH " + src.pushPath
	switch patched.status {
	case http.StatusOK:
		violations, err := s.validator.Validate(where, patched.body)
		if err != nil {
			return err
		}
		for _, v := range violations {
			problems = append(problems, "200 body: "+v.String())
		}
		problems = append(problems, propertiesDiffer("200 body", patched.json, map[string]any{"Context": src.context}, "Context")...)
	case http.StatusNoContent:
		again, err := s.get(ctx, src.pushPath)
		if err != nil {
			return err
		}
		problems = append(problems, propertiesDiffer("GET after the PATCH", again.json, map[string]any{"Context": src.context}, "Context")...)
	default:
		problems = append(problems, fmt.Sprintf("PATCH of Context answered %d, want 200 or 204: %.200s", patched.status, patched.body))
	}
	s.check(ruleSubscriptions, where, problems)
	return nil
}

// deletePushMember deletes the push subscription: it is gone from the
// collection and answers 404 with an error body.
func (s *session) deletePushMember(ctx context.Context, src *eventSources) error {
	path := src.pushPath
	deleted, err := s.request(ctx, http.MethodDelete, path, nil, withBasic, nil)
	if err != nil {
		return err
	}
	where := "DELETE " + path
	if deleted.status != http.StatusOK && deleted.status != http.StatusNoContent {
		s.fail(ruleSubscriptions, where, "answered %d, want 200 or 204", deleted.status)
		return nil
	}
	src.pushPath = ""
	gone, err := s.get(ctx, path)
	if err != nil {
		return err
	}
	if gone.status != http.StatusNotFound {
		s.fail(ruleSubscriptions, where, "GET after the DELETE answered %d, want 404", gone.status)
		return nil
	}
	s.pass(ruleSubscriptions, where)
	problems, err := s.errorBodyProblems("GET "+path+" (deleted)", gone)
	if err != nil {
		return err
	}
	s.check(ruleErrorBody, "GET "+path+" (deleted)", problems)
	return nil
}

// propertiesDiffer lists the keys whose values in body are not want's.
func propertiesDiffer(what string, body, want map[string]any, keys ...string) []string {
	var problems []string
	for _, k := range keys {
		if body[k] != want[k] {
			problems = append(problems, fmt.Sprintf("%s has %s %v, want %v", what, k, body[k], want[k]))
		}
	}
	return problems
}

func lookup(body map[string]any, keys ...string) any {
	var cur any = body
	for _, k := range keys {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[k]
	}
	return cur
}

// onLoopback tells whether a base URL names a loopback host.
func onLoopback(baseURL string) bool {
	u, err := url.Parse(baseURL)
	if err != nil {
		return false
	}
	if u.Hostname() == "localhost" {
		return true
	}
	ip := net.ParseIP(u.Hostname())
	return ip != nil && ip.IsLoopback()
}

// nonce tells this run's subscriptions and events from any other's.
func nonce() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// eventReceiver is the push subscription's destination: it keeps every
// body POSTed to it and answers 204.
type eventReceiver struct {
	url      string
	server   *http.Server
	mu       sync.Mutex
	received []receivedEvent
	arrived  chan struct{} // closed and replaced at each arrival
}

type receivedEvent struct {
	contentType string
	body        []byte
}

func startEventReceiver(address string) (*eventReceiver, error) {
	listener, err := net.Listen("tcp", address)
	if err != nil {
		return nil, fmt.Errorf("event receiver: %w", err)
	}
	r := &eventReceiver{url: "http://" + listener.Addr().String() + "/conformance/events", arrived: make(chan struct{})}
	r.server = &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.server.Serve(listener) }()
	return r, nil
}

func (r *eventReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, maxReplyBytes))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.received = append(r.received, receivedEvent{contentType: req.Header.Get("Content-Type"), body: body})
	close(r.arrived)
	r.arrived = make(chan struct{})
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (r *eventReceiver) all() []receivedEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]receivedEvent(nil), r.received...)
}

// wait returns the first received body that match accepts.
func (r *eventReceiver) wait(ctx context.Context, timeout time.Duration, match func(map[string]any) bool) (map[string]any, bool) {
	return waitFor(ctx, timeout, func() ([]map[string]any, <-chan struct{}) {
		r.mu.Lock()
		defer r.mu.Unlock()
		var bodies []map[string]any
		for _, e := range r.received {
			bodies = append(bodies, decodeObject(e.body))
		}
		return bodies, r.arrived
	}, match)
}

func (r *eventReceiver) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.server.Shutdown(ctx)
}

// waitFor looks through what snapshot gives, again at each arrival, until
// match accepts one or the time is up; a nil arrival channel means nothing
// more will come.
func waitFor(ctx context.Context, timeout time.Duration, snapshot func() ([]map[string]any, <-chan struct{}), match func(map[string]any) bool) (map[string]any, bool) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		bodies, arrived := snapshot()
		for _, b := range bodies {
			if b != nil && match(b) {
				return b, true
			}
		}
		if arrived == nil {
			return nil, false
		}
		select {
		case <-arrived:
		case <-timer.C:
			return nil, false
		case <-ctx.Done():
			return nil, false
		}
	}
}

// sseStream is an open server-sent event stream, read as it comes.
type sseStream struct {
	uri    string
	member string // its member of Subscriptions, once found
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	mu      sync.Mutex
	events  []sseEvent
	arrived chan struct{}
	ended   error
}

type sseEvent struct{ id, data string }

// openSSE opens the stream and waits for its headers: 200 and
// text/event-stream.
func openSSE(ctx context.Context, client *http.Client, t Target, uri string) (*sseStream, error) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(t.BaseURL, "/")+uri, nil)
	if err != nil {
		cancel()
		return nil, err
	}
	req.SetBasicAuth(t.Username, t.Password)
	req.Header.Set("Accept", "text/event-stream")
	// A service that never answers must not hold the run.
	timer := time.AfterFunc(defaultEventTimeout, cancel)
	resp, err := client.Do(req)
	timer.Stop()
	if err != nil {
		cancel()
		return nil, fmt.Errorf("opening the SSE stream: %w", err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		cancel()
		return nil, fmt.Errorf("the SSE stream answered %d with Content-Type %q, want 200 and text/event-stream: %.200s", resp.StatusCode, resp.Header.Get("Content-Type"), data)
	}
	s := &sseStream{uri: uri, cancel: cancel, done: make(chan struct{}), arrived: make(chan struct{})}
	go s.read(resp.Body)
	return s, nil
}

// read parses the stream (WHATWG "event stream interpretation": data
// lines joined, an event per blank line, comments skipped) until it ends.
func (s *sseStream) read(body io.ReadCloser) {
	defer close(s.done)
	defer body.Close()
	scanner := bufio.NewScanner(body)
	scanner.Buffer(make([]byte, 64<<10), maxReplyBytes)
	var id string
	var data []string
	for scanner.Scan() {
		line := scanner.Text()
		switch {
		case line == "":
			if len(data) > 0 {
				s.mu.Lock()
				s.events = append(s.events, sseEvent{id: id, data: strings.Join(data, "\n")})
				close(s.arrived)
				s.arrived = make(chan struct{})
				s.mu.Unlock()
			}
			id, data = "", nil
		case strings.HasPrefix(line, ":"):
		default:
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "data":
				data = append(data, value)
			case "id":
				id = value
			}
		}
	}
	err := scanner.Err()
	if err == nil {
		err = io.EOF
	}
	s.mu.Lock()
	s.ended = err
	close(s.arrived)
	s.arrived = make(chan struct{})
	s.mu.Unlock()
}

func (s *sseStream) all() []sseEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sseEvent(nil), s.events...)
}

func (s *sseStream) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

func (s *sseStream) wait(ctx context.Context, timeout time.Duration, match func(map[string]any) bool) (map[string]any, bool) {
	return waitFor(ctx, timeout, func() ([]map[string]any, <-chan struct{}) {
		s.mu.Lock()
		defer s.mu.Unlock()
		var bodies []map[string]any
		for _, e := range s.events {
			bodies = append(bodies, decodeObject([]byte(e.data)))
		}
		if s.ended != nil {
			return bodies, nil // nothing more will come
		}
		return bodies, s.arrived
	}, match)
}

func (s *sseStream) close() {
	s.once.Do(func() {
		s.cancel()
		<-s.done
	})
}

// decodeObject decodes a JSON object; nil if data is not one.
func decodeObject(data []byte) map[string]any {
	var obj map[string]any
	if json.Unmarshal(data, &obj) != nil {
		return nil
	}
	return obj
}
