// Package redfish is a Redfish BMC service in front of a machine.Backend:
// one ComputerSystem, Manager and Chassis per machine, sessions and HTTP
// Basic authentication, the standard roles, and Base registry errors, and
// each system's serial and graphical consoles over WebSockets. It
// speaks the machine contract only; it knows nothing about Kubernetes.
package redfish

import (
	"bufio"
	"cmp"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/uuid"

	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/internal/egress"
	"github.com/virtmetal/virtmetal/internal/events"
	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/machine"
)

// Config configures a Server. Zero optional fields take the defaults below.
type Config struct {
	Backend machine.Backend
	// Accounts are the users; at least one, usernames unique.
	Accounts []Account
	Logger   logr.Logger

	// SessionTimeout is the idle time after which a session ends
	// (default 30 minutes; Redfish allows 30 s to 24 h).
	SessionTimeout time.Duration
	// MaxSessions bounds the live sessions (default 64).
	MaxSessions int
	// MaxBodyBytes bounds request bodies (default 64 KiB).
	MaxBodyBytes int64
	// MaxSessionsPerAccount bounds one account's live sessions, so one
	// account cannot fill the table (default a quarter of MaxSessions).
	MaxSessionsPerAccount int
	// Limiter throttles failed logins per client and account, shared with
	// the other protocols of the BMC; nil means a limiter of this server's
	// own with the default policy. Accounts are never locked: throttling
	// the guessing source leaves the owner able to log in from another.
	Limiter *throttle.Limiter
	// TrustedProxies are the reverse proxies (an Ingress) whose
	// X-Forwarded-For names the client; from anyone else it is ignored.
	TrustedProxies []netip.Prefix
	// RetryAfter is what a 503 asks clients to wait (default 5 s).
	RetryAfter time.Duration
	// ServiceUUID is ServiceRoot.UUID (default random).
	ServiceUUID string
	// FirmwareVersion is each Manager's FirmwareVersion (default the
	// virtmetal build version).
	FirmwareVersion string
	// NetworkProtocol is what each Manager's NetworkProtocol says of the
	// BMC's own services.
	NetworkProtocol NetworkProtocol
	// Now is the clock (default time.Now); tests inject one.
	Now func() time.Time
	// Observer is told of every answered request, for metrics; nil tells
	// no one and costs nothing.
	Observer Observer
	// AuditLog records the power, boot and media actions made through
	// this service, and failed logins, and the LogServices serve it; share
	// one with the BMC's other protocols so their actions appear too. nil
	// means a log of this server's own.
	AuditLog *auditlog.Log
	// MaxEventStreams bounds the open SSE streams (default 64), and
	// MaxEventStreamsPerSource one client's (default 4).
	MaxEventStreams, MaxEventStreamsPerSource int
	// EventKeepAlive is how often an idle SSE stream gets a comment line
	// (default 30 s).
	EventKeepAlive time.Duration
	// EventPoll is how often the EventService's watcher asks the backend
	// whether a machine changed (default events.WatcherOptions'), once Run
	// runs.
	EventPoll time.Duration
	// MaxEventSubscriptions bounds the push subscriptions (default 16).
	MaxEventSubscriptions int
	// EventDeliveryRetryAttempts is how often a failed delivery is retried
	// before a subscription is suspended or deleted (default 3), and
	// EventDeliveryRetryInterval the wait between tries (default 30 s).
	EventDeliveryRetryAttempts int
	EventDeliveryRetryInterval time.Duration
	// EventDestinationsDenied are networks neither events are sent to nor
	// virtual media images are fetched from, on top of what egress.Policy
	// always refuses (link-local, metadata services, loopback, this host's
	// own addresses, and their NAT64, IPv4-mapped and 6to4 forms): the
	// cluster's pod and service networks, say.
	EventDestinationsDenied []netip.Prefix
	// EventDestinationsAllowLoopback lets event subscriptions send to, and
	// images be fetched from, loopback, for a receiver on the BMC's own
	// host.
	EventDestinationsAllowLoopback bool
	// DestinationResolver resolves the host names of image URLs, whose
	// every address must pass the same policy (default
	// net.DefaultResolver); tests inject one that asks no DNS server.
	DestinationResolver egress.Resolver
	// EventDestinationRoots verify destinations' certificates (default
	// the system's roots).
	EventDestinationRoots *x509.CertPool
	// ConsoleSessions admits one stream per machine and console; share
	// the one IPMI's Serial-over-LAN uses, so that a console held over
	// one protocol is refused over the other. nil means the server's own.
	ConsoleSessions *machine.ConsoleSessions
	// ConsoleWriteTimeout is how long a console's output waits for a
	// client that does not read it before the console is closed (default
	// 10 s); meanwhile the console is not read, so nothing piles up.
	ConsoleWriteTimeout time.Duration
	// ConsoleKeepAlive is how often an open console's WebSocket is pinged
	// (default 30 s); a client that answers nothing within
	// ConsoleWriteTimeout of a ping is gone.
	ConsoleKeepAlive time.Duration
}

