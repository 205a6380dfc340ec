// Package egress decides which addresses bmc-server may make requests to,
// or have made on its behalf: event deliveries it sends itself, and
// virtual media images the backend's importer (KubeVirt's CDI) fetches
// inside the cluster. One Policy serves both, so that what one refuses
// the other cannot be used to reach.
package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// ErrRefused: the destination is one the BMC never sends to, nor has
// anything fetched from.
var ErrRefused = errors.New("destination refused")

// ErrUnresolved: the destination's name did not resolve, so whether it is
// refused cannot be told; UnresolvedError.Temporary says whether asking
// again may help.
var ErrUnresolved = errors.New("destination does not resolve")

// Resolver resolves host names; *net.Resolver is one, and tests inject
// their own so that no real DNS server is asked.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Options configure a Policy.
type Options struct {
	// AllowLoopback lets destinations be loopback addresses, for a
	// receiver on the BMC's own host. Denied networks still win.
	AllowLoopback bool
	// Denied are networks refused on top of the built-in ones: the
	// cluster's pod and service networks, say. IPv4-mapped IPv6 prefixes
	// deny the IPv4 addresses they map.
	Denied []netip.Prefix
	// OwnAddresses are the BMC's own addresses, asked at each check
	// (default: this host's interfaces' addresses).
	OwnAddresses func() []netip.Addr
	// Resolver resolves host names (default net.DefaultResolver).
	Resolver Resolver
}

// Policy refuses destinations the BMC must not reach or have reached:
// unspecified, broadcast, multicast and link-local addresses (with them
// 169.254.169.254), cloud metadata services outside link-local, loopback
// unless allowed, the BMC's own addresses, the denied networks, and any
// IPv6 address that carries a refused IPv4 address (IPv4-mapped,
// IPv4-compatible, IPv4-translated, NAT64, 6to4, Teredo), since a NAT64
// gateway or a tunnel takes a request there. It is safe for concurrent use.
type Policy struct {
	allowLoopback bool
	denied        []netip.Prefix
	ownAddresses  func() []netip.Addr
	resolver      Resolver
}

// New returns the Policy o describes.
func New(o Options) *Policy {
	p := &Policy{allowLoopback: o.AllowLoopback, denied: unmappedPrefixes(o.Denied), ownAddresses: o.OwnAddresses, resolver: o.Resolver}
	if p.ownAddresses == nil {
		p.ownAddresses = interfaceAddresses
	}
	if p.resolver == nil {
		p.resolver = net.DefaultResolver
	}
	return p
}

// refusedNetworks are refused whatever the options: unspecified ("this
// network", 0/8, which Linux connects to as the local host), link-local
// (with it 169.254.169.254), multicast, the reserved 240/4 with the
// broadcast address, and cloud metadata services outside link-local,
// which hold the node's credentials.
var refusedNetworks = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("100.100.100.200/32"), // Alibaba Cloud
	netip.MustParsePrefix("::/128"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("ff00::/8"),
	netip.MustParsePrefix("fd00:ec2::254/128"), // AWS, IPv6
}

// loopbackNetworks are refused unless Options.AllowLoopback.
var loopbackNetworks = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// RefusedNetworks are the networks a Policy with these options refuses
// (denied ones as compared, IPv4-mapped prefixes as IPv4), for what
// enforces the policy elsewhere: the controller leaves them out of the
// BMC pods' NetworkPolicy.
func RefusedNetworks(o Options) []netip.Prefix {
	refused := slices.Concat(refusedNetworks, unmappedPrefixes(o.Denied))
	if !o.AllowLoopback {
		refused = append(refused, loopbackNetworks...)
	}
	return refused
}

// CheckAddr returns an error wrapping ErrRefused when addr is refused.
func (p *Policy) CheckAddr(addr netip.Addr) error {
	addr = addr.WithZone("").Unmap()
	if err := p.checkOne(addr); err != nil {
		return err
	}
	for _, v4 := range embeddedIPv4(addr) {
		if err := p.checkOne(v4); err != nil {
			return fmt.Errorf("%w (%s carries %s)", err, addr, v4)
		}
	}
	return nil
}

