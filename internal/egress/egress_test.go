package egress_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/virtmetal/virtmetal/internal/egress"
)

// resolver answers from a table and fails every other name as not found.
type resolver map[string][]string

func (r resolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	texts, ok := r[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	addrs := make([]netip.Addr, len(texts))
	for i, t := range texts {
		addrs[i] = netip.MustParseAddr(t)
	}
	return addrs, nil
}

// TestCheckHost: every refused address is refused in each form that
// reaches it, literal or through a name; others pass. Nothing is dialled.
func TestCheckHost(t *testing.T) {
	own := netip.MustParseAddr("192.0.2.10")
	names := resolver{
		"images.example":     {"198.51.100.7", "2001:db8::7"},
		"metadata.example":   {"169.254.169.254"},
		"sneaky.example":     {"198.51.100.7", "10.244.3.4"}, // one bad address is enough
		"nat64.example":      {"64:ff9b::a9fe:a9fe"},
		"service.example":    {"10.96.0.1"},
		"own.example":        {"192.0.2.10"},
		"localhost":          {"127.0.0.1", "::1"},
		"empty.example":      {},
		"public-nat.example": {"64:ff9b::c633:6407"}, // 198.51.100.7
	}
	policy := egress.New(egress.Options{
		Denied:       []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:10:244::/56")},
		OwnAddresses: func() []netip.Addr { return []netip.Addr{own} },
		Resolver:     names,
	})
	loopbackAllowed := egress.New(egress.Options{AllowLoopback: true, Denied: []netip.Prefix{netip.MustParsePrefix("::ffff:10.96.0.0/108")}, OwnAddresses: func() []netip.Addr { return nil }, Resolver: names})
	tests := []struct {
		name, host string
		policy     *egress.Policy
		want       error // nil: allowed
	}{
		{"metadata", "169.254.169.254", policy, egress.ErrRefused},
		{"metadata bracketed NAT64", "[64:ff9b::a9fe:a9fe]", policy, egress.ErrRefused},
		{"metadata NAT64 written dotted", "64:ff9b::169.254.169.254", policy, egress.ErrRefused},
		{"metadata local-use NAT64 /96", "64:ff9b:1::a9fe:a9fe", policy, egress.ErrRefused},
		{"metadata local-use NAT64 /48", "64:ff9b:1:a9fe:a9:fe00::", policy, egress.ErrRefused},
		{"metadata local-use NAT64 /64", "64:ff9b:1:0:a9:fea9:fe00:0", policy, egress.ErrRefused},
		{"metadata IPv4-mapped", "::ffff:169.254.169.254", policy, egress.ErrRefused},
		{"metadata IPv4-compatible", "::169.254.169.254", policy, egress.ErrRefused},
		{"metadata IPv4-translated", "::ffff:0:a9fe:a9fe", policy, egress.ErrRefused},
		{"metadata 6to4", "2002:a9fe:a9fe::", policy, egress.ErrRefused},
		{"metadata Teredo client", "2001:0:c633:6407::5601:5601", policy, egress.ErrRefused},
		{"metadata decimal", "2852039166", policy, egress.ErrRefused},
		{"metadata hexadecimal parts", "0xa9.0xfe.0xa9.0xfe", policy, egress.ErrRefused},
		{"metadata octal parts", "0251.0376.0251.0376", policy, egress.ErrRefused},
		{"metadata two parts", "169.16689662", policy, egress.ErrRefused},
		{"metadata trailing dot", "169.254.169.254.", policy, egress.ErrRefused},
		{"metadata IPv6 (AWS)", "fd00:ec2::254", policy, egress.ErrRefused},
		{"metadata Alibaba", "100.100.100.200", policy, egress.ErrRefused},
		{"link-local IPv6 with zone", "fe80::1%eth0", policy, egress.ErrRefused},
		{"unspecified", "0.0.0.0", policy, egress.ErrRefused},
		{"this network", "0.1.2.3", policy, egress.ErrRefused},
		{"broadcast", "255.255.255.255", policy, egress.ErrRefused},
		{"multicast", "ff02::1", policy, egress.ErrRefused},
		{"loopback", "127.0.0.1", policy, egress.ErrRefused},
		{"loopback IPv6", "::1", policy, egress.ErrRefused},
		{"loopback NAT64", "64:ff9b::7f00:1", policy, egress.ErrRefused},
		{"loopback allowed", "127.0.0.1", loopbackAllowed, nil},
		{"loopback IPv6 allowed", "::1", loopbackAllowed, nil},
		{"denied pod address", "10.244.1.5", policy, egress.ErrRefused},
		{"denied pod address 6to4", "2002:af4:105::", policy, egress.ErrRefused},
		{"denied pod address IPv4-mapped", "::ffff:10.244.1.5", policy, egress.ErrRefused},
		{"denied IPv6 pod address", "fd00:10:244::9", policy, egress.ErrRefused},
		{"denied written IPv4-mapped", "10.96.0.1", loopbackAllowed, egress.ErrRefused},
		{"own address", "192.0.2.10", policy, egress.ErrRefused},
		{"own address NAT64", "64:ff9b::c000:20a", policy, egress.ErrRefused},
		{"name of metadata", "metadata.example", policy, egress.ErrRefused},
		{"name of metadata NAT64", "nat64.example", policy, egress.ErrRefused},
		{"name with one denied address", "sneaky.example", policy, egress.ErrRefused},
		{"name of a service", "service.example", policy, egress.ErrRefused},
		{"name of the BMC", "own.example", policy, egress.ErrRefused},
		{"localhost", "localhost", policy, egress.ErrRefused},
		{"unknown name", "nowhere.example", policy, egress.ErrUnresolved},
		{"name without addresses", "empty.example", policy, egress.ErrUnresolved},
		{"public address", "198.51.100.7", policy, nil},
		{"public IPv6", "[2001:db8::7]", policy, nil},
		{"public address through NAT64", "64:ff9b::c633:6407", policy, nil},
		{"public name", "images.example", policy, nil},
		{"public name through NAT64", "public-nat.example", policy, nil},
		{"digits in a name", "10.example", policy, egress.ErrUnresolved},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.policy.CheckHost(t.Context(), tt.host)
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("CheckHost(%q) = %v, want %v", tt.host, err, tt.want)
			}
		})
	}
}

