// Package node simulates the Kubernetes node and Ingress controller that
// run virtmetal's BMC pods: for each of bmc-controller's BMC Deployments it
// runs the pod's one container and routes each BMC's Ingress host to it.
//
// With runc and podman (Options.Containers) it does what a kubelet and its
// runtime do with the pod: the container's image, taken from a podman
// store, is unpacked into an OCI bundle, and runc runs it with the pod's
// securityContext (its user and groups, a read-only root file system, the
// capabilities left after its drops, no new privileges), the image's
// entrypoint with the container's command, args and env, its Secret and
// ConfigMap volumes bind-mounted read-only from folders kept as the
// kubelet keeps them (files behind a ..data link swapped in one rename
// when the object changes), and the Deployment's httpGet readiness and
// liveness probes deciding whether the container is routed to and whether
// it is killed and started again. Without them the container's command
// runs as a process of this user, the bmc-server binary of
// Options.Binary, its mount paths in its arguments changed for the
// folders.
//
// Unlike a kubelet, the node stand-in gives a container no network
// namespace of its own (it shares the host's, each container port moved to
// a free loopback port named in its arguments), no cgroup namespace, no
// resource limits and no rlimits (the sandbox it runs in refuses them), no
// seccomp profile, no /etc/hosts, resolv.conf nor KUBERNETES_SERVICE_*
// variables; its ServiceAccount's credentials are a kubeconfig (KUBECONFIG,
// in a volume at the usual service-account path) rather than a projected
// token; a readiness probe runs every 50 ms until it first passes rather
// than every period. Not modelled either: replicas beyond one, scheduling,
// image pulls (the images are in the store already), restart back-off,
// Service ports and endpoints, TLS at the Ingress (bmc-server's own is
// reached through Dial), and DNS beyond the Ingress hosts.
package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/maas"
)

// Options are what a node needs from the cluster and the host.
type Options struct {
	// Client lists Deployments, Services, Ingresses, Secrets, ConfigMaps
	// and VirtualMachineBMCs.
	Client client.Reader
	// Containers runs each BMC pod's container from its image; nil: the
	// container's command runs as a process of this user, Binary.
	Containers *Containers
	// Binary is the bmc-server executable every BMC container runs
	// without Containers.
	Binary string
	// Dir holds the volumes, and the images and containers of
	// Containers; it is the processes' HOME too.
	Dir string
	// Domain is the BMC domain: Ingress hosts <vm>.<namespace>.<domain>
	// name the VMs.
	Domain string
	// Kubeconfig is the path of a kubeconfig for a ServiceAccount, which
	// a pod of that account is given.
	Kubeconfig func(namespace, serviceAccount string) (string, error)
	// Log is where the output of a process goes, by a name of the
	// Deployment's.
	Log func(name string) (io.Writer, error)
	// Logf tells what went wrong; nil drops it.
	Logf func(format string, args ...any)
	// OnReady is told, on every routing while it holds, that a VM's BMC is
	// ready (its host leads to a ready process that serves it); nil: not
	// told.
	OnReady func(vm maas.VMRef, detail string)
}

// Node plays the kubelet and the Ingress controller for the controller's
// BMC Deployments, whatever their workload mode: one container per
// Deployment, run from its image by runc or as a process (see the package
// doc), with its volumes, a kubeconfig of the pod's ServiceAccount, and
// loopback ports in place of the container ports. A container that exits,
// or that its liveness probe kills, is started again, as its pod's would
// be; a changed pod template replaces it. Each Ingress host
// leads through Dial to the ready process of the Deployment its backend
// Service selects; a per-VM process's IPMI port is found through
// IPMIAddress.
type Node struct {
	opts   Options
	wake   chan struct{} // a process got ready: route it without waiting
	images images        // unpacked for Containers

	mu      sync.Mutex
	running map[types.NamespacedName]*bmcProcess // by Deployment
	hosts   map[string]*bmcProcess               // Ingress host → its ready process
	vms     map[maas.VMRef]*vmBMC                // the VMs whose Ingress leads to a process
}

