package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stmcginnis/gofish"

	"github.com/virtmetal/virtmetal/internal/bmcserver"
	"github.com/virtmetal/virtmetal/internal/certs"
	"github.com/virtmetal/virtmetal/internal/poll"
)

// fastTuning makes the timeouts short enough to watch.
var fastTuning = bmcserver.Tuning{
	ReadHeaderTimeout: 300 * time.Millisecond,
	ReadTimeout:       600 * time.Millisecond,
	WriteTimeout:      2 * time.Second,
	IdleTimeout:       time.Second,
	ReloadEvery:       50 * time.Millisecond,
}

// started is a bmc-server running in the test.
type started struct {
	base     string // http(s)://host:port
	ipmiPort string
	stdout   *lockedBuffer
	stderr   *lockedBuffer
	done     chan error
	cancel   context.CancelFunc
}

// startServer runs the command with args and waits for its banner.
func startServer(t *testing.T, args []string, env map[string]string, tune bmcserver.Tuning) *started {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &started{stdout: &lockedBuffer{}, stderr: &lockedBuffer{}, done: make(chan error, 1), cancel: cancel}
	go func() {
		s.done <- runTuned(ctx, args, func(k string) string { return env[k] }, s.stdout, s.stderr, tune)
	}()
	urlPattern := regexp.MustCompile(`(https?://\S+)/redfish/v1/`)
	ipmiPattern := regexp.MustCompile(`at udp \S+:(\d+)`)
	t.Cleanup(cancel) // also when no banner comes
	poll.Until(t, "the banner", func() error {
		select {
		case err := <-s.done:
			t.Fatalf("run returned early: %v; stderr %s", err, s.stderr.String())
		default:
		}
		out := s.stdout.String()
		// The banner ends with the password, or, serving --vms-dir, the VMs.
		m := urlPattern.FindStringSubmatch(out)
		if m == nil || !strings.Contains(out, "Password:") && !strings.Contains(out, "VMs:") {
			return fmt.Errorf("stdout %q stderr %q", out, s.stderr.String())
		}
		s.base = m[1]
		if m := ipmiPattern.FindStringSubmatch(out); m != nil {
			s.ipmiPort = m[1]
		}
		return nil
	})
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-s.done:
			if err != nil {
				t.Errorf("run returned %v after shutdown", err)
			}
		case <-time.After(bmcserver.ShutdownTimeout + time.Second):
			t.Error("run did not return after the context ended")
		}
	})
	return s
}

// insecureClient is a client for the server's generated certificate. It
// keeps no idle connection: tests make one per request, and connections
// left open would count against the per-source cap (and be reset by it).
func insecureClient() *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true,
	}}
}

