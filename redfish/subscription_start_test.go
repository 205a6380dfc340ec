package redfish_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"

	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

// TestFirstEventAfterSubscribingIsDelivered: on a BMC that has told no
// event yet, an event published the moment the POST is answered reaches
// the new subscription. The delivery used to subscribe to the feed later,
// on its own goroutine, "from now", and lost such an event. The handler is
// called in-process and the reset follows at once, with no network round
// trip between them to hide the gap; each round is a fresh BMC.
func TestFirstEventAfterSubscribingIsDelivered(t *testing.T) {
	r := newReceiver(t)
	for range 20 {
		backend := memory.New(memory.Options{})
		srv, err := redfish.NewServer(redfish.Config{
			Backend:                        backend,
			Accounts:                       []redfish.Account{{Username: adminUser, Password: adminPass, Role: redfish.RoleAdministrator}},
			Logger:                         testr.New(t),
			EventDestinationsAllowLoopback: true,
			EventDestinationRoots:          r.ts.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs,
		})
		if err != nil {
			t.Fatal(err)
		}
		serve := func(method, path, body string) int {
			req := httptest.NewRequest(method, path, strings.NewReader(body))
			req.SetBasicAuth(adminUser, adminPass)
			req.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			srv.ServeHTTP(w, req)
			return w.Code
		}
		before := len(r.messageKeys())
		if code := serve(http.MethodPost, subscriptionsURI, `{"Destination":"`+r.ts.URL+`/events","Protocol":"Redfish"}`); code != http.StatusCreated {
			t.Fatalf("POST: %d", code)
		}
		if code := serve(http.MethodPost, "/redfish/v1/Systems/vm-0/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`); code != http.StatusNoContent {
			t.Fatalf("Reset: %d", code)
		}
		poll.True(t, "the reset made right after the subscription delivered", func() bool { return len(r.messageKeys()) > before })
		srv.StopEventStreams()
	}
}