// Observer learns what the service answered. Its method must be cheap and
// safe for concurrent use.
type Observer interface {
	// ObserveRequest is one request: the path pattern of its route in the
	// route table ("" for a URI none matches, so unknown URIs cannot grow
	// the label set, and for a 503 given before routing while the backend
	// is not ready), its method, the status answered and the time taken.
	ObserveRequest(route, method string, status int, took time.Duration)
}

const (
	defaultSessionTimeout = 30 * time.Minute
	minSessionTimeout     = 30 * time.Second
	maxSessionTimeout     = 24 * time.Hour
	defaultMaxSessions    = 64
	defaultMaxBodyBytes   = 64 << 10
	defaultRetryAfter     = 5 * time.Second
)

// Server is the Redfish service; it implements http.Handler.
type Server struct {
	backend     machine.Backend
	log         logr.Logger
	auth        *authenticator
	maxBody     int64
	retryAfter  time.Duration
	serviceUUID string
	observer    Observer
	audit       *auditlog.Log
	now         func() time.Time
	ready       machine.Readiness // nil when the backend is always ready
	versioned   machine.Versioned // nil when the backend cannot say when machines change

	// events are the machines' changes the EventService streams.
	events      *events.Feed
	watcher     *events.Watcher
	streams     eventStreams
	eventBodies renderedEvents
	// subscriptions are the EventService's members: push subscriptions,
	// delivered through delivery and allowed by destinations, and SSE
	// streams.
	subscriptions     subscriptionTable
	subscriptionStore *subscriptionStore
	destinations      *egress.Policy
	delivery          deliveryClients

	// rendered keeps GET answers until what they show changes.
	rendered renderCache

	// tasks are the TaskService's: inserts whose image is not ready yet.
	tasks taskStore

	// firmwareVersion is Manager.FirmwareVersion.
	firmwareVersion string
	// protocols is what Manager.NetworkProtocol says.
	protocols NetworkProtocol

	// consoles admits one stream per machine and console kind.
	consoles            *machine.ConsoleSessions
	consoleWriteTimeout time.Duration
	consoleKeepAlive    time.Duration

	// patchLocks serialises If-Match checks with the writes they guard, per
	// machine.
	patchLocksMu sync.Mutex
	patchLocks   map[string]*sync.Mutex
}

var _ http.Handler = (*Server)(nil)

// isUUID says whether s is a UUID in its 36-character hyphenated form, in
// either case (uuid.Validate alone also takes braces, a urn: prefix or no
// hyphens). Not a regular expression: this runs at every start, and a
// pattern compiled there stays in every BMC's heap.
func isUUID(s string) bool { return len(s) == 36 && uuid.Validate(s) == nil }

