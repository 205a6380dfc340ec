package kubevirt

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// Informers caches the VMs and VMIs that Backends read, and tells each
// subscribed Backend of its own VM's and VMI's events and of whether the
// API server answers. A Backend without Options.Informers has Informers
// of its own, selected on its VM's name so that a Role with resourceNames
// suffices. NewInformers makes namespace-wide ones for a bmc-server that
// serves many VMs of a namespace: run once and shared by all its Backends,
// they keep two watches however many VMs are served.
type Informers struct {
	namespace string
	vms, vmis *objectCache
	// client and selector are those of the watches, for the probe.
	client   rest.Interface
	selector fields.Selector
	timeout  time.Duration
	probe    time.Duration

	// api, made by NewInformers, is what every Backend sharing them sends
	// its requests through: one set of clients per namespace, and each
	// request's outcome tells every subscriber whether the API server
	// answers, as the watches' do.
	api *apiGroups
	// cdi is the answer those Backends share to whether CDI is installed.
	cdi *cdiAnswer
	// stateLoads bounds those Backends' reads of their state Secrets in
	// flight: a bmc-server starting thousands of VMs would send them all
	// at once, and the memory the answers take together stays in its RSS.
	stateLoads chan struct{}

	mu sync.RWMutex
	// subscribers are the Backends by VM name; each slice is replaced,
	// never changed, so a dispatch can range over it unlocked.
	subscribers map[string][]*Backend
}

// InformersOptions configures Informers.
type InformersOptions struct {
	// RequestTimeout bounds the probe. Zero means 10s.
	RequestTimeout time.Duration
	// ProbeInterval is how often the API server is probed, so one that
	// silently drops traffic is noticed (a watch on such a connection
	// reports nothing for minutes). Zero means 5s.
	ProbeInterval time.Duration
}

// NewInformers makes the namespace-wide Informers shared by the Backends
// of one namespace (Options.Informers). They need list and watch on the
// namespace's VMs and VMIs; Run runs them. Nothing contacts the API
// server before Run.
func NewInformers(cfg *rest.Config, namespace string, opts InformersOptions) (*Informers, error) {
	if namespace == "" {
		return nil, errors.New("kubevirt informers: a namespace is required")
	}
	inf := &Informers{}
	consoleCfg := cfg
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &reachability{next: rt, to: inf} })
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubevirt informers: %w", err)
	}
	api, err := newAPIGroups(cfg, consoleCfg, httpClient, backendScheme())
	if err != nil {
		return nil, fmt.Errorf("kubevirt informers: %w", err)
	}
	inf.api, inf.cdi, inf.stateLoads = &api, &cdiAnswer{}, make(chan struct{}, sharedStateLoads)
	inf.init(api.kubevirt, namespace, fields.Everything(), opts)
	return inf, nil
}

// sharedStateLoads is how many state reads the Backends of shared Informers
// send at once.
const sharedStateLoads = 16

// newOwnInformers makes the Informers of one Backend, which watch only
// objects named vmName, through the Backend's client.
func newOwnInformers(client rest.Interface, namespace, vmName string, opts InformersOptions) *Informers {
	inf := &Informers{}
	inf.init(client, namespace, fields.OneTermEqualSelector("metadata.name", vmName), opts)
	return inf
}

func (inf *Informers) init(client rest.Interface, namespace string, selector fields.Selector, opts InformersOptions) {
	inf.namespace, inf.client, inf.selector = namespace, client, selector
	inf.timeout = cmp.Or(opts.RequestTimeout, 10*time.Second)
	inf.probe = cmp.Or(opts.ProbeInterval, 5*time.Second)
	inf.subscribers = map[string][]*Backend{}
	inf.vms = inf.newCache(vmResource, &kubevirtv1.VirtualMachine{})
	inf.vmis = inf.newCache(vmiResource, &kubevirtv1.VirtualMachineInstance{})
}

func (inf *Informers) newCache(resource string, example runtime.Object) *objectCache {
	lw := toolscache.NewListWatchFromClient(inf.client, resource, inf.namespace, inf.selector)
	lw.ListFunc, lw.WatchFunc = nil, nil // the context-taking ones below serve
	lw.ListWithContextFunc = reportingFailures(inf, lw.ListWithContextFunc)
	lw.WatchFuncWithContext = reportingFailures(inf, lw.WatchFuncWithContext)
	// One dispatch serves every subscriber, by name: a handler per Backend
	// would see every VM's events.
	return newObjectCache(lw, resource, example, inf.dispatch)
}

