package controllers

import (
	"context"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

// sharedHealth carries what the shared reconciler last met in each
// namespace to the BMC reconciler, which reports it on the
// VirtualMachineBMCs that server serves: a tenant sees why its BMC is not
// served in its own objects, not only in the controller's log.
type sharedHealth struct {
	mu       sync.Mutex
	failures map[string]error // by namespace
	// changed tells the BMC reconciler of a namespace whose failure came
	// or went (the event's object carries only the namespace).
	changed chan event.GenericEvent
}

func newSharedHealth() *sharedHealth {
	return &sharedHealth{failures: map[string]error{}, changed: make(chan event.GenericEvent, 64)}
}

// failure is the namespace's last failure, or nil; nil also from a nil
// sharedHealth.
func (h *sharedHealth) failure(namespace string) error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failures[namespace]
}

// record makes err (nil: none) the namespace's failure and says whether
// that changed what is reported; a change wakes the BMC reconciler.
func (h *sharedHealth) record(ctx context.Context, namespace string, err error) bool {
	h.mu.Lock()
	old := h.failures[namespace]
	same := (old == nil) == (err == nil) && (err == nil || old.Error() == err.Error())
	if err == nil {
		delete(h.failures, namespace)
	} else {
		h.failures[namespace] = err
	}
	h.mu.Unlock()
	if same {
		return false
	}
	select {
	case h.changed <- event.GenericEvent{Object: &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: namespace}}}:
	case <-ctx.Done():
	}
	return true
}
