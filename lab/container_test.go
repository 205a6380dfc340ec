package lab_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/lab"
	"github.com/virtmetal/virtmetal/maas"
)

// bmcUser is the user bmc-controller's Deployments run bmc-server as.
const bmcUser = "65532"

// TestBMCContainer: the BMC pod of the VM that existed before the
// controller runs from the bmc-server image, by runc, as the pod's
// securityContext says: as user and group 65532, without any capability
// nor a way to gain privileges, its root file system read-only (a write to
// / fails), its credentials mounted read-only. Without runc or podman the
// lab runs processes: the test fails under CI=true (hack/test.sh installs
// both) and skips otherwise.
func TestBMCContainer(t *testing.T) {
	l := theLab
	if !l.RunsContainers() {
		err := lab.CanRunContainers()
		if os.Getenv("CI") == "true" {
			t.Fatalf("the BMC pods run as processes (%v): under CI they must run from their image (hack/test.sh installs runc and podman)", err)
		}
		t.Skipf("the BMC pods run as processes: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), flowDeadline)
	defer cancel()
	poll.Until(t, "the BMC of "+preExisting.String()+" ready", func() error {
		for _, b := range l.BMCs() {
			if b.VM == preExisting && b.Ready {
				return nil
			}
		}
		return fmt.Errorf("no ready BMC of %s", preExisting)
	})
	checkContainer(t, ctx, l, preExisting)
}

// checkContainer checks, when the lab runs containers, that the VM's BMC
// is a running runc container with the pod's hardening.
func checkContainer(t *testing.T, ctx context.Context, l *lab.Lab, vm maas.VMRef) {
	t.Helper()
	if !l.RunsContainers() {
		return
	}
	state, err := l.BMCContainer(ctx, vm)
	if err != nil {
		t.Fatal(err)
	}
	if state.Status != "running" || state.PID == 0 {
		t.Fatalf("container %s: %+v, want a running one", state.ID, state)
	}
	proc := fmt.Sprintf("/proc/%d", state.PID)
	status, err := os.ReadFile(proc + "/status")
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(string(status), "\n") {
		if name, value, ok := strings.Cut(line, ":"); ok {
			fields[name] = strings.Join(strings.Fields(value), " ")
		}
	}
	for name, want := range map[string]string{
		"Uid":        strings.Repeat(bmcUser+" ", 3) + bmcUser,
		"Gid":        strings.Repeat(bmcUser+" ", 3) + bmcUser,
		"CapEff":     "0000000000000000",
		"CapPrm":     "0000000000000000",
		"CapBnd":     "0000000000000000",
		"NoNewPrivs": "1",
	} {
		if fields[name] != want {
			t.Errorf("container %s: %s %q, want %q", state.ID, name, fields[name], want)
		}
	}
	// It runs the image's binary, from the bundle runc was given.
	if exe, err := os.Readlink(proc + "/exe"); err != nil || exe != "/bmc-server" {
		t.Errorf("container %s runs %q (%v), want the image's /bmc-server", state.ID, exe, err)
	}
	if root, err := os.Readlink(proc + "/root"); err != nil || root != "/" || state.Rootfs != filepath.Join(state.Bundle, "rootfs") {
		t.Errorf("container %s: root %q (%v), rootfs %s of bundle %s", state.ID, root, err, state.Rootfs, state.Bundle)
	}
	mounts, err := os.ReadFile(proc + "/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var rootOptions, credentialOptions string
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		switch {
		case f[4] == "/":
			rootOptions = f[5]
		case strings.HasPrefix(f[4], "/etc/virtmetal/"):
			credentialOptions = f[5]
		}
	}
	if !strings.HasPrefix(rootOptions, "ro,") {
		t.Errorf("container %s: / mounted %q, want read-only", state.ID, rootOptions)
	}
	// Through the container's own root, even root cannot write.
	err = os.WriteFile(proc+"/root/written", []byte("x"), 0o600)
	if !errors.Is(err, syscall.EROFS) {
		t.Errorf("container %s: writing to / gave %v, want %v", state.ID, err, syscall.EROFS)
	}
	if !strings.HasPrefix(credentialOptions, "ro,") {
		t.Errorf("container %s: credentials under /etc/virtmetal mounted %q, want read-only", state.ID, credentialOptions)
	}
}
