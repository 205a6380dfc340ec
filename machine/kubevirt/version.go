package kubevirt

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/machine"
)

var (
	_ machine.Versioned      = (*Backend)(nil)
	_ machine.ChangeNotifier = (*Backend)(nil)
)

// stateVersion follows the resourceVersions of the VM and VMI as the
// caches deliver them. A cache tells of an object after it holds it, so a
// version read before reading the cache never claims a state newer than
// the one read.
type stateVersion struct {
	version atomic.Uint64
	// refreshAt (Unix nanoseconds, 0 for none) is when a remembered answer
	// read alongside the VM (an instancetype, whether CDI is installed) is
	// to be asked again: the state may then change without an event.
	refreshAt atomic.Int64

	mu    sync.Mutex
	vm    string        // the VM's resourceVersion, "" when absent
	vmi   string        // the VMI's resourceVersion, "" when absent
	vmNew chan struct{} // closed, and replaced, when vm changes

	changes machine.Broadcast // told of every bump
}

// bump marks a change of state.
func (v *stateVersion) bump() {
	v.version.Add(1)
	v.changes.Notify()
}

// Changed is closed at the next change of the VM's version: a cache's
// delivery of the VM or its VMI. A remembered answer that falls due is told
// at the next StateVersion.
func (b *Backend) Changed() <-chan struct{} { return b.state.changes.Changed() }

// refreshBy asks for a change of version by t at the latest.
func (v *stateVersion) refreshBy(t time.Time) {
	at := t.UnixNano()
	for {
		current := v.refreshAt.Load()
		if current != 0 && current <= at || v.refreshAt.CompareAndSwap(current, at) {
			return
		}
	}
}

// current is the version, counting a refresh that is due.
func (v *stateVersion) current(now time.Time) uint64 {
	if at := v.refreshAt.Load(); at != 0 && now.UnixNano() >= at && v.refreshAt.CompareAndSwap(at, 0) {
		v.bump()
	}
	return v.version.Load()
}

// observe records what a cache delivered: obj, or its deletion.
func (v *stateVersion) observe(obj any, deleted bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch o := obj.(type) {
	case *kubevirtv1.VirtualMachine:
		rv := o.ResourceVersion
		if deleted {
			rv = ""
		}
		if rv != v.vm {
			v.vm = rv
			if v.vmNew != nil {
				close(v.vmNew)
			}
			v.vmNew = make(chan struct{})
			v.bump()
		}
	case *kubevirtv1.VirtualMachineInstance:
		rv := o.ResourceVersion
		if deleted {
			rv = ""
		}
		if rv != v.vmi {
			v.vmi = rv
			v.bump()
		}
	}
}

// awaitVM waits until the informer has delivered the VM at resourceVersion
// written or later (resource versions are etcd revisions: a larger one is
// newer), or ctx ends.
func (v *stateVersion) awaitVM(ctx context.Context, written uint64) {
	for {
		v.mu.Lock()
		seen, _ := strconv.ParseUint(v.vm, 10, 64)
		if v.vmNew == nil {
			v.vmNew = make(chan struct{})
		}
		next := v.vmNew
		v.mu.Unlock()
		if seen >= written {
			return
		}
		select {
		case <-next:
		case <-ctx.Done():
			return
		}
	}
}

// StateVersion is the machine's version while the cache serves reads: it
// changes with every resourceVersion of the VM or VMI the informers
// deliver, and when a remembered instancetype or CDI answer is due to be
// asked again. While the cache is not synced, or the API server is
// unreachable (reads then go to it), there is none.
func (b *Backend) StateVersion(id string) (uint64, bool) {
	if id != b.vmName {
		return 0, true // never found: nothing to change
	}
	if !b.synced.Load() || b.watchFailing.Load() {
		return 0, false
	}
	return b.state.current(time.Now()), true
}
