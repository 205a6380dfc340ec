package bmcserver

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"

	"github.com/go-logr/logr"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
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

// TestNetworkProtocolFromFlags: the Managers' NetworkProtocol follows
// --listen, --insecure-http and --ipmi-listen, IPMI for the first machine.
func TestNetworkProtocolFromFlags(t *testing.T) {
	backend := memory.New(memory.Options{Machines: 2})
	tests := []struct {
		name    string
		cfg     Config
		backend machine.Backend
		want    redfish.NetworkProtocol
	}{
		{"HTTPS only", Config{Listen: ":8443"}, backend, redfish.NetworkProtocol{RedfishPort: 8443}},
		{"any port", Config{Listen: "127.0.0.1:0"}, backend, redfish.NetworkProtocol{}},
		{"plain HTTP", Config{Listen: ":8080", InsecureHTTP: true}, backend, redfish.NetworkProtocol{RedfishPort: 8080, PlainHTTP: true}},
		{"with IPMI", Config{Listen: ":8443", IPMIListen: ":623"}, backend, redfish.NetworkProtocol{RedfishPort: 8443, IPMIPort: 623, IPMIMachine: "vm-0"}},
		{"virtual hosts, no IPMI", Config{Listen: ":8443", IPMIListen: ":623"}, nil, redfish.NetworkProtocol{RedfishPort: 8443}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := networkProtocol(t.Context(), tt.cfg, tt.backend); got != tt.want {
				t.Errorf("networkProtocol = %+v, want %+v", got, tt.want)
			}
		})
	}
}
