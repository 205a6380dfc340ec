package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Containers is the node's container runtime: each BMC pod's container
// runs with runc, from a bundle whose root is its image, unpacked from the
// podman store that holds it.
type Containers struct {
	Runc   string // runc's path
	Podman string // podman's path
	// PodmanEnv points podman at the store that holds the images (see
	// PodmanStore).
	PodmanEnv []string
}

// FindContainers is the runtime when runc and podman are installed, with
// the images in the store PodmanStore gave podmanEnv for.
func FindContainers(podmanEnv []string) (*Containers, error) {
	runc, err := exec.LookPath("runc")
	if err != nil {
		return nil, err
	}
	podman, err := exec.LookPath("podman")
	if err != nil {
		return nil, err
	}
	return &Containers{Runc: runc, Podman: podman, PodmanEnv: podmanEnv}, nil
}

// PodmanStore makes dir a podman store of its own, configured there and
// nowhere else, and returns PodmanStoreEnv(dir). vfs copies layers rather
// than mounting them: it works in a container, where overlay rarely does,
// and `podman image mount` then is a plain folder.
func PodmanStore(dir string) ([]string, error) {
	for _, sub := range []string{"root", "run", "libpod", "tmp", "data"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "storage.conf"), fmt.Appendf(nil, "[storage]\ndriver = \"vfs\"\ngraphroot = %q\nrunroot = %q\n",
		filepath.Join(dir, "root"), filepath.Join(dir, "run")), 0o600); err != nil {
		return nil, err
	}
	// libpod's state (default /run/libpod) here, and no event log.
	if err := os.WriteFile(filepath.Join(dir, "containers.conf"), fmt.Appendf(nil, "[engine]\ntmp_dir = %q\nevents_logger = \"none\"\n",
		filepath.Join(dir, "libpod")), 0o600); err != nil {
		return nil, err
	}
	return PodmanStoreEnv(dir), nil
}

// PodmanStoreEnv is the environment that points podman at the store
// PodmanStore made in dir.
func PodmanStoreEnv(dir string) []string {
	return []string{
		"CONTAINERS_STORAGE_CONF=" + filepath.Join(dir, "storage.conf"),
		"CONTAINERS_CONF=" + filepath.Join(dir, "containers.conf"), // only this file, not the host's
		"TMPDIR=" + filepath.Join(dir, "tmp"),
		"XDG_DATA_HOME=" + filepath.Join(dir, "data"),
	}
}

