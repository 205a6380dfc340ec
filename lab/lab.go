// Package lab runs virtmetal's whole flow on one machine, from a created VM
// to a commissioned, Ready MaaS machine: KubeVirt's real control plane
// (kube-apiserver, etcd, virt-api and virt-controller, as
// internal/kubetest/realkubevirt runs them, with its stand-in for the node
// that runs the VMs), the real bmc-controller and bmc-server binaries
// (started from what the controller asks for, with the RBAC the manifests
// give them; bmc-server from its image, by runc, when runc and podman are
// installed), the real MaaS reconciler, and a MaaS that enlists PXE-booting
// VMs, runs the real commissioning script and powers machines through their
// BMCs the way MaaS's power drivers do. What cannot run here is simulated,
// by the packages of sim/: the guests (sim/guest, booted when the node
// stand-in boots their VMI), the node that runs the BMC pods (sim/node) and
// MaaS (sim/maas). The lab wires them to the real components. The real
// control plane runs in a network namespace: the lab needs root, and fails
// without it.
package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	controllermanifests "github.com/virtmetal/virtmetal/deploy/controller"
	"github.com/virtmetal/virtmetal/internal/kubescheme"
	"github.com/virtmetal/virtmetal/internal/kubetest"
	"github.com/virtmetal/virtmetal/internal/kubetest/realkubevirt"
	"github.com/virtmetal/virtmetal/maas"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/sim/guest"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
	"github.com/virtmetal/virtmetal/sim/node"
)

// Names the lab gives what the manifests deploy.
const (
	// DefaultDomain is the BMC domain: <vm>.<namespace>.<domain>.
	DefaultDomain     = "bmc.lab.virtmetal.test"
	systemNamespace   = "virtmetal-system"
	controllerAccount = "virtmetal-controller"
	reconcilerAccount = "maas-reconciler"
	imagePrefix       = "virtmetal"
	imageTag          = "lab"
	bmcImage          = imagePrefix + "/bmc-server:" + imageTag
	// podmanStore is the folder, in Build's, of the podman store that
	// holds the images.
	podmanStore        = "podman"
	enrolmentLabel     = "virtmetal.io/enabled"
	controllerRoleFile = "deploy/controller/rbac/role.yaml"
	reconcilerRBACFile = "deploy/reconciler/rbac.yaml"
	commissioningFile  = "deploy/maas/virtmetal-bmc-config.py"
)

// Options configure a lab.
type Options struct {
	// Domain of the BMCs; DefaultDomain when empty.
	Domain string
	// Workload is bmc-controller's --workload: how BMCs are deployed
	// ("shared": one bmc-server per namespace); the controller's default
	// when empty.
	Workload string
	// ReconcileInterval is the MaaS reconciler's --interval; 500 ms when 0.
	ReconcileInterval time.Duration
	// OnEvent is told of every step of every VM's flow, once per step.
	OnEvent func(Event)
	// Logs receives the processes' output and the reconciler's log; nil
	// keeps them in files under the lab's folder only.
	Logs io.Writer
	// Binaries is a folder where Build put bmc-server and bmc-controller,
	// and the bmc-server image when runc and podman are installed; empty,
	// Start builds them. A test builds them first, so that no deadline of
	// its covers a cold compile.
	Binaries string
}

// Lab is a running lab. Its methods are safe for concurrent use.
type Lab struct {
	// Cluster is KubeVirt's real control plane, with the node stand-in
	// where the VMs' guests boot.
	Cluster *realkubevirt.Cluster
	Client  client.Client // cluster admin, with virtmetal's types
	// watched is what the lab's stand-ins and its progress read: an
	// informer cache of Client's view, so that their polling costs the API
	// server nothing, as the watches of a kubelet and an Ingress
	// controller do.
	watched cache.Cache
	// MaaS is the simulated region API; MaaSClient talks to it as the
	// reconciler does.
	MaaS       *maassim.Server
	MaaSClient *maas.Client
	Domain     string

	opts     Options
	root     string // the module's folder: deploy/ files are read there
	dir      string
	bins     string
	progress *progress
	recent   recentLines
	node     *node.Node
	rack     *maassim.Rack
	consumed onceConsumed // what RackCommissioningBoot found
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	mu         sync.Mutex
	controller *node.Process
	webhooks   *envtest.WebhookInstallOptions
}

