package redfish_test

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/redfish"
)

// namedHosts resolves from a table, asking no DNS server, and counts the
// names it is asked.
type namedHosts struct {
	hosts map[string][]netip.Addr
	asked atomic.Int32
}

func (r *namedHosts) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.asked.Add(1)
	return r.hosts[host], nil
}

// countingMachine counts the InsertMedia calls that reach the backend,
// whose importer is what would fetch the image.
type countingMachine struct {
	machine.Machine
	inserts atomic.Int32
}

func (m *countingMachine) InsertMedia(ctx context.Context, image string) error {
	m.inserts.Add(1)
	return m.Machine.InsertMedia(ctx, image)
}

// TestInsertMediaRefusesWhatEventsRefuse: an image the backend's importer
// would fetch from the metadata service, in any of the forms that reach
// it, from a denied pod network, or through a name that resolves there,
// is refused with ActionParameterValueNotInList before the backend is
// asked for anything; an image elsewhere is inserted.
func TestInsertMediaRefusesWhatEventsRefuse(t *testing.T) {
	denied := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.96.0.0/12")}
	tests := []struct {
		name, image string
		refused     bool
	}{
		{"metadata", "http://169.254.169.254/latest/meta-data/iam/", true},
		{"metadata through NAT64", "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/", true},
		{"metadata IPv4-mapped", "http://[::ffff:169.254.169.254]/latest/meta-data/", true},
		{"metadata 6to4", "http://[2002:a9fe:a9fe::]/latest/meta-data/", true},
		{"metadata decimal", "http://2852039166/latest/meta-data/", true},
		{"name of the metadata service", "http://metadata.example/computeMetadata/v1/", true},
		{"name with a denied address among others", "https://mirror.example/boot.iso", true},
		{"denied pod network", "http://10.244.3.7:8080/boot.iso", true},
		{"denied service network through NAT64", "http://[64:ff9b::a60:1]/boot.iso", true},
		{"loopback", "http://127.0.0.1:10250/pods", true},
		{"name that does not resolve", "http://nowhere.example/boot.iso", true},
		{"image elsewhere", "http://images.example/boot.iso", false},
		{"address elsewhere", "https://[2001:db8::80]/boot.iso", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resolver := &namedHosts{hosts: map[string][]netip.Addr{
				"metadata.example": {netip.MustParseAddr("169.254.169.254")},
				"mirror.example":   {netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("10.244.9.9")},
				"images.example":   {netip.MustParseAddr("198.51.100.7")},
			}}
			var counting *countingMachine
			f := newFixture(t, func(cfg *redfish.Config, b *stubBackend) {
				cfg.EventDestinationsDenied = denied
				cfg.DestinationResolver = resolver
				counting = &countingMachine{Machine: b.Get("vm-0")}
				b.replaced["vm-0"] = counting
			})
			res := f.do(asAdmin("POST", sysInsert0, `{"Image":"`+tt.image+`"}`))
			if !tt.refused {
				if res.status != http.StatusNoContent || counting.inserts.Load() != 1 {
					t.Fatalf("%s: %d %s, %d inserts; want 204 and one insert", tt.image, res.status, res.raw, counting.inserts.Load())
				}
				return
			}
			if res.status != http.StatusBadRequest || !strings.Contains(string(res.raw), `"Base.1.19.ActionParameterValueNotInList"`) ||
				!strings.Contains(string(res.raw), `"Resolution"`) {
				t.Errorf("%s: %d %s, want 400 ActionParameterValueNotInList with a Resolution", tt.image, res.status, res.raw)
			}
			if n := counting.inserts.Load(); n != 0 {
				t.Errorf("%s reached the backend %d times: its importer would fetch it", tt.image, n)
			}
			if media, _ := counting.VirtualMedia(t.Context()); media.Inserted {
				t.Errorf("%s inserted: %+v", tt.image, media)
			}
		})
	}
}

// TestSubscriptionToNAT64MetadataRefused: an event subscription to the
// metadata service through NAT64, or written IPv4-mapped or 6to4, is
// refused as the plain address is.
func TestSubscriptionToNAT64MetadataRefused(t *testing.T) {
	for _, destination := range []string{
		"http://[64:ff9b::a9fe:a9fe]/",
		"http://[64:ff9b:1::a9fe:a9fe]/",
		"http://[::ffff:a9fe:a9fe]/",
		"http://[2002:a9fe:a9fe::1]/",
		"http://[64:ff9b::7f00:1]:8080/", // loopback through NAT64
	} {
		t.Run(destination, func(t *testing.T) {
			f := newFixture(t, nil)
			defer f.server.StopEventStreams()
			res := f.do(asAdmin("POST", subscriptionsURI, `{"Destination":"`+destination+`","Protocol":"Redfish"}`))
			if res.status != http.StatusBadRequest || !strings.Contains(string(res.raw), "PropertyValueNotInList") {
				t.Errorf("POST %s: %d %s, want 400 PropertyValueNotInList", destination, res.status, res.raw)
			}
		})
	}
}

// timingOut is a resolver whose DNS server does not answer.
type timingOut struct{}

func (timingOut) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	return nil, &net.DNSError{Err: "i/o timeout", Name: host, IsTimeout: true}
}

// TestInsertMediaWhileDNSFails: an image whose name cannot be resolved
// for now is a 503 with Retry-After, not a refusal, and reaches no
// backend.
func TestInsertMediaWhileDNSFails(t *testing.T) {
	var counting *countingMachine
	f := newFixture(t, func(cfg *redfish.Config, b *stubBackend) {
		cfg.DestinationResolver = timingOut{}
		counting = &countingMachine{Machine: b.Get("vm-0")}
		b.replaced["vm-0"] = counting
	})
	res := f.do(asAdmin("POST", sysInsert0, `{"Image":"http://images.example/boot.iso"}`))
	if res.status != http.StatusServiceUnavailable || res.header.Get("Retry-After") == "" || counting.inserts.Load() != 0 {
		t.Errorf("%d %s (Retry-After %q), %d inserts; want 503 with Retry-After and none", res.status, res.raw, res.header.Get("Retry-After"), counting.inserts.Load())
	}
}
