package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtmetal/virtmetal/internal/benchsize"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
)

// sharedBenchVMsEnv lists the sizes (VMs served) of the shared
// bmc-server's benchmarks, comma-separated; hack/test.sh's one-shot run
// sets small ones. The first size is the baseline the others compare with.
const sharedBenchVMsEnv = "VIRTMETAL_SHARED_BENCH_VMS"

// sharedBenchVMs are the sizes of the shared bmc-server's benchmarks: the
// issue's range, 1 to 2,000 VMs in one process, unless sharedBenchVMsEnv
// says otherwise.
func sharedBenchVMs(b *testing.B) []int {
	b.Helper()
	return benchsize.FromEnv(b, sharedBenchVMsEnv, 1, 10, 100, 500, 2000)
}

// bmcServerBinaryEnv names a bmc-server binary to measure instead of this
// tree's, so a previous commit's runs beside it in one session.
const bmcServerBinaryEnv = "VIRTMETAL_BMC_SERVER_BINARY"

// sharedCluster creates as many VMs as the largest size and returns the
// API server's folder and the binary to run.
func sharedCluster(b *testing.B, sizes []int) (dir, binary string) {
	b.Helper()
	env, dir := rssCluster(b)
	// Where the controller tells each VM's service to keep its state.
	state := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: bmcspec.SharedStateSecret}}
	if err := env.Client.Create(b.Context(), state); err != nil {
		b.Fatalf("creating the state Secret: %v", err)
	}
	for i := range slices.Max(sizes) {
		if err := env.Client.Create(b.Context(), benchVM(i)); err != nil {
			b.Fatalf("creating a VM: %v", err)
		}
	}
	if binary = os.Getenv(bmcServerBinaryEnv); binary != "" {
		return dir, binary
	}
	return dir, buildAsTheImage(b, dir)
}

// sharedIdleWindow is how long BenchmarkSharedRSS watches the server's CPU
// once every VM answers and nothing asks it anything.
const sharedIdleWindow = 5 * time.Second

// BenchmarkSharedRSS runs bmc-server --vms-dir as its own process against a
// real API server, serving each size's number of VMs of one namespace
// (vms=N), and reads its resident memory once every VM's Redfish service
// answers: what the shared bmc-server's memory request and limit are sized
// from. per-VM-KB is the growth from the first size, per VM added;
// idle-CPU-% is the share of a core the server then uses over
// sharedIdleWindow with no request. Run it with -benchtime 1x: each
// iteration is a process start.
func BenchmarkSharedRSS(b *testing.B) {
	sizes := sharedBenchVMs(b)
	dir, binary := sharedCluster(b, sizes)
	base, baseRSS := sizes[0], 0.0
	for _, vms := range sizes {
		b.Run("vms="+strconv.Itoa(vms), func(b *testing.B) {
			for range b.N {
				server := startShared(b, binary, dir, vms)
				rss := procStatus(b, server.pid, "VmRSS")
				server.client.CloseIdleConnections()
				cpuBefore := procCPU(b, server.pid)
				time.Sleep(sharedIdleWindow)
				idle := procCPU(b, server.pid) - cpuBefore
				server.stop()
				b.ReportMetric(100*idle.Seconds()/sharedIdleWindow.Seconds(), "idle-CPU-%")
				b.ReportMetric(rss, "rss-MB")
				if vms == base {
					baseRSS = rss
				} else if baseRSS > 0 {
					b.ReportMetric((rss-baseRSS)*1024/float64(vms-base), "per-VM-KB")
				}
			}
		})
	}
}

// BenchmarkSharedGetSystem GETs one VM's ComputerSystem from a shared
// bmc-server serving each size's number of VMs: what serving many VMs
// costs each request (the goal: within 10 % from 1 to 2,000 VMs).
func BenchmarkSharedGetSystem(b *testing.B) {
	sizes := sharedBenchVMs(b)
	dir, binary := sharedCluster(b, sizes)
	for _, vms := range []int{sizes[0], slices.Max(sizes)} {
		b.Run("vms="+strconv.Itoa(vms), func(b *testing.B) {
			server := startShared(b, binary, dir, vms)
			defer server.stop()
			for b.Loop() {
				if err := server.getSystem(0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// sharedServer is a running bmc-server --vms-dir.
type sharedServer struct {
	pid    int
	base   string
	client *http.Client
	stop   func()
}

// startShared starts bmc-server on the first vms VMs and returns it once
// each answers on its own host.
func startShared(b *testing.B, binary, dir string, vms int) *sharedServer {
	b.Helper()
	vmsDir := filepath.Join(dir, "vms-"+strconv.Itoa(vms))
	specs := map[string][]byte{}
	for i := range vms {
		specs[fmt.Sprintf("node-%d", i)] = fmt.Appendf(nil, `{"username":"maas","password":"s3cret","hosts":["node-%d.default.bmc.test"],"stateSecret":%q}`, i, bmcspec.SharedStateSecret)
	}
	writeVolume(b, vmsDir, specs)
	cmd := exec.Command(binary, "--backend", "kubevirt", "--namespace", "default", "--vms-dir", vmsDir, "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(dir, "kubeconfig"))
	cmd, base, stderr, stop := startBMCServer(b, cmd)
	server := &sharedServer{pid: cmd.Process.Pid, base: base, stop: stop, client: &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the server's generated certificate
	}}}
	waitReady(b, server.client, base)
	for i := range vms {
		var err error
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
			if err = server.getSystem(i); err == nil {
				break
			}
			if time.Now().After(deadline) {
				stop()
				b.Fatalf("node-%d never answered: %v\n%s", i, err, stderr.String())
			}
		}
	}
	return server
}

// getSystem GETs VM node-i's ComputerSystem on its own host.
func (s *sharedServer) getSystem(i int) error {
	req, err := http.NewRequest(http.MethodGet, s.base+"/redfish/v1/Systems/node-"+strconv.Itoa(i), nil)
	if err != nil {
		return err
	}
	req.Host = fmt.Sprintf("node-%d.default.bmc.test", i)
	req.SetBasicAuth("maas", "s3cret")
	res, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if _, err := io.Copy(io.Discard, res.Body); err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", req.URL.Path, res.Status)
	}
	return nil
}
