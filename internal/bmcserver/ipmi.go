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

// startIPMI serves the backend's first machine over IPMI until ctx ends. A
// BMC's IPMI channel belongs to one machine; the memory backend's others are
// reachable through Redfish only. The machine is looked up per call, so
// IPMI starts (answering "node busy") while the backend cannot answer yet.
// If serving fails, stop ends the process with the error: half a BMC that
// looks whole is worse than a restart.
func startIPMI(ctx context.Context, stop context.CancelCauseFunc, cfg Config, backend machine.Backend, creds credentials,
	limiter *throttle.Limiter, audit *auditlog.Log, log logr.Logger) (*ipmi.Server, net.Addr, error) {
	ids, err := backend.Machines(ctx)
	switch {
	case err != nil:
		return nil, nil, fmt.Errorf("IPMI: no machine to serve: %w", err)
	case len(ids) == 0:
		return nil, nil, errors.New("IPMI: no machine to serve: the backend lists none")
	}
	srv, err := ipmi.NewServer(ipmi.Config{
		Machine:   newLazyMachine(backend, ids[0]),
		Username:  creds.username,
		Password:  creds.password,
		EnableV15: cfg.IPMIV15,
		Limiter:   limiter,
		AuditLog:  audit,
		Logger:    log,
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
