package redfish

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/virtmetal/virtmetal/machine"
)

// Push subscriptions outlive the process when the backend keeps state
// (machine.StateStore): a provisioning stack subscribes once, not after
// every restart of its BMC's pod. Each is kept as the properties its POST
// would carry and is read back through the POST's own rules, so what is
// restored is held to today's destination policy, not to the one it was
// made under. SSE members are not kept: their streams end with the
// process.
const subscriptionsStateKey = "redfish-subscriptions"

// subscriptionsStateVersion is the format of what is kept; a record of
// another version is left alone, neither read nor overwritten.
const subscriptionsStateVersion = 1

type storedSubscriptions struct {
	Version       int                  `json:"version"`
	LastID        int                  `json:"lastId"`
	Subscriptions []storedSubscription `json:"subscriptions"`
}

type storedSubscription struct {
	ID         string                     `json:"id"`
	Owner      string                     `json:"owner"`
	Suspended  bool                       `json:"suspended,omitempty"`
	Properties map[string]json.RawMessage `json:"properties"`
}

// subscriptionStore keeps the table in a backend's StateStore.
type subscriptionStore struct {
	state machine.StateStore // nil: nowhere to keep them
	log   logr.Logger

	mu     sync.Mutex // one load, then one save at a time
	loaded bool
	// refused is set when the kept record is of another format: saving
	// would destroy what a newer bmc-server wrote.
	refused bool
	saved   []byte
	// failed says the last save failed; retrying, that retrySaves runs.
	failed, retrying bool
}

func newSubscriptionStore(backend machine.Backend, log logr.Logger) *subscriptionStore {
	st := &subscriptionStore{log: log}
	st.state, _ = backend.(machine.StateStore)
	st.loaded = st.state == nil
	return st
}

// subscriptionsLoaded restores the kept subscriptions once, before any
// request reads or changes the collection; until the store answers, such
// requests get a 503 rather than a collection that would lose what was
// kept.
func (s *Server) subscriptionsLoaded(ctx context.Context) *apiError {
	st := s.subscriptionStore
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.loaded {
		return nil
	}
	data, err := st.state.LoadState(ctx, subscriptionsStateKey)
	switch {
	case errors.Is(err, machine.ErrNotSupported):
		st.log.Info("event subscriptions are not kept across restarts: the backend has nowhere to keep them", "reason", err.Error())
		st.state = nil
	case err != nil:
		e := s.retryLater(msgServiceTemporarilyUnavailable, fmt.Sprint(int(s.retryAfter/time.Second)))
		e.cause = err
		return e
	default:
		s.restoreSubscriptions(data)
		st.saved = data
	}
	st.loaded = true
	return nil
}

// restoreSubscriptionsWhenReachable loads the kept subscriptions, trying
// again while the store cannot be read, until ctx ends.
func (s *Server) restoreSubscriptionsWhenReachable(ctx context.Context) {
	for s.subscriptionsLoaded(ctx) != nil {
		timer := time.NewTimer(s.retryAfter)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return
		}
	}
}

func (s *Server) restoreSubscriptions(data []byte) {
	st := s.subscriptionStore
	if len(data) == 0 {
		return
	}
	var kept storedSubscriptions
	if err := json.Unmarshal(data, &kept); err != nil || kept.Version != subscriptionsStateVersion {
		st.refused = true
		st.log.Error(err, "kept event subscriptions not restored, and not overwritten: unknown format", "version", kept.Version)
		return
	}
	s.subscriptions.mu.Lock()
	s.subscriptions.last = max(s.subscriptions.last, kept.LastID)
	s.subscriptions.mu.Unlock()
	for _, k := range kept.Subscriptions {
		draft := &subscriptionDraft{subscriptionSettings: subscriptionSettings{policy: retrySuspend, verifyCertificate: true}}
		if problems := s.readSubscription(draft, k.Properties, false); len(problems) > 0 || draft.destination == nil {
			st.log.Info("kept event subscription dropped: it is no longer accepted", "subscription", k.ID, "problems", len(problems))
			continue
		}
		sub := &subscription{kind: subscriptionRedfishEvent, owner: k.Owner,
			destination: draft.destination, headers: draft.headers, filter: draft.filter}
		sub.settings.Store(&draft.subscriptionSettings)
		if !s.subscriptions.restore(sub, k.ID) {
			st.log.Info("kept event subscription dropped: the subscription limit is reached", "subscription", k.ID)
			continue
		}
		if k.Suspended {
			s.subscriptions.suspend(sub)
		}
		s.startDelivery(sub, s.events.Last())
	}
}

