package redfish

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/virtmetal/virtmetal/machine/memory"
)

// TestDestinationGuardRefusesOwnAddresses: the guard refuses this host's
// own addresses (here injected, so that the test does not depend on the
// machine's interfaces), in whatever form the dialer sees them, and lets
// others through; loopback only when allowed, denied prefixes never.
func TestDestinationGuardRefusesOwnAddresses(t *testing.T) {
	own := []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")}
	guard := &destinationGuard{
		denied:       []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
		ownAddresses: func() []netip.Addr { return own },
	}
	tests := []struct {
		address       string // as the dialer's Control sees it
		refused       bool
		refusedUnless bool // refused unless loopback is allowed
	}{
		{"192.0.2.10:443", true, true},
		{"[::ffff:192.0.2.10]:443", true, true},
		{"[2001:db8::10]:80", true, true},
		{"192.0.2.11:443", false, false},
		{"[2001:db8::11]:80", false, false},
		{"198.51.100.7:80", true, true},
		{"127.0.0.1:80", true, false},
		{"[::1]:80", true, false},
		{"169.254.169.254:80", true, true},
		{"not an address", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.address, func(t *testing.T) {
			for _, allow := range []bool{false, true} {
				guard.allowLoopback = allow
				err := guard.control("tcp", tt.address, nil)
				want := tt.refused
				if allow {
					want = tt.refusedUnless
				}
				if (err != nil) != want || (err != nil && !errors.Is(err, errDestinationRefused)) {
					t.Errorf("allowLoopback %v: %v, want refused %v", allow, err, want)
				}
			}
		})
	}
}

// TestSubscriptionToOwnAddressRefused: a POST whose Destination is one of
// the host's own addresses is a 400, as the dialer would refuse it.
func TestSubscriptionToOwnAddressRefused(t *testing.T) {
	s, err := NewServer(Config{Backend: memory.New(memory.Options{Machines: 1}), Accounts: []Account{{Username: "admin", Password: "secret", Role: RoleAdministrator}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.StopEventStreams)
	s.destinations.ownAddresses = func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("192.0.2.10")} }
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