// Start starts KubeVirt's real control plane with the node stand-in that
// boots the guests, builds bmc-server and bmc-controller, and starts the
// node that runs the BMC pods, the MaaS simulator and the reconciler. The
// bmc-controller is left to StartController, so that VMs can exist before
// it, as in a cluster where virtmetal is installed later. Close stops
// everything.
func Start(ctx context.Context, opts Options) (_ *Lab, err error) {
	if opts.Domain == "" {
		opts.Domain = DefaultDomain
	}
	if opts.ReconcileInterval == 0 {
		opts.ReconcileInterval = 500 * time.Millisecond
	}
	root, err := moduleRoot(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "virtmetal-lab-")
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	l := &Lab{Domain: opts.Domain, opts: opts, root: root, dir: dir, bins: filepath.Join(dir, "bin"), ctx: runCtx, cancel: cancel,
		consumed: onceConsumed{vm: map[maas.VMRef]bool{}}}
	l.progress = newProgress(opts.OnEvent)
	ctrllog.SetLogger(logr.Discard()) // controller-runtime's clients; the processes log to files
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	// The guests boot where the node stand-in boots their VMI: one that
	// boots from the network asks MaaS's rack, as a PXE ROM would, side by
	// side with the others. (No VM exists before Start returns, so the rack
	// is there for the first boot.)
	onBoot := func(vmi *kubevirtv1.VirtualMachineInstance, device machine.BootTarget) {
		if device == machine.BootPxe {
			go l.rack.NetworkBoot(l.ctx, guest.NetBootOf(vmi))
		}
	}
	// First: without root it fails at once.
	if err := l.startCluster(ctx, onBoot); err != nil {
		return nil, err
	}
	if opts.Binaries != "" {
		l.bins = opts.Binaries
	} else if err := Build(ctx, l.bins); err != nil {
		return nil, err
	}
	if err := l.installRBAC(ctx); err != nil {
		return nil, err
	}

	// The BMC pods run from their image when Build could build it.
	var containers *node.Containers
	if store := filepath.Join(l.bins, podmanStore); fileExists(store) {
		if containers, err = node.FindContainers(node.PodmanStoreEnv(store)); err != nil {
			return nil, err
		}
	}
	l.node = node.New(node.Options{
		Client: l.watched, Containers: containers, Binary: filepath.Join(l.bins, "bmc-server"), Dir: l.dir, Domain: l.Domain,
		Kubeconfig: l.kubeconfig, Log: l.logFile, Logf: l.logf,
		OnReady: func(vm maas.VMRef, detail string) { l.progress.record(vm, StepBMCReady, detail) },
	})
	l.goRun(l.node.Run)

	l.MaaS = maassim.Start()
	key, err := maas.ParseAPIKey(maassim.APIKey)
	if err != nil {
		return nil, err
	}
	if l.MaaSClient, err = maas.NewClient(l.MaaS.URL(), key, nil); err != nil {
		return nil, err
	}
	if l.rack, err = l.newRack(); err != nil {
		return nil, err
	}
	l.rack.Start(l.ctx)
	l.goRun(l.watchProgress)

	if err := l.startReconciler(); err != nil {
		return nil, err
	}
	return l, nil
}

// goRun runs f until the lab closes.
func (l *Lab) goRun(f func(ctx context.Context)) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f(l.ctx)
	}()
}

// startCluster starts KubeVirt's real control plane and its node
// stand-in, whose guests' boots go to onBoot. Without root it fails, saying
// so: the cluster needs a network namespace.
func (l *Lab) startCluster(ctx context.Context, onBoot func(*kubevirtv1.VirtualMachineInstance, machine.BootTarget)) error {
	cluster, err := realkubevirt.Start(ctx, realkubevirt.Options{})
	if err != nil {
		return fmt.Errorf("KubeVirt's control plane (the lab runs it in a network namespace: run as root, with hack/setup-kubevirt.sh's binaries): %w", err)
	}
	l.Cluster = cluster
	scheme := kubescheme.New()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		return err
	}
	if l.Client, err = client.New(cluster.Config, client.Options{Scheme: scheme}); err != nil {
		return err
	}
	// Its readers only read: no copy of every object on every poll.
	if l.watched, err = cache.New(cluster.Config, cache.Options{Scheme: scheme, DefaultUnsafeDisableDeepCopy: ptr.To(true)}); err != nil {
		return err
	}
	l.goRun(func(ctx context.Context) { _ = l.watched.Start(ctx) })
	_, err = cluster.StartNode(ctx, "node01", realkubevirt.NodeOptions{OnBoot: onBoot})
	return err
}

