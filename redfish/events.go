package redfish

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/virtmetal/virtmetal/internal/events"
	"github.com/virtmetal/virtmetal/machine"
)

// The EventService: what happens to the machines (events.Watcher tells it,
// whoever made it happen) as Redfish events, streamed over server-sent
// events (DSP0266 "Server-sent events"). Push subscriptions are not served.
const (
	eventServicePath = "/redfish/v1/EventService"
	ssePath          = eventServicePath + "/SSE"

	defaultMaxEventStreams          = 64
	defaultMaxEventStreamsPerSource = 4
	defaultEventKeepAlive           = 30 * time.Second
	// sseWriteTimeout bounds each write to a stream, so a client that
	// stops reading is let go.
	sseWriteTimeout = 30 * time.Second
)

// resourceEventRegistry holds the messages of DMTF's ResourceEvent registry
// the service sends, with their registry version; texts are the registry's.
var resourceEventRegistry = map[string]struct{ version, text string }{
	"ResourcePoweredOn":   {"1.3.0", "The resource `%1` has powered on."},
	"ResourcePoweredOff":  {"1.3.0", "The resource `%1` has powered off."},
	"ResourcePoweringOn":  {"1.3.0", "The resource `%1` is powering on."},
	"ResourcePoweringOff": {"1.3.0", "The resource `%1` is powering off."},
	"ResourceChanged":     {"1.0.0", "One or more resource properties have changed."},
	"ResourceCreated":     {"1.0.0", "The resource has been created successfully."},
	"ResourceRemoved":     {"1.0.0", "The resource has been removed successfully."},
}

const resourceEventPrefix = "ResourceEvent"

// eventResourceTypes are the schemas of the events' origins.
var eventResourceTypes = []string{"ComputerSystem", "VirtualMedia", "AccountService"}

// eventStreams counts the open streams, in all and per client.
type eventStreams struct {
	max, maxPerSource int
	keepAlive         time.Duration
	mu                sync.Mutex
	total             int
	perSource         map[string]int
	stopped           chan struct{} // closed by StopEventStreams
	stopOnce          sync.Once
}

func (es *eventStreams) open(source string) bool {
	es.mu.Lock()
	defer es.mu.Unlock()
	if es.total >= es.max || es.perSource[source] >= es.maxPerSource {
		return false
	}
	es.total++
	es.perSource[source]++
	return true
}

func (es *eventStreams) close(source string) {
	es.mu.Lock()
	defer es.mu.Unlock()
	es.total--
	if es.perSource[source]--; es.perSource[source] == 0 {
		delete(es.perSource, source)
	}
}

// EventStreams is how many SSE streams are open.
func (s *Server) EventStreams() int {
	s.streams.mu.Lock()
	defer s.streams.mu.Unlock()
	return s.streams.total
}

// StopEventStreams ends every SSE stream, console and push delivery and
// refuses new streams, so that a graceful shutdown does not wait for clients that
// never hang up. Register it with http.Server.RegisterOnShutdown.
func (s *Server) StopEventStreams() {
	s.streams.stopOnce.Do(func() { close(s.streams.stopped) })
}

// Run watches the machines for the EventService until ctx ends: changes
// made elsewhere than through this service (IPMI, another BMC, the guest,
// the cluster's API) are reported within the watcher's poll. Without it
// only this service's own writes are. It also restores the kept push
// subscriptions, so their deliveries resume before any client asks. It
// returns ctx's error.
func (s *Server) Run(ctx context.Context) error {
	go s.restoreSubscriptionsWhenReachable(ctx)
	return s.watcher.Run(ctx)
}

