// Package kubevirt is the machine backend for one KubeVirt VirtualMachine:
// a BMC's view of a VM. It translates power actions into the VM's
// runStrategy and KubeVirt's start, stop and restart subresources, boot overrides
// into the devices' bootOrder, virtual media into a CDI DataVolume
// attached as a CD-ROM, and consoles into WebSockets of virt-api's console
// and vnc subresources (console.go).
//
// Reads come from an informer cache: of the backend's own, scoped by field
// selector to the one VM and its VMI (so a Role with resourceNames
// suffices), or namespace-wide and shared by the backends of one
// bmc-server (Informers). Writes go to the API server and retry on
// conflict. Every piece of state (the boot override and
// the order it replaced, the inserted image) lives on the VM as annotations,
// so a restarted BMC carries on where the last one stopped.
package kubevirt

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	kubevirtv1 "kubevirt.io/api/core/v1"
	instancetypev1beta1 "kubevirt.io/api/instancetype/v1beta1"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/virtmetal/virtmetal/machine"
)

// Options configures a Backend.
type Options struct {
	// Logger receives the backend's logs; the zero value discards them.
	Logger logr.Logger
	// RequestTimeout bounds every API call, so an unreachable API server
	// yields ErrUnavailable rather than a hung request. Zero means 10s.
	RequestTimeout time.Duration
	// ProbeInterval is how often the backend's own informers probe the
	// API server (InformersOptions.ProbeInterval). Zero means 5s.
	ProbeInterval time.Duration
	// Informers, when set, are the namespace-wide cache (NewInformers) the
	// backend reads its VM and VMI from, run by the caller and shared with
	// the other backends of the namespace, whose API clients it then sends
	// its requests through too (New's rest.Config goes unused). Nil gives
	// the backend informers and clients of its own, its informers selected
	// on its VM's name, which Start runs.
	Informers *Informers
	// MediaSize is the size of the DataVolume an inserted image is imported
	// into. Zero means 8Gi.
	MediaSize resource.Quantity
	// MediaStorageClass is the DataVolume's storage class; empty means the
	// cluster default.
	MediaStorageClass string
	// ReportingInstance names this process in the Events it records (its
	// pod's name); empty means "bmc-server".
	ReportingInstance string
	// StateSecret is the Secret of the VM's namespace the backend keeps
	// protocol state in (bmcspec.StateSecretName);
	// empty keeps none.
	StateSecret string
	// StateEntry, when set, is the key of StateSecret that holds the
	// backend's state, a JSON object of its state keys: the shared
	// bmc-server keeps every VM's state in one Secret a namespace
	// (bmcspec.SharedStateSecret), under the VM's name, so that enrolling
	// a VM writes no Secret of its own. Empty, each state key is a key of
	// StateSecret.
	StateEntry string
}

// Backend serves one VirtualMachine as one machine whose ID is the VM name.
type Backend struct {
	namespace string
	vmName    string
	log       logr.Logger
	timeout   time.Duration
	mediaSize resource.Quantity
	mediaSC   string
	// reportingInstance is Options.ReportingInstance.
	reportingInstance string
	stateSecret       string
	stateEntry        string
	// stateEntryMu makes SaveState's read-modify-write of the entry take
	// turns, so two keys saved at once both stay.
	stateEntryMu sync.Mutex

	api apiGroups // direct API access: writes and degraded reads
	// subresourcesMissing is set while the cluster does not serve that API
	// group (no virt-api), so the fallback is logged once, not per call.
	subresourcesMissing atomic.Bool

	// mediaMu makes inserts and ejects take turns.
	mediaMu sync.Mutex
	// mediaDone is the last import VirtualMedia saw Succeeded, or nil.
	mediaDone atomic.Pointer[importDone]
	// cdi is cdiInstalledRecently's remembered answer, shared with the
	// backends of shared Informers.
	cdi *cdiAnswer

	// informers cache the VM and its VMI; Start runs them if they are
	// the backend's own.
	informers     *Informers
	ownsInformers bool

	// watchFailing is set while the API server cannot be reached; reads
	// then go to the API server, whose answer tells a stale cache from an
	// outage.
	watchFailing atomic.Bool
	// synced is set once the cache has read the VM and VMI.
	synced atomic.Bool
	// changed wakes the loop that consumes Once overrides.
	changed chan struct{}
	// state is what StateVersion reports.
	state stateVersion
	// power coalesces runStrategy writes.
	power powerWrites
	// restartMu makes SetBootOverride and the loop take turns restarting
	// a start that would boot without the override, so one start is
	// restarted once.
	restartMu sync.Mutex
	// subresourceMu has the backend's calls of virt-api's subresources
	// take turns (callSubresource).
	subresourceMu sync.Mutex

	instancetypes memo[instancetypev1beta1.VirtualMachineInstancetypeSpec]
	claimSizes    memo[int64] // by claim name
}

