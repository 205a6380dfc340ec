package redfish

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/virtmetal/virtmetal/internal/events"
)

// The EventService's Subscriptions (DSP0266 "Event subscription"): push
// subscriptions a client POSTs, delivered by delivery.go, and one member per
// open SSE stream, which the service makes when the stream opens and
// removes when it closes; deleting that member ends the stream.
const (
	subscriptionsPath   = eventServicePath + "/Subscriptions"
	submitTestEventPath = eventServicePath + "/Actions/EventService.SubmitTestEvent"

	subscriptionRedfishEvent = "RedfishEvent"
	subscriptionSSE          = "SSE"

	defaultMaxSubscriptions = 16
	maxContextLength        = 256
	maxHTTPHeaders          = 16
)

func subscriptionPath(id string) string { return subscriptionsPath + "/" + id }

// Delivery retry policies (EventDestination.DeliveryRetryPolicy).
const (
	retryTerminate        = "TerminateAfterRetries"
	retrySuspend          = "SuspendRetries"
	retryForever          = "RetryForever"
	retryForeverBackingOf = "RetryForeverWithBackoff"
)

var retryPolicies = []string{retryTerminate, retrySuspend, retryForever, retryForeverBackingOf}

// subscription is one member of the collection.
type subscription struct {
	id       string
	kind     string // subscriptionRedfishEvent or subscriptionSSE
	owner    string // the account that made it
	settings atomic.Pointer[subscriptionSettings]

	// Push subscriptions only.
	destination *url.URL
	headers     http.Header // sent with each event, never shown
	filter      subscriptionFilter

	// Under subscriptionTable.mu.
	suspended   bool
	resumed     chan struct{} // closed when a suspended subscription resumes
	replaySince time.Time     // where a resumed subscription starts, when replay
	replay      bool
	resumeAfter uint64        // the feed's last event when it resumed
	unseen      bool          // resumed, and its delivery has not yet seen it
	ended       chan struct{} // closed when it is deleted
}

// subscriptionSettings are what PATCH may change, replaced whole so that a
// delivery under way reads one consistent set.
type subscriptionSettings struct {
	context           string
	policy            string
	verifyCertificate bool
}

// subscriptionFilter is what a push subscription asked for; empty lists
// let everything through.
type subscriptionFilter struct {
	registryPrefixes, messageIDs, resourceTypes, originResources []string
	excludeMessageIDs, excludeRegistryPrefixes                   []string
}

func (f subscriptionFilter) matches(r record) bool {
	in := func(list []string, values ...string) bool {
		return slices.ContainsFunc(values, func(v string) bool { return slices.Contains(list, v) })
	}
	// The schema: "the MessageId major and minor version details should
	// be ignored".
	inIDs := func(list []string) bool {
		return slices.ContainsFunc(list, func(id string) bool { return record{messageID: id}.unversionedID() == r.unversionedID() })
	}
	switch {
	case len(f.registryPrefixes) > 0 && !in(f.registryPrefixes, r.registryPrefix()):
		return false
	case len(f.messageIDs) > 0 && !inIDs(f.messageIDs):
		return false
	case len(f.resourceTypes) > 0 && !in(f.resourceTypes, r.resourceType):
		return false
	case len(f.originResources) > 0 && !in(f.originResources, r.origin):
		return false
	case inIDs(f.excludeMessageIDs), in(f.excludeRegistryPrefixes, r.registryPrefix()):
		return false
	}
	return true
}

// subscriptionTable holds the members; ids are never reused while the
// service runs, so a client's URI never names another's subscription.
type subscriptionTable struct {
	max   int        // push subscriptions; SSE streams have their own bound
	edits sync.Mutex // serialises PATCHes, each a read and a write of settings
	mu    sync.Mutex
	byID  map[string]*subscription
	last  int
}

func (t *subscriptionTable) add(sub *subscription) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.roomLocked(sub) {
		return false
	}
	t.last++
	t.insertLocked(sub, strconv.Itoa(t.last))
	return true
}

// restore puts back a kept subscription under its old id, or under a new
// one if an SSE stream opened before the restore took it.
func (t *subscriptionTable) restore(sub *subscription, id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.roomLocked(sub) {
		return false
	}
	if _, taken := t.byID[id]; taken {
		t.last++
		id = strconv.Itoa(t.last)
	}
	t.insertLocked(sub, id)
	return true
}

