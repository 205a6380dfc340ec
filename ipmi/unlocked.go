package ipmi

import (
	"context"

	"github.com/virtmetal/virtmetal/machine"
)

// callUnlocked is the Interceptor of every machine call a handler makes:
// the call releases the server's lock (so one slow backend call does not
// stall other clients' packets) and has a deadline (so a hung backend
// answers "node busy" instead of never). Handlers hold the lock when they
// call, and must expect the session table to have changed when the call
// returns.
func (s *Server) callUnlocked(ctx context.Context, _ machine.Call, call func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.callLimit)
	defer cancel()
	s.mu.Unlock()
	defer s.mu.Lock()
	return call(ctx)
}
