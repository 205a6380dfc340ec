package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/virtmetal/virtmetal/internal/kubetest"
)

// BenchmarkKubeVirtRSS builds bmc-server, runs it as its own process on
// the KubeVirt backend against a real API server, and reads the process's
// resident memory from /proc: once ready and idle, after eight keep-alive
// clients polled the system (with a power action every 64th request), and
// its peak (VmHWM). The load is b.N requests; the process and the API
// server are started once for each way of running it. VIRTMETAL_BMC_SERVER_BINARY names another
// commit's binary to measure instead, beside this one's in one session;
// VIRTMETAL_RSS_IDLE_WATCH keeps reading the idle process for minutes
// before the load (idleWatchEnv).
//
// "pod" runs it as the controller's Deployment does (asPod); "kubeconfig"
// as the figures before 2026-12-06 were taken, with a kubeconfig and
// without the metrics endpoint.
func BenchmarkKubeVirtRSS(b *testing.B) {
	env, dir := rssCluster(b)
	vm := benchVM(1)
	if err := env.Client.Create(b.Context(), vm); err != nil {
		b.Fatalf("creating the VM: %v", err)
	}
	binary := os.Getenv(bmcServerBinaryEnv)
	if binary == "" {
		binary = buildAsTheImage(b, dir)
	}
	b.Run("pod", func(b *testing.B) {
		pod := asPod(b, env, dir, "maas", "s3cret")
		// The controller's arguments for a per-VM pod (controllers/workload.go),
		// less those an older binary measured beside this one lacks.
		args := []string{"--backend", "kubevirt", "--namespace", "default", "--vm", "node-1", "--listen", "127.0.0.1:0", "--credentials-dir", pod.credentials}
		known := flagsOf(b, binary)
		if known["metrics-listen"] {
			args = append(args, "--metrics-listen", "127.0.0.1:0")
		}
		if known["fqdn"] {
			args = append(args, "--fqdn", "node-1.default.bmc.test")
		}
		cmd, base, _, stop := startBMCServer(b, pod.command(binary, args...))
		defer stop()
		measureRSS(b, cmd, base)
	})
	b.Run("kubeconfig", func(b *testing.B) {
		cmd := exec.Command(binary, "--backend", "kubevirt", "--namespace", "default", "--vm", "node-1", "--listen", "127.0.0.1:0")
		cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(dir, "kubeconfig"), "BMC_USERNAME=maas", "BMC_PASSWORD=s3cret")
		cmd, base, _, stop := startBMCServer(b, cmd)
		defer stop()
		measureRSS(b, cmd, base)
	})
}

// flagsOf lists the flags binary's --help names.
func flagsOf(b *testing.B, binary string) map[string]bool {
	b.Helper()
	out, _ := exec.Command(binary, "--help").CombinedOutput() // flag's --help exits 0 or 2
	known := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+--?([a-z-]+)`).FindAllStringSubmatch(string(out), -1) {
		known[m[1]] = true
	}
	if !known["backend"] {
		b.Fatalf("%s --help lists no flags:\n%s", binary, out)
	}
	return known
}

// measureRSS reads the idle figures of the started bmc-server, then loads
// it with b.N requests and reads the loaded and peak figures.
func measureRSS(b *testing.B, cmd *exec.Cmd, base string) {
	b.Helper()
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the server's generated certificate
		MaxIdleConnsPerHost: 8,
	}}
	waitReady(b, client, base)
	idle := settledRSS(b, cmd.Process.Pid)
	// The account: pages of the executable (clean, shared with the page
	// cache, but counted) and memory the process allocated.
	idleFile, idleAnon := procStatus(b, cmd.Process.Pid, "RssFile"), procStatus(b, cmd.Process.Pid, "RssAnon")
	later := watchIdle(b, cmd.Process.Pid, idleWatchTime(b))

	system := base + "/redfish/v1/Systems/node-1"
	var sent atomic.Int64
	b.Run("GetSystem-8clients", func(b *testing.B) {
		b.SetParallelism(4) // eight clients on two cores
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				var err error
				if n := sent.Add(1); n%64 == 0 {
					err = send(client, http.MethodPost, system+"/Actions/ComputerSystem.Reset", []string{`{"ResetType":"On"}`, `{"ResetType":"ForceOff"}`}[n/64%2])
				} else {
					err = send(client, http.MethodGet, system, "")
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.StopTimer()
		b.ReportMetric(idle, "idle-MB")
		b.ReportMetric(idleFile, "idle-file-MB")
		b.ReportMetric(idleAnon, "idle-anon-MB")
		if later.total > 0 {
			b.ReportMetric(later.highest, "idle-max-MB")
			b.ReportMetric(later.total, "idle-later-MB")
			b.ReportMetric(later.file, "idle-later-file-MB")
			b.ReportMetric(later.anon, "idle-later-anon-MB")
		}
		b.ReportMetric(procStatus(b, cmd.Process.Pid, "VmRSS"), "loaded-MB")
		b.ReportMetric(procStatus(b, cmd.Process.Pid, "RssFile"), "loaded-file-MB")
		b.ReportMetric(procStatus(b, cmd.Process.Pid, "RssAnon"), "loaded-anon-MB")
		b.ReportMetric(procStatus(b, cmd.Process.Pid, "VmHWM"), "peak-MB")
	})
}

// rssCluster starts an API server of the benchmark's own (the process
// under measurement must not share one that tests load) and writes its
// admin kubeconfig into the returned folder.
func rssCluster(b *testing.B) (*kubetest.Env, string) {
	b.Helper()
	ctrllog.SetLogger(logr.Discard())
	env, err := kubetest.Start(kubetest.Options{})
	if err != nil {
		b.Fatalf("envtest: %v", err)
	}
	b.Cleanup(func() { _ = env.Stop() })
	dir := b.TempDir()
	kubeconfig, err := env.AdminKubeConfig()
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kubeconfig"), kubeconfig, 0o600); err != nil {
		b.Fatal(err)
	}
	return env, dir
}

// benchVM is the halted VM node-<i> of the default namespace, stamped as
// the controller leaves it (the backend reads the system's UUID there).
func benchVM(i int) *kubevirtv1.VirtualMachine {
	name := fmt.Sprintf("node-%d", i)
	halted := kubevirtv1.RunStrategyHalted
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &halted,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{
					Firmware: &kubevirtv1.Firmware{UUID: types.UID(fmt.Sprintf("5b0c7f2e-8a43-4b0e-9d51-%012x", i)), Serial: name + ".default"},
					Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{{
						Name: "default", MacAddress: "02:00:00:00:00:01",
						InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}},
					}}},
				},
				Networks: []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
			}},
		},
	}
}

// buildAsTheImage builds bmc-server into dir as hack/images.sh builds the
// image's binary: what a BMC pod runs.
func buildAsTheImage(b *testing.B, dir string) string {
	b.Helper()
	binary := filepath.Join(dir, "bmc-server")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", binary, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	return binary
}

// startBMCServer starts cmd, a bmc-server, and returns it with the base
// URL of its banner, its standard error, and how to stop it.
func startBMCServer(b *testing.B, cmd *exec.Cmd) (*exec.Cmd, string, *bytes.Buffer, func()) {
	b.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	stderr := &bytes.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	var once sync.Once
	stop := func() { once.Do(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }) }
	b.Cleanup(stop) // also when the benchmark fails before its caller can stop it
	base := bannerURL(b, stdout)
	return cmd, base, stderr, stop
}

func bannerURL(b *testing.B, stdout io.Reader) string {
	b.Helper()
	found := make(chan string, 1)
	go func() {
		pattern := regexp.MustCompile(`(https://\S+)/redfish/v1/`)
		scanner := bufio.NewScanner(stdout)
		for scanner.Scan() {
			if m := pattern.FindStringSubmatch(scanner.Text()); m != nil {
				found <- m[1]
			}
		}
		close(found)
	}()
	select {
	case base, ok := <-found:
		if !ok {
			b.Fatal("bmc-server exited without a banner")
		}
		return base
	case <-time.After(3 * time.Minute): // a shared server reads all its VMs first
		b.Fatal("no banner from bmc-server")
	}
	return ""
}