// roomLocked says whether the limit on push subscriptions admits sub.
func (t *subscriptionTable) roomLocked(sub *subscription) bool {
	if sub.kind != subscriptionRedfishEvent {
		return true
	}
	pushed := 0
	for _, s := range t.byID {
		if s.kind == subscriptionRedfishEvent {
			pushed++
		}
	}
	return pushed < t.max
}

func (t *subscriptionTable) insertLocked(sub *subscription, id string) {
	sub.id = id
	sub.ended = make(chan struct{})
	t.byID[id] = sub
}

func (t *subscriptionTable) get(id string) (*subscription, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sub, ok := t.byID[id]
	return sub, ok
}

// remove deletes a member and ends what serves it; false if it was gone.
func (t *subscriptionTable) remove(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	sub, ok := t.byID[id]
	if ok {
		delete(t.byID, id)
		close(sub.ended)
	}
	return ok
}

func (t *subscriptionTable) ids() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sortedIDsLocked()
}

func (t *subscriptionTable) sortedIDsLocked() []string {
	ids := make([]string, 0, len(t.byID))
	for id := range t.byID {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b string) int {
		x, _ := strconv.Atoi(a)
		y, _ := strconv.Atoi(b)
		return x - y
	})
	return ids
}

// suspend stops a push subscription's deliveries until resume; it returns
// the channel that resume closes.
func (t *subscriptionTable) suspend(sub *subscription) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !sub.suspended {
		sub.suspended, sub.resumed = true, make(chan struct{})
	}
	return sub.resumed
}

// resume lets a suspended subscription deliver again, the events since
// the given time first when replay is set, else those after the feed's
// event after; resuming one that is not suspended does nothing.
func (t *subscriptionTable) resume(sub *subscription, since time.Time, replay bool, after uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if sub.suspended {
		sub.suspended, sub.replaySince, sub.replay, sub.resumeAfter, sub.unseen = false, since, replay, after, true
		close(sub.resumed)
	}
}

// takeReplay is where a resumed subscription starts: the time its
// ResumeSubscription asked for, or replay false for the feed's last event
// when it resumed (not when its delivery wakes: an event between the two is
// one to deliver); resumed is false when there was no resume since the
// last call.
func (t *subscriptionTable) takeReplay(sub *subscription) (since time.Time, replay bool, after uint64, resumed bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	since, replay, after, resumed = sub.replaySince, sub.replay, sub.resumeAfter, sub.unseen
	sub.replay, sub.unseen = false, false
	return since, replay, after, resumed
}

// interrupted tells a delivery to stop following the feed: the
// subscription is suspended, or was suspended and resumed since the
// delivery last looked, and must start where the resume says.
func (t *subscriptionTable) interrupted(sub *subscription) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return sub.suspended || sub.unseen
}

func (t *subscriptionTable) isSuspended(sub *subscription) bool {
	return t.whileSuspended(sub) != nil
}

// whileSuspended is the channel that closes when a suspended subscription
// resumes; nil when it is not suspended.
func (t *subscriptionTable) whileSuspended(sub *subscription) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !sub.suspended {
		return nil
	}
	return sub.resumed
}

func (s *Server) getSubscriptions(c *call) (result, error) {
	if apiErr := s.subscriptionsLoaded(c.ctx()); apiErr != nil {
		return result{}, apiErr
	}
	ids := s.subscriptions.ids()
	paths := make([]string, len(ids))
	for i, id := range ids {
		paths[i] = subscriptionPath(id)
	}
	return result{body: collection(typeEventDestinationColl, subscriptionsPath, "Event Subscriptions", paths)}, nil
}

func (s *Server) subscriptionFor(c *call) (*subscription, *apiError) {
	if apiErr := s.subscriptionsLoaded(c.ctx()); apiErr != nil {
		return nil, apiErr
	}
	id := c.vars["subscriptionID"]
	sub, ok := s.subscriptions.get(id)
	if !ok {
		return nil, newError(http.StatusNotFound, msgResourceNotFound, "EventDestination", id)
	}
	return sub, nil
}

// subscriptionOwner lets the account that made a subscription change and
// delete it without ConfigureManager (the privilege registry's
// ConfigureSelf).
func (s *Server) subscriptionOwner(c *call) string {
	if sub, ok := s.subscriptions.get(c.vars["subscriptionID"]); ok {
		return sub.owner
	}
	return ""
}

