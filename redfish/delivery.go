package redfish

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/virtmetal/virtmetal/internal/egress"
	"github.com/virtmetal/virtmetal/internal/events"
)

// Push delivery: each subscription has one goroutine that follows the
// event feed from where it last delivered and POSTs each event it asked
// for, retrying as its DeliveryRetryPolicy says. A destination that does
// not answer holds only its own goroutine and one event: while it retries,
// the feed drops it as a lagging subscriber, and it resumes from the
// feed's bounded history, told by EventBufferExceeded when it fell beyond.
const (
	defaultDeliveryRetryAttempts = 3
	defaultDeliveryRetryInterval = 30 * time.Second
	// maxBackoff bounds RetryForeverWithBackoff's doubling, as a multiple
	// of DeliveryRetryIntervalSeconds.
	maxBackoff       = 32
	deliveryTimeout  = 15 * time.Second
	maxResponseBytes = 4 << 10
)

// EventDeliveryObserver, when the Config's Observer implements it, learns
// the outcome of each POST to a subscription's destination: "delivered",
// "failed" (refused by the destination or unreachable) or "refused" (the
// service would not connect to the destination's address).
type EventDeliveryObserver interface {
	ObserveEventDelivery(outcome string)
}

// deliveryClients POST events: one client that verifies the destination's
// certificate, one that does not (VerifyCertificate false). Neither uses
// a proxy from the environment, which would dial on the policy's behalf,
// nor follows redirects. Each is made at its first delivery: most services
// have no push subscription, and a shared bmc-server has thousands.
type deliveryClients struct {
	verifying, trusting func() *http.Client
	retryAttempts       int
	retryInterval       time.Duration
}

func newDeliveryClients(policy *egress.Policy, roots *x509.CertPool, attempts int, interval time.Duration) deliveryClients {
	client := func(verify bool) *http.Client {
		dialer := &net.Dialer{Timeout: 5 * time.Second, Control: policy.Control}
		return &http.Client{
			Timeout: deliveryTimeout,
			Transport: &http.Transport{
				DialContext:           dialer.DialContext,
				TLSClientConfig:       &tls.Config{RootCAs: roots, InsecureSkipVerify: !verify, MinVersion: tls.VersionTLS12}, //nolint:gosec // the subscription's VerifyCertificate
				TLSHandshakeTimeout:   5 * time.Second,
				ResponseHeaderTimeout: 10 * time.Second,
				MaxIdleConnsPerHost:   1,
				IdleConnTimeout:       30 * time.Second,
			},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return deliveryClients{
		verifying:     sync.OnceValue(func() *http.Client { return client(true) }),
		trusting:      sync.OnceValue(func() *http.Client { return client(false) }),
		retryAttempts: attempts, retryInterval: interval,
	}
}

// startDelivery runs a push subscription's deliveries, of the events after
// the given one, until it is deleted or the service stops. It subscribes to
// the feed before it returns, so an event published once the caller has
// answered is never missed (after 0 means "from now", not "from the start").
func (s *Server) startDelivery(sub *subscription, after uint64) {
	feed, complete := s.events.Subscribe(after)
	go func() {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-sub.ended:
			case <-s.streams.stopped:
			}
			cancel()
		}()
		s.deliver(ctx, sub, after, feed, complete)
	}()
}

// deliver drains feed, then joins the feed again after each drain (a lag,
// a suspension, a resume), until ctx ends.
func (s *Server) deliver(ctx context.Context, sub *subscription, after uint64, feed *events.Subscription, complete bool) {
	for ctx.Err() == nil {
		if feed != nil && s.subscriptions.isSuspended(sub) {
			feed.Close()
			feed = nil
		}
		if feed == nil {
			if resumed := s.subscriptions.whileSuspended(sub); resumed != nil {
				select {
				case <-resumed:
				case <-ctx.Done():
					return
				}
			}
			complete = true
			// A resume, seen here or not (suspended and resumed while a
			// push was under way), starts where it says.
			if since, replay, resumeAfter, resumed := s.subscriptions.takeReplay(sub); resumed {
				after = resumeAfter
				if replay {
					feed = s.events.SubscribeSince(since)
				}
			}
			if feed == nil {
				feed, complete = s.events.Subscribe(after)
			}
		}
		if complete || s.pushLost(ctx, sub) {
			after = s.drain(ctx, sub, feed, after)
		}
		feed.Close()
		feed = nil
	}
	if feed != nil {
		feed.Close()
	}
}

