package conformance_test

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/schemas"

	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

// pushedEvent is one POST a receiver got.
type pushedEvent struct {
	header http.Header
	body   []byte
}

// startHTTPSReceiver is an event destination on loopback over HTTPS: it
// hands every POST to the returned channel and answers 204.
func startHTTPSReceiver(t *testing.T) (*httptest.Server, <-chan pushedEvent) {
	t.Helper()
	got := make(chan pushedEvent, 64)
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil || r.Method != http.MethodPost {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		select {
		case got <- pushedEvent{header: r.Header.Clone(), body: body}:
		default: // the test stopped reading; drop
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(ts.Close)
	return ts, got
}

// nextEventWith waits for the pushed Event whose record carries message,
// skipping others (the BMC's own events).
func nextEventWith(t *testing.T, got <-chan pushedEvent, message string) (pushedEvent, schemas.Event) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case p := <-got:
			var event schemas.Event
			if err := json.Unmarshal(p.body, &event); err != nil {
				t.Fatalf("gofish cannot decode the pushed body %s: %v", p.body, err)
			}
			if len(event.Events) > 0 && event.Events[0].Message == message {
				return p, event
			}
		case <-timeout:
			t.Fatalf("no event with Message %q reached the receiver", message)
		}
	}
}

// TestGofishEventSubscription is a push subscription's life through
// gofish's EventService API against a BMC served like bmc-server's (the
// service's Run loop going), with a receiver on loopback over HTTPS whose
// certificate the BMC verifies: create, list and read back, a test event
// received and decoded by gofish and valid against Event's JSON schema,
// delete.
func TestGofishEventSubscription(t *testing.T) {
	validator := sharedValidator(t)
	receiver, pushed := startHTTPSReceiver(t)
	roots := x509.NewCertPool()
	roots.AddCert(receiver.Certificate())
	ts := serveBMCWith(t, memory.New(memory.Options{}), func(cfg *redfish.Config) {
		// The receiver is on this host, over TLS with its own certificate.
		cfg.EventDestinationsAllowLoopback = true
		cfg.EventDestinationRoots = roots
	})
	client, err := gofish.Connect(gofish.ClientConfig{Endpoint: ts.URL, Username: maasUser, Password: maasPass, Insecure: true, HTTPClient: ts.Client()})
	if err != nil {
		t.Fatalf("connect (session auth): %v", err)
	}
	defer client.Logout()
	es, err := client.Service.EventService()
	if err != nil {
		t.Fatalf("EventService: %v", err)
	}
	if !es.ServiceEnabled || es.SubscriptionsLink == "" || es.SubmitTestEventTarget == "" {
		t.Fatalf("EventService: ServiceEnabled %t, Subscriptions %q, SubmitTestEvent %q; want enabled with both", es.ServiceEnabled, es.SubscriptionsLink, es.SubmitTestEventTarget)
	}

	const (
		context = "gofish rack 7"
		token   = "gofish-receiver-token"
	)
	destination := receiver.URL + "/events"
	// No registry or resource type filter: the test events below are of
	// a registry of their own.
	uri, err := es.CreateEventSubscriptionInstance(destination, nil, nil,
		map[string]string{"X-Receiver-Token": token}, schemas.RedfishEventDestinationProtocol, context,
		schemas.SuspendRetriesDeliveryRetryPolicy, nil)
	if err != nil {
		t.Fatalf("CreateEventSubscriptionInstance: %v", err)
	}
	if !strings.HasPrefix(uri, es.SubscriptionsLink+"/") {
		t.Fatalf("the new subscription's URI is %q, want a member of %s", uri, es.SubscriptionsLink)
	}

	listed, err := es.Subscriptions()
	if err != nil {
		t.Fatalf("Subscriptions: %v", err)
	}
	if !slices.ContainsFunc(listed, func(d *schemas.EventDestination) bool { return d.ODataID == uri }) {
		t.Errorf("Subscriptions does not list %s", uri)
	}
	sub, err := es.GetEventSubscription(uri)
	if err != nil {
		t.Fatalf("GetEventSubscription: %v", err)
	}
	for _, c := range []struct{ what, got, want string }{
		{"Destination", sub.Destination, destination},
		{"Context", sub.Context, context},
		{"Protocol", string(sub.Protocol), string(schemas.RedfishEventDestinationProtocol)},
		{"SubscriptionType", string(sub.SubscriptionType), string(schemas.RedfishEventSubscriptionType)},
		{"DeliveryRetryPolicy", string(sub.DeliveryRetryPolicy), string(schemas.SuspendRetriesDeliveryRetryPolicy)},
	} {
		if c.got != c.want {
			t.Errorf("subscription %s = %q, want %q", c.what, c.got, c.want)
		}
	}
	// HttpHeaders are write-only: they may hold the receiver's credentials.
	if len(sub.HTTPHeaders) != 0 {
		t.Errorf("HttpHeaders read back as %v, want them hidden", sub.HTTPHeaders)
	}

	// Each SubmitTestEvent the service accepts must reach the receiver
	// as an Event valid against its schema; one it refuses must get a
	// clean Redfish 400 that gofish decodes.
	rfc3339 := time.Now().UTC().Format(time.RFC3339)
	tests := []struct {
		name, messageID, timestamp string
		// mustRefuse is the Base message a 400 must carry; "" lets the
		// service accept the event or refuse it.
		mustRefuse string
	}{
		{"versioned MessageId", "Conformance.1.0.GofishTest", rfc3339, ""},
		// Event's schema wants MessageId as Prefix.Major.Minor.Key, and so
		// does SubmitTestEvent's parameter pattern in the CSDL.
		{"unversioned MessageId", "Conformance.GofishTest", rfc3339, "ActionParameterValueFormatError"},
		// What SubmitTestingEvent sends as EventTimestamp.
		{"time.String() timestamp", "Conformance.1.0.GofishTest", time.Now().String(), "ActionParameterValueFormatError"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			message := "gofish test event " + tt.name
			_, err := es.SubmitTestEvent(&schemas.EventServiceSubmitTestEventParameters{
				MessageID:         tt.messageID,
				Message:           message,
				MessageArgs:       []string{"one"},
				MessageSeverity:   schemas.OKHealth,
				EventTimestamp:    tt.timestamp,
				OriginOfCondition: es.ODataID,
			})
			var refused *schemas.Error
			switch {
			case errors.As(err, &refused) && refused.HTTPReturnedStatusCode == http.StatusBadRequest && len(refused.ExtendedInfos) > 0:
				if !strings.HasSuffix(refused.ExtendedInfos[0].MessageID, "."+tt.mustRefuse) {
					t.Errorf("refused with %s, want %s", refused.ExtendedInfos[0].MessageID, tt.mustRefuse)
				}
				return // refused cleanly: nothing is delivered
			case err != nil:
				t.Fatalf("SubmitTestEvent: %v, want success or a Redfish 400", err)
			case tt.mustRefuse != "":
				t.Fatalf("SubmitTestEvent accepted, want a 400 with %s", tt.mustRefuse)
			}
			p, event := nextEventWith(t, pushed, message)
			if got := p.header.Get("X-Receiver-Token"); got != token {
				t.Errorf("the POST carried X-Receiver-Token %q, want the subscription's HttpHeaders value", got)
			}
			if ct := p.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
			record := event.Events[0]
			if event.Context != context || record.MessageID != tt.messageID || record.MessageSeverity != schemas.OKHealth || !slices.Equal(record.MessageArgs, []string{"one"}) {
				t.Errorf("gofish decoded Context %q, MessageId %q, MessageSeverity %q, MessageArgs %v; want %q, %q, OK, [one]",
					event.Context, record.MessageID, record.MessageSeverity, record.MessageArgs, context, tt.messageID)
			}
			violations, err := validator.Validate("pushed Event", p.body)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range violations {
				t.Errorf("%s; body %s", v, p.body)
			}
		})
	}

	// gofish's SubmitTestingEvent helper sends no MessageId and a Go
	// time.String() timestamp, not RFC 3339: the service must answer with
	// a Redfish 400 gofish can decode, and go on serving.
	t.Run("SubmitTestingEvent helper", func(t *testing.T) {
		err := es.SubmitTestingEvent("gofish helper event")
		var refused *schemas.Error
		if !errors.As(err, &refused) || refused.HTTPReturnedStatusCode != http.StatusBadRequest {
			t.Fatalf("SubmitTestingEvent: %v, want a Redfish 400", err)
		}
		if !strings.HasPrefix(refused.Code, "Base.") || len(refused.ExtendedInfos) == 0 || refused.ExtendedInfos[0].MessageID == "" {
			t.Fatalf("the 400 has code %q and ExtendedInfo %+v, want a Base message saying what is wrong", refused.Code, refused.ExtendedInfos)
		}
		t.Logf("SubmitTestingEvent: 400 %s", refused.ExtendedInfos[0].MessageID)
		if _, err := es.GetEventSubscription(uri); err != nil {
			t.Errorf("after the 400 the service no longer answers: %v", err)
		}
	})

	if err := es.DeleteEventSubscription(uri); err != nil {
		t.Fatalf("DeleteEventSubscription: %v", err)
	}
	var gone *schemas.Error
	if _, err := es.GetEventSubscription(uri); !errors.As(err, &gone) || gone.HTTPReturnedStatusCode != http.StatusNotFound {
		t.Errorf("GetEventSubscription after the delete: %v, want a 404", err)
	}
	if listed, err := es.Subscriptions(); err != nil || slices.ContainsFunc(listed, func(d *schemas.EventDestination) bool { return d.ODataID == uri }) {
		t.Errorf("Subscriptions after the delete: %v, still listing %s", err, uri)
	}
}
