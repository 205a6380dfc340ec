package kubevirt

import (
	"context"
	"sync"

	kubevirtv1 "kubevirt.io/api/core/v1"
)

// powerWrites coalesces concurrent runStrategy writes on the VM. Writes
// one after another would each read the VM, conflict with the others'
// writes, retry and wait for their own echo in the cache; and the VM would
// end in whichever finished last. Instead, a caller that finds a write in
// flight leaves its wish and waits: the next write applies the latest wish
// for every caller waiting, so the VM ends in the state of the last request
// and each caller waits for at most two writes.
type powerWrites struct {
	mu      sync.Mutex
	want    kubevirtv1.VirtualMachineRunStrategy
	asked   uint64 // wishes so far; the last one is want
	written uint64 // wishes the last finished write covered
	writing bool
	// finished is closed, and replaced, when a write finishes.
	finished chan struct{}
	result   powerWriteResult // of the last finished write
}

type powerWriteResult struct {
	vmi *kubevirtv1.VirtualMachineInstance
	err error
}

// writeRunStrategy writes s as the VM's runStrategy, together with the
// wishes of concurrent callers, and returns once a write that covers this
// wish is in the API server and the cache (with the VMI it found), or ctx
// ends. A write covering several wishes applies the last, and its outcome
// is every covered caller's: each of them asked for a state the last wish
// replaces.
func (b *Backend) writeRunStrategy(ctx context.Context, s kubevirtv1.VirtualMachineRunStrategy) (*kubevirtv1.VirtualMachineInstance, error) {
	p := &b.power
	p.mu.Lock()
	p.asked++
	mine := p.asked
	p.want = s
	for {
		if p.written >= mine {
			result := p.result
			p.mu.Unlock()
			return result.vmi, result.err
		}
		if !p.writing {
			p.writing = true
			target, upTo := p.want, p.asked
			p.mu.Unlock()
			// The write serves other callers too: one client going away
			// must not cancel it for them (updateVM bounds it in time).
			vmi, err := b.updateVM(context.WithoutCancel(ctx), setRunStrategy(target))
			p.mu.Lock()
			p.writing, p.written, p.result = false, upTo, powerWriteResult{vmi, err}
			if p.finished != nil {
				close(p.finished)
			}
			p.finished = nil
			continue
		}
		if p.finished == nil {
			p.finished = make(chan struct{})
		}
		finished := p.finished
		p.mu.Unlock()
		select {
		case <-finished:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		p.mu.Lock()
	}
}