// drain delivers the feed's events until the feed drops the subscription
// for lagging, a delivery gives up, the subscription is suspended or ctx
// ends; it returns the last event dealt with.
func (s *Server) drain(ctx context.Context, sub *subscription, feed *events.Subscription, after uint64) uint64 {
	for {
		select {
		case e, open := <-feed.C:
			if !open {
				return after
			}
			if s.subscriptions.interrupted(sub) {
				return after
			}
			if rec, ok := recordOf(e); ok && sub.filter.matches(rec) {
				payload, err := eventPayload(e, rec, sub.settings.Load().context)
				if err != nil {
					s.log.Error(err, "event not delivered", "subscription", sub.id, "event", e.ID)
				} else if !s.push(ctx, sub, payload) {
					return e.ID
				}
			}
			after = e.ID
		case <-ctx.Done():
			return after
		}
	}
}

// pushLost tells the destination that events were lost, as the SSE stream
// does, with Base's EventBufferExceeded.
func (s *Server) pushLost(ctx context.Context, sub *subscription) bool {
	payload, err := json.Marshal(lostEventsBody(sub.settings.Load().context))
	return err == nil && s.push(ctx, sub, payload)
}

// push POSTs one event, retrying as the subscription's policy says. It
// returns false when it gave up (the subscription is then suspended or
// deleted), was suspended meanwhile, or ctx ended.
func (s *Server) push(ctx context.Context, sub *subscription, payload []byte) bool {
	interval := s.delivery.retryInterval
	for attempt := 1; ; attempt++ {
		err := s.postEvent(ctx, sub, payload)
		s.observeDelivery(err)
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		policy := sub.settings.Load().policy
		if attempt > s.delivery.retryAttempts && (policy == retrySuspend || policy == retryTerminate) {
			if policy == retryTerminate {
				s.log.Info("event subscription deleted: its destination did not take an event", "subscription", sub.id, "attempts", attempt, "error", err.Error())
				s.subscriptions.remove(sub.id)
			} else {
				s.log.Info("event subscription suspended: its destination did not take an event", "subscription", sub.id, "attempts", attempt, "error", err.Error())
				s.subscriptions.suspend(sub)
			}
			// The removal ends ctx; the save needs a context of its own.
			saveCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deliveryTimeout)
			s.saveSubscriptions(saveCtx)
			cancel()
			return false
		}
		if policy == retryForeverBackingOf {
			interval = min(2*interval, maxBackoff*s.delivery.retryInterval)
		}
		timer := time.NewTimer(interval)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return false
		}
		if s.subscriptions.whileSuspended(sub) != nil {
			return false
		}
	}
}

func (s *Server) postEvent(ctx context.Context, sub *subscription, payload []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, sub.destination.String(), bytes.NewReader(payload))
	if err != nil {
		return err
	}
	if sub.headers != nil {
		req.Header = sub.headers.Clone()
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "virtmetal-bmc/"+s.firmwareVersion)
	client := s.delivery.verifying
	if !sub.settings.Load().verifyCertificate {
		client = s.delivery.trusting
	}
	resp, err := client().Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBytes))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("the destination answered %s", resp.Status)
	}
	return nil
}

func (s *Server) observeDelivery(err error) {
	o, ok := s.observer.(EventDeliveryObserver)
	if !ok {
		return
	}
	switch {
	case err == nil:
		o.ObserveEventDelivery("delivered")
	case errors.Is(err, egress.ErrRefused):
		o.ObserveEventDelivery("refused")
	default:
		o.ObserveEventDelivery("failed")
	}
}

// lostEventsBody is the Event that says events were lost before the
// client could have them, with no id so that an SSE client's
// Last-Event-ID stays what it was.
func lostEventsBody(context string) map[string]any {
	body := map[string]any{
		"@odata.type": typeEvent.odataType(), "Id": "lost", "Name": "Event",
		"Events": []any{map[string]any{
			"EventType": "Other", "MemberId": "0", "MessageId": registryVersion + "." + msgEventBufferExceeded,
			"Message": message{key: msgEventBufferExceeded}.text(), "MessageArgs": []string{}, "MessageSeverity": "Warning",
		}},
	}
	if context != "" {
		body["Context"] = context
	}
	return body
}