func waitReady(b *testing.B, client *http.Client, base string) {
	b.Helper()
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if res, err := client.Get(base + "/readyz"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			b.Fatal("bmc-server not ready")
		}
	}
}

func send(client *http.Client, method, url, body string) error {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.SetBasicAuth("maas", "s3cret")
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %d", method, url, res.StatusCode)
	}
	return nil
}

// settledRSS waits until the resident memory of process pid has stayed
// the same for a second, and returns it. A process answers ready while
// the rest of its start is still under way (the EventService's first read,
// say): the figure read at that instant moved by up to 0.3 MB between runs.
func settledRSS(b *testing.B, pid int) float64 {
	b.Helper()
	const still = 10 // readings 100 ms apart
	last, same := procStatus(b, pid, "VmRSS"), 0
	for deadline := time.Now().Add(30 * time.Second); same < still; {
		time.Sleep(100 * time.Millisecond)
		if now := procStatus(b, pid, "VmRSS"); now == last {
			same++
		} else {
			last, same = now, 0
		}
		if time.Now().After(deadline) {
			b.Fatalf("the resident memory of bmc-server did not settle in 30 s (last %.2f MB)", last)
		}
	}
	return last
}

// idleWatchEnv names how long measureRSS keeps watching the idle process
// once it has settled, as a Go duration ("10m"). An idle BMC's resident
// memory grows for minutes after its start, while the collector's periodic
// cycles run, then levels off (docs/benchmarks.md); unset, idle is the
// settled reading alone, so that a run of every benchmark stays short.
const idleWatchEnv = "VIRTMETAL_RSS_IDLE_WATCH"

func idleWatchTime(b *testing.B) time.Duration {
	b.Helper()
	value := os.Getenv(idleWatchEnv)
	if value == "" {
		return 0
	}
	d, err := time.ParseDuration(value)
	if err != nil || d <= 0 {
		b.Fatalf("%s=%q: want a positive duration such as 10m", idleWatchEnv, value)
	}
	return d
}

// idleWatch is what watchIdle read: the highest figure, and the last with
// its file-backed and anonymous parts.
type idleWatch struct{ highest, total, file, anon float64 }

// watchIdle reads the resident memory of process pid every 5 s for the
// duration given, with no client; the zero idleWatch when it is zero.
func watchIdle(b *testing.B, pid int, d time.Duration) idleWatch {
	b.Helper()
	var w idleWatch
	if d == 0 {
		return w
	}
	const every = 5 * time.Second
	for end := time.Now().Add(d); ; time.Sleep(every) {
		w.total = procStatus(b, pid, "VmRSS")
		w.highest = max(w.highest, w.total)
		if time.Now().After(end) {
			w.file, w.anon = procStatus(b, pid, "RssFile"), procStatus(b, pid, "RssAnon")
			return w
		}
	}
}

// procStatus reads a memory figure of /proc/PID/status, in MB (MiB).
func procStatus(b *testing.B, pid int, field string) float64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb / 1024
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// procCPU is the CPU time process pid has used, its threads' user and
// system time from /proc/PID/stat, counted in USER_HZ (100 a second on
// Linux whatever the kernel's tick).
func procCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from the last ')'. utime and stime are the stat's 14th and 15th.
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			b.Fatalf("/proc/%d/stat: %v", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / 100
}
