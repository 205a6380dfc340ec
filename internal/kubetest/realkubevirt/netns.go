package realkubevirt

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// netns is a network namespace made for one cluster, joined to the host by
// a veth pair: the host end has HostIP, the end inside has IP, both in a
// /30 of 198.51.100.0/24 (TEST-NET-2, never a real interface's address).
// Slot i of 64 uses 198.51.100.4i/30; a lock file held for the cluster's
// lifetime reserves the slot, so clusters of parallel test binaries do not
// collide and a slot left behind by a killed binary is reaped and reused.
type netns struct {
	Name   string
	IP     string // inside the namespace: where kube-apiserver and virt-api are reached
	HostIP string
	hostIf string
	lock   *os.File
}

const lockDir = "/run/virtmetal-kubevirt"

// canMakeNetns says why this process cannot make a network namespace.
func canMakeNetns() error {
	if os.Geteuid() != 0 {
		return errors.New("realkubevirt needs root to make a network namespace for the cluster (ip netns add); it does not fall back to the simulator")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("realkubevirt needs the ip command (iproute2) to make a network namespace: %w", err)
	}
	return nil
}

func newNetns() (*netns, error) {
	if err := canMakeNetns(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		return nil, err
	}
	for slot := range 64 {
		f, err := os.OpenFile(filepath.Join(lockDir, fmt.Sprintf("slot-%d.lock", slot)), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		n := &netns{
			Name:   fmt.Sprintf("virtmetal-kv%d", slot),
			IP:     fmt.Sprintf("198.51.100.%d", 4*slot+2),
			HostIP: fmt.Sprintf("198.51.100.%d", 4*slot+1),
			hostIf: fmt.Sprintf("vmkv%dh", slot),
			lock:   f,
		}
		n.reap()
		if err := n.create(); err != nil {
			n.reap()
			f.Close()
			return nil, err
		}
		return n, nil
	}
	return nil, errors.New("realkubevirt: all 64 network namespace slots are in use")
}

func (n *netns) create() error {
	nsIf := strings.TrimSuffix(n.hostIf, "h") + "n"
	for _, args := range [][]string{
		{"netns", "add", n.Name},
		{"-n", n.Name, "link", "set", "lo", "up"},
		{"link", "add", n.hostIf, "type", "veth", "peer", "name", nsIf},
		{"link", "set", nsIf, "netns", n.Name},
		{"addr", "add", n.HostIP + "/30", "dev", n.hostIf},
		{"link", "set", n.hostIf, "up"},
		{"-n", n.Name, "addr", "add", n.IP + "/30", "dev", nsIf},
		{"-n", n.Name, "link", "set", nsIf, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// reap removes the namespace and the veth pair, whether this cluster made
// them or a killed one left them behind.
func (n *netns) reap() {
	_ = exec.Command("ip", "netns", "del", n.Name).Run()
	if _, err := net.InterfaceByName(n.hostIf); err == nil {
		_ = exec.Command("ip", "link", "del", n.hostIf).Run()
	}
}

// command runs a program inside the namespace.
func (n *netns) command(bin string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.Name, bin}, args...)...)
}

func (n *netns) close() {
	n.reap()
	n.lock.Close()
}