var (
	_ machine.Backend   = (*Backend)(nil)
	_ machine.Readiness = (*Backend)(nil)
)

// Ready reports whether the backend can answer: its cache has synced and
// the API server is reachable. Before that, reads would miss the VMI.
func (b *Backend) Ready() error {
	switch {
	case !b.synced.Load():
		return machine.Errorf(machine.ErrUnavailable, "the cache of VM %s/%s has not synced yet", b.namespace, b.vmName)
	case b.watchFailing.Load():
		return machine.Errorf(machine.ErrUnavailable, "the API server is unreachable")
	}
	return nil
}

// backendScheme has only the kinds the backend reads and writes: every
// registered kind costs memory in every BMC pod. One serves every backend
// of the process (a scheme is read-only once built).
var backendScheme = sync.OnceValue(func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		kubevirtv1.AddToScheme, instancetypev1beta1.AddToScheme, cdiv1beta1.AddToScheme, eventsv1.AddToScheme, addCoreKinds,
	} {
		if err := add(s); err != nil {
			panic(err) // static registrations: cannot fail
		}
	}
	return s
})

// addCoreKinds registers the two core kinds the backend reads and writes,
// not the group's sixty: each registered kind is maps in every BMC's heap.
func addCoreKinds(s *runtime.Scheme) error {
	s.AddKnownTypes(corev1.SchemeGroupVersion, &corev1.Secret{}, &corev1.PersistentVolumeClaim{})
	metav1.AddToGroupVersion(s, corev1.SchemeGroupVersion)
	return nil
}

// New creates the backend for the VM namespace/vmName. It does not contact
// the API server; Start does.
func New(cfg *rest.Config, namespace, vmName string, opts Options) (*Backend, error) {
	if namespace == "" || vmName == "" {
		return nil, errors.New("kubevirt backend: namespace and VM name are required")
	}
	b := &Backend{
		namespace: namespace,
		vmName:    vmName,
		log:       opts.Logger.WithValues("namespace", namespace, "vm", vmName),
		timeout:   opts.RequestTimeout,
		mediaSize: opts.MediaSize,
		mediaSC:   opts.MediaStorageClass,
		changed:   make(chan struct{}, 1),

		reportingInstance: cmp.Or(opts.ReportingInstance, "bmc-server"),
		stateSecret:       opts.StateSecret,
		stateEntry:        opts.StateEntry,
	}
	if b.timeout == 0 {
		b.timeout = 10 * time.Second
	}
	if b.mediaSize.IsZero() {
		b.mediaSize = resource.MustParse("8Gi")
	}
	if opts.Informers != nil && opts.Informers.namespace != namespace {
		return nil, fmt.Errorf("kubevirt backend: the informers are of namespace %s, not %s", opts.Informers.namespace, namespace)
	}
	if opts.Informers != nil {
		b.informers, b.api, b.cdi = opts.Informers, *opts.Informers.api, opts.Informers.cdi
		return b, nil
	}
	b.cdi = &cdiAnswer{}
	// Every request answers whether the API server is reachable.
	consoleCfg := cfg
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &reachability{next: rt, to: b} })
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubevirt backend: %w", err)
	}
	if b.api, err = newAPIGroups(cfg, consoleCfg, httpClient, backendScheme()); err != nil {
		return nil, fmt.Errorf("kubevirt backend: %w", err)
	}
	b.informers = newOwnInformers(b.api.kubevirt, namespace, vmName,
		InformersOptions{RequestTimeout: b.timeout, ProbeInterval: opts.ProbeInterval})
	b.ownsInformers = true
	return b, nil
}

