package redfish_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

// benchServer is the full stack a BMC client meets: TLS, HTTP/1.1
// keep-alive, HTTP Basic on every request (as MaaS does), the memory
// backend.
func benchServer(b *testing.B) *httptest.Server {
	return benchServerWith(b, nil)
}

// benchServerWith uses limiter (nil: the default throttling).
func benchServerWith(b *testing.B, limiter *throttle.Limiter) *httptest.Server {
	b.Helper()
	srv, err := redfish.NewServer(redfish.Config{
		Backend:  memory.New(memory.Options{Machines: 4}),
		Accounts: []redfish.Account{{Username: adminUser, Password: adminPass, Role: redfish.RoleAdministrator}},
		Logger:   logr.Discard(),
		Limiter:  limiter,
	})
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(srv)
	ts.StartTLS()
	b.Cleanup(ts.Close)
	return ts
}

// benchRequest returns errors instead of failing, because RunParallel's
// goroutines may not call b.Fatal.
func benchRequest(client *http.Client, method, url, body string, wantStatus int) error {
	var reader io.Reader
	if body != "" {
		reader = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, reader)
	if err != nil {
		return err
	}
	req.SetBasicAuth(adminUser, adminPass)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := client.Do(req)
	if err != nil {
		return err
	}
	// Drain so the connection is reused.
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != wantStatus {
		return fmt.Errorf("%s %s: status %d, want %d", method, url, res.StatusCode, wantStatus)
	}
	return nil
}

func BenchmarkGetComputerSystem(b *testing.B) {
	ts := benchServer(b)
	client := ts.Client()
	url := ts.URL + system0
	b.ReportAllocs()
	for b.Loop() {
		if err := benchRequest(client, "GET", url, "", http.StatusOK); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGetComputerSystemParallel(b *testing.B) {
	ts := benchServer(b)
	client := ts.Client()
	url := ts.URL + system0
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := benchRequest(client, "GET", url, "", http.StatusOK); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// resetBodies alternate so every POST changes the power state.
var resetBodies = [2]string{`{"ResetType":"On"}`, `{"ResetType":"ForceOff"}`}

func BenchmarkResetComputerSystem(b *testing.B) {
	ts := benchServer(b)
	client := ts.Client()
	url := ts.URL + reset0
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := benchRequest(client, "POST", url, resetBodies[i%2], http.StatusNoContent); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkResetComputerSystemParallel(b *testing.B) {
	ts := benchServer(b)
	client := ts.Client()
	url := ts.URL + reset0
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if err := benchRequest(client, "POST", url, resetBodies[i%2], http.StatusNoContent); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// BenchmarkThrottlingSuccessPath compares, in one run, a status poll with
// the right password through the default throttling and through no
// throttling at all: the bookkeeping of a successful login must be lost in
// the noise of the request.
func BenchmarkThrottlingSuccessPath(b *testing.B) {
	for _, tt := range []struct {
		name    string
		limiter *throttle.Limiter
	}{
		{"unthrottled", throttle.Unlimited},
		{"throttled", nil},
	} {
		b.Run(tt.name, func(b *testing.B) {
			ts := benchServerWith(b, tt.limiter)
			client := ts.Client()
			url := ts.URL + system0
			b.ReportAllocs()
			for b.Loop() {
				if err := benchRequest(client, "GET", url, "", http.StatusOK); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// getPaths are every GET a provisioning system polls or walks, one per
// kind of resource.
var getPaths = []struct{ name, path string }{
	{"ServiceRoot", "/redfish/v1"},
	{"Systems", "/redfish/v1/Systems"},
	{"ComputerSystem", "/redfish/v1/Systems/vm-0"},
	{"EthernetInterface", "/redfish/v1/Systems/vm-0/EthernetInterfaces/default"},
	{"SimpleStorage", "/redfish/v1/Systems/vm-0/SimpleStorage/1"},
	{"VirtualMedia", "/redfish/v1/Systems/vm-0/VirtualMedia/Cd"},
	{"Manager", "/redfish/v1/Managers/vm-0"},
	{"Chassis", "/redfish/v1/Chassis/vm-0"},
}

// headerWriter is the least a response needs: the handler's own
// allocations are what is measured, not a recorder's.
type headerWriter struct {
	header http.Header
	status int
	bytes  int
}

func (w *headerWriter) Header() http.Header         { return w.header }
func (w *headerWriter) WriteHeader(status int)      { w.status = status }
func (w *headerWriter) Write(b []byte) (int, error) { w.bytes += len(b); return len(b), nil }

// BenchmarkServeGetUnchanged is the handler's own cost of a GET of an
// unchanged resource with HTTP Basic (the request parsed, the connection
// and TLS excluded): what render-on-change saves shows in allocs/op.
func BenchmarkServeGetUnchanged(b *testing.B) {
	srv, err := redfish.NewServer(redfish.Config{
		Backend:  memory.New(memory.Options{Machines: 4}),
		Accounts: []redfish.Account{{Username: adminUser, Password: adminPass, Role: redfish.RoleAdministrator}},
		Logger:   logr.Discard(),
	})
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range getPaths {
		b.Run(p.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, p.path, nil)
			req.SetBasicAuth(adminUser, adminPass)
			w := &headerWriter{header: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				clear(w.header)
				srv.ServeHTTP(w, req)
				if w.status != http.StatusOK {
					b.Fatalf("GET %s: %d", p.path, w.status)
				}
			}
		})
	}
}
