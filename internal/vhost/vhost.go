// Package vhost serves the BMCs of many VMs from one process, as virtual
// hosts. A directory (a mounted Secret) holds one file per VM, named after
// it, with the VM's credentials and the host names its BMC answers to:
//
//	{"username": "maas", "password": "...", "hosts": ["web1.team-a.bmc.example.com"]}
//
// A request reaches the Redfish service of the VM whose host its Host
// header names; each VM has a service, a backend and accounts of its own,
// so one VM's credentials open nothing of another's. The package knows
// machines only through the backend contract: the caller says how a VM's
// backend starts.
package vhost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/redfish"
)

// Config configures a Router.
type Config struct {
	// Dir holds the VM files.
	Dir string
	// StartBackend starts the backend of the VM named vm as spec, its
	// file, says (spec.StateSecret: where its state is kept); it serves
	// until ctx ends: when the VM's file is removed, or changes so that
	// its service restarts (its host, its StateSecret), or the context
	// given to Reload ends.
	StartBackend func(ctx context.Context, vm string, spec bmcspec.SharedVM) (machine.Backend, error)
	// NetworkProtocol is what each VM's Manager says of the shared
	// listener's protocols; its FQDN is each VM's own host (fqdn).
	NetworkProtocol redfish.NetworkProtocol
	// Limiter bounds failed logins; each VM's service counts in a scope
	// of its own (throttle.Limiter.Scoped), so that failures at one VM
	// neither hold back another's logins nor are cleared by them, and
	// the memory bound is the whole server's. nil means one with the
	// default policy.
	Limiter *throttle.Limiter
	// TrustedProxies are the reverse proxies whose X-Forwarded-For names
	// the client.
	TrustedProxies []netip.Prefix
	// Grace is how long a VM's previous password keeps working after its
	// file changes it.
	Grace  time.Duration
	Logger logr.Logger
	// Observer is given to every VM's Redfish service (redfish.Config).
	Observer redfish.Observer
	// Intercept, when set, runs every backend call (for metrics).
	Intercept machine.Interceptor
	// EventDestinationsDenied and EventDestinationsAllowLoopback are
	// given to every VM's Redfish service (redfish.Config): where its
	// push subscriptions may not, and may, send events.
	EventDestinationsDenied        []netip.Prefix
	EventDestinationsAllowLoopback bool
	// EventPoll is given to every VM's Redfish service (redfish.Config):
	// how often its EventService asks the backend whether the VM changed.
	// Each VM has a watcher, so the shared server's idle CPU grows with
	// VMs over EventPoll.
	EventPoll time.Duration
}

// Router is the http.Handler of the virtual hosts.
type Router struct {
	cfg Config
	log logr.Logger

	// hosts maps a host name to the service of the VM that claims it; it
	// is replaced whole by Reload, so requests read it without a lock.
	hosts  atomic.Pointer[map[string]http.Handler]
	loaded atomic.Bool

	mu  sync.Mutex // serialises Reload
	vms map[string]*servedVM
	// reported is the last message logged per problem, so a bad file is
	// logged when it appears or changes rather than at every reload.
	reported map[string]string
	// readData is the target of the directory's ..data link at the last
	// reload, "" when it has none (not a Secret volume).
	readData string
}

type servedVM struct {
	spec   bmcspec.SharedVM
	server *redfish.Server
	stop   context.CancelFunc
}

var (
	_ http.Handler      = (*Router)(nil)
	_ machine.Readiness = (*Router)(nil)
)

// New builds a Router that serves nothing until Reload has read Dir.
func New(cfg Config) (*Router, error) {
	switch {
	case cfg.Dir == "":
		return nil, errors.New("vhost: Config.Dir is empty")
	case cfg.StartBackend == nil:
		return nil, errors.New("vhost: Config.StartBackend is nil")
	}
	if cfg.Limiter == nil {
		cfg.Limiter = throttle.New(throttle.Policy{})
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = logr.Discard()
	}
	r := &Router{cfg: cfg, log: cfg.Logger.WithName("vhost"), vms: map[string]*servedVM{}, reported: map[string]string{}}
	r.hosts.Store(&map[string]http.Handler{})
	return r, nil
}