func (c *Containers) podman(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, c.Podman, args...)
	cmd.Env = append(os.Environ(), c.PodmanEnv...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("podman %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

func (c *Containers) runc(ctx context.Context, root string, args ...string) ([]byte, error) {
	out, err := exec.CommandContext(ctx, c.Runc, append([]string{"--root", root}, args...)...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("runc %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}

// image is an image unpacked into a folder, with what its configuration
// gives a container.
type image struct {
	id, rootfs           string
	entrypoint, cmd, env []string
	user, workingDir     string
}

// images unpacks each image once per node, by its content (its ID).
type images struct {
	mu       sync.Mutex
	unpacked map[string]*image // by ID
}

// unpack makes ref's files a folder under dir, as a runtime pulls and
// unpacks an image before its first container.
func (c *Containers) unpack(ctx context.Context, cache *images, dir, ref string) (*image, error) {
	out, err := c.podman(ctx, "image", "inspect", ref)
	if err != nil {
		return nil, err
	}
	var inspected []struct {
		ID     string `json:"Id"`
		Config struct {
			User       string
			Entrypoint []string
			Cmd        []string
			Env        []string
			WorkingDir string
		}
	}
	if err := json.Unmarshal(out, &inspected); err != nil || len(inspected) != 1 {
		return nil, fmt.Errorf("podman image inspect %s: %v (%d images)", ref, err, len(inspected))
	}
	in := inspected[0]
	cache.mu.Lock()
	defer cache.mu.Unlock()
	if img := cache.unpacked[in.ID]; img != nil {
		return img, nil
	}
	img := &image{id: in.ID, rootfs: filepath.Join(dir, in.ID, "rootfs"), entrypoint: in.Config.Entrypoint, cmd: in.Config.Cmd,
		env: in.Config.Env, user: in.Config.User, workingDir: in.Config.WorkingDir}
	mounted, err := c.podman(ctx, "image", "mount", ref)
	if err != nil {
		return nil, err
	}
	defer func() { _, _ = c.podman(context.WithoutCancel(ctx), "image", "unmount", ref) }()
	if err := os.MkdirAll(filepath.Dir(img.rootfs), 0o700); err != nil {
		return nil, err
	}
	tmp := img.rootfs + ".tmp"
	if out, err := exec.CommandContext(ctx, "cp", "-a", strings.TrimSpace(string(mounted)), tmp).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("copying %s: %w: %s", ref, err, out)
	}
	if err := os.Rename(tmp, img.rootfs); err != nil {
		return nil, err
	}
	if cache.unpacked == nil {
		cache.unpacked = map[string]*image{}
	}
	cache.unpacked[in.ID] = img
	return img, nil
}

// containerSpec is what the node runs one container with, the pod's
// values resolved.
type containerSpec struct {
	id, hostname string
	args, env    []string
	workingDir   string
	uid, gid     uint32
	groups       []uint32
	readOnlyRoot bool
	// noNewPrivileges: allowPrivilegeEscalation false.
	noNewPrivileges bool
	capabilities    []string
	mounts          []bindMount
}

type bindMount struct{ source, destination string }

// defaultCapabilities are those a container gets from containerd and
// CRI-O when its securityContext neither adds nor drops any.
var defaultCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
	"CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// securityOf applies the pod's and the container's securityContext, over
// the image's user, to spec, as the kubelet and its runtime do; what the
// stand-in cannot honour is an error, as the kubelet's
// CreateContainerConfigError.
func securityOf(spec *containerSpec, pod corev1.PodSpec, container corev1.Container, img *image) error {
	psc := pod.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	sc := container.SecurityContext
	if sc == nil {
		sc = &corev1.SecurityContext{}
	}
	uid, gid, err := imageUser(img.user)
	if err != nil {
		return err
	}
	for _, v := range []*int64{psc.RunAsUser, sc.RunAsUser} {
		if v != nil {
			uid = uint32(*v)
		}
	}
	for _, v := range []*int64{psc.RunAsGroup, sc.RunAsGroup} {
		if v != nil {
			gid = uint32(*v)
		}
	}
	nonRoot := psc.RunAsNonRoot
	if sc.RunAsNonRoot != nil {
		nonRoot = sc.RunAsNonRoot
	}
	if nonRoot != nil && *nonRoot && uid == 0 {
		return errors.New("runAsNonRoot, and the container would run as root")
	}
	if sc.Privileged != nil && *sc.Privileged {
		return errors.New("privileged containers are not run by the node stand-in")
	}
	spec.uid, spec.gid = uid, gid
	if psc.FSGroup != nil {
		spec.groups = append(spec.groups, uint32(*psc.FSGroup))
	}
	for _, g := range psc.SupplementalGroups {
		spec.groups = append(spec.groups, uint32(g))
	}
	spec.readOnlyRoot = sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
	spec.noNewPrivileges = sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation
	caps := defaultCapabilities
	if c := sc.Capabilities; c != nil {
		caps = nil
		dropped := map[string]bool{}
		for _, d := range c.Drop {
			dropped[capName(d)] = true
		}
		for _, name := range defaultCapabilities {
			if !dropped["CAP_ALL"] && !dropped[name] {
				caps = append(caps, name)
			}
		}
		for _, a := range c.Add {
			caps = append(caps, capName(a))
		}
	}
	spec.capabilities = caps
	return nil
}

func capName(c corev1.Capability) string {
	name := strings.ToUpper(string(c))
	if !strings.HasPrefix(name, "CAP_") {
		name = "CAP_" + name
	}
	return name
}

// imageUser reads an image's numeric USER ("uid" or "uid:gid"); the
// images hold no /etc/passwd to name one by.
func imageUser(user string) (uid, gid uint32, err error) {
	if user == "" {
		return 0, 0, nil
	}
	u, g, hasGroup := strings.Cut(user, ":")
	parse := func(s string) (uint32, error) {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("image user %q is not numeric: the node stand-in reads no /etc/passwd", user)
		}
		return uint32(n), nil
	}
	if uid, err = parse(u); err != nil {
		return 0, 0, err
	}
	gid = uid
	if hasGroup {
		gid, err = parse(g)
	}
	return uid, gid, err
}

// commandOf is the container's argv, from the image's entrypoint and cmd
// as the pod's command and args override them.
func commandOf(container corev1.Container, img *image) []string {
	switch {
	case len(container.Command) > 0:
		return append(append([]string(nil), container.Command...), container.Args...)
	case len(container.Args) > 0:
		return append(append([]string(nil), img.entrypoint...), container.Args...)
	default:
		return append(append([]string(nil), img.entrypoint...), img.cmd...)
	}
}

// ociConfig is the part of an OCI runtime configuration (config.json) the
// node writes.
type ociConfig struct {
	OCIVersion string     `json:"ociVersion"`
	Process    ociProcess `json:"process"`
	Root       ociRoot    `json:"root"`
	Hostname   string     `json:"hostname"`
	Mounts     []ociMount `json:"mounts"`
	Linux      ociLinux   `json:"linux"`
}

type ociProcess struct {
	User            ociUser         `json:"user"`
	Args            []string        `json:"args"`
	Env             []string        `json:"env"`
	Cwd             string          `json:"cwd"`
	Capabilities    ociCapabilities `json:"capabilities"`
	NoNewPrivileges bool            `json:"noNewPrivileges"`
}

type ociUser struct {
	UID            uint32   `json:"uid"`
	GID            uint32   `json:"gid"`
	AdditionalGids []uint32 `json:"additionalGids,omitempty"`
}

type ociCapabilities struct {
	Bounding  []string `json:"bounding"`
	Effective []string `json:"effective"`
	Permitted []string `json:"permitted"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	Namespaces    []ociNamespace `json:"namespaces"`
	MaskedPaths   []string       `json:"maskedPaths"`
	ReadonlyPaths []string       `json:"readonlyPaths"`
}

type ociNamespace struct {
	Type string `json:"type"`
}

// ociConfigOf is the bundle's configuration. Unlike a kubelet's: no
// network namespace (the container shares the host's, its ports moved to
// free loopback ones), no cgroup namespace nor resources, and no rlimits:
// the sandbox this runs in refuses them.
func ociConfigOf(spec containerSpec) ociConfig {
	mounts := []ociMount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
	}
	for _, m := range spec.mounts {
		mounts = append(mounts, ociMount{Destination: m.destination, Type: "bind", Source: m.source,
			Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}})
	}
	cwd := spec.workingDir
	if cwd == "" {
		cwd = "/"
	}
	return ociConfig{
		OCIVersion: "1.0.2",
		Process: ociProcess{
			User: ociUser{UID: spec.uid, GID: spec.gid, AdditionalGids: spec.groups},
			Args: spec.args, Env: spec.env, Cwd: cwd,
			Capabilities:    ociCapabilities{Bounding: spec.capabilities, Effective: spec.capabilities, Permitted: spec.capabilities},
			NoNewPrivileges: spec.noNewPrivileges,
		},
		Root:     ociRoot{Path: "rootfs", Readonly: spec.readOnlyRoot},
		Hostname: spec.hostname,
		Mounts:   mounts,
		Linux: ociLinux{
			Namespaces: []ociNamespace{{Type: "pid"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}},
			MaskedPaths: []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
				"/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
}

// run makes the container's bundle under dir, its root a copy of the
// image's files made of hard links, and runs it with runc in the
// foreground: runc passes the container's output to logs and the signals
// it gets to the container, and deletes it once it exits.
func (c *Containers) run(img *image, spec containerSpec, root, dir string, logs io.Writer) (*Process, error) {
	bundle := filepath.Join(dir, spec.id)
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return nil, err
	}
	if out, err := exec.Command("cp", "-al", img.rootfs, filepath.Join(bundle, "rootfs")).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("linking the root of %s: %w: %s", spec.id, err, out)
	}
	config, err := json.MarshalIndent(ociConfigOf(spec), "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), config, 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(c.Runc, "--root", root, "run", "--bundle", bundle, spec.id)
	cmd.Stdout, cmd.Stderr = logs, logs
	// Should this process die, runc passes the TERM on to the container.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	p, err := StartProcess(cmd)
	if err != nil {
		return nil, err
	}
	p.kill = func() {
		// A KILL is not passed on by runc: runc kill sends it, and
		// should the container not be there yet, runc itself goes.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := c.runc(ctx, root, "kill", spec.id, "KILL"); err != nil {
			_ = cmd.Process.Kill()
		}
		select {
		case <-p.done:
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			<-p.done
		}
		_, _ = c.runc(context.Background(), root, "delete", "--force", spec.id)
	}
	go func() {
		<-p.done
		_ = os.RemoveAll(bundle)
	}()
	return p, nil
}

// ContainerState is what runc reports of a running container.
type ContainerState struct {
	ID     string `json:"id"`
	PID    int    `json:"pid"`
	Status string `json:"status"`
	Bundle string `json:"bundle"`
	Rootfs string `json:"rootfs"`
}

func (c *Containers) state(ctx context.Context, root, id string) (ContainerState, error) {
	out, err := c.runc(ctx, root, "state", id)
	if err != nil {
		return ContainerState{}, err
	}
	var st ContainerState
	err = json.Unmarshal(out, &st)
	return st, err
}