func (s *Server) getSubscription(c *call) (result, error) {
	sub, apiErr := s.subscriptionFor(c)
	if apiErr != nil {
		return result{}, apiErr
	}
	return result{body: s.subscriptionBody(sub)}, nil
}

func (s *Server) subscriptionBody(sub *subscription) map[string]any {
	path := subscriptionPath(sub.id)
	settings := sub.settings.Load()
	body := resource(typeEventDestination, path, sub.id, "Event Subscription "+sub.id)
	body["Context"] = settings.context
	body["Protocol"] = "Redfish"
	body["SubscriptionType"] = sub.kind
	body["EventFormatType"] = "Event"
	if sub.kind == subscriptionSSE {
		body["Status"] = map[string]any{"State": "Enabled", "Health": "OK"}
		return body
	}
	body["Destination"] = sub.destination.String()
	body["DeliveryRetryPolicy"] = settings.policy
	body["VerifyCertificate"] = settings.verifyCertificate
	body["HttpHeaders"] = []any{} // write-only: they may hold credentials
	f := sub.filter
	for property, list := range map[string][]string{
		"RegistryPrefixes": f.registryPrefixes, "MessageIds": f.messageIDs, "ResourceTypes": f.resourceTypes,
		"ExcludeMessageIds": f.excludeMessageIDs, "ExcludeRegistryPrefixes": f.excludeRegistryPrefixes,
	} {
		body[property] = append([]string{}, list...)
	}
	body["OriginResources"] = links(f.originResources...)
	body["OriginResources@odata.count"] = len(f.originResources)
	if s.subscriptions.isSuspended(sub) {
		body["Status"] = map[string]any{"State": "Disabled", "Health": "Warning"}
	} else {
		body["Status"] = map[string]any{"State": "Enabled", "Health": "OK"}
	}
	body["Actions"] = map[string]any{
		"#EventDestination.ResumeSubscription":  map[string]any{"target": path + "/Actions/EventDestination.ResumeSubscription"},
		"#EventDestination.SuspendSubscription": map[string]any{"target": path + "/Actions/EventDestination.SuspendSubscription"},
	}
	return body
}

// subscriptionProperty reads one property of a subscription's POST or
// PATCH body into the subscription being built.
type subscriptionProperty func(s *Server, sub *subscriptionDraft, raw json.RawMessage, pointer string) *message

// subscriptionDraft is a subscription being read from a body.
type subscriptionDraft struct {
	subscriptionSettings
	destination *url.URL
	headers     http.Header
	filter      subscriptionFilter
}

// subscriptionProperties are what a client may set: at creation all of
// them, later only those marked patchable.
var subscriptionProperties = map[string]struct {
	read      subscriptionProperty
	patchable bool
}{
	"Destination":             {readDestination, false},
	"Protocol":                {readConstant("Redfish"), false},
	"SubscriptionType":        {readConstant(subscriptionRedfishEvent), false},
	"EventFormatType":         {readConstant("Event"), false},
	"Context":                 {readContext, true},
	"DeliveryRetryPolicy":     {readRetryPolicy, true},
	"VerifyCertificate":       {readVerifyCertificate, true},
	"HttpHeaders":             {readHTTPHeaders, false},
	"RegistryPrefixes":        {readList(func(f *subscriptionFilter) *[]string { return &f.registryPrefixes }, knownRegistryPrefix), false},
	"ExcludeRegistryPrefixes": {readList(func(f *subscriptionFilter) *[]string { return &f.excludeRegistryPrefixes }, knownRegistryPrefix), false},
	"MessageIds":              {readList(func(f *subscriptionFilter) *[]string { return &f.messageIDs }, knownMessageID), false},
	"ExcludeMessageIds":       {readList(func(f *subscriptionFilter) *[]string { return &f.excludeMessageIDs }, knownMessageID), false},
	"ResourceTypes":           {readList(func(f *subscriptionFilter) *[]string { return &f.resourceTypes }, knownResourceType), false},
	"OriginResources":         {readOriginResources, false},
}

// readOnlySubscriptionProperties are the body's own properties, which a
// client cannot set.
var readOnlySubscriptionProperties = []string{"@odata.id", "@odata.type", "Id", "Name", "Status", "Actions", "OriginResources@odata.count"}

