package bmcserver

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
)

func TestUnknownBackend(t *testing.T) {
	if _, err := newBackend(t.Context(), Config{Backend: "vmware", Machines: 1}, logr.Discard()); err == nil {
		t.Error("unknown backend: want an error")
	}
}

// TestKubeConfigSendsWithoutClientSideLimit: a power action costs the
// backend a few API requests; client-go's default limit (5 a second) would
// queue MaaS's actions on one VM behind each other, as a 20-a-second one
// halved the throughput of cmd/bmc-server's BenchmarkKubeVirtRSS.
func TestKubeConfigSendsWithoutClientSideLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", path)
	cfg, err := kubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.QPS >= 0 || cfg.RateLimiter != nil {
		t.Errorf("QPS %v, rate limiter %v: want no client-side limit (QPS < 0)", cfg.QPS, cfg.RateLimiter)
	}
}
