package redfish_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/gorilla/websocket"

	"github.com/virtmetal/virtmetal/internal/throttle"
	"github.com/virtmetal/virtmetal/machine/machinetest"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
	"github.com/virtmetal/virtmetal/sim/console"
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

// BenchmarkSerialConsoleEcho types into vm-0's serial console and reads
// the echo back, through the console's WebSocket (TLS, as a client meets
// it) and, for comparison, through the console stream itself: the
// difference per op is what the WebSocket adds to a round trip, and
// MB/s the echo throughput.
func BenchmarkSerialConsoleEcho(b *testing.B) {
	for _, size := range []int{64, 4 << 10} {
		typed := bytes.Repeat([]byte{'x'}, size)
		b.Run(fmt.Sprintf("direct/%dB", size), func(b *testing.B) {
			m, err := memory.New(memory.Options{Machines: 1}).Machine(context.Background(), "vm-0")
			if err != nil {
				b.Fatal(err)
			}
			stream := machinetest.AtPrompt(b, m, "vm-0")
			buf := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := stream.Write(typed); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(stream, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("websocket/%dB", size), func(b *testing.B) {
			ts := benchServer(b)
			if err := benchRequest(ts.Client(), "POST", ts.URL+reset0, `{"ResetType":"On"}`, http.StatusNoContent); err != nil {
				b.Fatal(err)
			}
			dialer := websocket.Dialer{TLSClientConfig: ts.Client().Transport.(*http.Transport).TLSClientConfig}
			r, _ := http.NewRequest("GET", "/", nil)
			r.SetBasicAuth(adminUser, adminPass)
			conn, _, err := dialer.Dial("wss"+strings.TrimPrefix(ts.URL, "https")+system0+"/Oem/VirtMetal/SerialConsole", r.Header)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			stream := &wsStream{conn: conn}
			machinetest.ReadPast(b, stream, console.Prompt("vm-0"))
			buf := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				if err := conn.WriteMessage(websocket.BinaryMessage, typed); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(stream, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
