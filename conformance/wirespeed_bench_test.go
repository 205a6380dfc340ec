package conformance_test

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/virtmetal/virtmetal/internal/ceiling"
)

// wireClients is how many keep-alive connections the load comes over, as
// in the wrk runs of docs/benchmarks.md.
const wireClients = 8

// BenchmarkWireSpeed compares, in one run, GETs over TLS with HTTP Basic
// from wireClients parallel keep-alive connections: first the ceiling (a
// handler that only checks the credentials and answers a fixed 1.4 KB
// JSON), then every kind of Redfish resource on the memory and the KubeVirt
// backend. %ceiling is a GET's throughput as a share of the ceiling's in
// the same run. The client runs in the same process, so the figures
// include its cost on both sides of the ratio.
func BenchmarkWireSpeed(b *testing.B) {
	var ceilingNs float64
	b.Run("ceiling", func(b *testing.B) {
		ts := quietTLSServer(b, ceiling.Handler(maasUser, maasPass))
		ceilingNs = parallelGets(b, ts, "/")
	})
	for _, backend := range backends {
		bmc := startBMC(b, backend)
		for _, r := range []struct{ name, path string }{
			{"ServiceRoot", "/redfish/v1"},
			{"Systems", "/redfish/v1/Systems"},
			{"ComputerSystem", bmc.system},
			{"EthernetInterface", bmc.system + "/EthernetInterfaces/" + bmc.nic},
			{"SimpleStorage", bmc.system + "/SimpleStorage/1"},
			{"VirtualMedia", bmc.system + "/VirtualMedia/Cd"},
			{"Manager", "/redfish/v1/Managers/" + bmc.machine},
			{"Chassis", "/redfish/v1/Chassis/" + bmc.machine},
		} {
			b.Run(backend+"/"+r.name, func(b *testing.B) {
				ns := parallelGets(b, bmc.ts, r.path)
				if ceilingNs > 0 {
					b.ReportMetric(100*ceilingNs/ns, "%ceiling")
				}
			})
		}
	}
}

// parallelGets GETs path from wireClients goroutines sharing one client
// with as many keep-alive connections, and returns the ns per GET.
func parallelGets(b *testing.B, ts *httptest.Server, path string) float64 {
	client := parallelClient(b, ts)
	url := ts.URL + path
	// Open every connection (TLS handshake included) before timing.
	errs := make(chan error, wireClients)
	for range wireClients {
		go func() { errs <- getOK(client, url) }()
	}
	for range wireClients {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	b.SetParallelism((wireClients + 1) / 2) // GOMAXPROCS is 2 on the reference machine
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := getOK(client, url); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	return float64(b.Elapsed().Nanoseconds()) / float64(b.N)
}

// parallelClient is a client of ts that keeps wireClients connections.
func parallelClient(tb testing.TB, ts *httptest.Server) *http.Client {
	transport := ts.Client().Transport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = wireClients
	transport.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the test server's own certificate
	tb.Cleanup(transport.CloseIdleConnections)
	return &http.Client{Transport: transport}
}

func getOK(client *http.Client, url string) error {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.SetBasicAuth(maasUser, maasPass)
	res, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d", url, res.StatusCode)
	}
	return nil
}