// saveSubscriptions keeps the table as it is now; a failure is retried by
// retrySaves, and the answer to the request that changed the table does
// not wait for that: the change is live either way.
func (s *Server) saveSubscriptions(ctx context.Context) {
	st := s.subscriptionStore
	st.mu.Lock()
	defer st.mu.Unlock()
	st.failed = false
	if !st.loaded || st.state == nil || st.refused {
		return
	}
	data, err := json.Marshal(s.subscriptions.snapshot())
	if err != nil {
		st.log.Error(err, "event subscriptions not kept")
		return
	}
	if bytes.Equal(data, st.saved) {
		return
	}
	if err := st.state.SaveState(ctx, subscriptionsStateKey, data); err != nil {
		st.log.Error(err, "event subscriptions not kept yet; retrying")
		st.failed = true
		if !st.retrying {
			st.retrying = true
			go s.retrySaves()
		}
		return
	}
	st.saved = data
}

// retrySaves saves again, backing off, until a save succeeds or the service
// stops. It runs only while saves fail: a shared bmc-server has a service
// per VM, and an idle goroutine each would cost a stack per VM.
func (s *Server) retrySaves() {
	const first, most = time.Second, time.Minute
	st := s.subscriptionStore
	for wait := first; ; wait = min(2*wait, most) {
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-s.streams.stopped:
			timer.Stop()
			st.mu.Lock()
			st.retrying = false
			st.mu.Unlock()
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s.saveSubscriptions(ctx)
		cancel()
		st.mu.Lock()
		done := !st.failed
		if done {
			st.retrying = false
		}
		st.mu.Unlock()
		if done {
			return
		}
	}
}

// snapshot is the table's push subscriptions as they are kept.
func (t *subscriptionTable) snapshot() storedSubscriptions {
	t.mu.Lock()
	defer t.mu.Unlock()
	kept := storedSubscriptions{Version: subscriptionsStateVersion, LastID: t.last, Subscriptions: []storedSubscription{}}
	for _, id := range t.sortedIDsLocked() {
		sub := t.byID[id]
		if sub.kind != subscriptionRedfishEvent {
			continue
		}
		kept.Subscriptions = append(kept.Subscriptions, storedSubscription{
			ID: sub.id, Owner: sub.owner, Suspended: sub.suspended, Properties: sub.properties(),
		})
	}
	return kept
}

// properties are what a POST making sub would carry.
func (sub *subscription) properties() map[string]json.RawMessage {
	settings := sub.settings.Load()
	headers := []map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(sub.headers)) {
		for _, v := range sub.headers[name] {
			headers = append(headers, map[string]string{name: v})
		}
	}
	origins := make([]map[string]string, len(sub.filter.originResources))
	for i, o := range sub.filter.originResources {
		origins[i] = map[string]string{"@odata.id": o}
	}
	props := map[string]any{
		"Destination":         sub.destination.String(),
		"Protocol":            "Redfish",
		"Context":             settings.context,
		"DeliveryRetryPolicy": settings.policy,
		"VerifyCertificate":   settings.verifyCertificate,
		"HttpHeaders":         headers,
		"OriginResources":     origins,
	}
	for name, list := range map[string][]string{
		"RegistryPrefixes": sub.filter.registryPrefixes, "ExcludeRegistryPrefixes": sub.filter.excludeRegistryPrefixes,
		"MessageIds": sub.filter.messageIDs, "ExcludeMessageIds": sub.filter.excludeMessageIDs,
		"ResourceTypes": sub.filter.resourceTypes,
	} {
		if len(list) > 0 {
			props[name] = list
		}
	}
	raw := make(map[string]json.RawMessage, len(props))
	for name, v := range props {
		raw[name], _ = json.Marshal(v) // strings, bools and lists of them
	}
	return raw
}
