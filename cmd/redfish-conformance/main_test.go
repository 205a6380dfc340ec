package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/virtmetal/virtmetal/conformance/schemacheck"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

func startBMC(t *testing.T, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	server, err := redfish.NewServer(redfish.Config{
		Backend:  memory.New(memory.Options{Machines: 1}),
		Accounts: []redfish.Account{{Username: "admin", Password: "cmd-secret", Role: redfish.RoleAdministrator}},
		Logger:   logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewTLSServer(wrap(server))
	t.Cleanup(ts.Close)
	return ts.URL
}

func TestRun(t *testing.T) {
	bundle := schemacheck.RequireBundle(t)
	env := func(key string) string {
		return map[string]string{"REDFISH_USERNAME": "admin", "REDFISH_PASSWORD": "cmd-secret"}[key]
	}
	noEnv := func(string) string { return "" }
	healthy := startBMC(t, func(h http.Handler) http.Handler { return h })
	// A service that forgets Cache-Control fails a rule.
	broken := startBMC(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(noCacheControl{w}, r)
		})
	})
	tests := []struct {
		name     string
		args     []string
		getenv   func(string) string
		wantCode int
		wantOut  string
		wantErr  string
	}{
		{"clean summary", []string{"--url", healthy, "--insecure", "--write", "--schemas", bundle}, env, 0, "session life cycle", ""},
		{"read-only says what it left out", []string{"--url", healthy, "--insecure", "--schemas", bundle}, env, 0, "not run: patch", ""},
		{"failure exits 1 with the URI and reason", []string{"--url", broken, "--insecure", "--schemas", bundle}, env, 1, "FAIL response headers /redfish/v1/Systems\n    no Cache-Control header", ""},
		{"untrusted certificate", []string{"--url", healthy, "--schemas", bundle}, env, 2, "", "certificate"},
		{"no URL", []string{"--schemas", bundle}, env, 2, "", "--url is required"},
		{"event receiver where it cannot listen", []string{"--url", healthy, "--insecure", "--write", "--event-listen", "192.0.2.1:1", "--schemas", bundle}, env, 2, "", "192.0.2.1:1"},
		{"no credentials", []string{"--url", healthy, "--insecure", "--schemas", bundle}, noEnv, 2, "", "REDFISH_USERNAME"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), tt.args, tt.getenv, &stdout, &stderr)
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.wantCode, stdout.String(), stderr.String())
			}
			if !strings.Contains(stdout.String(), tt.wantOut) {
				t.Errorf("stdout lacks %q:\n%s", tt.wantOut, stdout.String())
			}
			if !strings.Contains(stderr.String(), tt.wantErr) {
				t.Errorf("stderr lacks %q:\n%s", tt.wantErr, stderr.String())
			}
		})
	}
	t.Run("json", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		if code := run(t.Context(), []string{"--url", broken, "--insecure", "--json", "--schemas", bundle}, env, &stdout, &stderr); code != 1 {
			t.Fatalf("exit %d, want 1: %s", code, stderr.String())
		}
		var report struct {
			Target  string `json:"target"`
			Results []struct {
				Rule, URI, Outcome, Reason string
			} `json:"results"`
		}
		if err := json.Unmarshal(stdout.Bytes(), &report); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, stdout.String())
		}
		if report.Target != broken || len(report.Results) == 0 {
			t.Fatalf("report = %+v", report)
		}
		for _, r := range report.Results {
			if r.Outcome == "fail" && r.Rule == "response headers" && r.Reason == "no Cache-Control header" {
				return
			}
		}
		t.Errorf("no failed response headers result in %+v", report.Results)
	})
}

// noCacheControl drops Cache-Control from every answer.
type noCacheControl struct{ http.ResponseWriter }

func (w noCacheControl) WriteHeader(status int) {
	w.Header().Del("Cache-Control")
	w.ResponseWriter.WriteHeader(status)
}

func (w noCacheControl) Write(b []byte) (int, error) {
	w.Header().Del("Cache-Control")
	return w.ResponseWriter.Write(b)
}
