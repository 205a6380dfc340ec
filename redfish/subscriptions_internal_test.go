package redfish

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/virtmetal/virtmetal/internal/egress"
	"github.com/virtmetal/virtmetal/machine/memory"
)

// TestSubscriptionToOwnAddressRefused: a POST whose Destination is one of
// the host's own addresses is a 400, as the dialer would refuse it.
func TestSubscriptionToOwnAddressRefused(t *testing.T) {
	s, err := NewServer(Config{Backend: memory.New(memory.Options{Machines: 1}), Accounts: []Account{{Username: "admin", Password: "secret", Role: RoleAdministrator}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.StopEventStreams)
	s.destinations = egress.New(egress.Options{OwnAddresses: func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("192.0.2.10")} }})
	for destination, want := range map[string]int{
		"https://192.0.2.10/events": http.StatusBadRequest,
		"https://192.0.2.11/events": http.StatusCreated,
	} {
		req := httptest.NewRequest(http.MethodPost, subscriptionsPath, strings.NewReader(`{"Destination":"`+destination+`","Protocol":"Redfish"}`))
		req.SetBasicAuth("admin", "secret")
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != want || want == http.StatusBadRequest && !strings.Contains(rec.Body.String(), `"`+registryVersion+"."+msgPropertyValueNotInList+`"`) {
			t.Errorf("%s: %d %s, want %d", destination, rec.Code, rec.Body, want)
		}
	}
}
