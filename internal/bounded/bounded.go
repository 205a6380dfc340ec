// Package bounded runs work concurrently, a bounded number at a time.
package bounded

import "sync"

// Each calls work(i) for every i in [0, n), at most limit at once (at
// least one), and returns when all have.
func Each(n, limit int, work func(i int)) {
	slots := make(chan struct{}, max(limit, 1))
	var wg sync.WaitGroup
	for i := range n {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			work(i)
		})
	}
	wg.Wait()
}