// reportingFailures is call (a list or a watch), telling inf when it
// fails: an API server that refuses or fails it is an outage the transport
// does not see, as it answered. A call cut short by ctx is none.
func reportingFailures[T any](inf *Informers, call func(context.Context, metav1.ListOptions) (T, error)) func(context.Context, metav1.ListOptions) (T, error) {
	return func(ctx context.Context, opts metav1.ListOptions) (T, error) {
		got, err := call(ctx, opts)
		if err != nil && ctx.Err() == nil {
			inf.unreachable(err)
		}
		return got, err
	}
}

// Run runs the informers and the probe until ctx ends.
func (inf *Informers) Run(ctx context.Context) {
	var loops sync.WaitGroup
	loops.Go(func() { inf.vms.Run(ctx) })
	loops.Go(func() { inf.vmis.Run(ctx) })
	loops.Go(func() { inf.probeLoop(ctx) })
	loops.Wait()
}

// HasSynced reports whether both caches have listed their objects once.
func (inf *Informers) HasSynced() bool { return inf.vms.HasSynced() && inf.vmis.HasSynced() }

// subscribe has b told of its VM's events from now on, starting with
// what the caches already hold (shared Informers may have synced long
// before b started), until unsubscribe.
func (inf *Informers) subscribe(b *Backend) {
	inf.mu.Lock()
	inf.subscribers[b.vmName] = append(slices.Clip(inf.subscribers[b.vmName]), b)
	inf.mu.Unlock()
	for _, cache := range []*objectCache{inf.vms, inf.vmis} {
		if obj, exists, err := cache.get(inf.key(b.vmName)); err == nil && exists {
			b.observed(obj, false)
		}
	}
}

func (inf *Informers) unsubscribe(b *Backend) {
	inf.mu.Lock()
	defer inf.mu.Unlock()
	rest := slices.DeleteFunc(slices.Clone(inf.subscribers[b.vmName]), func(s *Backend) bool { return s == b })
	if len(rest) == 0 {
		delete(inf.subscribers, b.vmName)
		return
	}
	inf.subscribers[b.vmName] = rest
}

func (inf *Informers) key(vmName string) string { return inf.namespace + "/" + vmName }

// dispatch hands a cache's event to the Backends of the object's name (a
// VM and its VMI share it) and to no other.
func (inf *Informers) dispatch(obj any, deleted bool) {
	key, err := toolscache.MetaNamespaceKeyFunc(obj)
	if err != nil {
		return
	}
	_, name, err := toolscache.SplitMetaNamespaceKey(key)
	if err != nil {
		return
	}
	inf.mu.RLock()
	subscribers := inf.subscribers[name]
	inf.mu.RUnlock()
	for _, b := range subscribers {
		// An event is news from the watch: the API server answers.
		b.reachable()
		b.observed(obj, deleted)
	}
}

// each calls f for every subscribed Backend.
func (inf *Informers) each(f func(*Backend)) {
	inf.mu.RLock()
	defer inf.mu.RUnlock()
	for _, subscribers := range inf.subscribers {
		for _, b := range subscribers {
			f(b)
		}
	}
}

// reachable and unreachable tell every subscriber what a request of the
// informers or the probe found: reads of all of them come from the caches
// or go through to the API server together.
func (inf *Informers) reachable()            { inf.each(func(b *Backend) { b.reachable() }) }
func (inf *Informers) unreachable(err error) { inf.each(func(b *Backend) { b.unreachable(err) }) }

// probeLoop lists at most one VM every probe interval, through the same
// transport as the watches, so reachability tracks a blackholed server
// (noticed within the interval plus the request timeout) as well as a
// refused one. Shared Informers probe once for all their Backends.
func (inf *Informers) probeLoop(ctx context.Context) {
	ticker := time.NewTicker(inf.probe)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		probeCtx, cancel := context.WithTimeout(ctx, inf.timeout)
		err := inf.client.Get().Namespace(inf.namespace).Resource(vmResource).
			VersionedParams(&metav1.ListOptions{FieldSelector: inf.selector.String(), Limit: 1}, metav1.ParameterCodec).
			Do(probeCtx).Error()
		cancel()
		if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
			inf.unreachable(err)
		}
	}
}

// reachabilityListener is told, for every request, whether the API server
// answered: a Backend of its own requests, Informers of their watches'.
type reachabilityListener interface {
	reachable()
	unreachable(err error)
}

// reachability notes, for every request, whether the API server answered.
// The reflector retries a refused watch quietly (no error handler call),
// so outages are seen at the transport.
type reachability struct {
	next http.RoundTripper
	to   reachabilityListener
}

func (r *reachability) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	switch {
	case err == nil:
		r.to.reachable()
	case req.Context().Err() == nil: // not the caller giving up
		r.to.unreachable(err)
	}
	return resp, err
}
