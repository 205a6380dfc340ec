package machine

import "sync"

// ChangeNotifier is implemented by Versioned backends that can also say
// when a StateVersion moves, so that a watcher need not poll to learn it.
type ChangeNotifier interface {
	// Changed returns a channel that is closed at the next change of any
	// of the backend's machines (it may close sooner). Ask for it before
	// reading the versions, so a change in between is not missed.
	Changed() <-chan struct{}
}

// Broadcast implements Changed for a backend: Notify closes the channel
// Changed last handed out. The zero value is ready; it is safe for
// concurrent use.
type Broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

// Changed returns the channel the next Notify closes.
func (b *Broadcast) Changed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

// Notify wakes every holder of Changed's channel.
func (b *Broadcast) Notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}
