package poll

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"
)

func TestUntilReturnsOnceTheCheckHolds(t *testing.T) {
	tries := 0
	Until(t, "three tries", func() error {
		if tries++; tries < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if tries != 3 {
		t.Errorf("%d tries, want 3", tries)
	}
	calls := 0
	True(t, "at once", func() bool { calls++; return true })
	if calls != 1 {
		t.Errorf("a condition that holds was tried %d times", calls)
	}
}

// recorder is a testing.TB whose Fatalf records and ends its goroutine,
// as testing's does.
type recorder struct {
	testing.TB
	fatal string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestUntilFailsWithTheLastError(t *testing.T) {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		until(r, 50*time.Millisecond, Interval, "the door", func() error { return errors.New("still shut") })
	}()
	<-done
	if r.fatal != "the door: still still shut after 50ms" {
		t.Errorf("failure %q", r.fatal)
	}
}