// Dir is the lab's folder: binaries, kubeconfigs, mounted Secrets, logs.
func (l *Lab) Dir() string { return l.dir }

// Close stops every process and server and removes the lab's folder.
func (l *Lab) Close() {
	l.cancel()
	l.mu.Lock()
	if l.controller != nil {
		l.controller.Stop()
	}
	l.mu.Unlock()
	l.wg.Wait()
	if l.node != nil {
		l.node.StopAll()
	}
	if l.MaaS != nil {
		l.MaaS.Close()
	}
	if l.Cluster != nil {
		_ = l.Cluster.Stop()
	}
	if l.webhooks != nil {
		_ = l.webhooks.Cleanup()
	}
	_ = os.RemoveAll(l.dir)
}

// moduleRoot is the folder of virtmetal's go.mod: the lab builds the
// binaries and reads deploy/ from there.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("the lab runs inside the virtmetal module (no go.mod found)")
	}
	return filepath.Dir(gomod), nil
}

// Build builds what the lab deploys into dir as `make images` does
// (hack/images.sh): bmc-server and bmc-controller, static, and, when runc
// and podman are installed (CanRunContainers), their images, in a podman
// store of dir's, for the node to run the BMC pods from. It takes minutes
// cold, mostly Go's compile.
func Build(ctx context.Context, dir string) error {
	root, err := moduleRoot(ctx)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "images.sh"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "IMAGE_PREFIX="+imagePrefix, "IMAGE_TAG="+imageTag,
		"IMAGES=bmc-server bmc-controller", "IMAGES_CONTEXT="+dir, "CONTAINER_ENGINE=none")
	if CanRunContainers() == nil {
		podman, _ := exec.LookPath("podman")
		store, err := node.PodmanStore(filepath.Join(dir, podmanStore))
		if err != nil {
			return err
		}
		cmd.Env = append(append(cmd.Env, store...), "CONTAINER_ENGINE="+podman)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("hack/images.sh: %w\n%s", err, out)
	}
	return nil
}

// CanRunContainers says why the lab cannot run the BMC pods from their
// image (runc or podman is missing); nil when it can.
func CanRunContainers() error {
	_, err := node.FindContainers(nil)
	return err
}

// RunsContainers says whether the BMC pods run from their image, with
// runc; else they are processes of this user.
func (l *Lab) RunsContainers() bool { return fileExists(filepath.Join(l.bins, podmanStore)) }

// BMCContainer is what runc reports of the container serving the VM's BMC.
func (l *Lab) BMCContainer(ctx context.Context, vm maas.VMRef) (node.ContainerState, error) {
	return l.node.ContainerState(ctx, vm)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// installRBAC creates what the manifests give the controller and the
// reconciler: their ServiceAccounts and roles, read from deploy/.
func (l *Lab) installRBAC(ctx context.Context) error {
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: systemNamespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: controllerAccount, Namespace: systemNamespace}},
	}
	for _, file := range []string{controllerRoleFile, reconcilerRBACFile} {
		docs, err := l.readManifests(file)
		if err != nil {
			return err
		}
		objs = append(objs, docs...)
	}
	var role string
	for _, obj := range objs {
		if file := obj.GetObjectKind().GroupVersionKind().Kind; file == "ClusterRole" && role == "" {
			role = obj.GetName() // the controller's role comes first
		}
	}
	objs = append(objs, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: controllerAccount},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: controllerAccount, Namespace: systemNamespace}},
	})
	for _, obj := range objs {
		if err := l.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %s %s: %w", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
		}
	}
	return nil
}

