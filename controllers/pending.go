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
