package bmcserver

import (
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/virtmetal/virtmetal/internal/throttle"
)

// perSourceListener caps the connections one client address holds open, so
// a few hosts cannot take every file descriptor with idle or slow
// connections. A connection over the cap is closed as soon as accepted.
// Trusted proxies carry every client's connections and are not capped.
type perSourceListener struct {
	net.Listener
	max    int
	exempt []netip.Prefix

	mu   sync.Mutex
	open map[string]int
}

func limitPerSource(l net.Listener, max int, exempt []netip.Prefix) *perSourceListener {
	return &perSourceListener{Listener: l, max: max, exempt: exempt, open: map[string]int{}}
}

func (l *perSourceListener) exempted(addr net.Addr) bool {
	ap, err := netip.ParseAddrPort(addr.String())
	return err == nil && slices.ContainsFunc(l.exempt, func(p netip.Prefix) bool { return p.Contains(ap.Addr().Unmap()) })
}

func (l *perSourceListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.exempted(c.RemoteAddr()) {
			return c, nil
		}
		source := throttle.Source(c.RemoteAddr().String())
		l.mu.Lock()
		allowed := l.open[source] < l.max
		if allowed {
			l.open[source]++
		}
		l.mu.Unlock()
		if allowed {
			return &countedConn{Conn: c, release: func() { l.release(source) }}, nil
		}
		c.Close()
	}
}

func (l *perSourceListener) release(source string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[source]--; l.open[source] <= 0 {
		delete(l.open, source)
	}
}

// countedConn gives its slot back once, however often it is closed.
type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