func (p *Policy) checkOne(addr netip.Addr) error {
	if !addr.IsValid() || slices.ContainsFunc(refusedNetworks, func(n netip.Prefix) bool { return n.Contains(addr) }) {
		return fmt.Errorf("%w: %s is unspecified, broadcast, multicast, link-local or a metadata service", ErrRefused, addr)
	}
	// What the operator denies wins over allowLoopback.
	for _, n := range p.denied {
		if n.Contains(addr) {
			return fmt.Errorf("%w: %s is in the denied %s", ErrRefused, addr, n)
		}
	}
	if addr.IsLoopback() {
		if p.allowLoopback {
			return nil
		}
		return fmt.Errorf("%w: %s is loopback", ErrRefused, addr)
	}
	if slices.Contains(p.ownAddresses(), addr) {
		return fmt.Errorf("%w: %s is this BMC's own address", ErrRefused, addr)
	}
	return nil
}

// CheckHost checks a URL's host (an address, bracketed or not, or a name):
// a name must resolve, where the BMC resolves, to addresses that all pass.
// Numeric hosts that are no canonical address ("2852039166", "0xa9.0xfe.
// 0xa9.0xfe", "169.254.169.254.") are read as the IPv4 address the C
// library's resolver, and so an importer using it, would read them as.
func (p *Policy) CheckHost(ctx context.Context, host string) error {
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if addr, err := netip.ParseAddr(host); err == nil {
		return p.CheckAddr(addr)
	}
	if addr, ok := legacyIPv4(host); ok {
		return p.CheckAddr(addr)
	}
	addrs, err := p.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return &UnresolvedError{Host: host, Err: err}
	}
	if len(addrs) == 0 {
		return &UnresolvedError{Host: host, Err: errors.New("no addresses")}
	}
	for _, addr := range addrs {
		if err := p.CheckAddr(addr); err != nil {
			return fmt.Errorf("%s resolves to %s: %w", host, addr, err)
		}
	}
	return nil
}

// UnresolvedError is a host name that did not resolve.
type UnresolvedError struct {
	Host string
	Err  error
}

func (e *UnresolvedError) Error() string {
	return fmt.Sprintf("%s: %s: %v", ErrUnresolved, e.Host, e.Err)
}

func (e *UnresolvedError) Unwrap() []error { return []error{ErrUnresolved, e.Err} }

// Temporary says whether the resolver's failure may pass (a timeout, a
// server failure), unlike a name that does not exist.
func (e *UnresolvedError) Temporary() bool {
	var dns *net.DNSError
	return errors.As(e.Err, &dns) && (dns.IsTimeout || dns.IsTemporary) && !dns.IsNotFound
}

// Control is a net.Dialer's Control: it checks the address each
// connection is about to be made to, after resolution, so a name that
// resolves elsewhere later gains nothing.
func (p *Policy) Control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrRefused, err)
	}
	return p.CheckAddr(ap.Addr())
}

// unmappedPrefixes writes an IPv4-mapped IPv6 prefix (::ffff:10.0.0.0/104)
// as the IPv4 prefix it means, since addresses are compared unmapped.
func unmappedPrefixes(prefixes []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, len(prefixes))
	for i, n := range prefixes {
		if n.Addr().Is4In6() && n.Bits() >= 96 {
			n = netip.PrefixFrom(n.Addr().Unmap(), n.Bits()-96)
		}
		out[i] = n.Masked()
	}
	return out
}