func (s *Server) getEventService(*call) (result, error) {
	body := resource(typeEventService, eventServicePath, "EventService", "Event Service")
	body["ServiceEnabled"] = true
	body["Status"] = map[string]any{"State": "Enabled", "Health": "OK"}
	body["EventFormatTypes"] = []string{"Event"}
	body["RegistryPrefixes"] = eventRegistryPrefixes
	body["ResourceTypes"] = eventResourceTypes
	body["ServerSentEventUri"] = ssePath
	body["Subscriptions"] = link(subscriptionsPath)
	body["DeliveryRetryAttempts"] = s.delivery.retryAttempts
	body["DeliveryRetryIntervalSeconds"] = int((s.delivery.retryInterval + time.Second - 1) / time.Second)
	body["ExcludeMessageId"] = true
	body["ExcludeRegistryPrefix"] = true
	body["IncludeOriginOfConditionSupported"] = false
	body["SubordinateResourcesSupported"] = false
	body["Actions"] = map[string]any{
		"#EventService.SubmitTestEvent": map[string]any{"target": submitTestEventPath},
	}
	// EventType, deprecated, is left out: the validators warn on it.
	body["SSEFilterPropertiesSupported"] = map[string]any{
		"EventFormatType": true, "MessageId": true, "RegistryPrefix": true, "ResourceType": true,
		"OriginResource": true, "MetricReportDefinition": false, "SubordinateResources": false,
	}
	return result{body: body}, nil
}

// record is one event as Redfish tells it.
type record struct {
	messageID    string // registry prefix, version and key
	message      string
	args         []string
	severity     string
	origin       string // OriginOfCondition; "" for none
	resourceType string // the origin's schema
	// timestamp, when set, is the time a test event asked for.
	timestamp time.Time
	groupID   *int64
}

// resourceEvent is a record of one of resourceEventRegistry's messages.
func resourceEvent(key, origin, resourceType string, args ...string) record {
	entry := resourceEventRegistry[key]
	if args == nil {
		args = []string{}
	}
	return record{
		messageID: resourceEventPrefix + "." + entry.version + "." + key,
		message:   message{args: args}.format(entry.text),
		args:      args, severity: "OK", origin: origin, resourceType: resourceType,
	}
}

// registryPrefix is the registry part of the MessageId ("ResourceEvent").
func (r record) registryPrefix() string {
	prefix, _, _ := strings.Cut(r.messageID, ".")
	return prefix
}

// unversionedID is the MessageId without the registry's version
// ("ResourceEvent.ResourcePoweredOn"), which filters may use.
func (r record) unversionedID() string {
	return r.registryPrefix() + "." + r.messageID[strings.LastIndex(r.messageID, ".")+1:]
}

// recordOf translates a machine event.
func recordOf(e events.Event) (record, bool) {
	system := systemPath(e.Machine)
	switch e.Kind {
	case events.PowerChanged:
		key, ok := map[machine.PowerState]string{
			machine.PowerOn: "ResourcePoweredOn", machine.PowerOff: "ResourcePoweredOff",
			machine.PoweringOn: "ResourcePoweringOn", machine.PoweringOff: "ResourcePoweringOff",
		}[e.Power]
		return resourceEvent(key, system, "ComputerSystem", system), ok
	case events.BootOverrideChanged:
		return resourceEvent("ResourceChanged", system, "ComputerSystem"), true
	case events.MediaInserted, events.MediaEjected:
		// The drive stays; what it holds changed.
		return resourceEvent("ResourceChanged", cdPath(e.Machine), "VirtualMedia"), true
	case events.MachineAdded:
		return resourceEvent("ResourceCreated", system, "ComputerSystem"), true
	case events.MachineRemoved:
		return resourceEvent("ResourceRemoved", system, "ComputerSystem"), true
	case events.AccountsChanged:
		return resourceEvent("ResourceChanged", accountServicePath, "AccountService"), true
	case events.Test:
		r, ok := e.Detail.(record)
		return r, ok
	}
	return record{}, false
}

// eventPayload is the Event resource that carries e, to an SSE stream
// (context "") or to a subscription's destination (its Context).
func eventPayload(e events.Event, r record, context string) ([]byte, error) {
	id := strconv.FormatUint(e.ID, 10)
	timestamp := e.Time
	if !r.timestamp.IsZero() {
		timestamp = r.timestamp
	}
	entry := map[string]any{
		"EventId":         id,
		"EventTimestamp":  timestamp.UTC().Format(time.RFC3339),
		"EventType":       "Other", // deprecated; MessageId says what happened
		"MemberId":        "0",
		"MessageId":       r.messageID,
		"Message":         r.message,
		"MessageArgs":     r.args,
		"MessageSeverity": r.severity,
	}
	if r.origin != "" {
		entry["OriginOfCondition"] = link(r.origin)
	}
	if r.groupID != nil {
		entry["EventGroupId"] = *r.groupID
	}
	body := map[string]any{
		"@odata.type": typeEvent.odataType(),
		"Id":          id,
		"Name":        "Event",
		"Events":      []any{entry},
	}
	if context != "" {
		body["Context"] = context
	}
	return json.Marshal(body)
}