// vmBMC is one VM's BMC: its Ingress host, the process behind it and the
// VM's credentials.
type vmBMC struct {
	host  string
	proc  *bmcProcess
	ready bool // proc is ready and serves the VM
	credentials
}

type credentials struct{ username, password string }

type bmcProcess struct {
	deployment types.NamespacedName
	vm         maas.VMRef        // its one VM; zero for a shared process
	labels     map[string]string // its pod's
	template   string            // what the process was started from
	volumes    []*volume         // read and written by sync only
	proc       *Process
	container  string // runc's ID of the container; "" for a process
	redfish    string
	ipmi       string
	ready      bool
	starts     int
}

// serves says whether the process serves vm: a per-VM process its VM, a
// shared one each VM with a file in its volumes.
func (p *bmcProcess) serves(vm maas.VMRef) bool {
	if p.vm.Name != "" {
		return p.vm == vm
	}
	if vm.Namespace != p.deployment.Namespace {
		return false
	}
	for _, v := range p.volumes {
		if _, ok := v.data[vm.Name]; ok {
			return true
		}
	}
	return false
}

// New makes a node; Run runs it.
func New(opts Options) *Node {
	return &Node{opts: opts, wake: make(chan struct{}, 1), running: map[types.NamespacedName]*bmcProcess{}}
}

func (s *Node) logf(format string, args ...any) {
	if s.opts.Logf != nil {
		s.opts.Logf(format, args...)
	}
}

