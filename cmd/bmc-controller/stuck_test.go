package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStopsWhenItCannotWork: a controller whose ClusterRole lacks what it
// needs (here: every permission) never gets its caches synced. It must not
// idle forever: it exits, saying why, when the caches do not sync in time,
// and it exits on SIGTERM meanwhile. Each case runs the command in a process
// of its own, as its pod does (controller-runtime's manager is left behind
// spinning, which only exiting ends).
func TestStopsWhenItCannotWork(t *testing.T) {
	kubeconfig, err := env.KubeConfigFor("virtmetal-no-permissions")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{
		"--kubeconfig", path, "--domain", "bmc.example.org", "--bmc-image", "virtmetal/bmc-server:test",
		"--webhook-port", "0", "--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--graceful-shutdown-timeout", "1s",
	}
	tests := []struct {
		name     string
		args     []string
		sigterm  time.Duration // after start; 0: none
		wantLog  string
		within   time.Duration
		wantCode int
	}{
		{"caches never sync: it gives up", []string{"--cache-sync-timeout", "3s"}, 0, "the caches did not sync within 3s", 20 * time.Second, 1},
		{"SIGTERM while the caches cannot sync", []string{"--cache-sync-timeout", "10m"}, 2 * time.Second, "the manager did not stop within 1s", 20 * time.Second, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			encoded, err := json.Marshal(append(args, tc.args...))
			if err != nil {
				t.Fatal(err)
			}
			var logs syncBuffer
			child := exec.Command(os.Args[0], "-test.run=^$")
			child.Env = append(os.Environ(), runArgsEnv+"="+string(encoded))
			child.Stdout, child.Stderr = &logs, &logs
			start := time.Now()
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- child.Wait() }()
			if tc.sigterm > 0 {
				time.Sleep(tc.sigterm)
				_ = child.Process.Signal(syscall.SIGTERM)
			}
			select {
			case err = <-exited:
			case <-time.After(tc.within):
				_ = child.Process.Kill()
				<-exited
				t.Fatalf("still running after %v; logs:\n%s", tc.within, logs.String())
			}
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != tc.wantCode {
				t.Errorf("exit %v after %v, want code %d", err, time.Since(start).Round(time.Millisecond), tc.wantCode)
			}
			if !strings.Contains(logs.String(), tc.wantLog) {
				t.Errorf("the log does not say %q:\n%s", tc.wantLog, logs.String())
			}
		})
	}
}
