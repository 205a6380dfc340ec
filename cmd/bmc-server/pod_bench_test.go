package main

import (
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/kubetest"
)

// podRun holds what a kubelet gives a BMC pod's container.
type podRun struct {
	serviceAccount string // the ServiceAccount volume: token, ca.crt, namespace
	credentials    string // the credentials Secret's volume
	home           string // an empty HOME: no ~/.kube/config to find
	host, port     string // KUBERNETES_SERVICE_HOST and _PORT
}

// asPod prepares, in dir, what a kubelet gives a BMC pod: a ServiceAccount
// token from the TokenRequest API with the API server's CA and the
// namespace, and the credentials Secret's files, both laid out as the
// kubelet writes volumes. The account is bound to cluster-admin: this
// measures memory, not RBAC (controllers' tests hold the BMC's Role).
func asPod(b *testing.B, env *kubetest.Env, dir, username, password string) podRun {
	b.Helper()
	ctx := b.Context()
	account := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "node-1-bmc"}}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1-bmc-benchmark"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: account.Namespace, Name: account.Name}},
	}
	for _, obj := range []client.Object{account, binding} {
		if err := env.Client.Create(ctx, obj); err != nil {
			b.Fatalf("creating %s: %v", obj.GetName(), err)
		}
	}
	token := &authenticationv1.TokenRequest{}
	if err := env.Client.SubResource("token").Create(ctx, account, token); err != nil {
		b.Fatalf("requesting the ServiceAccount's token: %v", err)
	}
	server, err := url.Parse(env.Config.Host)
	if err != nil {
		b.Fatal(err)
	}
	host, port, err := net.SplitHostPort(server.Host)
	if err != nil {
		b.Fatal(err)
	}
	p := podRun{
		serviceAccount: filepath.Join(dir, "serviceaccount"),
		credentials:    filepath.Join(dir, "credentials"),
		home:           filepath.Join(dir, "home"),
		host:           host,
		port:           port,
	}
	writeVolume(b, p.serviceAccount, map[string][]byte{
		"token": []byte(token.Status.Token), "ca.crt": env.Config.CAData, "namespace": []byte(account.Namespace),
	})
	writeVolume(b, p.credentials, map[string][]byte{"username": []byte(username), "password": []byte(password)})
	if err := os.Mkdir(p.home, 0o700); err != nil {
		b.Fatal(err)
	}
	return p
}

// command runs binary with args where client-go's in-cluster config finds
// the ServiceAccount: in a mount namespace of the process's own whose /run
// (which /var/run names) is a fresh tmpfs holding
// secrets/kubernetes.io/serviceaccount, so the host's /run is untouched.
// The shell execs, so the process measured is bmc-server itself. Like a
// container, it gets only the environment below. It needs root, which
// hack/test.sh has.
func (p podRun) command(binary string, args ...string) *exec.Cmd {
	const mountAccount = `mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount &&
		mount --bind "$0" /run/secrets/kubernetes.io/serviceaccount && exec "$@"`
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c", mountAccount, p.serviceAccount, binary}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + p.home, "KUBERNETES_SERVICE_HOST=" + p.host, "KUBERNETES_SERVICE_PORT=" + p.port}
	return cmd
}

// writeVolume lays files out in dir as the kubelet writes a Secret or
// projected volume: in a timestamped folder that ..data links to, each
// file a link through ..data. A volume already there is kept: a
// benchmark's function may run more than once, writing the same files.
func writeVolume(b *testing.B, dir string, files map[string][]byte) {
	b.Helper()
	if _, err := os.Lstat(filepath.Join(dir, "..data")); err == nil {
		return
	}
	const version = "..2026_12_06_00_00_00.000000001"
	if err := os.MkdirAll(filepath.Join(dir, version), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.Symlink(version, filepath.Join(dir, "..data")); err != nil {
		b.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, version, name), content, 0o444); err != nil {
			b.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			b.Fatal(err)
		}
	}
}