// Run keeps the processes and routes in line with the cluster until ctx
// ends; StopAll then stops the processes.
func (s *Node) Run(ctx context.Context) {
	for {
		if err := s.sync(ctx); err != nil && ctx.Err() == nil {
			s.logf("bmc supervisor: %v", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// sync brings the processes in line with the Deployments, their volumes
// with the Secrets, and the routes with the Ingresses.
func (s *Node) sync(ctx context.Context) error {
	var (
		deployments appsv1.DeploymentList
		services    corev1.ServiceList
		ingresses   networkingv1.IngressList
		secretList  corev1.SecretList
		configMaps  corev1.ConfigMapList
		bmcs        v1beta1.VirtualMachineBMCList
	)
	if err := s.opts.Client.List(ctx, &deployments, client.MatchingLabels{v1beta1.LabelManagedBy: v1beta1.ManagedByValue}); err != nil {
		return err
	}
	for _, list := range []client.ObjectList{&services, &ingresses, &secretList, &configMaps, &bmcs} {
		if err := s.opts.Client.List(ctx, list); err != nil {
			return err
		}
	}
	secrets := map[types.NamespacedName]map[string][]byte{}
	all := sources{}
	for _, secret := range secretList.Items {
		key := client.ObjectKeyFromObject(&secret)
		secrets[key] = secret.Data
		all[source{kind: "Secret", NamespacedName: key}] = secret.Data
	}
	for _, cm := range configMaps.Items {
		data := maps.Clone(cm.BinaryData)
		if data == nil {
			data = map[string][]byte{}
		}
		for k, v := range cm.Data {
			data[k] = []byte(v)
		}
		all[source{kind: "ConfigMap", NamespacedName: client.ObjectKeyFromObject(&cm)}] = data
	}
	if err := s.syncProcesses(ctx, deployments.Items, all); err != nil {
		return err
	}
	s.route(ingresses.Items, services.Items, vmCredentials(bmcs.Items, secrets))
	return nil
}

// syncProcesses starts, replaces and stops processes after the Deployments
// and refreshes the volumes of the ones that keep running.
func (s *Node) syncProcesses(ctx context.Context, deployments []appsv1.Deployment, all sources) error {
	wanted := map[types.NamespacedName]bool{}
	for i := range deployments {
		d := &deployments[i]
		key := client.ObjectKeyFromObject(d)
		wanted[key] = true
		data, err := json.Marshal(d.Spec.Template.Spec)
		if err != nil {
			return err
		}
		template := string(data)
		s.mu.Lock()
		p := s.running[key]
		s.mu.Unlock()
		switch {
		case p == nil:
		case p.template != template:
			s.remove(key, p)
			p.proc.Stop()
		case p.proc.Exited():
			s.remove(key, p)
		default:
			if err := refreshVolumes(p, all); err != nil {
				s.logf("refreshing the volumes of %s: %v", key, err)
			}
			continue
		}
		if d.Spec.Replicas != nil && *d.Spec.Replicas == 0 {
			continue
		}
		starts := 1
		if p != nil {
			starts = p.starts + 1
		}
		if err := s.start(ctx, d, template, starts, all); err != nil {
			s.logf("starting bmc-server for %s: %v", key, err)
		}
	}
	s.mu.Lock()
	var gone []*bmcProcess
	for key, p := range s.running {
		if !wanted[key] {
			delete(s.running, key)
			gone = append(gone, p)
		}
	}
	s.mu.Unlock()
	for _, p := range gone {
		p.proc.Stop()
	}
	return nil
}

// remove forgets the process; the next route drops its hosts.
func (s *Node) remove(key types.NamespacedName, p *bmcProcess) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running[key] == p {
		delete(s.running, key)
	}
}

// start runs the Deployment's one container as its pod would: from its
// image with Containers, else as a process of this user.
func (s *Node) start(ctx context.Context, d *appsv1.Deployment, template string, starts int, all sources) error {
	pod := d.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		return fmt.Errorf("want one container, got %d", len(pod.Containers))
	}
	container := pod.Containers[0]
	key := client.ObjectKeyFromObject(d)
	p := &bmcProcess{deployment: key, labels: d.Spec.Template.Labels, template: template, starts: starts}
	if name := d.Labels[v1beta1.LabelVM]; name != "" {
		p.vm = maas.VMRef{Namespace: d.Namespace, Name: name}
	}
	mounts, err := s.mountVolumes(d, pod, container, p, all)
	if err != nil {
		return err
	}
	args, ports, err := p.movePorts(container.Args)
	if err != nil {
		return err
	}
	readiness, err := probeOf(container.ReadinessProbe, container, ports)
	if err != nil {
		return err
	}
	liveness, err := probeOf(container.LivenessProbe, container, ports)
	if err != nil {
		return err
	}
	kubeconfig, err := s.opts.Kubeconfig(d.Namespace, pod.ServiceAccountName)
	if err != nil {
		return err
	}
	logs, err := s.opts.Log("bmc-" + d.Namespace + "-" + d.Name)
	if err != nil {
		return err
	}
	if s.opts.Containers != nil {
		err = s.runContainer(ctx, d, container, args, kubeconfig, mounts, logs, p)
	} else {
		err = s.runProcess(container, args, kubeconfig, mounts, logs, p)
	}
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.running[key] = p
	s.mu.Unlock()
	go s.runProbes(ctx, key, p, readiness, liveness)
	return nil
}

// movePorts gives each port the container listens on a free loopback
// port in its place, in args: the container shares the host's network.
// It returns the arguments and container port → the address standing for
// it.
func (p *bmcProcess) movePorts(containerArgs []string) ([]string, map[int32]string, error) {
	args := slices.Clone(containerArgs)
	ports := map[int32]string{}
	for i := 0; i+1 < len(args); i++ {
		network := "tcp"
		switch args[i] {
		case "--listen", "--metrics-listen":
		case "--ipmi-listen":
			network = "udp"
		default:
			continue
		}
		_, portText, err := net.SplitHostPort(args[i+1])
		if err != nil {
			return nil, nil, fmt.Errorf("%s %s: %w", args[i], args[i+1], err)
		}
		containerPort, err := strconv.ParseInt(portText, 10, 32)
		if err != nil {
			return nil, nil, fmt.Errorf("%s %s: %w", args[i], args[i+1], err)
		}
		port, err := FreePort(network)
		if err != nil {
			return nil, nil, err
		}
		args[i+1] = fmt.Sprintf("127.0.0.1:%d", port)
		switch args[i] {
		case "--listen":
			p.redfish = args[i+1]
		case "--ipmi-listen":
			p.ipmi = args[i+1]
		}
		if network == "tcp" {
			ports[int32(containerPort)] = args[i+1]
		}
	}
	if p.redfish == "" {
		return nil, nil, fmt.Errorf("no --listen in %q", containerArgs)
	}
	return args, ports, nil
}

// runProcess runs the container's command as a process of this user, its
// mount paths in args changed for the volumes' folders.
func (s *Node) runProcess(container corev1.Container, args []string, kubeconfig string, mounts map[string]string, logs io.Writer, p *bmcProcess) error {
	for i := range args {
		for from, to := range mounts {
			if args[i] == from || strings.HasPrefix(args[i], from+"/") {
				args[i] = to + strings.TrimPrefix(args[i], from)
			}
		}
	}
	env, err := envOf(container)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.opts.Binary, args...)
	cmd.Env = append(env, "KUBECONFIG="+kubeconfig, "HOME="+s.opts.Dir)
	cmd.Stdout, cmd.Stderr = logs, logs
	p.proc, err = StartProcess(cmd)
	return err
}

// serviceAccountPath is where a pod's ServiceAccount credentials are
// mounted.
const serviceAccountPath = "/var/run/secrets/kubernetes.io/serviceaccount"

// runContainer runs the container from its image with runc, as its user,
// its volumes bind-mounted read-only at their mount paths and its
// ServiceAccount's kubeconfig at serviceAccountPath.
func (s *Node) runContainer(ctx context.Context, d *appsv1.Deployment, container corev1.Container, args []string, kubeconfig string, mounts map[string]string, logs io.Writer, p *bmcProcess) error {
	c := s.opts.Containers
	img, err := c.unpack(ctx, &s.images, filepath.Join(s.opts.Dir, "images"), container.Image)
	if err != nil {
		return err
	}
	pod := d.Spec.Template.Spec
	container.Args = args
	spec := containerSpec{
		id:       fmt.Sprintf("%s.%s.%s.%d", filepath.Base(s.opts.Dir), d.Namespace, d.Name, p.starts),
		hostname: d.Name,
		args:     commandOf(container, img),
	}
	if err := securityOf(&spec, pod, container, img); err != nil {
		return err
	}
	// The ServiceAccount's credentials, as a volume of their own.
	account := &volume{dir: filepath.Join(s.opts.Dir, "volumes", d.Namespace, d.Name, "serviceaccount"), mode: 0o440, gid: int(spec.gid)}
	if len(spec.groups) > 0 {
		account.gid = int(spec.groups[0])
	}
	config, err := os.ReadFile(kubeconfig)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(account.dir); err != nil {
		return err
	}
	if err := account.write(map[string][]byte{"kubeconfig": config}); err != nil {
		return err
	}
	spec.mounts = append(spec.mounts, bindMount{source: account.dir, destination: serviceAccountPath})
	for path, dir := range mounts {
		spec.mounts = append(spec.mounts, bindMount{source: dir, destination: path})
	}
	slices.SortFunc(spec.mounts, func(a, b bindMount) int { return strings.Compare(a.destination, b.destination) })
	env, err := envOf(container)
	if err != nil {
		return err
	}
	// The image's, then the pod's; HOME as runtimes set it for a user
	// without a passwd entry.
	spec.env = append(append(append(slices.Clone(img.env), "HOSTNAME="+spec.hostname, "HOME=/"), env...),
		"KUBECONFIG="+serviceAccountPath+"/kubeconfig")
	spec.workingDir = container.WorkingDir
	if spec.workingDir == "" {
		spec.workingDir = img.workingDir
	}
	p.container = spec.id
	p.proc, err = c.run(img, spec, s.runcRoot(), filepath.Join(s.opts.Dir, "containers"), logs)
	return err
}

func (s *Node) runcRoot() string { return filepath.Join(s.opts.Dir, "runc") }

// envOf is the container's environment; values from other objects are
// not looked up by the stand-in.
func envOf(container corev1.Container) ([]string, error) {
	var env []string
	for _, e := range container.Env {
		if e.ValueFrom != nil {
			return nil, fmt.Errorf("env %s: valueFrom is not resolved by the node stand-in", e.Name)
		}
		env = append(env, e.Name+"="+e.Value)
	}
	if len(container.EnvFrom) > 0 {
		return nil, errors.New("envFrom is not resolved by the node stand-in")
	}
	return env, nil
}

// mountVolumes lays out the container's volumes in folders, as the kubelet
// mounts them, and returns mount path → folder.
func (s *Node) mountVolumes(d *appsv1.Deployment, pod corev1.PodSpec, container corev1.Container, p *bmcProcess, all sources) (map[string]string, error) {
	mounts := map[string]string{}
	for _, mount := range container.VolumeMounts {
		v, err := volumeOf(pod, mount.Name, d.Namespace, filepath.Join(s.opts.Dir, "volumes", d.Namespace, d.Name, mount.Name))
		if err != nil {
			return nil, err
		}
		data, err := v.dataOf(all)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", mount.Name, err)
		}
		if err := os.RemoveAll(v.dir); err != nil {
			return nil, err
		}
		if err := v.write(data); err != nil {
			return nil, err
		}
		p.volumes = append(p.volumes, v)
		mounts[mount.MountPath] = v.dir
	}
	return mounts, nil
}

