package redfish_test

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"

	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

// TestDeniedNetworksWin: what the operator denies is refused even where
// loopback is allowed, and a denied network written IPv4-mapped denies its
// IPv4 addresses.
func TestDeniedNetworksWin(t *testing.T) {
	tests := []struct {
		name, denied, destination string
		want                      int
	}{
		{"denied loopback beats allowed loopback", "127.0.0.0/8", "https://127.0.0.1:9/events", http.StatusBadRequest},
		{"allowed loopback outside the denied networks", "10.0.0.0/8", "https://127.0.0.1:9/events", http.StatusCreated},
		{"IPv4-mapped denied network", "::ffff:192.0.2.0/120", "https://192.0.2.7/events", http.StatusBadRequest},
		{"IPv4 address outside the IPv4-mapped network", "::ffff:192.0.2.0/120", "https://198.51.100.7/events", http.StatusCreated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, err := redfish.NewServer(redfish.Config{
				Backend:                        memory.New(memory.Options{}),
				Accounts:                       []redfish.Account{{Username: adminUser, Password: adminPass, Role: redfish.RoleAdministrator}},
				Logger:                         testr.New(t),
				EventDestinationsAllowLoopback: true,
				EventDestinationsDenied:        []netip.Prefix{netip.MustParsePrefix(tt.denied)},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.StopEventStreams() // ends the deliveries of what was made
			req := httptest.NewRequest(http.MethodPost, subscriptionsURI, strings.NewReader(`{"Destination":"`+tt.destination+`","Protocol":"Redfish"}`))
			req.SetBasicAuth(adminUser, adminPass)
			req.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			srv.ServeHTTP(w, req)
			if w.Code != tt.want {
				t.Errorf("POST %s with %s denied: %d, want %d: %s", tt.destination, tt.denied, w.Code, tt.want, w.Body)
			}
			if tt.want == http.StatusBadRequest && !strings.Contains(w.Body.String(), "PropertyValueNotInList") {
				t.Errorf("refusal %s lacks PropertyValueNotInList", w.Body)
			}
		})
	}
}
