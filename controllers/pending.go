package controllers

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// cacheLagAllowance is how long a creation is trusted to reach the cache.
// Past it, an object the cache still lacks is created again: it may have
// been deleted before the cache ever showed it.
const cacheLagAllowance = 5 * time.Second

// pendingCreations remembers the objects a reconciler created until its
// cache shows them (the role of expectations in Kubernetes' own
// controllers). The cache lags the API server: without this, a reconcile
// that another watch event brings in between finds no object and creates
// it again, and the API server refuses it, which at enrolment of a whole
// namespace is one wasted write for every second VM.
type pendingCreations struct {
	mu      sync.Mutex
	created map[types.NamespacedName]pendingCreation
}

type pendingCreation struct {
	owner types.UID // the object it was created for: a recreated owner starts afresh
	until time.Time
}

// add records that key was created for owner at now.
func (p *pendingCreations) add(key types.NamespacedName, owner types.UID, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.created == nil {
		p.created = map[types.NamespacedName]pendingCreation{}
	}
	p.created[key] = pendingCreation{owner: owner, until: now.Add(cacheLagAllowance)}
}

// observed forgets key: the cache shows it.
func (p *pendingCreations) observed(key types.NamespacedName) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.created, key)
}

// wait says how much longer to wait for the cache to show key, created for
// owner; zero means create it (never created, created for another owner,
// or the allowance is over).
func (p *pendingCreations) wait(key types.NamespacedName, owner types.UID, now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.created[key]
	if !ok || c.owner != owner || !now.Before(c.until) {
		delete(p.created, key)
		return 0
	}
	return c.until.Sub(now)
}

// writtenStatuses remembers the status a reconciler last wrote for each
// object and the resourceVersion it read the object at. A reconcile that
// reads that same version again (the cache has not shown the write yet)
// and would write the same status skips it, rather than sending the API
// server the write a second time.
type writtenStatuses[S any] struct {
	mu      sync.Mutex
	written map[types.NamespacedName]writtenStatus[S]
}

type writtenStatus[S any] struct {
	from   string // the resourceVersion the write was computed from
	status S
}

// unchanged says whether status, computed from key at resourceVersion,
// is what was last written from that same version.
func (w *writtenStatuses[S]) unchanged(key types.NamespacedName, resourceVersion string, status S, equal func(a, b S) bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	last, ok := w.written[key]
	if ok && last.from != resourceVersion {
		delete(w.written, key) // the cache has moved on: compare with it
		return false
	}
	return ok && equal(last.status, status)
}

// wrote records that status was written for key read at resourceVersion.
func (w *writtenStatuses[S]) wrote(key types.NamespacedName, resourceVersion string, status S) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.written == nil {
		w.written = map[types.NamespacedName]writtenStatus[S]{}
	}
	w.written[key] = writtenStatus[S]{from: resourceVersion, status: status}
}

// forget drops key: its object is gone.
func (w *writtenStatuses[S]) forget(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.written, key)
}
