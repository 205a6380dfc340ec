package bmcserver

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/go-logr/logr"

	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/ipmi"
	"github.com/virtmetal/virtmetal/machine"
)

// sharedByProtocols is what Redfish and IPMI of one process hold in
// common: a client's failed logins count in both, both write one audit log,
// and a console has one client whichever protocol it comes through.
type sharedByProtocols struct {
	limiter  *throttle.Limiter
	audit    *auditlog.Log
	consoles *machine.ConsoleSessions
}

// startIPMI serves the backend's first machine over IPMI until ctx ends. A
// BMC's IPMI channel belongs to one machine; the memory backend's others are
// reachable through Redfish only. The machine is looked up per call, so
// IPMI starts (answering "node busy") while the backend cannot answer yet.
// If serving fails, stop ends the process with the error: half a BMC that
// looks whole is worse than a restart.
func startIPMI(ctx context.Context, stop context.CancelCauseFunc, cfg Config, backend machine.Backend, creds credentials,
	shared sharedByProtocols, log logr.Logger) (*ipmi.Server, net.Addr, error) {
	ids, err := backend.Machines(ctx)
	switch {
	case err != nil:
		return nil, nil, fmt.Errorf("IPMI: no machine to serve: %w", err)
	case len(ids) == 0:
		return nil, nil, errors.New("IPMI: no machine to serve: the backend lists none")
	}
	srv, err := ipmi.NewServer(ipmi.Config{
		Machine:         newLazyMachine(backend, ids[0]),
		Username:        creds.username,
		Password:        creds.password,
		EnableV15:       cfg.IPMIV15,
		Limiter:         shared.limiter,
		AuditLog:        shared.audit,
		ConsoleSessions: shared.consoles,
		Logger:          log,
	})
	if err != nil {
		return nil, nil, err
	}
	conn, err := net.ListenPacket("udp", cfg.IPMIListen)
	if err != nil {
		return nil, nil, fmt.Errorf("IPMI: %w", err)
	}
	go func() {
		defer conn.Close()
		if err := srv.Serve(ctx, conn); err != nil {
			stop(err)
		}
	}()
	return srv, conn.LocalAddr(), nil
}