// Start runs the Once-override bookkeeping, and the backend's own
// informers, until ctx ends; shared informers tell it of its VM's events
// meanwhile. While the API server is not reachable, the informers keep
// retrying and reads go to the API server (and fail ErrUnavailable).
func (b *Backend) Start(ctx context.Context) error {
	b.informers.subscribe(b)
	defer b.informers.unsubscribe(b)
	var loops sync.WaitGroup
	if b.ownsInformers {
		loops.Go(func() { b.informers.Run(ctx) })
	}
	// On this goroutine, one stack fewer per VM served; and the loop's
	// first read comes from the cache, not the API server, which a shared
	// bmc-server starting thousands of VMs would otherwise read each from.
	if b.WaitForCacheSync(ctx) {
		b.consumeOnceLoop(ctx)
	}
	loops.Wait()
	return nil
}

// WaitForCacheSync blocks until the cache has read the VM and VMI once (true)
// or ctx ends (false).
func (b *Backend) WaitForCacheSync(ctx context.Context) bool {
	if !toolscache.WaitForCacheSync(ctx.Done(), b.informers.HasSynced) {
		return false
	}
	b.synced.Store(true)
	return true
}

// cacheServes says whether reads may come from the cache: it has synced
// and its watches work.
func (b *Backend) cacheServes() bool {
	return b.synced.Load() && !b.watchFailing.Load()
}

// observed runs for every informer event of the VM or VMI, which may have
// changed.
func (b *Backend) observed(obj any, deleted bool) {
	b.state.observe(obj, deleted)
	select {
	case b.changed <- struct{}{}:
	default:
	}
}

func (b *Backend) unreachable(err error) {
	if !b.watchFailing.Swap(true) {
		b.state.bump()
		b.log.Error(err, "API server unreachable; reading through to it until it answers again")
	}
}

func (b *Backend) reachable() {
	if b.watchFailing.Swap(false) {
		// Reads come from the cache again, which may hold what changed
		// meanwhile: no answer from before the outage is current.
		b.state.bump()
		b.log.Info("API server reachable again")
	}
}

// Machines lists the one VM.
func (b *Backend) Machines(context.Context) ([]string, error) {
	return []string{b.vmName}, nil
}

// Machine returns the VM's machine, or ErrNotFound for any other ID or when
// the VM does not exist.
func (b *Backend) Machine(ctx context.Context, id string) (machine.Machine, error) {
	if id != b.vmName {
		return nil, machine.Errorf(machine.ErrNotFound, "machine %q (this BMC serves %q)", id, b.vmName)
	}
	vm, vmi, err := b.read(ctx)
	if err != nil {
		return nil, err
	}
	var running *kubevirtv1.VirtualMachineInstanceSpec
	if vmi != nil {
		running = &vmi.Spec
	}
	return &Machine{b: b, modes: bootModes(vm), media: b.cdiInstalledRecently(ctx), consoles: consoleKinds(&vm.Spec.Template.Spec, running)}, nil
}

// read returns the VM and its VMI (nil when there is none).
func (b *Backend) read(ctx context.Context) (*kubevirtv1.VirtualMachine, *kubevirtv1.VirtualMachineInstance, error) {
	if !b.cacheServes() {
		return b.readLive(ctx)
	}
	vm, err := fromCache[*kubevirtv1.VirtualMachine](b.informers.vms, b, vmResource)
	if err != nil {
		return nil, nil, b.apiError(err, "reading the VirtualMachine")
	}
	vmi, err := fromCache[*kubevirtv1.VirtualMachineInstance](b.informers.vmis, b, vmiResource)
	return b.checkRead(vm, vmi, err)
}

// readLive reads from the API server, for read-modify-write.
func (b *Backend) readLive(ctx context.Context) (*kubevirtv1.VirtualMachine, *kubevirtv1.VirtualMachineInstance, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	vm, err := b.getVM(ctx)
	if err != nil {
		return nil, nil, b.apiError(err, "reading the VirtualMachine")
	}
	vmi, err := b.getVMI(ctx)
	return b.checkRead(vm, vmi, err)
}