func getStatus(t *testing.T, client *http.Client, url, user, pass string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// dialFrom opens a TCP connection to addr from a loopback source address.
func dialFrom(t *testing.T, source, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedWithin reports whether the server closes c within d.
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// TestSlowClientsAreCut holds connections that send their headers slowly
// and ones that declare a body and never send it (with and without
// credentials): other clients are served meanwhile, and the slow ones are
// cut at the read timeouts. A client address over its connection cap is
// refused at once, and no other address is affected.
func TestSlowClientsAreCut(t *testing.T) {
	env := map[string]string{"BMC_USERNAME": "maas", "BMC_PASSWORD": "s3cret"}
	s := startServer(t, []string{"--listen", "127.0.0.1:0", "--insecure-http", "--max-connections-per-source", "12"}, env, fastTuning)
	addr := strings.TrimPrefix(s.base, "http://")
	var slow []net.Conn
	for i := range 5 {
		c := dialFrom(t, "127.0.0.2", addr)
		fmt.Fprintf(c, "GET /redfish/v1/Systems HTTP/1.1\r\nHost: x\r\n") // never ends its headers
		slow = append(slow, c)
		c = dialFrom(t, "127.0.0.2", addr)
		auth := ""
		if i%2 == 0 {
			auth = "Authorization: Basic bWFhczpzM2NyZXQ=\r\n"
		}
		fmt.Fprintf(c, "POST /redfish/v1/Systems/vm-0/Actions/ComputerSystem.Reset HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{", auth)
		slow = append(slow, c)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	if got := getStatus(t, client, s.base+"/redfish/v1/Systems", "maas", "s3cret"); got != http.StatusOK {
		t.Fatalf("another client while slow ones are held: %d", got)
	}
	for i, c := range slow {
		if !closedWithin(c, 3*time.Second) {
			t.Errorf("slow connection %d still open after the read timeout", i)
		}
	}

	// The cap: 12 idle connections from one address, the 13th is closed.
	for range 12 {
		c := dialFrom(t, "127.0.0.3", addr)
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		if _, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
			t.Fatalf("connection within the cap: %v", err)
		}
	}
	over := dialFrom(t, "127.0.0.3", addr)
	fmt.Fprintf(over, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	if !closedWithin(over, 200*time.Millisecond) {
		t.Error("a connection over the per-source cap was kept")
	}
	if got := getStatus(t, client, s.base+"/healthz", "", ""); got != http.StatusOK {
		t.Errorf("another address while one is at its cap: %d", got)
	}
}

// TestTrustedProxyNotCapped: an Ingress carries every client's connections,
// so a trusted proxy's address is not held to the per-source cap.
func TestTrustedProxyNotCapped(t *testing.T) {
	env := map[string]string{"BMC_USERNAME": "maas", "BMC_PASSWORD": "s3cret"}
	s := startServer(t, []string{"--listen", "127.0.0.1:0", "--insecure-http", "--max-connections-per-source", "2",
		"--trusted-proxies", "127.0.0.4/32"}, env, fastTuning)
	addr := strings.TrimPrefix(s.base, "http://")
	for i := range 5 {
		c := dialFrom(t, "127.0.0.4", addr)
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		if _, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
			t.Fatalf("proxy connection %d: %v", i+1, err)
		}
	}
}

// TestHealthEndpoints: /healthz and /readyz answer without credentials and
// say nothing beyond ok.
func TestHealthEndpoints(t *testing.T) {
	env := map[string]string{"BMC_USERNAME": "maas", "BMC_PASSWORD": "s3cret"}
	s := startServer(t, []string{"--listen", "127.0.0.1:0"}, env, fastTuning)
	client := insecureClient()
	for _, path := range []string{"/healthz", "/readyz"} {
		res, err := client.Get(s.base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || string(body) != "ok\n" {
			t.Errorf("%s: %d %q, want 200 ok", path, res.StatusCode, body)
		}
	}
}

// TestStartsWithAPIServerDown: with the API server unreachable at start,
// bmc-server starts and says "not ready" everywhere (/readyz, Redfish 503
// with Retry-After, IPMI "node busy" to ipmitool) instead of exiting.
func TestStartsWithAPIServerDown(t *testing.T) {
	ipmitool := lookTool(t, "ipmitool")
	useDeadAPIServer(t)
	env := map[string]string{"BMC_USERNAME": "maas", "BMC_PASSWORD": "s3cret"}
	s := startServer(t, []string{"--backend", "kubevirt", "--namespace", "default", "--vm", "node-1",
		"--listen", "127.0.0.1:0", "--insecure-http", "--ipmi-listen", "127.0.0.1:0"}, env, fastTuning)
	client := &http.Client{Timeout: 15 * time.Second}
	if got := getStatus(t, client, s.base+"/healthz", "", ""); got != http.StatusOK {
		t.Errorf("/healthz: %d", got)
	}
	if got := getStatus(t, client, s.base+"/readyz", "", ""); got != http.StatusServiceUnavailable {
		t.Errorf("/readyz with the API server down: %d, want 503", got)
	}
	req, _ := http.NewRequest("GET", s.base+"/redfish/v1/Systems/node-1", nil)
	req.SetBasicAuth("maas", "s3cret")
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") == "" {
		t.Errorf("Redfish with the API server down: %d, Retry-After %q", res.StatusCode, res.Header.Get("Retry-After"))
	}
	out, err := runIPMITool(t, ipmitool, s.ipmiPort, "maas", "s3cret", "chassis", "power", "status")
	if err == nil || !strings.Contains(strings.ToLower(out), "busy") {
		t.Errorf("ipmitool with the API server down: %v\n%s\nwant a node busy failure", err, out)
	}
	// Failing to reach the API server, too, is logged in the one format.
	logs := s.stderr.String()
	for line := range strings.Lines(logs) {
		if !json.Valid([]byte(line)) {
			t.Errorf("a log line that is not JSON: %q", line)
		}
	}
	if !strings.Contains(logs, "API server unreachable") {
		t.Errorf("no log line says the API server is unreachable:\n%s", logs)
	}
}

// useDeadAPIServer points KUBECONFIG at an API server address that
// refuses connections: nothing listens on it.
func useDeadAPIServer(t *testing.T) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := l.Addr().String()
	l.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://%s"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, deadAddr)), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kubeconfig)
}

func lookTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not found: %v", name, err)
		}
		t.Skipf("%s not found: %v", name, err)
	}
	return path
}