func (l *Lab) readManifests(file string) ([]client.Object, error) {
	data, err := os.ReadFile(filepath.Join(l.root, file))
	if err != nil {
		return nil, err
	}
	decoder := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []client.Object
	for {
		u := &unstructured.Unstructured{}
		if err := decoder.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

// kubeconfig writes a kubeconfig file for a ServiceAccount, so that the
// process using it meets exactly that account's RBAC.
func (l *Lab) kubeconfig(namespace, account string) (string, error) {
	path := filepath.Join(l.dir, "kubeconfig", namespace+"."+account)
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	data, err := l.Cluster.KubeConfigFor(kubetest.ServiceAccountUser(namespace, account),
		"system:serviceaccounts", "system:serviceaccounts:"+namespace, "system:authenticated")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	return path, os.WriteFile(path, data, 0o600)
}

// StartController installs the admission webhooks and starts bmc-controller
// as its Deployment does, as its own ServiceAccount, then waits until it is
// ready (its webhook server included).
func (l *Lab) StartController(ctx context.Context) error {
	hooks := filepath.Join(l.dir, "webhooks")
	if err := os.MkdirAll(hooks, 0o700); err != nil {
		return err
	}
	if err := controllermanifests.WriteWebhooks(hooks); err != nil {
		return err
	}
	// kube-apiserver, in the cluster's network namespace, reaches the
	// webhook server at the host's end of the veth pair.
	install := &envtest.WebhookInstallOptions{Paths: []string{hooks}, LocalServingHost: l.Cluster.HostIP()}
	if err := install.PrepWithoutInstalling(); err != nil {
		return err
	}
	kubeconfig, err := l.kubeconfig(systemNamespace, controllerAccount)
	if err != nil {
		return err
	}
	probe, err := node.FreePort("tcp")
	if err != nil {
		return err
	}
	args := []string{
		"--kubeconfig", kubeconfig,
		"--domain", l.Domain,
		"--bmc-image", bmcImage,
		"--metrics-bind-address", "0",
		"--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", probe),
		"--webhook-host", install.LocalServingHost,
		"--webhook-port", fmt.Sprint(install.LocalServingPort),
		"--webhook-cert-dir", install.LocalServingCertDir,
	}
	if l.opts.Workload != "" {
		args = append(args, "--workload", l.opts.Workload)
	}
	cmd := exec.Command(filepath.Join(l.bins, "bmc-controller"), args...)
	logs, err := l.logFile("bmc-controller")
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logs, logs
	controller, err := node.StartProcess(cmd)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.controller, l.webhooks = controller, install
	l.mu.Unlock()
	if err := node.WaitHTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", probe), time.Minute); err != nil {
		return fmt.Errorf("bmc-controller not ready (log in %s): %w", l.dir, err)
	}
	// The configurations go in once their server answers: they fail closed.
	return install.Install(l.Cluster.Config)
}

// logFile opens the log of one process, appending; with Options.Logs the
// output goes there too.
func (l *Lab) logFile(name string) (io.Writer, error) {
	if err := os.MkdirAll(filepath.Join(l.dir, "logs"), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(l.dir, "logs", name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	if l.opts.Logs != nil {
		return io.MultiWriter(f, l.opts.Logs), nil
	}
	return f, nil
}

// startReconciler runs the real reconciler in a loop, as its Deployment
// does, as its ServiceAccount.
func (l *Lab) startReconciler() error {
	cfg, err := l.Cluster.ConfigFor(kubetest.ServiceAccountUser(systemNamespace, reconcilerAccount),
		"system:serviceaccounts", "system:serviceaccounts:"+systemNamespace, "system:authenticated")
	if err != nil {
		return err
	}
	cluster, err := maas.NewKubeCluster(cfg)
	if err != nil {
		return err
	}
	logs, err := l.logFile("reconciler")
	if err != nil {
		return err
	}
	r := &maas.Reconciler{
		MaaS: l.MaaSClient, Cluster: cluster, Domain: l.Domain,
		Log: funcrLogger(logs).WithName("maas"),
	}
	l.goRun(func(ctx context.Context) { _ = r.Run(ctx, l.opts.ReconcileInterval, 4*l.opts.ReconcileInterval) })
	return nil
}

// funcrLogger logs JSON lines, as the commands do.
func funcrLogger(out io.Writer) logr.Logger {
	return funcr.NewJSON(func(obj string) { fmt.Fprintln(out, obj) }, funcr.Options{})
}
