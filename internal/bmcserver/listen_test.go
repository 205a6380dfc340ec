package bmcserver

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"

	"github.com/go-logr/logr"
)

// TestFailedPartEndsServing: when a part of the BMC fails (the IPMI
// listener), serveUntilDone stops and returns that failure, so the process
// exits non-zero instead of serving half a BMC.
func TestFailedPartEndsServing(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	broken := errors.New("ipmi: read: socket gone")
	done := make(chan error, 1)
	go func() { done <- serveUntilDone(ctx, &http.Server{Handler: http.NotFoundHandler()}, l, logr.Discard()) }()
	cancel(broken)
	if err := <-done; !errors.Is(err, broken) {
		t.Fatalf("serve returned %v, want the IPMI failure", err)
	}
}
