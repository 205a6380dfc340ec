package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/internal/promtest"
)

// TestMetricsListen: --metrics-listen serves Prometheus text without
// credentials on its own port, and the numbers move with the Redfish and
// IPMI traffic; without the flag no metrics are served.
func TestMetricsListen(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env := map[string]string{"BMC_USERNAME": "maas", "BMC_PASSWORD": "s3cret"}
	var stdout, stderr lockedBuffer
	done := make(chan error, 1)
	args := []string{"--listen", "127.0.0.1:0", "--insecure-http", "--ipmi-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"}
	go func() { done <- run(ctx, args, func(k string) string { return env[k] }, &stdout, &stderr) }()

	metricsPattern := regexp.MustCompile(`Metrics at (http://\S+/metrics)`)
	redfishPattern := regexp.MustCompile(`(http://\S+)/redfish/v1/`)
	var metricsURL, base string
	poll.Until(t, "the addresses printed", func() error {
		if m := metricsPattern.FindStringSubmatch(stdout.String()); m != nil {
			metricsURL = m[1]
		}
		if m := redfishPattern.FindStringSubmatch(stdout.String()); m != nil {
			base = m[1]
		}
		if metricsURL == "" || base == "" {
			return fmt.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
		}
		return nil
	})
	get := func(path, pass string) map[string]any {
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		req.SetBasicAuth("maas", pass)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var doc map[string]any
		_ = json.NewDecoder(res.Body).Decode(&doc)
		return doc
	}
	get("/redfish/v1/Systems", "wrong")
	members, _ := get("/redfish/v1/Systems", "s3cret")["Members"].([]any)
	if len(members) == 0 {
		t.Fatal("no system")
	}
	get(members[0].(map[string]any)["@odata.id"].(string), "s3cret") // reads the machine through the backend

	res, err := http.Get(metricsURL) // no credentials
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d", res.StatusCode)
	}
	families := promtest.Parse(t, strings.NewReader(string(body)))
	for _, name := range []string{"virtmetal_bmc_redfish_requests_total", "virtmetal_bmc_redfish_request_duration_seconds",
		"virtmetal_bmc_backend_calls_total", "virtmetal_bmc_backend_ready", "virtmetal_bmc_login_failures_total",
		"virtmetal_bmc_ipmi_sessions", "process_resident_memory_bytes"} {
		if _, ok := families[name]; !ok {
			t.Errorf("no %s", name)
		}
	}
	if f := families["virtmetal_bmc_login_failures_total"]; f != nil && f.Metric[0].Counter.GetValue() != 1 {
		t.Errorf("login failures = %v, want 1", f.Metric[0].Counter.GetValue())
	}
	if res, err := http.Get(strings.TrimSuffix(metricsURL, "/metrics") + "/redfish/v1"); err == nil {
		res.Body.Close()
		if res.StatusCode != http.StatusNotFound {
			t.Errorf("the metrics port serves %d for Redfish, want 404", res.StatusCode)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run returned %v after shutdown", err)
	}
	// The port may be another process's by now: only our metrics count.
	if res, err := http.Get(metricsURL); err == nil {
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if strings.Contains(string(body), "virtmetal_bmc_") {
			t.Error("metrics still served after shutdown")
		}
	}
}

func TestMetricsOffByDefault(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.MetricsListen != "" {
		t.Errorf("--metrics-listen defaults to %q, want off", o.MetricsListen)
	}
}