// ServeHTTP hands the request to the service of the VM its Host names; a
// host that no VM claims gets Redfish's own 404.
func (r *Router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if h, ok := (*r.hosts.Load())[hostOf(req.Host)]; ok {
		h.ServeHTTP(w, req)
		return
	}
	redfish.NotFound(w, req)
}

// hostOf is the host name of a Host header: port stripped, lower case, no
// trailing dot, as hosts are compared.
func hostOf(hostport string) string {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	return canonicalHost(host)
}

func canonicalHost(host string) string { return strings.TrimSuffix(strings.ToLower(host), ".") }

// Ready is nil once the directory has been read. Each VM's readiness is
// its own service's (503 until its backend can serve), so that one VM
// whose cache has not synced does not take every other out of service.
func (r *Router) Ready() error {
	if !r.loaded.Load() {
		return machine.Errorf(machine.ErrUnavailable, "%s has not been read yet", r.cfg.Dir)
	}
	return nil
}

// Run reloads the directory every interval until ctx ends.
func (r *Router) Run(ctx context.Context, every time.Duration) {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		// Reload has logged what went wrong; the VMs it could not read
		// keep being served as they were.
		_, _ = r.Reload(ctx)
	}
}

// Reload reads the directory and serves what it says: a new file starts
// its VM's backend (it runs until ctx ends or the file goes), a removed one
// stops it, changed credentials are rotated with the grace, and the hosts
// are routed afresh. A file that cannot be read or parsed is logged and
// skipped; the VM it described, if served, keeps its last good
// description. If the directory cannot be read at all, nothing changes.
// Reload returns how many VMs are served.
func (r *Router) Reload(ctx context.Context) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// A Secret volume changes only by the kubelet swapping its ..data
	// link: while the link is the one last read and nothing is left to
	// retry, the files are those read (re-reading thousands every few
	// seconds was most of an idle shared server's CPU).
	data, _ := os.Readlink(filepath.Join(r.cfg.Dir, "..data"))
	if data != "" && data == r.readData && r.loaded.Load() && len(r.reported) == 0 {
		return len(r.vms), nil
	}
	r.readData = data
	seen := map[string]bool{}
	defer r.forgetResolved(seen)
	specs, bad, err := readDir(r.cfg.Dir)
	if err != nil {
		err = fmt.Errorf("reading the VMs directory: %w", err)
		r.problem(seen, "dir", err, "cannot read the VMs directory; serving the VMs read before", "dir", r.cfg.Dir)
		return len(r.vms), err
	}
	for name, err := range bad {
		r.problem(seen, "file/"+name, err, "skipping a VM file", "file", filepath.Join(r.cfg.Dir, name))
		if vm, ok := r.vms[name]; ok {
			specs[name] = vm.spec
		}
	}
	for name, vm := range r.vms {
		if _, ok := specs[name]; !ok {
			vm.stop()
			delete(r.vms, name)
			r.log.Info("stopped serving a VM", "vm", name)
		}
	}
	for name, spec := range specs {
		vm, ok := r.vms[name]
		if !ok {
			vm, err := r.start(ctx, name, spec)
			if err != nil {
				r.problem(seen, "file/"+name, err, "cannot serve a VM; retrying at the next reload", "vm", name)
				continue
			}
			r.vms[name] = vm
			r.log.Info("serving a VM", "vm", name, "hosts", spec.Hosts)
			continue
		}
		if spec.Username != vm.spec.Username || spec.Password != vm.spec.Password {
			if err := vm.server.SetAccounts(accounts(spec), r.cfg.Grace); err != nil {
				r.problem(seen, "file/"+name, err, "cannot apply a VM's new credentials; keeping the current ones", "vm", name)
				continue
			}
			r.log.Info("credentials rotated", "vm", name, "username", spec.Username, "previousAcceptedFor", r.cfg.Grace)
		}
		if changed := restartFor(vm.spec, spec); changed != "" {
			// The service's Manager names the host it is reached at:
			// a new name is a new service, as a changed --fqdn restarts a
			// VM's own bmc-server. And the service reads the VM's kept
			// subscriptions once, as it starts: kept in another Secret
			// now, they are read there by a new service. Its sessions end.
			restarted, err := r.start(ctx, name, spec)
			if err != nil {
				r.problem(seen, "file/"+name, err, "cannot restart a VM's service for its changed file; serving it as before", "vm", name, "changed", changed)
				continue
			}
			vm.stop()
			r.vms[name] = restarted
			r.log.Info("the VM's service restarted", "vm", name, "changed", changed, "hosts", spec.Hosts, "stateSecret", spec.StateSecret)
			continue
		}
		if !slices.Equal(spec.Hosts, vm.spec.Hosts) {
			r.log.Info("hosts changed", "vm", name, "hosts", spec.Hosts)
		}
		vm.spec = spec
	}
	r.route(seen)
	r.loaded.Store(true)
	return len(r.vms), nil
}