// TestControlRefusesOwnAddresses: the policy refuses this host's
// own addresses (here injected, so that the test does not depend on the
// machine's interfaces), in whatever form the dialer sees them, and lets
// others through; loopback only when allowed, denied prefixes never.
func TestControlRefusesOwnAddresses(t *testing.T) {
	own := []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")}
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
				policy := egress.New(egress.Options{
					AllowLoopback: allow, Denied: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
					OwnAddresses: func() []netip.Addr { return own }, Resolver: resolver{},
				})
				err := policy.Control("tcp", tt.address, nil)
				want := tt.refused
				if allow {
					want = tt.refusedUnless
				}
				if (err != nil) != want || (err != nil && !errors.Is(err, egress.ErrRefused)) {
					t.Errorf("allowLoopback %v: %v, want refused %v", allow, err, want)
				}
			}
		})
	}
}

// TestControlChecksTheDialledAddress: the dialer's check reads the
// address it is given, embedded forms included.
func TestControlChecksTheDialledAddress(t *testing.T) {
	policy := egress.New(egress.Options{OwnAddresses: func() []netip.Addr { return nil }, Resolver: resolver{}})
	for address, refused := range map[string]bool{
		"[64:ff9b::a9fe:a9fe]:80": true,
		"169.254.169.254:80":      true,
		"198.51.100.7:443":        false,
		"not an address":          true,
	} {
		if err := policy.Control("tcp", address, nil); errors.Is(err, egress.ErrRefused) != refused {
			t.Errorf("Control(%s) = %v, want refused %v", address, err, refused)
		}
	}
}

// TestUnresolvedTemporary: a resolver's timeout may pass, a missing name
// does not.
func TestUnresolvedTemporary(t *testing.T) {
	for _, tt := range []struct {
		err  *net.DNSError
		want bool
	}{
		{&net.DNSError{Err: "timeout", IsTimeout: true}, true},
		{&net.DNSError{Err: "server misbehaving", IsTemporary: true}, true},
		{&net.DNSError{Err: "no such host", IsNotFound: true}, false},
	} {
		policy := egress.New(egress.Options{Resolver: failing{tt.err}})
		var unresolved *egress.UnresolvedError
		if err := policy.CheckHost(t.Context(), "images.example"); !errors.As(err, &unresolved) || unresolved.Temporary() != tt.want {
			t.Errorf("%v: %v, want temporary %v", tt.err, err, tt.want)
		}
	}
}

type failing struct{ err error }

func (f failing) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return nil, f.err
}

// TestRefusedNetworksAreRefused: the networks told to whoever enforces
// the policy elsewhere are ones the policy refuses, first and last
// address, with and without loopback.
func TestRefusedNetworksAreRefused(t *testing.T) {
	for _, o := range []egress.Options{
		{Denied: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("::ffff:10.96.0.0/108")}},
		{AllowLoopback: true},
	} {
		o.OwnAddresses, o.Resolver = func() []netip.Addr { return nil }, resolver{}
		policy := egress.New(o)
		networks := egress.RefusedNetworks(o)
		if !slices.Contains(networks, netip.MustParsePrefix("127.0.0.0/8")) == !o.AllowLoopback {
			t.Errorf("allow loopback %v: networks %v", o.AllowLoopback, networks)
		}
		for _, n := range networks {
			for _, addr := range []netip.Addr{n.Addr(), lastAddr(n)} {
				if err := policy.CheckAddr(addr); !errors.Is(err, egress.ErrRefused) {
					t.Errorf("%s of %s: %v, want refused", addr, n, err)
				}
			}
		}
	}
}

// lastAddr is the last address of n.
func lastAddr(n netip.Prefix) netip.Addr {
	b := n.Masked().Addr().AsSlice()
	for i := n.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	addr, _ := netip.AddrFromSlice(b)
	return addr
}
