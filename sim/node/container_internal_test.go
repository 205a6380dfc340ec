package node

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// TestSecurityOf: the pod's and the container's securityContext, over the
// image's user, give the container's user, groups, root, capabilities and
// privileges as a kubelet's runtime would; what the stand-in cannot honour
// is refused.
func TestSecurityOf(t *testing.T) {
	img := &image{user: "65532:65532", entrypoint: []string{"/bmc-server"}}
	hardened := corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{
		RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532), RunAsGroup: ptr.To[int64](65532), FSGroup: ptr.To[int64](65532),
	}}
	locked := &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true), Privileged: ptr.To(false),
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	for _, tt := range []struct {
		name      string
		pod       corev1.PodSpec
		sc        *corev1.SecurityContext
		image     *image
		want      containerSpec
		wantError string
	}{
		{name: "bmc-controller's Deployment", pod: hardened, sc: locked, image: img,
			want: containerSpec{uid: 65532, gid: 65532, groups: []uint32{65532}, readOnlyRoot: true, noNewPrivileges: true}},
		{name: "the image's user, the runtime's defaults", image: img,
			want: containerSpec{uid: 65532, gid: 65532, capabilities: defaultCapabilities}},
		{name: "the container's user over the pod's", pod: hardened, image: img,
			sc: &corev1.SecurityContext{RunAsUser: ptr.To[int64](1000), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"NET_RAW", "CAP_KILL"}, Add: []corev1.Capability{"NET_ADMIN"}}},
			want: containerSpec{uid: 1000, gid: 65532, groups: []uint32{65532}, capabilities: slices.Concat(
				slices.DeleteFunc(slices.Clone(defaultCapabilities), func(c string) bool { return c == "CAP_NET_RAW" || c == "CAP_KILL" }),
				[]string{"CAP_NET_ADMIN"})}},
		{name: "root refused by runAsNonRoot", pod: corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true)}},
			image: &image{}, wantError: "runAsNonRoot"},
		{name: "privileged refused", sc: &corev1.SecurityContext{Privileged: ptr.To(true)}, image: img, wantError: "privileged"},
		{name: "named image user refused", image: &image{user: "nobody"}, wantError: "not numeric"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got containerSpec
			err := securityOf(&got, tt.pod, corev1.Container{SecurityContext: tt.sc}, tt.image)
			if tt.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantError) {
					t.Fatalf("error %v, want one saying %q", err, tt.wantError)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.uid != tt.want.uid || got.gid != tt.want.gid || !slices.Equal(got.groups, tt.want.groups) ||
				got.readOnlyRoot != tt.want.readOnlyRoot || got.noNewPrivileges != tt.want.noNewPrivileges ||
				!slices.Equal(got.capabilities, tt.want.capabilities) {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// TestCommandOf: the pod's command replaces the image's entrypoint and
// cmd, its args the image's cmd only.
func TestCommandOf(t *testing.T) {
	img := &image{entrypoint: []string{"/bmc-server"}, cmd: []string{"--help"}}
	for _, tt := range []struct {
		name      string
		container corev1.Container
		want      []string
	}{
		{"the image's", corev1.Container{}, []string{"/bmc-server", "--help"}},
		{"args", corev1.Container{Args: []string{"--listen", ":8443"}}, []string{"/bmc-server", "--listen", ":8443"}},
		{"command and args", corev1.Container{Command: []string{"/other"}, Args: []string{"-v"}}, []string{"/other", "-v"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := commandOf(tt.container, img); !slices.Equal(got, tt.want) {
				t.Errorf("%q, want %q", got, tt.want)
			}
		})
	}
}

// TestOCIConfigOf: the bundle's configuration sets no rlimits and no
// network nor cgroup namespace (the sandbox refuses them), and mounts the
// volumes read-only.
func TestOCIConfigOf(t *testing.T) {
	cfg := ociConfigOf(containerSpec{uid: 65532, gid: 65532, readOnlyRoot: true, noNewPrivileges: true,
		mounts: []bindMount{{source: "/tmp/v", destination: "/etc/virtmetal/credentials"}}})
	for _, ns := range cfg.Linux.Namespaces {
		if ns.Type == "network" || ns.Type == "cgroup" {
			t.Errorf("namespace %s", ns.Type)
		}
	}
	if !cfg.Root.Readonly || !cfg.Process.NoNewPrivileges || cfg.Process.User.UID != 65532 || len(cfg.Process.Capabilities.Bounding) > 0 {
		t.Errorf("root read-only %v, no new privileges %v, user %d, bounding %q", cfg.Root.Readonly, cfg.Process.NoNewPrivileges,
			cfg.Process.User.UID, cfg.Process.Capabilities.Bounding)
	}
	if data, err := json.Marshal(cfg); err != nil || strings.Contains(string(data), "rlimits") {
		t.Errorf("config.json %s (%v): want no rlimits", data, err)
	}
	last := cfg.Mounts[len(cfg.Mounts)-1]
	if last.Destination != "/etc/virtmetal/credentials" || last.Type != "bind" || !slices.Contains(last.Options, "ro") {
		t.Errorf("volume mount %+v, want a read-only bind", last)
	}
}
