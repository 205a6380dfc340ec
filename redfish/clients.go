package redfish

import (
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/virtmetal/virtmetal/internal/throttle"
)

// clientAddresses tells who sent a request, for throttling. Behind an
// Ingress every request comes from the proxy, so X-Forwarded-For is read,
// but only from the configured proxies: anyone else could write any
// address there and escape throttling.
type clientAddresses struct {
	trustedProxies []netip.Prefix
}

// source is the throttling key of r's client.
func (c clientAddresses) source(r *http.Request) string {
	peer, ok := parseHost(r.RemoteAddr)
	if !ok || !c.trusted(peer) {
		return throttle.Source(r.RemoteAddr)
	}
	// Each proxy appends the address it received from; walk back from the
	// nearest hop to the first one that is not one of ours.
	client := peer
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for _, hop := range slices.Backward(hops) {
		addr, ok := parseHost(strings.TrimSpace(hop))
		if !ok {
			break // garbage before this point may be forged: stop at the last good hop
		}
		client = addr
		if !c.trusted(addr) {
			break
		}
	}
	return throttle.Source(client.String())
}

func (c clientAddresses) trusted(addr netip.Addr) bool {
	return slices.ContainsFunc(c.trustedProxies, func(p netip.Prefix) bool { return p.Contains(addr) })
}

// parseHost reads an IP address with or without a port.
func parseHost(s string) (netip.Addr, bool) {
	if host, _, err := net.SplitHostPort(s); err == nil {
		s = host
	}
	addr, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return addr.Unmap().WithZone(""), true
}