// renderedEvents keeps the payloads of the last events, so that an event
// told to many streams is marshalled once.
type renderedEvents struct {
	mu   sync.Mutex
	byID map[uint64][]byte
	ids  []uint64 // oldest first, at most renderedEventsKept
}

const renderedEventsKept = 64

func (c *renderedEvents) event(e events.Event, r record) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if payload, ok := c.byID[e.ID]; ok {
		return payload, nil
	}
	payload, err := eventPayload(e, r, "")
	if err != nil {
		return nil, err
	}
	if c.byID == nil {
		c.byID = map[uint64][]byte{}
	}
	if len(c.ids) == renderedEventsKept {
		delete(c.byID, c.ids[0])
		c.ids = c.ids[1:]
	}
	c.byID[e.ID] = payload
	c.ids = append(c.ids, e.ID)
	return payload, nil
}

// eventFilter is a parsed $filter: any of its alternatives, each a set of
// property equalities that must all hold.
type eventFilter [][]filterTerm

type filterTerm struct{ property, value string }

// sseFilterProperties are the properties $filter may test.
var sseFilterProperties = map[string]bool{
	"EventFormatType": true, "MessageId": true, "RegistryPrefix": true, "ResourceType": true, "OriginResource": true,
}

// parseEventFilter reads "A eq 'x' or A eq 'y' and B eq z": alternatives
// joined by or, each of terms joined by and; values quoted or not.
func parseEventFilter(expr string) (eventFilter, bool) {
	var f eventFilter
	for _, alternative := range splitWord(expr, "or") {
		var terms []filterTerm
		for _, term := range splitWord(alternative, "and") {
			fields := strings.Fields(term)
			if len(fields) != 3 || fields[1] != "eq" || !sseFilterProperties[fields[0]] {
				return nil, false
			}
			value := fields[2]
			if len(value) >= 2 && value[0] == '\'' && value[len(value)-1] == '\'' {
				value = value[1 : len(value)-1]
			}
			if value == "" || strings.ContainsRune(value, '\'') {
				return nil, false
			}
			terms = append(terms, filterTerm{fields[0], value})
		}
		f = append(f, terms)
	}
	return f, len(f) > 0
}

// splitWord splits s at the whole word w, surrounded by spaces.
func splitWord(s, w string) []string {
	return strings.Split(s, " "+w+" ")
}