func readConstant(want string) subscriptionProperty {
	return func(_ *Server, _ *subscriptionDraft, raw json.RawMessage, pointer string) *message {
		value, ok := jsonString(raw)
		if !ok {
			return typeError(raw, pointer)
		}
		if value != want {
			return notInList(value, pointer)
		}
		return nil
	}
}

func typeError(raw json.RawMessage, pointer string) *message {
	m := propertyError(msgPropertyValueTypeError, pointer, jsonText(raw), strings.TrimPrefix(pointer, "/"))
	return &m
}

func notInList(value, pointer string) *message {
	m := propertyError(msgPropertyValueNotInList, pointer, value, strings.TrimPrefix(pointer, "/"))
	return &m
}

func formatError(value, pointer string) *message {
	m := propertyError(msgPropertyValueFormatError, pointer, value, strings.TrimPrefix(pointer, "/"))
	return &m
}

// readDestination takes an http or https URL whose host is a name or an
// address the guard allows; a name's addresses are checked when a
// delivery connects, so a name that later resolves elsewhere gains nothing.
func readDestination(s *Server, sub *subscriptionDraft, raw json.RawMessage, pointer string) *message {
	value, ok := jsonString(raw)
	if !ok {
		return typeError(raw, pointer)
	}
	u, err := url.Parse(value)
	switch {
	case err != nil || u.Host == "" || u.Opaque != "" || u.Fragment != "" || len(value) > 2048:
		return formatError(value, pointer)
	case u.User != nil:
		// Credentials go in HttpHeaders, which are never shown.
		return formatError(value, pointer)
	case u.Scheme != "http" && u.Scheme != "https":
		return notInList(value, pointer)
	}
	if addr, err := netip.ParseAddr(strings.Trim(u.Hostname(), "[]")); err == nil && s.destinations.CheckAddr(addr) != nil {
		return notInList(value, pointer)
	}
	sub.destination = u
	return nil
}

func readContext(_ *Server, sub *subscriptionDraft, raw json.RawMessage, pointer string) *message {
	if strings.TrimSpace(string(raw)) == "null" {
		sub.context = ""
		return nil
	}
	value, ok := jsonString(raw)
	if !ok {
		return typeError(raw, pointer)
	}
	if len(value) > maxContextLength {
		return formatError(value[:32]+"...", pointer)
	}
	sub.context = value
	return nil
}

func readRetryPolicy(_ *Server, sub *subscriptionDraft, raw json.RawMessage, pointer string) *message {
	value, ok := jsonString(raw)
	if !ok {
		return typeError(raw, pointer)
	}
	if !slices.Contains(retryPolicies, value) {
		return notInList(value, pointer)
	}
	sub.policy = value
	return nil
}

func readVerifyCertificate(_ *Server, sub *subscriptionDraft, raw json.RawMessage, pointer string) *message {
	value, ok := jsonBool(raw)
	if !ok {
		return typeError(raw, pointer)
	}
	sub.verifyCertificate = value
	return nil
}

// readHTTPHeaders takes the schema's [{"Name": "Value"}, ...] and also a
// single object, as gofish sends; headers that would change how the
// request is framed or routed are refused.
func readHTTPHeaders(_ *Server, sub *subscriptionDraft, raw json.RawMessage, pointer string) *message {
	var list []map[string]json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		var one map[string]json.RawMessage
		if json.Unmarshal(raw, &one) != nil || one == nil {
			return typeError(raw, pointer)
		}
		list = []map[string]json.RawMessage{one}
	}
	headers := http.Header{}
	for i, entry := range list {
		for _, name := range sortedKeys(entry) {
			value, ok := jsonString(entry[name])
			at := pointer + "/" + strconv.Itoa(i) + "/" + name
			switch canonical := http.CanonicalHeaderKey(name); {
			case !ok:
				return typeError(entry[name], at)
			case !validHeaderName(name) || strings.ContainsAny(value, "\r\n\x00"):
				return formatError(name, at)
			case slices.Contains([]string{"Host", "Content-Length", "Content-Type", "Transfer-Encoding", "Connection", "Te", "Upgrade", "Trailer"}, canonical):
				return notInList(name, at)
			default:
				headers.Add(canonical, value)
			}
		}
	}
	if len(headers) > maxHTTPHeaders {
		return typeError(raw, pointer)
	}
	sub.headers = headers
	return nil
}

