package bmcmetrics_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/virtmetal/virtmetal/internal/bmcmetrics"
	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

// BenchmarkObservedRequests is what the metrics cost a Redfish request:
// the same requests to a service without metrics (the reference) and to
// one wired as bmc-server --metrics-listen wires it (Observer, intercepted
// backend). "system" is a GET answered from what was kept; "reset" goes
// through the backend.
func BenchmarkObservedRequests(b *testing.B) {
	for _, withMetrics := range []bool{false, true} {
		name := "without"
		if withMetrics {
			name = "with"
		}
		backend := machine.Backend(memory.New(memory.Options{Machines: 1}))
		cfg := redfish.Config{
			Accounts: []redfish.Account{{Username: user, Password: password, Role: redfish.RoleAdministrator}},
			Limiter:  throttle.Unlimited,
		}
		if withMetrics {
			metrics := bmcmetrics.New()
			backend, cfg.Observer = machine.InterceptBackend(backend, metrics.Intercept), metrics
		}
		cfg.Backend = backend
		srv, err := redfish.NewServer(cfg)
		if err != nil {
			b.Fatal(err)
		}
		for _, req := range []struct{ name, method, path, body string }{
			{"system", http.MethodGet, "/redfish/v1/Systems/vm-0", ""},
			{"reset", http.MethodPost, "/redfish/v1/Systems/vm-0/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`},
		} {
			b.Run(req.name+"/"+name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					r := httptest.NewRequest(req.method, req.path, strings.NewReader(req.body))
					if req.body != "" {
						r.Header.Set("Content-Type", "application/json")
					}
					r.SetBasicAuth(user, password)
					w := httptest.NewRecorder()
					srv.ServeHTTP(w, r)
					if w.Code >= 300 {
						b.Fatalf("%s %s: %d", req.method, req.path, w.Code)
					}
				}
			})
		}
	}
}
