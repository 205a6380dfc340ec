package conformance_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/virtmetal/virtmetal/internal/kubetest/realkubevirt"
	"github.com/virtmetal/virtmetal/internal/termtest"
	"github.com/virtmetal/virtmetal/machine/machinetest"
	"github.com/virtmetal/virtmetal/sim/console"
)

// BenchmarkConsoleThroughBMC: the serial console of a VM on KubeVirt's
// real virt-api as a client of the BMC gets it (bmc-server's Redfish
// WebSocket, kubevirt backend) beside a client of virt-api's console
// subresource itself, in one run: one typed byte's echo (the latency a
// keystroke sees) and a 16 KiB echo (throughput). Then bmc-server's
// resident memory idle and with one idle SOL session open.
func BenchmarkConsoleThroughBMC(b *testing.B) {
	bin := buildBMCServer(b)
	bmc := startConsoleBMC(b, bin, "kubevirt")
	streams := []struct {
		name string
		dial func() (*websocket.Conn, error)
	}{
		{"virt-api", func() (*websocket.Conn, error) {
			conn, _, err := realkubevirt.DialSubresource(cluster.Config, bmc.namespace, bmc.hostname, "console")
			return conn, err
		}},
		{"bmc-server", func() (*websocket.Conn, error) {
			conn, _, err := bmc.dial(machineSerial)
			return conn, err
		}},
	}
	for _, s := range streams {
		for _, size := range []int{1, 16 << 10} {
			b.Run(fmt.Sprintf("%s/%dB", s.name, size), func(b *testing.B) {
				conn, err := s.dial()
				if err != nil {
					b.Fatal(err)
				}
				defer conn.Close()
				stream := &wsStream{conn: conn}
				machinetest.BenchEcho(b, stream, bmc.hostname, size)
			})
		}
	}
	// An op reads the resident memory while the SOL session idles; the
	// figure is the largest read.
	b.Run("rss", func(b *testing.B) {
		idle := vmRSS(b, bmc.pid)
		ipmitool := termtest.RequireTool(b, "ipmitool", "apt-get install ipmitool")
		tm := termtest.Start(b, ipmitool, "-I", "lanplus", "-C", "17", "-H", "127.0.0.1", "-p", bmc.ipmiPort, "-U", ironicBMCUser, "-P", ironicBMCPass, "sol", "activate")
		tm.WaitFor(0, console.Prompt(bmc.hostname))
		time.Sleep(2 * time.Second) // the session idle, its keep-alives going
		var open float64
		for b.Loop() {
			open = max(open, vmRSS(b, bmc.pid))
		}
		b.ReportMetric(idle, "idle-MB")
		b.ReportMetric(open, "sol-open-MB")
		tm.Type("~.")
		if err := tm.Exited(); err != nil {
			b.Fatalf("ipmitool: %v\n%s", err, tm.Output())
		}
	})
}

// vmRSS is the process's resident memory in MB (VmRSS).
func vmRSS(b *testing.B, pid int) float64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb / 1000
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