// This file's patterns are compiled at their first use: most BMCs never
// see a subscription, and a pattern compiled at start stays in every BMC's
// heap.
var headerName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`) })

func validHeaderName(name string) bool { return headerName().MatchString(name) }

// readList reads an array of strings, each of which must be known.
func readList(field func(*subscriptionFilter) *[]string, known func(string) bool) subscriptionProperty {
	return func(_ *Server, sub *subscriptionDraft, raw json.RawMessage, pointer string) *message {
		var list []string
		if json.Unmarshal(raw, &list) != nil {
			return typeError(raw, pointer)
		}
		for i, v := range list {
			if !known(v) {
				return notInList(v, pointer+"/"+strconv.Itoa(i))
			}
		}
		*field(&sub.filter) = list
		return nil
	}
}

func readOriginResources(_ *Server, sub *subscriptionDraft, raw json.RawMessage, pointer string) *message {
	var list []map[string]string
	if json.Unmarshal(raw, &list) != nil {
		return typeError(raw, pointer)
	}
	origins := make([]string, 0, len(list))
	for i, l := range list {
		id, ok := l["@odata.id"]
		if !ok || len(l) != 1 || !strings.HasPrefix(id, "/redfish/v1/") {
			return formatError(jsonText(raw), pointer+"/"+strconv.Itoa(i))
		}
		origins = append(origins, strings.TrimRight(id, "/"))
	}
	sub.filter.originResources = origins
	return nil
}

// eventRegistryPrefixes are the registries of the messages the service
// sends: ResourceEvent's, and Base's EventBufferExceeded.
var eventRegistryPrefixes = []string{resourceEventPrefix, baseRegistryPrefix}

func knownRegistryPrefix(p string) bool { return slices.Contains(eventRegistryPrefixes, p) }

func knownResourceType(t string) bool {
	return slices.Contains(eventResourceTypes, t)
}

// knownMessageID accepts a ResourceEvent message the service sends, with or
// without its version, and any well-formed id of another registry a test
// event may carry.
func knownMessageID(id string) bool {
	parts := strings.Split(id, ".")
	if parts[0] == resourceEventPrefix {
		_, ok := resourceEventRegistry[parts[len(parts)-1]]
		return ok && (len(parts) == 2 || len(parts) == 4 || len(parts) == 5)
	}
	return messageIDPattern().MatchString(id)
}

var messageIDPattern = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[A-Za-z0-9]+(\.[0-9]+\.[0-9]+(\.[0-9]+)?)?\.[A-Za-z0-9]+$`)
})