// checkRead finishes a read: a VM without a template is no machine, and a
// missing VMI is none (nil).
func (b *Backend) checkRead(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance, vmiErr error) (*kubevirtv1.VirtualMachine, *kubevirtv1.VirtualMachineInstance, error) {
	if vm.Spec.Template == nil {
		return nil, nil, fmt.Errorf("VirtualMachine %s/%s has no template", b.namespace, b.vmName)
	}
	switch {
	case apierrors.IsNotFound(vmiErr):
		return vm, nil, nil
	case vmiErr != nil:
		return nil, nil, b.apiError(vmiErr, "reading the VirtualMachineInstance")
	}
	return vm, vmi, nil
}

// conflictBackoff spaces updateVM's attempts. virt-controller writes a
// VM's status several times in the second after a start or stop, each
// time changing its resourceVersion: client-go's default (5 attempts in
// about 50 ms) lost to it on KubeVirt's real control plane. This gives it
// about 2 s.
var conflictBackoff = wait.Backoff{Steps: 12, Duration: 10 * time.Millisecond, Factor: 1.5, Jitter: 0.2}

// updateVM reads the VM and VMI from the API server, lets mutate change the
// VM, and writes it back, retrying on conflict. Every update also records
// a consumed Once override, so no write can resurrect one. mutate returns
// false when it changed nothing.
func (b *Backend) updateVM(ctx context.Context, mutate func(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) (bool, error)) (vmi *kubevirtv1.VirtualMachineInstance, err error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	err = retry.RetryOnConflict(conflictBackoff, func() error {
		var vm *kubevirtv1.VirtualMachine
		var err error
		vm, vmi, err = b.readLive(ctx)
		if err != nil {
			return err
		}
		consumed := consumeOnce(vm, vmi)
		changed, err := mutate(vm, vmi)
		if err != nil || !(changed || consumed) {
			return err
		}
		if err := b.putVM(ctx, vm); err != nil {
			if apierrors.IsConflict(err) {
				return err // retried
			}
			return b.apiError(err, "updating the VirtualMachine")
		}
		if consumed {
			b.log.Info("Once boot override consumed; previous boot order restored", "vmi", vmi.UID)
		}
		b.awaitCache(ctx, vm.ResourceVersion)
		return nil
	})
	if apierrors.IsConflict(err) {
		return nil, machine.Errorf(machine.ErrUnavailable, "VirtualMachine %s/%s keeps changing: %v", b.namespace, b.vmName, err)
	}
	return vmi, err
}

// awaitCache waits briefly until the informer has delivered the VM version
// the backend just wrote, so a read after a write sees it, and so does
// StateVersion.
func (b *Backend) awaitCache(ctx context.Context, written string) {
	want, err := strconv.ParseUint(written, 10, 64)
	if err != nil || !b.cacheServes() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, cacheLagLimit)
	defer cancel()
	b.state.awaitVM(ctx, want)
}

// cacheLagLimit bounds how long a write waits for its echo in the cache.
const cacheLagLimit = 2 * time.Second

// consumeOnceLoop restores the boot order as soon as a VMI has started with
// a Once override, also when that happened while no BMC was running, and
// restarts a start under way that would boot without the override.
func (b *Backend) consumeOnceLoop(ctx context.Context) {
	backoff := wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Cap: 10 * time.Second, Steps: 100}
	var retryAfter <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.changed:
		case <-retryAfter:
		}
		retryAfter = nil
		vm, vmi, err := b.read(ctx)
		if err != nil {
			continue
		}
		switch {
		case onceConsumed(vm, vmi):
			_, err = b.updateVM(ctx, func(*kubevirtv1.VirtualMachine, *kubevirtv1.VirtualMachineInstance) (bool, error) {
				return false, nil // updateVM consumes the override itself
			})
			if err != nil {
				b.log.Error(err, "cannot restore the boot order after a Once override; will retry")
			}
		case startsWithoutOverride(vm, vmi):
			err = b.restartStaleStart(ctx)
			if err != nil {
				b.log.Error(err, "cannot restart a start that would boot without the boot override; will retry")
			}
		}
		if err != nil {
			retryAfter = time.After(backoff.Step())
			continue
		}
		backoff.Steps = 100
		backoff.Duration = 100 * time.Millisecond
	}
}

