package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestRunShowsTheFlow runs the command as a user would, with
// --exit-when-ready: every step is printed, in order, then how to reach the
// BMC.
func TestRunShowsTheFlow(t *testing.T) {
	// Bounded by --timeout, which starts once the lab is up: building
	// bmc-server and bmc-controller cold takes minutes and no deadline of
	// the test covers it.
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"--namespace", "demo", "--vm", "web1", "--ipmi", "--exit-when-ready", "--timeout", "4m"}, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	at := 0
	for _, step := range []string{"VM created", "MAC and serial", "PXE boot", "enlisted", "power config", "renamed/pooled", "commissioning", "Ready"} {
		i := strings.Index(out[at:], step)
		if i < 0 {
			t.Fatalf("step %q missing or out of order in:\n%s", step, out)
		}
		at += i
	}
	for _, want := range []string{"BMC ready", "demo/web1 is Ready in MaaS", "curl -k -u", "ipmitool -I lanplus", "web1-demo"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
