package main

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// BenchmarkSharedRSS runs bmc-server --vms-dir as its own process against a
// real API server, serving 1 and then 200 VMs of one namespace, and reads
// its resident memory once every VM's Redfish service answers: what the
// shared bmc-server's memory request and limit are sized from (per-VM-MB
// is the growth from one VM to 200, per VM).
func BenchmarkSharedRSS(b *testing.B) {
	env, dir := rssCluster(b)
	const most = 200
	for i := range most {
		if err := env.Client.Create(b.Context(), benchVM(i)); err != nil {
			b.Fatalf("creating a VM: %v", err)
		}
	}
	binary := buildAsTheImage(b, dir)
	var one float64
	for _, vms := range []int{1, most} {
		b.Run("VMs-"+strconv.Itoa(vms), func(b *testing.B) {
			for range b.N {
				rss := sharedRSS(b, binary, dir, vms)
				b.ReportMetric(rss, "rss-MB")
				if vms == 1 {
					one = rss
				} else if one > 0 {
					b.ReportMetric((rss-one)/float64(vms-1), "per-VM-MB")
				}
			}
		})
	}
}

// sharedRSS starts bmc-server on the first vms VMs and returns its RSS once
// each answers on its own host.
func sharedRSS(b *testing.B, binary, dir string, vms int) float64 {
	b.Helper()
	vmsDir := filepath.Join(dir, "vms-"+strconv.Itoa(vms))
	if err := os.MkdirAll(vmsDir, 0o700); err != nil {
		b.Fatal(err)
	}
	for i := range vms {
		spec := fmt.Sprintf(`{"username":"maas","password":"s3cret","hosts":["node-%d.default.bmc.test"]}`, i)
		if err := os.WriteFile(filepath.Join(vmsDir, fmt.Sprintf("node-%d", i)), []byte(spec), 0o400); err != nil {
			b.Fatal(err)
		}
	}
	cmd, base, stderr, stop := startBMCServer(b, binary, dir, nil,
		"--backend", "kubevirt", "--namespace", "default", "--vms-dir", vmsDir, "--listen", "127.0.0.1:0")
	defer stop()
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the server's generated certificate
	}}
	waitReady(b, client, base)
	for i := range vms {
		host := fmt.Sprintf("node-%d.default.bmc.test", i)
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
			req, err := http.NewRequest(http.MethodGet, base+"/redfish/v1/Systems/node-"+strconv.Itoa(i), nil)
			if err != nil {
				b.Fatal(err)
			}
			req.Host = host
			req.SetBasicAuth("maas", "s3cret")
			res, err := client.Do(req)
			if err == nil {
				res.Body.Close()
				if res.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s never answered: %v\n%s", host, err, stderr.String())
			}
		}
	}
	return procStatus(b, cmd.Process.Pid, "VmRSS")
}