// testEventMessageID is what SubmitTestEvent takes: a versioned id, as the
// Event a receiver gets must carry (Event's MessageId pattern).
var testEventMessageID = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9]+\.[0-9]+\.[0-9]+\.[A-Za-z0-9]+$`) })

// createSubscription is the POST of a push subscription: 201 with its URI
// in Location. Every problem of the body is told at once.
func (s *Server) createSubscription(c *call) (result, error) {
	params, apiErr := decodeObject(c.body)
	if apiErr != nil {
		return result{}, apiErr
	}
	if apiErr := s.subscriptionsLoaded(c.ctx()); apiErr != nil {
		return result{}, apiErr
	}
	draft := &subscriptionDraft{subscriptionSettings: subscriptionSettings{policy: retrySuspend, verifyCertificate: true}}
	var problems []message
	for _, key := range []string{"Destination", "Protocol"} {
		if _, ok := params[key]; !ok {
			problems = append(problems, propertyError(msgPropertyMissing, "/"+key, key))
		}
	}
	problems = append(problems, s.readSubscription(draft, params, false)...)
	if len(problems) > 0 {
		return result{}, badRequest(problems...)
	}
	sub := &subscription{kind: subscriptionRedfishEvent, owner: c.user.username,
		destination: draft.destination, headers: draft.headers, filter: draft.filter}
	sub.settings.Store(&draft.subscriptionSettings)
	if !s.subscriptions.add(sub) {
		return result{}, s.retryLater(msgEventSubscriptionLimitExceeded)
	}
	s.startDelivery(sub, s.events.Last())
	s.saveSubscriptions(c.ctx())
	return result{
		status: http.StatusCreated,
		body:   s.subscriptionBody(sub),
		header: http.Header{"Location": {subscriptionPath(sub.id)}},
	}, nil
}

// readSubscription applies a body's properties to sub.
func (s *Server) readSubscription(sub *subscriptionDraft, params map[string]json.RawMessage, patch bool) []message {
	var problems []message
	for _, key := range sortedKeys(params) {
		prop, known := subscriptionProperties[key]
		switch {
		case slices.Contains(readOnlySubscriptionProperties, key), known && patch && !prop.patchable:
			problems = append(problems, propertyError(msgPropertyNotWritable, "/"+key, key))
		case !known:
			problems = append(problems, propertyError(msgPropertyUnknown, "/"+key, key))
		default:
			if m := prop.read(s, sub, params[key], "/"+key); m != nil {
				problems = append(problems, *m)
			}
		}
	}
	return problems
}

// patchSubscription changes what may change after creation: Context,
// DeliveryRetryPolicy and VerifyCertificate of a push subscription. The
// body is checked whole before anything changes.
func (s *Server) patchSubscription(c *call) (result, error) {
	sub, apiErr := s.subscriptionFor(c)
	if apiErr != nil {
		return result{}, apiErr
	}
	params, apiErr := decodeObject(c.body)
	if apiErr != nil {
		return result{}, apiErr
	}
	if len(params) == 0 {
		return result{}, newError(http.StatusBadRequest, msgEmptyJSON)
	}
	if sub.kind == subscriptionSSE {
		var problems []message
		for _, key := range sortedKeys(params) {
			problems = append(problems, propertyError(msgPropertyNotWritable, "/"+key, key))
		}
		return result{}, badRequest(problems...)
	}
	s.subscriptions.edits.Lock()
	defer s.subscriptions.edits.Unlock()
	edited := &subscriptionDraft{subscriptionSettings: *sub.settings.Load()}
	if problems := s.readSubscription(edited, params, true); len(problems) > 0 {
		return result{}, badRequest(problems...)
	}
	sub.settings.Store(&edited.subscriptionSettings)
	s.saveSubscriptions(c.ctx())
	return result{body: s.subscriptionBody(sub)}, nil
}

func (s *Server) deleteSubscription(c *call) (result, error) {
	if apiErr := s.subscriptionsLoaded(c.ctx()); apiErr != nil {
		return result{}, apiErr
	}
	id := c.vars["subscriptionID"]
	if !s.subscriptions.remove(id) {
		return result{}, newError(http.StatusNotFound, msgResourceNotFound, "EventDestination", id)
	}
	s.saveSubscriptions(c.ctx())
	return result{}, nil
}

func (s *Server) suspendSubscription(c *call) (result, error) {
	sub, apiErr := s.subscriptionFor(c)
	if apiErr != nil {
		return result{}, apiErr
	}
	if _, apiErr := actionParams(c.body, "SuspendSubscription", nil, nil); apiErr != nil {
		return result{}, apiErr
	}
	if sub.kind == subscriptionSSE {
		return result{}, newError(http.StatusBadRequest, msgActionNotSupported, "SuspendSubscription")
	}
	s.subscriptions.suspend(sub)
	s.saveSubscriptions(c.ctx())
	return result{}, nil
}

// resumeSubscription delivers again: the events the feed still holds
// that are newer than DeliverBufferedEventDuration (an ISO 8601 duration),
// and none from the suspension without it, as a subscription suspended for
// a dead destination could otherwise flood it on its return.
func (s *Server) resumeSubscription(c *call) (result, error) {
	const action = "ResumeSubscription"
	sub, apiErr := s.subscriptionFor(c)
	if apiErr != nil {
		return result{}, apiErr
	}
	params, apiErr := actionParams(c.body, action, []string{"DeliverBufferedEventDuration"}, nil)
	if apiErr != nil {
		return result{}, apiErr
	}
	if sub.kind == subscriptionSSE {
		return result{}, newError(http.StatusBadRequest, msgActionNotSupported, action)
	}
	var buffered time.Duration
	if raw, ok := params["DeliverBufferedEventDuration"]; ok {
		text, ok := jsonString(raw)
		if !ok {
			return result{}, newError(http.StatusBadRequest, msgActionParameterValueTypeError, jsonText(raw), "DeliverBufferedEventDuration", action)
		}
		if text != "" {
			if buffered, ok = parseISODuration(text); !ok {
				return result{}, newError(http.StatusBadRequest, msgActionParameterValueFormat, text, "DeliverBufferedEventDuration", action)
			}
		}
	}
	s.subscriptions.resume(sub, s.now().Add(-buffered), buffered > 0, s.events.Last())
	s.saveSubscriptions(c.ctx())
	return result{}, nil
}

var isoDuration = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^P(?:([0-9]+)D)?(?:T(?:([0-9]+)H)?(?:([0-9]+)M)?(?:([0-9]+(?:\.[0-9]+)?)S)?)?$`)
})

