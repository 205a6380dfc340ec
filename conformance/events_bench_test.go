package conformance_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/ssetest"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

// BenchmarkEventLatency is the time from a machine's change to its event
// at an SSE client over TLS, as p50 and p99: on the memory backend for a
// Reset made through Redfish (told before the answer) and one made beside
// the BMC (found by the watcher's poll), on the KubeVirt backend for the
// VM's runStrategy patched straight on the API server (from the
// acknowledgement of the patch); minimal is the reference, an SSE handler
// that writes each event the moment it is handed one.
func BenchmarkEventLatency(b *testing.B) {
	b.Run("minimal", func(b *testing.B) {
		ref := startMinimalSSE(b)
		stream := openBenchStream(b, ref.ts, "/")
		var latencies []time.Duration
		for b.Loop() {
			start := time.Now()
			ref.send <- "x"
			stream.Next(b, 10*time.Second)
			latencies = append(latencies, time.Since(start))
		}
		reportPercentiles(b, latencies, "ms")
	})
	b.Run("memory/through-redfish", func(b *testing.B) {
		bmc := startMemoryBMC(b)
		reset := bmc.ts.URL + bmc.system + "/Actions/ComputerSystem.Reset"
		bodies := [2]string{`{"ResetType":"On"}`, `{"ResetType":"ForceOff"}`}
		measureEventLatency(b, openBenchStream(b, bmc.ts, "/redfish/v1/EventService/SSE"), "ms-after-answer", func(i int) error {
			return post(bmc.ts.Client(), reset, bodies[i%2])
		})
	})
	b.Run("memory/beside", func(b *testing.B) {
		backend := memory.New(memory.Options{})
		ts := serveBMC(b, backend)
		resets := [2]machine.ResetType{machine.ResetOn, machine.ResetForceOff}
		measureEventLatency(b, openBenchStream(b, ts, "/redfish/v1/EventService/SSE"), "ms", func(i int) error {
			return backend.Get("vm-0").Reset(context.Background(), resets[i%2])
		})
	})
	b.Run("kubevirt/beside", func(b *testing.B) {
		bmc := startKubeVirtBMC(b, cluster.Config) // halted
		stream := openBenchStream(b, bmc.ts, "/redfish/v1/EventService/SSE")
		strategies := [2]kubevirtv1.VirtualMachineRunStrategy{kubevirtv1.RunStrategyAlways, kubevirtv1.RunStrategyHalted}
		final := [2]string{"ResourceEvent.1.3.0.ResourcePoweredOn", "ResourceEvent.1.3.0.ResourcePoweredOff"}
		vm := &kubevirtv1.VirtualMachine{}
		vm.Namespace, vm.Name = bmc.namespace, bmc.machine
		var first []time.Duration
		i := 0
		for b.Loop() {
			patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"spec":{"runStrategy":%q}}`, strategies[i%2]))
			if err := cluster.Client.Patch(context.Background(), vm, patch); err != nil {
				b.Fatal(err)
			}
			acked := time.Now()
			e := stream.Next(b, 30*time.Second)
			first = append(first, time.Since(acked))
			// Let the power change finish (the simulated virt-controller
			// starts or stops the VMI) before the next one.
			for id, _ := e.Record(b); id != final[i%2]; id, _ = stream.Next(b, 30*time.Second).Record(b) {
			}
			i++
		}
		reportPercentiles(b, first, "ms-after-ack")
	})
}

// measureEventLatency makes change i at each iteration and reports the
// time from its return to the stream's next event.
func measureEventLatency(b *testing.B, stream *ssetest.Stream, unit string, change func(i int) error) {
	var latencies []time.Duration
	i := 0
	for b.Loop() {
		if err := change(i); err != nil {
			b.Fatal(err)
		}
		changed := time.Now()
		stream.Next(b, 10*time.Second)
		latencies = append(latencies, time.Since(changed))
		i++
	}
	reportPercentiles(b, latencies, unit)
}

// BenchmarkEventStreamMemory is the heap one open SSE stream holds, with
// 100 open: the BMC's against the minimal reference's.
func BenchmarkEventStreamMemory(b *testing.B) {
	const streams = 100
	measure := func(b *testing.B, open func() *ssetest.Stream) {
		for b.Loop() {
			before := heapInUse()
			kept := make([]*ssetest.Stream, 0, streams)
			for range streams {
				kept = append(kept, open())
			}
			after := heapInUse()
			b.ReportMetric(float64(after-before)/streams, "B/stream")
			for _, s := range kept {
				s.Response.Body.Close()
			}
		}
	}
	b.Run("minimal", func(b *testing.B) {
		ref := startMinimalSSE(b)
		measure(b, func() *ssetest.Stream { return openBenchStream(b, ref.ts, "/") })
	})
	b.Run("bmc", func(b *testing.B) {
		server, err := redfish.NewServer(redfish.Config{
			Backend:         memory.New(memory.Options{}),
			Accounts:        []redfish.Account{{Username: maasUser, Password: maasPass, Role: redfish.RoleAdministrator}},
			MaxEventStreams: 10 * streams, MaxEventStreamsPerSource: 10 * streams,
		})
		if err != nil {
			b.Fatal(err)
		}
		ts := quietTLSServer(b, server)
		b.Cleanup(server.StopEventStreams)
		measure(b, func() *ssetest.Stream { return openBenchStream(b, ts, "/redfish/v1/EventService/SSE") })
	})
}

// heapInUse is the live heap after a collection; it counts both ends of
// each stream (the test's client and the server), for the BMC and the
// reference alike.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

func openBenchStream(b *testing.B, ts *httptest.Server, path string) *ssetest.Stream {
	b.Helper()
	s, resp := ssetest.Open(b, ts.Client(), ts.URL+path, maasUser, maasPass, nil)
	if s == nil {
		b.Fatalf("SSE %s: %d", path, resp.StatusCode)
	}
	return s
}

// minimalSSE is the reference: a TLS server whose every request is a
// stream that writes each string handed to send as one event, at once.
type minimalSSE struct {
	ts   *httptest.Server
	send chan string
}

func startMinimalSSE(b *testing.B) *minimalSSE {
	m := &minimalSSE{send: make(chan string)}
	m.ts = quietTLSServer(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		flusher := w.(http.Flusher)
		flusher.Flush()
		for {
			select {
			case data := <-m.send:
				fmt.Fprintf(w, "data: %s\n\n", data)
				flusher.Flush()
			case <-r.Context().Done():
				return
			}
		}
	}))
	return m
}