// NewServer validates cfg and builds the service.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Backend == nil {
		return nil, errors.New("redfish: Config.Backend is nil")
	}
	if err := validateAccounts(cfg.Accounts); err != nil {
		return nil, err
	}

	switch {
	case cfg.MaxSessions < 0:
		return nil, fmt.Errorf("redfish: MaxSessions %d is negative", cfg.MaxSessions)
	case cfg.MaxSessionsPerAccount < 0:
		return nil, fmt.Errorf("redfish: MaxSessionsPerAccount %d is negative", cfg.MaxSessionsPerAccount)
	case cfg.MaxBodyBytes < 0:
		return nil, fmt.Errorf("redfish: MaxBodyBytes %d is negative", cfg.MaxBodyBytes)
	case cfg.MaxEventSubscriptions < 0 || cfg.EventDeliveryRetryAttempts < 0 || cfg.EventDeliveryRetryInterval < 0:
		return nil, errors.New("redfish: MaxEventSubscriptions, EventDeliveryRetryAttempts and EventDeliveryRetryInterval cannot be negative")
	case cfg.ConsoleWriteTimeout < 0 || cfg.ConsoleKeepAlive < 0:
		return nil, errors.New("redfish: ConsoleWriteTimeout and ConsoleKeepAlive cannot be negative")
	case cfg.RetryAfter != 0 && cfg.RetryAfter < time.Second:
		return nil, fmt.Errorf("redfish: RetryAfter %v is under the one second Retry-After can express", cfg.RetryAfter)
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	timeout := orDefault(cfg.SessionTimeout, defaultSessionTimeout)
	if timeout < minSessionTimeout || timeout > maxSessionTimeout {
		return nil, fmt.Errorf("redfish: SessionTimeout %v is outside [%v, %v]", timeout, minSessionTimeout, maxSessionTimeout)
	}
	maxSessions := orDefault(cfg.MaxSessions, defaultMaxSessions)
	maxPerAccount := orDefault(cfg.MaxSessionsPerAccount, max(maxSessions/4, 1))
	limiter := cfg.Limiter
	if limiter == nil {
		limiter = throttle.New(throttle.Policy{Now: now})
	}
	serviceUUID := cfg.ServiceUUID
	if serviceUUID == "" {
		serviceUUID = randomUUID()
	}
	if !isUUID(serviceUUID) {
		return nil, fmt.Errorf("redfish: ServiceUUID %q is not a UUID", serviceUUID)
	}
	log := cfg.Logger
	if log.GetSink() == nil {
		log = logr.Discard()
	}

	s := &Server{
		backend:     cfg.Backend,
		log:         log,
		auth:        newAuthenticator(cfg.Accounts, now, timeout, maxSessions, maxPerAccount, limiter, clientAddresses{trustedProxies: cfg.TrustedProxies}),
		maxBody:     orDefault(cfg.MaxBodyBytes, defaultMaxBodyBytes),
		retryAfter:  orDefault(cfg.RetryAfter, defaultRetryAfter),
		serviceUUID: strings.ToLower(serviceUUID),
		patchLocks:  map[string]*sync.Mutex{},
		observer:    cfg.Observer,
		now:         now,
	}
	s.firmwareVersion = orDefault(cfg.FirmwareVersion, buildVersion())
	s.protocols = cfg.NetworkProtocol
	s.consoles = cfg.ConsoleSessions
	if s.consoles == nil {
		s.consoles = &machine.ConsoleSessions{}
	}
	s.consoleWriteTimeout = orDefault(cfg.ConsoleWriteTimeout, defaultConsoleWriteTimeout)
	s.consoleKeepAlive = orDefault(cfg.ConsoleKeepAlive, defaultConsoleKeepAlive)
	s.audit = cfg.AuditLog
	if s.audit == nil {
		s.audit = auditlog.New(auditlog.Options{Now: now})
	}
	s.auth.audit = s.audit
	s.ready, _ = cfg.Backend.(machine.Readiness)
	s.versioned, _ = cfg.Backend.(machine.Versioned)
	s.events = events.NewFeed(events.Options{Now: now})
	s.watcher = events.NewWatcher(cfg.Backend, s.events, events.WatcherOptions{Interval: cfg.EventPoll})
	s.streams = eventStreams{
		max:          orDefault(cfg.MaxEventStreams, defaultMaxEventStreams),
		maxPerSource: orDefault(cfg.MaxEventStreamsPerSource, defaultMaxEventStreamsPerSource),
		keepAlive:    orDefault(cfg.EventKeepAlive, defaultEventKeepAlive),
		perSource:    map[string]int{},
		stopped:      make(chan struct{}),
	}
	s.subscriptions = subscriptionTable{max: orDefault(cfg.MaxEventSubscriptions, defaultMaxSubscriptions), byID: map[string]*subscription{}}
	s.subscriptionStore = newSubscriptionStore(cfg.Backend, s.log.WithName("subscriptions"))
	s.destinations = egress.New(egress.Options{
		AllowLoopback: cfg.EventDestinationsAllowLoopback, Denied: cfg.EventDestinationsDenied, Resolver: cfg.DestinationResolver,
	})
	s.delivery = newDeliveryClients(s.destinations, cfg.EventDestinationRoots,
		orDefault(cfg.EventDeliveryRetryAttempts, defaultDeliveryRetryAttempts),
		orDefault(cfg.EventDeliveryRetryInterval, defaultDeliveryRetryInterval))
	// Every write this service makes is logged, with the actor serveRoute
	// puts in its context, and its change is an event before it returns.
	s.backend = machine.InterceptBackend(cfg.Backend, machine.Chain(s.audit.Intercept, s.watcher.Intercept))
	return s, nil
}