// refreshVolumes brings the process's volumes to what their sources hold
// now, as the kubelet does while the pod runs; a deleted source leaves its
// volume as it was.
func refreshVolumes(p *bmcProcess, all sources) error {
	for _, v := range p.volumes {
		if data, ok := all[v.source]; ok {
			if err := v.write(data); err != nil {
				return err
			}
		}
	}
	return nil
}

// vmCredentials are each VM's username and password, from its BMC's
// credentials Secret or, for a VM of the shared bmc-server without one,
// from its entry of the namespace's shared Secret.
func vmCredentials(bmcs []v1beta1.VirtualMachineBMC, secrets map[types.NamespacedName]map[string][]byte) map[maas.VMRef]credentials {
	out := map[maas.VMRef]credentials{}
	for _, b := range bmcs {
		name := b.Spec.CredentialsSecret
		if name == "" {
			name = v1beta1.CredentialsSecretName(b.Spec.VMName)
		}
		data, own := secrets[types.NamespacedName{Namespace: b.Namespace, Name: name}]
		c := credentials{username: string(data[v1beta1.SecretUsernameKey]), password: string(data[v1beta1.SecretPasswordKey])}
		if !own && b.Spec.CredentialsSecret == "" {
			if entry, ok := bmcspec.ParseCredentials(secrets[types.NamespacedName{Namespace: b.Namespace, Name: bmcspec.SharedSecret}][b.Spec.VMName]); ok {
				c = credentials{username: entry.Username, password: entry.Password}
			}
		}
		out[maas.VMRef{Namespace: b.Namespace, Name: b.Spec.VMName}] = c
	}
	return out
}