func (f eventFilter) matches(r record) bool {
	if f == nil {
		return true
	}
	for _, terms := range f {
		all := true
		for _, t := range terms {
			if !t.matches(r) {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

func (t filterTerm) matches(r record) bool {
	switch t.property {
	case "EventFormatType":
		return t.value == "Event"
	case "MessageId":
		// With or without the registry's version.
		return t.value == r.messageID || t.value == r.unversionedID()
	case "RegistryPrefix":
		return t.value == r.registryPrefix()
	case "ResourceType":
		return t.value == r.resourceType
	case "OriginResource":
		return strings.TrimRight(t.value, "/") == r.origin
	}
	return false
}

// streamEvents is the SSE endpoint: the feed's events as they happen,
// after the ones since Last-Event-ID, filtered by $filter, with a comment
// line every keep-alive period so that proxies keep the connection. The
// stream ends when the credentials it was opened with stop being accepted
// (checked at each event and keep-alive).
func (s *Server) streamEvents(c *call) (result, error) {
	if accept := c.r.Header.Values("Accept"); len(accept) > 0 && !acceptsEventStream(accept) {
		return result{}, newError(http.StatusNotAcceptable, msgHeaderInvalid, "Accept: "+strings.Join(accept, ", "))
	}
	var filter eventFilter
	if q, ok := c.r.URL.Query()["$filter"]; ok {
		var valid bool
		if filter, valid = parseEventFilter(strings.Join(q, " and ")); !valid {
			return result{}, newError(http.StatusBadRequest, msgQueryParameterValueFormatError, strings.Join(q, " "), "$filter")
		}
	}
	var after uint64
	if last := c.r.Header.Get("Last-Event-ID"); last != "" {
		var err error
		if after, err = strconv.ParseUint(last, 10, 64); err != nil {
			return result{}, newError(http.StatusBadRequest, msgHeaderInvalid, "Last-Event-ID: "+last)
		}
	}
	select {
	case <-s.streams.stopped:
		return result{}, s.retryLater(msgEventSubscriptionLimitExceeded)
	default:
	}
	source := s.auth.clients.source(c.r)
	if !s.streams.open(source) {
		return result{}, s.retryLater(msgEventSubscriptionLimitExceeded)
	}
	return result{stream: func(w http.ResponseWriter, r *http.Request) {
		defer s.streams.close(source)
		// The stream is a member of Subscriptions while it is open;
		// deleting that member ends it.
		member := s.openSSESubscription(c.user.username)
		defer s.subscriptions.remove(member.id)
		s.serveStream(w, r, filter, after, member.ended)
	}}, nil
}

// acceptsEventStream tells whether Accept allows text/event-stream; a
// client that asks for JSON only gets a JSON error, not a stream.
func acceptsEventStream(accept []string) bool {
	for _, header := range accept {
		for _, r := range strings.Split(header, ",") {
			mediaRange, params, _ := strings.Cut(strings.TrimSpace(r), ";")
			if q, ok := strings.CutPrefix(strings.ReplaceAll(params, " ", ""), "q="); ok && strings.Trim(q, "0.") == "" {
				continue // q=0: not acceptable
			}
			switch strings.ToLower(strings.TrimSpace(mediaRange)) {
			case "text/event-stream", "text/*", "*/*":
				return true
			}
		}
	}
	return false
}

func (s *Server) serveStream(w http.ResponseWriter, r *http.Request, filter eventFilter, after uint64, deleted <-chan struct{}) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx (the usual Ingress) would hold the stream
	if r.Method == http.MethodHead {
		w.WriteHeader(http.StatusOK)
		return
	}
	sub, complete := s.events.Subscribe(after)
	defer sub.Close()
	rc := http.NewResponseController(w)
	// The server's read timeout would end a stream that outlives it.
	_ = rc.SetReadDeadline(time.Time{})
	write := func(text string) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(sseWriteTimeout))
		if _, err := fmt.Fprint(w, text); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	w.WriteHeader(http.StatusOK)
	if !write(": virtmetal event stream\n\n") {
		return
	}
	if !complete {
		// Some events since Last-Event-ID are gone: say so, without an id,
		// so that the client's Last-Event-ID stays what it was.
		lost, _ := json.Marshal(lostEventsBody(""))
		if !write("data: " + string(lost) + "\n\n") {
			return
		}
	}
	keepAlive := time.NewTicker(s.streams.keepAlive)
	defer keepAlive.Stop()
	for {
		select {
		case e, open := <-sub.C:
			if !open {
				return // fell behind: the client resumes with Last-Event-ID
			}
			rec, ok := recordOf(e)
			if !ok || !filter.matches(rec) {
				continue
			}
			if !s.auth.stillAuthorized(r) {
				return // rotated out, or its session ended
			}
			payload, err := s.eventBodies.event(e, rec)
			if err != nil {
				s.log.Error(err, "event not sent", "event", e.ID)
				continue
			}
			if !write("id: " + strconv.FormatUint(e.ID, 10) + "\ndata: " + string(payload) + "\n\n") {
				return
			}
		case <-keepAlive.C:
			if !s.auth.stillAuthorized(r) || !write(": keep-alive\n\n") {
				return
			}
		case <-r.Context().Done():
			return
		case <-s.streams.stopped:
			return
		case <-deleted:
			return
		}
	}
}
