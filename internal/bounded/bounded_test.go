package bounded_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/internal/bounded"
)

func TestEach(t *testing.T) {
	for _, tc := range []struct {
		name               string
		n, limit, wantMost int
	}{
		{"none", 0, 4, 0},
		{"fewer than the limit", 3, 8, 3},
		{"more than the limit", 40, 4, 4},
		{"limit below one", 5, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := make([]atomic.Int32, tc.n)
			var running, most atomic.Int32
			bounded.Each(tc.n, tc.limit, func(i int) {
				now := running.Add(1)
				for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
				}
				time.Sleep(20 * time.Millisecond)
				running.Add(-1)
				calls[i].Add(1)
			})
			for i := range calls {
				if c := calls[i].Load(); c != 1 {
					t.Errorf("work(%d) called %d times, want once", i, c)
				}
			}
			if got := most.Load(); got != int32(tc.wantMost) {
				t.Errorf("at most %d at once, want %d", got, tc.wantMost)
			}
		})
	}
}