// IPv6 forms that carry an IPv4 address a gateway or tunnel delivers to.
var (
	ipv4Compatible  = netip.MustParsePrefix("::/96")           // RFC 4291, deprecated
	ipv4Translated  = netip.MustParsePrefix("::ffff:0:0:0/96") // RFC 2765 (SIIT)
	nat64WellKnown  = netip.MustParsePrefix("64:ff9b::/96")    // RFC 6052
	nat64LocalUse   = netip.MustParsePrefix("64:ff9b:1::/48")  // RFC 8215: any RFC 6052 length inside
	sixToFour       = netip.MustParsePrefix("2002::/16")       // RFC 3056
	teredo          = netip.MustParsePrefix("2001::/32")       // RFC 4380
	ipv6Loopback    = netip.IPv6Loopback()
	ipv6Unspecified = netip.IPv6Unspecified()
)

// rfc6052Layouts are where an RFC 6052 prefix of each length puts the
// IPv4 address's four bytes (byte 8, "u", is always skipped).
var rfc6052Layouts = [][4]int{
	{6, 7, 9, 10},   // /48
	{7, 9, 10, 11},  // /56
	{9, 10, 11, 12}, // /64
	{12, 13, 14, 15},
}

// embeddedIPv4 are the IPv4 addresses an IPv6 address carries, in every
// form a request to it could reach them through.
func embeddedIPv4(addr netip.Addr) []netip.Addr {
	if !addr.Is6() {
		return nil
	}
	b := addr.As16()
	at := func(i [4]int) netip.Addr { return netip.AddrFrom4([4]byte{b[i[0]], b[i[1]], b[i[2]], b[i[3]]}) }
	last := [4]int{12, 13, 14, 15}
	switch {
	case ipv4Compatible.Contains(addr) && addr != ipv6Loopback && addr != ipv6Unspecified,
		ipv4Translated.Contains(addr), nat64WellKnown.Contains(addr):
		return []netip.Addr{at(last)}
	case nat64LocalUse.Contains(addr):
		out := make([]netip.Addr, len(rfc6052Layouts))
		for i, layout := range rfc6052Layouts {
			out[i] = at(layout)
		}
		return out
	case sixToFour.Contains(addr):
		return []netip.Addr{at([4]int{2, 3, 4, 5})}
	case teredo.Contains(addr):
		// The server's address, and the client's, stored inverted.
		client := netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]})
		return []netip.Addr{at([4]int{4, 5, 6, 7}), client}
	}
	return nil
}

// legacyIPv4 reads host as inet_aton does: one to four parts, each
// decimal, octal (leading 0) or hexadecimal (0x), the last filling the
// bytes left. ok is false for anything else (a host name).
func legacyIPv4(host string) (netip.Addr, bool) {
	parts := strings.Split(host, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	values := make([]uint64, len(parts))
	for i, part := range parts {
		base, digits := 10, part
		switch {
		case len(part) > 2 && (part[:2] == "0x" || part[:2] == "0X"):
			base, digits = 16, part[2:]
		case len(part) > 1 && part[0] == '0':
			base, digits = 8, part[1:]
		}
		v, err := strconv.ParseUint(digits, base, 32)
		if err != nil {
			return netip.Addr{}, false
		}
		values[i] = v
	}
	var n uint64
	for i, v := range values[:len(values)-1] {
		if v > 0xff {
			return netip.Addr{}, false
		}
		n |= v << (8 * (3 - i))
	}
	lastBits := 8 * (4 - (len(values) - 1))
	if last := values[len(values)-1]; last < 1<<lastBits {
		n |= last
	} else {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), true
}

// interfaceAddresses are this host's addresses.
func interfaceAddresses() []netip.Addr {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var own []netip.Addr
	for _, a := range addrs {
		if prefix, err := netip.ParsePrefix(a.String()); err == nil {
			own = append(own, prefix.Addr().Unmap())
		}
	}
	return own
}

// FixedResolver resolves every name to its addresses, asking no one: the
// tests' resolver.
type FixedResolver []netip.Addr

// LookupNetIP implements Resolver.
func (r FixedResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return r, nil
}