// start starts a VM's backend and its Redfish service.
func (r *Router) start(ctx context.Context, name string, spec bmcspec.SharedVM) (*servedVM, error) {
	ctx, stop := context.WithCancel(ctx)
	backend, err := r.cfg.StartBackend(ctx, name, spec)
	if err != nil {
		stop()
		return nil, fmt.Errorf("starting its backend: %w", err)
	}
	// Each VM has its own audit log; its power and boot actions also go to
	// the backend's own record (KubeVirt: Events on the VM).
	audit := auditlog.New(auditlog.Options{})
	if recorder, ok := backend.(machine.ActionRecorder); ok {
		audit.ForwardActions(ctx, recorder, func(e auditlog.Entry, err error) {
			r.log.Error(err, "the action is in the BMC's log but not recorded on the VM", "vm", name, "action", e.Message())
		})
	}
	if r.cfg.Intercept != nil {
		backend = machine.InterceptBackend(backend, r.cfg.Intercept)
	}
	protocols := r.cfg.NetworkProtocol
	protocols.FQDN = fqdn(spec)
	server, err := redfish.NewServer(redfish.Config{
		AuditLog:        audit,
		Backend:         backend,
		Accounts:        accounts(spec),
		Logger:          r.cfg.Logger.WithName("redfish").WithValues("vm", name),
		Limiter:         r.cfg.Limiter.Scoped(name),
		TrustedProxies:  r.cfg.TrustedProxies,
		Observer:        r.cfg.Observer,
		NetworkProtocol: protocols,

		EventDestinationsDenied:        r.cfg.EventDestinationsDenied,
		EventDestinationsAllowLoopback: r.cfg.EventDestinationsAllowLoopback,
		EventPoll:                      r.cfg.EventPoll,
	})
	if err != nil {
		stop()
		return nil, err
	}
	// The VM's EventService watches its own backend, so its events are
	// its own; they end with the VM.
	go func() { _ = server.Run(ctx) }()
	return &servedVM{spec: spec, server: server, stop: func() { server.StopEventStreams(); stop() }}, nil
}

// EventStreams is how many SSE streams the VMs' services hold open.
func (r *Router) EventStreams() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, vm := range r.vms {
		n += vm.server.EventStreams()
	}
	return n
}

// EventSubscriptions is how many push subscriptions the VMs' services
// hold, delivering and suspended.
func (r *Router) EventSubscriptions() (enabled, suspended int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, vm := range r.vms {
		e, s := vm.server.EventSubscriptions()
		enabled, suspended = enabled+e, suspended+s
	}
	return enabled, suspended
}

// StopEventStreams ends every VM's SSE streams, so that a graceful
// shutdown does not wait for them (http.Server.RegisterOnShutdown).
func (r *Router) StopEventStreams() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, vm := range r.vms {
		vm.server.StopEventStreams()
	}
}

// restartFor says what changed from was to is that only a new service of
// the VM serves ("hosts", "stateSecret"), or "" when nothing did.
func restartFor(was, is bmcspec.SharedVM) string {
	switch {
	case fqdn(was) != fqdn(is):
		return "hosts"
	case was.StateSecret != is.StateSecret:
		return "stateSecret"
	}
	return ""
}