// route is the Ingress controller: each Ingress host leads to the ready
// process of the Deployment its backend Service selects. A VM's BMC is
// ready once its host (<vm>.<namespace>.<domain>) leads to a ready process
// that serves the VM.
func (s *Node) route(ingresses []networkingv1.Ingress, services []corev1.Service, creds map[maas.VMRef]credentials) {
	selectors := map[types.NamespacedName]labels.Selector{}
	for _, svc := range services {
		if len(svc.Spec.Selector) > 0 {
			selectors[client.ObjectKeyFromObject(&svc)] = labels.SelectorFromSet(svc.Spec.Selector)
		}
	}
	s.mu.Lock()
	hosts := map[string]*bmcProcess{}
	vms := map[maas.VMRef]*vmBMC{}
	for _, ingress := range ingresses {
		for _, rule := range ingress.Spec.Rules {
			p := s.backendLocked(ingress.Namespace, rule, selectors)
			if p == nil {
				continue
			}
			host := strings.ToLower(rule.Host)
			if p.ready {
				hosts[host] = p
			}
			if vm, ok := maas.ParseBMCAddress(host, s.opts.Domain); ok {
				vms[vm] = &vmBMC{host: host, proc: p, ready: p.ready && p.serves(vm), credentials: creds[vm]}
			}
		}
	}
	s.hosts, s.vms = hosts, vms
	ready := map[maas.VMRef]string{}
	for vm, b := range vms {
		if b.ready {
			ready[vm] = fmt.Sprintf("bmc-server %s at %s (start %d)", b.proc.deployment, b.proc.redfish, b.proc.starts)
		}
	}
	s.mu.Unlock()
	if s.opts.OnReady != nil {
		for vm, detail := range ready {
			s.opts.OnReady(vm, detail)
		}
	}
}

