// Package poll waits, in tests, for what happens on another goroutine or in
// another process. One patience for every test of the project: a check that
// holds returns at once, so the patience costs only a failing test, and it
// is long enough for a loaded CI machine.
package poll

import (
	"errors"
	"testing"
	"time"
)

const (
	// Patience is how long a check may take to hold.
	Patience = 30 * time.Second
	// Interval is the pause between two tries.
	Interval = 5 * time.Millisecond
)

// Until calls check until it returns nil, and fails t with what and
// check's last error when that takes longer than Patience.
func Until(t testing.TB, what string, check func() error) {
	t.Helper()
	until(t, Patience, Interval, what, check)
}

// UntilEvery is Until for a check that costs another process work (a
// slow service's API) or may rightly take longer than Patience: one try
// every interval, for patience.
func UntilEvery(t testing.TB, patience, interval time.Duration, what string, check func() error) {
	t.Helper()
	until(t, patience, interval, what, check)
}

func until(t testing.TB, patience, interval time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %v after %s", what, err, patience)
		}
		time.Sleep(interval)
	}
}

// True is Until for a condition with nothing to say while it does not
// hold.
func True(t testing.TB, what string, cond func() bool) {
	t.Helper()
	Until(t, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

var errNotYet = errors.New("not yet")