func runIPMITool(t *testing.T, path, port, user, pass string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	all := append([]string{"-I", "lanplus", "-H", "127.0.0.1", "-p", port, "-U", user, "-P", pass, "-R", "1", "-N", "2"}, args...)
	out, err := exec.CommandContext(ctx, path, all...).CombinedOutput()
	return string(out), err
}

func writeCredentials(t *testing.T, dir, user, pass string) {
	t.Helper()
	// As the kubelet does: new files, then one rename.
	for name, value := range map[string]string{"username": user, "password": pass} {
		tmp := filepath.Join(dir, "."+name)
		if err := os.WriteFile(tmp, []byte(value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCredentialRotationUnderLiveServer rotates the mounted Secret's files
// under a running server and drives it with gofish and ipmitool before,
// during and after the grace window.
func TestCredentialRotationUnderLiveServer(t *testing.T) {
	ipmitool := lookTool(t, "ipmitool")
	ipmipower := lookTool(t, "ipmipower")
	dir := t.TempDir()
	writeCredentials(t, dir, "maas", "old-secret")
	const grace = 6 * time.Second // room for the clients of the window on a loaded machine
	s := startServer(t, []string{"--listen", "127.0.0.1:0", "--credentials-dir", dir, "--credentials-grace", grace.String(),
		"--ipmi-listen", "127.0.0.1:0"}, nil, fastTuning)
	client := insecureClient()
	gofishWorks := func(pass string, basic bool) error {
		c, err := gofish.Connect(gofish.ClientConfig{Endpoint: s.base, Username: "maas", Password: pass, Insecure: true, BasicAuth: basic, HTTPClient: client})
		if err != nil {
			return err
		}
		defer c.Logout()
		_, err = c.Service.Systems()
		return err
	}
	ipmiWorks := func(pass string) error {
		out, err := runIPMITool(t, ipmitool, s.ipmiPort, "maas", pass, "chassis", "power", "status")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	// MaaS's own client: freeipmi's ipmipower, as its power driver runs it.
	ipmipowerWorks := func(pass string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, ipmipower, "--driver-type", "LAN_2_0", "-W", "opensesspriv", "-h", "127.0.0.1:"+s.ipmiPort,
			"-u", "maas", "-p", pass, "-l", "OPERATOR", "--stat").CombinedOutput()
		if err != nil || !strings.Contains(string(out), ": off") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	// Before.
	if err := gofishWorks("old-secret", true); err != nil {
		t.Fatalf("gofish before the rotation: %v", err)
	}
	if err := ipmiWorks("old-secret"); err != nil {
		t.Fatalf("ipmitool before the rotation: %v", err)
	}
	session, err := gofish.Connect(gofish.ClientConfig{Endpoint: s.base, Username: "maas", Password: "old-secret", Insecure: true, HTTPClient: client})
	if err != nil {
		t.Fatal(err)
	}

	writeCredentials(t, dir, "maas", "new-secret")
	rotated := time.Now()
	for getStatus(t, client, s.base+"/redfish/v1/Systems", "maas", "new-secret") != http.StatusOK {
		if time.Since(rotated) > 2*time.Second {
			t.Fatal("the new password was not picked up")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// During: both passwords, both protocols. ipmitool with the new
	// password may need one retry (RAKP 2 is keyed before the console
	// shows which password it holds), as MaaS retries.
	if err := gofishWorks("old-secret", true); err != nil {
		t.Errorf("gofish with the old password in the window: %v", err)
	}
	if err := gofishWorks("new-secret", false); err != nil {
		t.Errorf("gofish with the new password in the window: %v", err)
	}
	if err := ipmiWorks("old-secret"); err != nil {
		t.Errorf("ipmitool with the old password in the window: %v", err)
	}
	if err := ipmipowerWorks("old-secret"); err != nil {
		t.Errorf("ipmipower with the old password in the window: %v", err)
	}
	if err := ipmiWorks("new-secret"); err != nil {
		if err := ipmiWorks("new-secret"); err != nil {
			t.Errorf("ipmitool with the new password in the window, retried: %v\n%s", err, s.stderr.String())
		}
	}
	if _, err := session.Service.Systems(); err != nil {
		t.Errorf("session from before the rotation, in the window: %v", err)
	}

	time.Sleep(time.Until(rotated.Add(grace + 200*time.Millisecond)))
	// After: only the new password; the old session has ended.
	if err := gofishWorks("old-secret", true); err == nil {
		t.Error("gofish with the old password after the window: accepted")
	}
	if err := ipmiWorks("old-secret"); err == nil {
		t.Error("ipmitool with the old password after the window: accepted")
	}
	if _, err := session.Service.Systems(); err == nil {
		t.Error("session opened with the old password outlived the window")
	}
	if err := gofishWorks("new-secret", true); err != nil {
		t.Errorf("gofish after the window: %v", err)
	}
	if err := ipmiWorks("new-secret"); err != nil {
		t.Errorf("ipmitool after the window: %v", err)
	}
	if err := ipmipowerWorks("new-secret"); err != nil {
		t.Errorf("ipmipower after the window: %v", err)
	}
	if err := ipmipowerWorks("old-secret"); err == nil {
		t.Error("ipmipower with the old password after the window: accepted")
	}
}

func writeCert(t *testing.T, certFile, keyFile, host string) *x509.Certificate {
	t.Helper()
	cert, err := certs.SelfSigned([]string{host}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	// Key first, so a poll between the two writes sees a mismatched pair
	// and keeps the old certificate.
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	return leaf
}

// TestSuppliedCertificateReloaded: --tls-cert/--tls-key are served, and a
// renewal written over them is served without a restart.
func TestSuppliedCertificateReloaded(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	first := writeCert(t, certFile, keyFile, "127.0.0.1")
	env := map[string]string{"BMC_USERNAME": "maas", "BMC_PASSWORD": "s3cret"}
	s := startServer(t, []string{"--listen", "127.0.0.1:0", "--tls-cert", certFile, "--tls-key", keyFile}, env, fastTuning)
	served := func() *x509.Certificate {
		conn, err := tls.Dial("tcp", strings.TrimPrefix(s.base, "https://"), &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0]
	}
	if !served().Equal(first) {
		t.Fatal("the supplied certificate is not served")
	}
	pool := x509.NewCertPool()
	pool.AddCert(first)
	verified := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if got := getStatus(t, verified, s.base+"/redfish/v1/Systems", "maas", "s3cret"); got != http.StatusOK {
		t.Fatalf("verified client: %d", got)
	}
	second := writeCert(t, certFile, keyFile, "127.0.0.1")
	poll.True(t, "the renewed certificate served", func() bool { return served().Equal(second) })
}

// TestFailedPartEndsTheProcess: when a part of the BMC fails (the IPMI
// listener), the process exits non-zero instead of serving half a BMC;
// internal/bmcserver's TestFailedPartEndsServing fails it while serving.
func TestFailedPartEndsTheProcess(t *testing.T) {
	// The IPMI port taken at start: run fails at once.
	taken, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	env := map[string]string{"BMC_USERNAME": "maas", "BMC_PASSWORD": "s3cret"}
	err = runTuned(t.Context(), []string{"--listen", "127.0.0.1:0", "--insecure-http", "--ipmi-listen", taken.LocalAddr().String()},
		func(k string) string { return env[k] }, io.Discard, io.Discard, fastTuning)
	if err == nil || !strings.Contains(err.Error(), "IPMI") {
		t.Fatalf("run with the IPMI port taken: %v, want an IPMI error", err)
	}
}