// backendLocked is the process of a Deployment whose pods the Service of
// the rule's first Service backend selects, nil when none runs.
func (s *Node) backendLocked(namespace string, rule networkingv1.IngressRule, selectors map[types.NamespacedName]labels.Selector) *bmcProcess {
	if rule.HTTP == nil {
		return nil
	}
	for _, path := range rule.HTTP.Paths {
		if path.Backend.Service == nil {
			continue
		}
		selector, ok := selectors[types.NamespacedName{Namespace: namespace, Name: path.Backend.Service.Name}]
		if !ok {
			return nil
		}
		for key, p := range s.running {
			if key.Namespace == namespace && selector.Matches(labels.Set(p.labels)) {
				return p
			}
		}
		return nil
	}
	return nil
}

// Dial resolves the BMCs' Ingress host names to their processes; any other
// name does not resolve, as a BMC whose pod is not ready is not routed.
func (s *Node) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	p, ok := s.hosts[strings.ToLower(host)]
	s.mu.Unlock()
	if !ok {
		return nil, &net.DNSError{Err: "no such host (no ready BMC)", Name: host, IsNotFound: true}
	}
	var d net.Dialer
	return d.DialContext(ctx, network, p.redfish)
}

// IPMIAddress is where the VM's IPMI BMC answers, while its process is
// ready.
func (s *Node) IPMIAddress(vm maas.VMRef) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.running {
		if p.vm == vm && p.ready && p.ipmi != "" {
			return p.ipmi, true
		}
	}
	return "", false
}

// BMC is what a user needs to reach one VM's BMC on the node.
type BMC struct {
	VM       maas.VMRef
	Host     string // the Ingress host; requests must carry it
	Server   string // namespace/name of the Deployment whose process serves it
	Redfish  string // https://127.0.0.1:port
	IPMI     string // 127.0.0.1:port, "" when off
	Username string // from the VM's credentials Secret
	Password string
	Ready    bool
	Starts   int // how often its process was started
	// Container is runc's ID of the container serving it; "" when the
	// node runs processes.
	Container string
}

// BMCs lists the BMCs of the VMs whose Ingress leads to a process.
func (s *Node) BMCs() []BMC {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []BMC
	for vm, b := range s.vms {
		out = append(out, BMC{VM: vm, Host: b.host, Server: b.proc.deployment.String(), Redfish: "https://" + b.proc.redfish,
			IPMI: b.proc.ipmi, Username: b.username, Password: b.password, Ready: b.ready, Starts: b.proc.starts,
			Container: b.proc.container})
	}
	slices.SortFunc(out, func(a, b BMC) int { return strings.Compare(a.VM.String(), b.VM.String()) })
	return out
}

// ContainerState is what runc reports of the container serving the VM.
func (s *Node) ContainerState(ctx context.Context, vm maas.VMRef) (ContainerState, error) {
	s.mu.Lock()
	b := s.vms[vm]
	s.mu.Unlock()
	switch {
	case b == nil:
		return ContainerState{}, fmt.Errorf("no BMC of %s runs", vm)
	case b.proc.container == "" || s.opts.Containers == nil:
		return ContainerState{}, fmt.Errorf("the BMC of %s runs as a process, not a container", vm)
	}
	return s.opts.Containers.state(ctx, s.runcRoot(), b.proc.container)
}

// Kill kills the bmc-server process serving the VM (the VMs it shares it
// with lose it too), as a crash would; Run starts it again as its
// Deployment would. It reports whether one ran.
func (s *Node) Kill(vm maas.VMRef) bool {
	s.mu.Lock()
	b := s.vms[vm]
	s.mu.Unlock()
	if b == nil {
		return false
	}
	b.proc.proc.Kill()
	return true
}

// StopAll stops every process, as the pods' deletion would.
func (s *Node) StopAll() {
	s.mu.Lock()
	procs := make([]*bmcProcess, 0, len(s.running))
	for key, p := range s.running {
		procs = append(procs, p)
		delete(s.running, key)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.proc.Stop()
		}()
	}
	wg.Wait()
}