// validateAccounts checks a list of accounts for NewServer and SetAccounts.
func validateAccounts(accounts []Account) error {
	if len(accounts) == 0 {
		return errors.New("redfish: Config.Accounts is empty; at least one account is needed")
	}
	seen := map[string]bool{}
	for i, acc := range accounts {
		switch {
		case acc.Username == "":
			return fmt.Errorf("redfish: account %d has an empty username", i+1)
		case acc.Password == "":
			return fmt.Errorf("redfish: account %q has an empty password", acc.Username)
		case !acc.Role.valid():
			return fmt.Errorf("redfish: account %q has unknown role %q (want one of %v)", acc.Username, acc.Role, roles)
		case seen[acc.Username]:
			return fmt.Errorf("redfish: username %q appears twice", acc.Username)
		}
		seen[acc.Username] = true
	}
	return nil
}

// SetAccounts replaces the accounts of a running server, as when a mounted
// Secret is rotated. An account whose password changed also accepts its
// previous password for grace, so clients keep working while they learn
// the new one; sessions opened with the previous password (before or
// during the window) end with that window, and sessions of removed
// accounts end at once.
func (s *Server) SetAccounts(accounts []Account, grace time.Duration) error {
	if err := validateAccounts(accounts); err != nil {
		return err
	}
	s.auth.setAccounts(accounts, grace)
	s.events.Publish(events.Event{Kind: events.AccountsChanged})
	return nil
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

func randomUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// patchLock returns the mutex that serialises writes to one machine.
func (s *Server) patchLock(id string) *sync.Mutex {
	s.patchLocksMu.Lock()
	defer s.patchLocksMu.Unlock()
	l, ok := s.patchLocks[id]
	if !ok {
		l = &sync.Mutex{}
		s.patchLocks[id] = l
	}
	return l
}

// ServeHTTP answers one request. It normalises the path (every URI works
// with and without a trailing slash, as MaaS retries with one), recovers
// from panics, and logs the outcome.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := s.now()
	rec := &recordingWriter{ResponseWriter: w}
	defer func() {
		if p := recover(); p != nil {
			s.log.Error(fmt.Errorf("panic: %v", p), "request handler panicked", "method", r.Method, "path", r.URL.Path)
			if !rec.wroteHeader {
				s.writeError(rec, r, &apiError{status: http.StatusInternalServerError, messages: []message{{key: msgInternalError}}})
			}
		}
		if s.observer != nil {
			s.observer.ObserveRequest(rec.route, r.Method, cmp.Or(rec.status, http.StatusOK), s.now().Sub(start))
		}
		if log := s.log.V(1); log.Enabled() {
			log.Info("request", "method", r.Method, "path", r.URL.Path, "status", rec.status, "duration", s.now().Sub(start))
		}
	}()

	if p := r.URL.Path; len(p) > 1 && strings.HasSuffix(p, "/") {
		trimmed := *r.URL
		trimmed.Path = strings.TrimRight(p, "/")
		trimmed.RawPath = ""
		r = r.Clone(r.Context())
		r.URL = &trimmed
	}
	if err := s.notReady(r); err != nil {
		s.writeError(rec, r, s.mapBackendError(err, operation{}))
		return
	}
	if s.serveKept(rec, r) {
		return
	}
	s.serveEndpoint(rec, r)
}

// notReady says why r cannot be served yet: until the backend is ready
// (a KubeVirt cache before its first sync, or an unreachable API server)
// every resource would be missing or partial, so the answer is 503 with
// Retry-After. The service root and the schema documents need no backend.
func (s *Server) notReady(r *http.Request) error {
	if s.ready == nil {
		return nil
	}
	switch p := r.URL.Path; {
	case !strings.HasPrefix(p, "/redfish/v1/"), p == "/redfish/v1/$metadata", p == "/redfish/v1/odata":
		return nil
	}
	return s.ready.Ready()
}

// recordingWriter remembers the status for logging and for the panic
// handler, which must not write a second header.
type recordingWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
	route       string // the route table's path pattern, once routed
}

func (w *recordingWriter) WriteHeader(status int) {
	if !w.wroteHeader {
		w.status, w.wroteHeader = status, true
	}
	w.ResponseWriter.WriteHeader(status)
}

// Hijack hands the connection to a console's WebSocket (console.go).
func (w *recordingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.status, w.wroteHeader = http.StatusSwitchingProtocols, true
	}
	return conn, rw, err
}

// Unwrap lets http.ResponseController reach the connection (SSE streams
// flush and set their own deadlines).
func (w *recordingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *recordingWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}