// restartStaleStart restarts a start under way that the API server, not
// only the cache, shows without the VM's boot override.
func (b *Backend) restartStaleStart(ctx context.Context) error {
	b.restartMu.Lock()
	defer b.restartMu.Unlock()
	vm, vmi, err := b.readLive(ctx)
	if err != nil || !startsWithoutOverride(vm, vmi) {
		return err
	}
	b.log.Info("a start under way was made from the template before the boot override: restarting it so it boots the override", "vmi", vmi.UID)
	return b.restartNow(ctx, vmi.UID)
}

// deleteVMI deletes the VMI with that UID (never a newer one), with the
// given grace period (nil: the object's own).
func (b *Backend) deleteVMI(ctx context.Context, uid types.UID, grace *int64) error {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	err := b.deleteIn(ctx, b.api.kubevirt, vmiResource, b.vmName, &metav1.DeleteOptions{Preconditions: preconditionUID(uid), GracePeriodSeconds: grace})
	// Gone, or already replaced by a newer VMI: either way that one stopped.
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return b.apiError(err, "deleting the VirtualMachineInstance")
}

// subresourceResult is how virt-api answered a start, stop or restart.
type subresourceResult int

const (
	subresourceDone subresourceResult = iota
	// subresourceRefused: virt-api found the VM in a state the action does
	// not apply to (409), e.g. stop on a VM that is not running.
	subresourceRefused
	// subresourceNotServed: no virt-api serves the API group (a cluster
	// without KubeVirt's API server, or envtest).
	subresourceNotServed
)

// callSubresource PUTs options to one of the VM's subresources (start, stop, restart).
func (b *Backend) callSubresource(ctx context.Context, subresource string, options any) (subresourceResult, error) {
	body, err := json.Marshal(options)
	if err != nil {
		return 0, fmt.Errorf("encoding %s options: %w", subresource, err)
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	// virt-api hands each call to virt-controller as a patch of the VM's
	// status.stateChangeRequests guarded by a test of their current value,
	// and answers 500 when another call or virt-controller changed them in
	// between: the calls take turns, and such an answer is retried.
	b.subresourceMu.Lock()
	defer b.subresourceMu.Unlock()
	backoff := wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Steps: 4}
	for {
		err = b.api.subresources.Put().Namespace(b.namespace).Resource("virtualmachines").Name(b.vmName).
			SubResource(subresource).Body(body).Do(ctx).Error()
		if !apierrors.IsInternalError(err) || backoff.Steps <= 1 || ctx.Err() != nil {
			break
		}
		b.log.V(1).Info("virt-api failed the request; retrying", "subresource", subresource, "reason", err.Error())
		select {
		case <-ctx.Done():
		case <-time.After(backoff.Step()):
		}
	}
	var status apierrors.APIStatus
	switch {
	case err == nil:
		b.subresourcesMissing.Store(false)
		return subresourceDone, nil
	case apierrors.IsConflict(err):
		b.log.V(1).Info("virt-api refused the request in the VM's current state", "subresource", subresource, "reason", err.Error())
		return subresourceRefused, nil
	case apierrors.IsNotFound(err) && errors.As(err, &status) && (status.Status().Details == nil || status.Status().Details.Group != kubevirtv1.SchemeGroupVersion.Group):
		// virt-api's own 404 (the VM is missing) names the kubevirt.io
		// group; the API server's 404 for an unserved group does not.
		if !b.subresourcesMissing.Swap(true) {
			b.log.V(1).Info("KubeVirt's subresource API is not served; powering by runStrategy Always and VMI deletion instead (restarts after a guest poweroff; a forced stop waits for the VMI's own grace period)",
				"group", kubevirtv1.SubresourceGroupName)
		}
		return subresourceNotServed, nil
	default:
		return 0, b.apiError(err, "calling "+subresource+" on the VirtualMachine")
	}
}