// parseISODuration reads the duration form Redfish uses, PnDTnHnMn.nS.
func parseISODuration(text string) (time.Duration, bool) {
	m := isoDuration().FindStringSubmatch(text)
	if m == nil || text == "P" || strings.HasSuffix(text, "T") {
		return 0, false
	}
	var d time.Duration
	for i, unit := range []time.Duration{24 * time.Hour, time.Hour, time.Minute, time.Second} {
		if m[i+1] == "" {
			continue
		}
		n, err := strconv.ParseFloat(m[i+1], 64)
		if err != nil || n > 1e6 {
			return 0, false
		}
		d += time.Duration(n * float64(unit))
	}
	return d, true
}

// openSSESubscription makes the member that stands for an SSE stream, with
// a Context of the service's choosing that says nothing of the client.
func (s *Server) openSSESubscription(owner string) *subscription {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	sub := &subscription{kind: subscriptionSSE, owner: owner}
	sub.settings.Store(&subscriptionSettings{context: hex.EncodeToString(b)})
	s.subscriptions.add(sub) // SSE streams are bounded by eventStreams
	return sub
}

// submitTestEvent sends a client's event to every stream and subscription
// whose filter lets it through.
func (s *Server) submitTestEvent(c *call) (result, error) {
	const action = "SubmitTestEvent"
	params, apiErr := actionParams(c.body, action,
		[]string{"MessageId", "MessageArgs", "Message", "MessageSeverity", "Severity", "OriginOfCondition", "EventId", "EventTimestamp", "EventGroupId", "EventType"},
		[]string{"MessageId"})
	if apiErr != nil {
		return result{}, apiErr
	}
	var problems []message
	str := func(key string) string {
		raw, ok := params[key]
		if !ok {
			return ""
		}
		v, ok := jsonString(raw)
		if !ok {
			problems = append(problems, message{key: msgActionParameterValueTypeError, args: []string{jsonText(raw), key, action}})
		}
		return v
	}
	r := record{messageID: str("MessageId"), message: str("Message"), severity: str("MessageSeverity"), args: []string{}}
	if r.messageID != "" && !testEventMessageID().MatchString(r.messageID) {
		problems = append(problems, message{key: msgActionParameterValueFormat, args: []string{r.messageID, "MessageId", action}})
	}
	if r.severity == "" {
		r.severity = "OK"
	}
	if !slices.Contains([]string{"OK", "Warning", "Critical"}, r.severity) {
		problems = append(problems, message{key: msgActionParameterValueNotInList, args: []string{r.severity, "MessageSeverity", action}})
	}
	if raw, ok := params["MessageArgs"]; ok && json.Unmarshal(raw, &r.args) != nil {
		problems = append(problems, message{key: msgActionParameterValueTypeError, args: []string{jsonText(raw), "MessageArgs", action}})
	}
	if origin := str("OriginOfCondition"); origin != "" {
		if !strings.HasPrefix(origin, "/redfish/v1") {
			problems = append(problems, message{key: msgActionParameterValueFormat, args: []string{origin, "OriginOfCondition", action}})
		}
		r.origin = strings.TrimRight(origin, "/")
	}
	if ts := str("EventTimestamp"); ts != "" {
		t, err := time.Parse(time.RFC3339, ts)
		if err != nil {
			problems = append(problems, message{key: msgActionParameterValueFormat, args: []string{ts, "EventTimestamp", action}})
		}
		r.timestamp = t
	}
	if raw, ok := params["EventGroupId"]; ok {
		var group int64
		if json.Unmarshal(raw, &group) != nil {
			problems = append(problems, message{key: msgActionParameterValueTypeError, args: []string{jsonText(raw), "EventGroupId", action}})
		}
		r.groupID = &group
	}
	// EventId (the service numbers its events), Severity and EventType
	// (deprecated) are accepted and not used.
	str("EventId")
	str("Severity")
	str("EventType")
	if len(problems) > 0 {
		return result{}, badRequest(problems...)
	}
	if r.message == "" {
		r.message = "Test event " + r.messageID
	}
	s.events.Publish(events.Event{Kind: events.Test, Detail: r})
	return result{}, nil
}
