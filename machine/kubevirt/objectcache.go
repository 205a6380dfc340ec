package kubevirt

import (
	"context"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"
)

// objectCache keeps what client-go's Reflector lists and watches of one
// resource, trimmed by keepWhatIsRead, and tells onChange of every change
// as the Reflector delivers it. It is a SharedIndexInformer without the
// parts Informers never used (DeltaFIFO, indexers, resync, and a queue and
// two goroutines per handler): those were about a third of an idle BMC's
// goroutines and some of the code it runs (docs/benchmarks.md).
type objectCache struct {
	store     toolscache.Store
	reflector *toolscache.Reflector
	onChange  func(obj any, deleted bool)
	synced    atomic.Bool
}

var _ toolscache.ReflectorStore = (*objectCache)(nil)

func newObjectCache(lw toolscache.ListerWatcher, name string, example runtime.Object, onChange func(obj any, deleted bool)) *objectCache {
	c := &objectCache{store: toolscache.NewStore(toolscache.MetaNamespaceKeyFunc), onChange: onChange}
	// The name is the Reflector's in logs; without one it would read it
	// from its caller's stack at every start.
	c.reflector = toolscache.NewReflectorWithOptions(lw, example, c, toolscache.ReflectorOptions{Name: name})
	return c
}

// Run lists and watches until ctx ends.
func (c *objectCache) Run(ctx context.Context) { c.reflector.RunWithContext(ctx) }

// HasSynced reports whether the first list is in the cache.
func (c *objectCache) HasSynced() bool { return c.synced.Load() }

// get returns the cached object of key (namespace/name).
func (c *objectCache) get(key string) (any, bool, error) { return c.store.GetByKey(key) }

// Add, Update, Delete, Replace and Resync are the Reflector's ReflectorStore.

func (c *objectCache) Add(obj any) error    { return c.apply(obj, c.store.Add, false) }
func (c *objectCache) Update(obj any) error { return c.apply(obj, c.store.Update, false) }
func (c *objectCache) Delete(obj any) error { return c.apply(obj, c.store.Delete, true) }

// apply trims obj, applies it to the store with op and tells onChange.
func (c *objectCache) apply(obj any, op func(any) error, deleted bool) error {
	obj, err := keepWhatIsRead(obj)
	if err != nil {
		return err
	}
	if err := op(obj); err != nil {
		return err
	}
	c.onChange(obj, deleted)
	return nil
}

// Replace takes a new list: what it lacks was deleted while no watch ran.
func (c *objectCache) Replace(list []any, resourceVersion string) error {
	listed := make(map[string]bool, len(list))
	for i, obj := range list {
		obj, err := keepWhatIsRead(obj)
		if err != nil {
			return err
		}
		key, err := toolscache.MetaNamespaceKeyFunc(obj)
		if err != nil {
			return err
		}
		list[i], listed[key] = obj, true
	}
	var gone []any
	for _, old := range c.store.List() {
		if key, err := toolscache.MetaNamespaceKeyFunc(old); err == nil && !listed[key] {
			gone = append(gone, old)
		}
	}
	if err := c.store.Replace(list, resourceVersion); err != nil {
		return err
	}
	for _, old := range gone {
		c.onChange(old, true)
	}
	for _, obj := range list {
		c.onChange(obj, false)
	}
	c.synced.Store(true)
	return nil
}

func (c *objectCache) Resync() error { return nil }
