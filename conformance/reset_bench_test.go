package conformance_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// vmAcks remembers when the API server last acknowledged a write of a VM.
type vmAcks struct {
	next http.RoundTripper
	last atomic.Int64 // Unix nanoseconds
}

func (a *vmAcks) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := a.next.RoundTrip(r)
	if err == nil && r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/virtualmachines/") {
		a.last.Store(time.Now().UnixNano())
	}
	return res, err
}

// BenchmarkKubeVirtReset is Redfish POST Reset on the KubeVirt backend,
// alternating On and ForceOff. one-client reports how long after the API
// server acknowledged the VM's write the client had its answer (the wait
// for the cache to show the write, so the next poll is consistent);
// clients-8 sends from eight keep-alive connections on one VM at once,
// fails on any error, and reports each request's latency.
func BenchmarkKubeVirtReset(b *testing.B) {
	acks := &vmAcks{}
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Wrap(func(next http.RoundTripper) http.RoundTripper { acks.next = next; return acks })
	bmc := startKubeVirtBMC(b, cfg)
	reset := bmc.ts.URL + bmc.system + "/Actions/ComputerSystem.Reset"
	bodies := [2]string{`{"ResetType":"On"}`, `{"ResetType":"ForceOff"}`}

	b.Run("one-client", func(b *testing.B) {
		client := bmc.ts.Client()
		var afterAck []time.Duration
		i := 0
		for b.Loop() {
			before := acks.last.Load()
			if err := post(client, reset, bodies[i%2]); err != nil {
				b.Fatal(err)
			}
			answered := time.Now().UnixNano()
			i++
			if ack := acks.last.Load(); ack != before {
				afterAck = append(afterAck, time.Duration(answered-ack))
			}
		}
		reportPercentiles(b, afterAck, "ms-after-ack")
	})
	b.Run(fmt.Sprintf("clients-%d", wireClients), func(b *testing.B) {
		client := parallelClient(b, bmc.ts)
		var mu sync.Mutex
		var latencies []time.Duration
		var sent atomic.Int64
		b.SetParallelism((wireClients + 1) / 2)
		b.RunParallel(func(pb *testing.PB) {
			var mine []time.Duration
			for pb.Next() {
				start := time.Now()
				if err := post(client, reset, bodies[sent.Add(1)%2]); err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(start))
			}
			mu.Lock()
			latencies = append(latencies, mine...)
			mu.Unlock()
		})
		reportPercentiles(b, latencies, "ms")
	})
}

func post(client *http.Client, url, body string) error {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewBufferString(body))
	if err != nil {
		return err
	}
	req.SetBasicAuth(maasUser, maasPass)
	req.Header.Set("Content-Type", "application/json")
	res, err := client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode/100 != 2 {
		answer, _ := io.ReadAll(res.Body)
		return fmt.Errorf("POST %s %s: %d %s", url, body, res.StatusCode, answer)
	}
	return nil
}

// reportPercentiles reports the median and the 99th percentile of ds.
func reportPercentiles(b *testing.B, ds []time.Duration, unit string) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	at := func(p float64) float64 { return float64(ds[int(p*float64(len(ds)-1))]) / float64(time.Millisecond) }
	b.ReportMetric(at(0.5), "p50-"+unit)
	b.ReportMetric(at(0.99), "p99-"+unit)
}