// cdiRecheck is how long cdiInstalledRecently trusts an answer. Every
// request asks for the machine's capabilities, and the REST mapper does not
// remember a missing API group: without this, a cluster without CDI would
// get one discovery request per Redfish request. CDI installed (or removed)
// later shows within this time; InsertMedia always asks afresh.
const cdiRecheck = time.Minute

// cdiAnswer is whether the API server serves CDI, remembered for
// cdiRecheck. It is a fact of the cluster: shared Informers keep one for
// all their backends, so a bmc-server serving thousands of VMs asks once,
// not once per VM.
type cdiAnswer struct {
	mu           sync.Mutex
	installed    bool
	answered     bool // installed holds an answer
	trustedUntil time.Time
	asking       bool // a lookup is under way
}

// cdiInstalledRecently is cdiInstalled, remembered for cdiRecheck. The
// lock guards the remembered answer only, never the lookup: a discovery
// request to a slow API server must not queue every other request. While
// one lookup is under way the others take the last answer (before any,
// media is offered, as lookUpCDIWithin does when it cannot tell).
func (b *Backend) cdiInstalledRecently(ctx context.Context) bool {
	a := b.cdi
	a.mu.Lock()
	now := time.Now()
	if a.asking || now.Before(a.trustedUntil) {
		installed, due := a.installed || !a.answered, a.trustedUntil
		if a.asking {
			// The answer under way may differ: read again once it has
			// had time to come (never a time already past, which would
			// have the version change at every read until it comes).
			due = now.Add(b.timeout)
		}
		a.mu.Unlock()
		b.state.refreshBy(due)
		return installed
	}
	a.asking = true
	a.mu.Unlock()
	installed, definite := b.lookUpCDIWithin(ctx)
	a.mu.Lock()
	a.asking = false
	if definite {
		a.installed, a.answered, a.trustedUntil = installed, true, time.Now().Add(cdiRecheck)
	}
	until := a.trustedUntil
	a.mu.Unlock()
	if definite {
		b.state.refreshBy(until)
	}
	return installed
}

// cdiInstalled reports whether the API server serves CDI's DataVolume.
func (b *Backend) cdiInstalled(ctx context.Context) bool {
	installed, _ := b.lookUpCDIWithin(ctx)
	return installed
}

// lookUpCDIWithin asks the API server, within the request timeout, whether
// it serves CDI's API group. definite is false when the answer is unknown
// (API server away or slow); installed is then true, so media is offered
// and InsertMedia checks again.
func (b *Backend) lookUpCDIWithin(ctx context.Context) (installed, definite bool) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	gv := cdiv1beta1.SchemeGroupVersion
	err := b.api.cdi.Get().AbsPath("/apis", gv.Group, gv.Version).Do(ctx).Error()
	switch {
	case err == nil:
		return true, true
	case apierrors.IsNotFound(err):
		return false, true
	}
	b.log.V(1).Info("cannot tell whether CDI is installed; offering virtual media until known", "error", err.Error())
	return true, false
}

// apiError maps an API error onto the machine sentinels: a missing object
// is ErrNotFound; failures retrying may cure (connection, timeout, 5xx,
// throttling) are ErrUnavailable; refusals stay plain errors.
func (b *Backend) apiError(err error, doing string) error {
	switch {
	case err == nil:
		return nil
	case isMachineError(err):
		return err
	case apierrors.IsNotFound(err):
		return machine.Errorf(machine.ErrNotFound, "%s %s/%s: %v", doing, b.namespace, b.vmName, err)
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err), apierrors.IsInvalid(err), apierrors.IsBadRequest(err), meta.IsNoMatchError(err):
		return fmt.Errorf("%s %s/%s: %w", doing, b.namespace, b.vmName, err)
	default:
		return machine.Errorf(machine.ErrUnavailable, "%s %s/%s: %v", doing, b.namespace, b.vmName, err)
	}
}