// fqdn is the name a VM's Manager says it is reached at: its host, when
// it has one (the controller writes its Ingress host, and only for the VM
// that holds it); with several, none is the name, and it says none.
func fqdn(spec bmcspec.SharedVM) string {
	if len(spec.Hosts) != 1 {
		return ""
	}
	return spec.Hosts[0]
}

func accounts(spec bmcspec.SharedVM) []redfish.Account {
	return []redfish.Account{{Username: spec.Username, Password: spec.Password, Role: redfish.RoleAdministrator}}
}

// route rebuilds the host table. A host that two VMs claim is served by
// neither: which one a client reaches would be a guess.
func (r *Router) route(seen map[string]bool) {
	claims := map[string][]string{}
	for name, vm := range r.vms {
		for _, host := range vm.spec.Hosts {
			claims[host] = append(claims[host], name)
		}
	}
	table := make(map[string]http.Handler, len(claims))
	for host, names := range claims {
		if len(names) > 1 {
			slices.Sort(names)
			r.problem(seen, "host/"+host, fmt.Errorf("host %s is claimed by VMs %s", host, strings.Join(names, ", ")),
				"a host claimed by several VMs is served by none", "host", host, "vms", names)
			continue
		}
		table[host] = r.vms[names[0]].server
	}
	r.hosts.Store(&table)
}

// problem logs err under key unless the last reload logged the same.
func (r *Router) problem(seen map[string]bool, key string, err error, msg string, keysAndValues ...any) {
	seen[key] = true
	if r.reported[key] == err.Error() {
		return
	}
	r.reported[key] = err.Error()
	r.log.Error(err, msg, keysAndValues...)
}

// forgetResolved drops the problems this reload did not meet again, so
// they are logged if they come back.
func (r *Router) forgetResolved(seen map[string]bool) {
	for key := range r.reported {
		if !seen[key] {
			delete(r.reported, key)
		}
	}
}

// readDir reads the VM files of dir through its entries, so that a
// Secret volume's NAME -> ..data/NAME links are followed. Dot-files (the
// volume's ..data and timestamped directories among them) and entries
// that are not regular files are not VMs; a file that cannot be read or
// parsed, or whose name is not a VM name, is returned in bad.
func readDir(dir string) (specs map[string]bmcspec.SharedVM, bad map[string]error, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	specs, bad = map[string]bmcspec.SharedVM{}, map[string]error{}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		path := filepath.Join(dir, name)
		info, err := os.Stat(path)
		switch {
		case err != nil:
			bad[name] = err
			continue
		case !info.Mode().IsRegular():
			continue
		case !bmcspec.IsDNSName(name):
			bad[name] = fmt.Errorf("%q is not a VM name (a DNS-1123 subdomain)", name)
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			bad[name] = err
			continue
		}
		spec, err := parseSpec(data)
		if err != nil {
			bad[name] = err
			continue
		}
		specs[name] = spec
	}
	return specs, bad, nil
}

// parseSpec parses and checks a VM file. Errors never quote the password.
func parseSpec(data []byte) (bmcspec.SharedVM, error) {
	var s bmcspec.SharedVM
	if err := json.Unmarshal(data, &s); err != nil {
		return bmcspec.SharedVM{}, fmt.Errorf("not a VM description: %w", err)
	}
	switch {
	case s.Username == "":
		return bmcspec.SharedVM{}, errors.New("no username")
	case s.Password == "":
		return bmcspec.SharedVM{}, errors.New("no password")
	case len(s.Hosts) == 0:
		return bmcspec.SharedVM{}, errors.New("no hosts")
	case s.StateSecret != "" && !bmcspec.IsDNSName(s.StateSecret):
		return bmcspec.SharedVM{}, fmt.Errorf("stateSecret %q is not a Secret name", s.StateSecret)
	}
	hosts := make([]string, len(s.Hosts))
	for i, h := range s.Hosts {
		hosts[i] = canonicalHost(h)
		if !bmcspec.IsDNSName(hosts[i]) {
			return bmcspec.SharedVM{}, fmt.Errorf("host %q is not a DNS name", h)
		}
	}
	slices.Sort(hosts)
	s.Hosts = slices.Compact(hosts)
	return s, nil
}
