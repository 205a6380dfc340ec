package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/internal/poll"
)

// writeVMFile writes a --vms-dir file as one rename, as the kubelet swaps
// a Secret's files.
func writeVMFile(t *testing.T, dir, name, user, pass string, hosts ...string) {
	t.Helper()
	writeVMSpec(t, dir, name, bmcspec.SharedVM{Username: user, Password: pass, Hosts: hosts})
}

// hostResponse is an answer to a request sent to a virtual host.
type hostResponse struct {
	status int
	header http.Header
	body   []byte
}

// doAtHost sends a request with host as its Host header.
func doAtHost(t *testing.T, client *http.Client, method, url, host, user, pass, body string) hostResponse {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s at %s: %v", method, url, host, err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return hostResponse{status: res.StatusCode, header: res.Header, body: data}
}

func TestSharedModeRefusesEnvironmentCredentials(t *testing.T) {
	args := []string{"--backend", "kubevirt", "--namespace", "default", "--vms-dir", t.TempDir(), "--listen", "127.0.0.1:0"}
	for _, env := range []map[string]string{
		{"BMC_USERNAME": "maas", "BMC_PASSWORD": "s3cret"},
		{"BMC_USERNAME": "maas"},
		{"BMC_PASSWORD": "s3cret"},
	} {
		t.Run(strings.Join(slices.Sorted(maps.Keys(env)), "+"), func(t *testing.T) {
			err := runTuned(t.Context(), args, func(k string) string { return env[k] }, io.Discard, io.Discard, fastTuning)
			if err == nil || !strings.Contains(err.Error(), "each VM's file holds its credentials") {
				t.Errorf("error = %v, want a refusal of BMC_USERNAME/BMC_PASSWORD", err)
			}
		})
	}
}

// TestSharedModeWithAPIServerDown: serving --vms-dir, the process starts
// before its directory can be read (not ready), is ready for any Host once
// it has read it even though no VM's backend can reach the API server, and
// each VM answers 503 on its own host meanwhile; other hosts get 404.
func TestSharedModeWithAPIServerDown(t *testing.T) {
	useDeadAPIServer(t)
	dir := filepath.Join(t.TempDir(), "vms")
	s := startServer(t, []string{"--backend", "kubevirt", "--namespace", "default", "--vms-dir", dir,
		"--listen", "127.0.0.1:0", "--insecure-http"}, nil, fastTuning)
	if !strings.Contains(s.stdout.String(), "VMs: none yet") {
		t.Errorf("banner %q: want it to say no VM was read", s.stdout.String())
	}
	client := &http.Client{Timeout: 15 * time.Second}
	const podAddress = "10.244.0.7:8443"
	if got := doAtHost(t, client, "GET", s.base+"/healthz", podAddress, "", "", "").status; got != http.StatusOK {
		t.Errorf("/healthz: %d, want 200", got)
	}
	if got := doAtHost(t, client, "GET", s.base+"/readyz", podAddress, "", "", "").status; got != http.StatusServiceUnavailable {
		t.Errorf("/readyz before the directory is read: %d, want 503", got)
	}

	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeVMFile(t, dir, "web1", "maas1", "pw1", "web1.team-a.bmc.example.com")
	writeVMFile(t, dir, "web2", "maas2", "pw2", "web2.team-a.bmc.example.com")
	poll.Until(t, "/readyz 200 after the directory appeared", func() error {
		if status := doAtHost(t, client, "GET", s.base+"/readyz", podAddress, "", "", "").status; status != http.StatusOK {
			return fmt.Errorf("status %d; stderr %s", status, s.stderr.String())
		}
		return nil
	})
	web1 := doAtHost(t, client, "GET", s.base+"/redfish/v1/Systems/web1", "web1.team-a.bmc.example.com", "maas1", "pw1", "")
	if web1.status != http.StatusServiceUnavailable || web1.header.Get("Retry-After") == "" {
		t.Errorf("web1 with the API server down: %d, Retry-After %q; want 503 with Retry-After", web1.status, web1.header.Get("Retry-After"))
	}
	unknown := doAtHost(t, client, "GET", s.base+"/redfish/v1/Systems", podAddress, "maas1", "pw1", "")
	var body struct {
		Error struct{ Code string } `json:"error"`
	}
	if err := json.Unmarshal(unknown.body, &body); unknown.status != http.StatusNotFound || err != nil || !strings.HasSuffix(body.Error.Code, ".ResourceNotFound") {
		t.Errorf("a host no VM claims: %d %s, want a Redfish 404", unknown.status, unknown.body)
	}
	for line := range strings.Lines(s.stderr.String()) {
		if !json.Valid([]byte(line)) {
			t.Errorf("a log line that is not JSON: %q", line)
		}
	}
}