func isMachineError(err error) bool {
	for _, s := range []error{machine.ErrNotFound, machine.ErrNotSupported, machine.ErrInvalidArgument, machine.ErrConflict, machine.ErrUnavailable} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// memo remembers what Inventory reads besides the VM for memoTTL:
// Inventory runs on every read of the machine's resources, and what it
// reads (an instancetype, which KubeVirt pins by revision for a running VM
// anyway; a claim's size) rarely changes.
type memo[T any] struct {
	mu      sync.Mutex
	entries map[string]memoEntry[T]
}

type memoEntry[T any] struct {
	value   T
	fetched time.Time
}

const memoTTL = time.Minute

// get is key's value if it was fetched less than memoTTL ago.
func (m *memo[T]) get(key string) (T, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[key]
	if !ok || time.Since(e.fetched) >= memoTTL {
		var zero T
		return zero, false
	}
	return e.value, true
}

// put remembers key's value and returns when it expires: answers rendered
// from it must be by then (stateVersion.refreshBy).
func (m *memo[T]) put(key string, value T) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.entries == nil {
		m.entries = map[string]memoEntry[T]{}
	}
	fetched := time.Now()
	m.entries[key] = memoEntry[T]{value: value, fetched: fetched}
	return fetched.Add(memoTTL)
}

func (b *Backend) instancetype(ctx context.Context, matcher *kubevirtv1.InstancetypeMatcher) (*instancetypev1beta1.VirtualMachineInstancetypeSpec, error) {
	if matcher == nil || matcher.Name == "" {
		return nil, nil
	}
	cluster := matcher.Kind == "" || matcher.Kind == "VirtualMachineClusterInstancetype" || matcher.Kind == "virtualmachineclusterinstancetype"
	key := matcher.Kind + "/" + matcher.Name
	if spec, ok := b.instancetypes.get(key); ok {
		return &spec, nil
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	var spec instancetypev1beta1.VirtualMachineInstancetypeSpec
	if cluster {
		it := &instancetypev1beta1.VirtualMachineClusterInstancetype{}
		if err := b.api.instancetypes.Get().Resource(clusterInstancetypeResource).Name(matcher.Name).Do(ctx).Into(it); err != nil {
			return nil, b.instancetypeError(err, "VirtualMachineClusterInstancetype", matcher.Name)
		}
		spec = it.Spec
	} else {
		it := &instancetypev1beta1.VirtualMachineInstancetype{}
		if err := b.api.instancetypes.Get().Namespace(b.namespace).Resource(instancetypeResource).Name(matcher.Name).Do(ctx).Into(it); err != nil {
			return nil, b.instancetypeError(err, "VirtualMachineInstancetype", matcher.Name)
		}
		spec = it.Spec
	}
	b.state.refreshBy(b.instancetypes.put(key, spec))
	return &spec, nil
}

// claimSize is the size of the VM's namespace's PersistentVolumeClaim
// claim, 0 when unknown: a claim that does not exist (yet), or that the
// BMC may not read (a Role not yet updated for a volume just added), is a
// disk of unknown size, not a failed Inventory.
func (b *Backend) claimSize(ctx context.Context, claim string) int64 {
	if size, ok := b.claimSizes.get(claim); ok {
		return size
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	pvc := &corev1.PersistentVolumeClaim{}
	err := b.api.core.Get().Namespace(b.namespace).Resource("persistentvolumeclaims").Name(claim).Do(ctx).Into(pvc)
	if err != nil && !apierrors.IsNotFound(err) {
		b.log.Error(err, "cannot read the size of a claim the VM's disk names", "claim", claim)
	}
	size := int64(0)
	if err == nil {
		size = claimCapacity(pvc)
	}
	b.state.refreshBy(b.claimSizes.put(claim, size))
	return size
}

// claimCapacity is a claim's size as the guest sees it: status.capacity
// once bound, which is the volume's real size (a provisioner rounds the
// request up, an expansion grows it); before that, the request, the least
// the claim will get, since an unbound claim has no capacity yet.
func claimCapacity(pvc *corev1.PersistentVolumeClaim) int64 {
	if q, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok && pvc.Status.Phase == corev1.ClaimBound {
		return q.Value()
	}
	return storageRequest(pvc.Spec.Resources.Requests)
}

// instancetypeError keeps a missing instancetype from reading as a missing
// machine: the VM exists, its description is broken.
func (b *Backend) instancetypeError(err error, kind, name string) error {
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%s %q named by VirtualMachine %s/%s: %w", kind, name, b.namespace, b.vmName, err)
	}
	return b.apiError(err, "reading "+kind+" "+name+" of")
}
