// Package node simulates the Kubernetes node and Ingress controller that
// run virtmetal's BMC pods, which cannot run here: for each of
// bmc-controller's BMC Deployments it runs the real bmc-server binary as a
// process, as the kubelet would run its one container, and routes each
// BMC's Ingress host to it. Not modelled: images and containers (the binary
// runs as this user, with only KUBECONFIG and HOME set), replicas beyond
// one, scheduling, resource limits, liveness probes, volumes other than
// Secrets, Service ports and endpoints, TLS at the Ingress (bmc-server's own
// is reached through Dial), and DNS beyond the Ingress hosts.
package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	// Client lists Deployments, Services, Ingresses, Secrets and
	// VirtualMachineBMCs.
	Client client.Reader
	// Binary is the bmc-server executable every BMC container runs.
	Binary string
	// Dir holds the Secret volumes; it is the processes' HOME too.
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
// BMC Deployments, whatever their workload mode: one bmc-server process per
// Deployment, started with the container's arguments, its Secret volumes
// written to folders (and rewritten when the Secrets change, as the kubelet
// does), a kubeconfig of the pod's ServiceAccount, and loopback ports in
// place of the container ports. A process that exits is started again, as
// its pod would be; a changed pod template replaces it. Each Ingress host
// leads through Dial to the ready process of the Deployment its backend
// Service selects; a per-VM process's IPMI port is found through
// IPMIAddress.
type Node struct {
	opts Options
	wake chan struct{} // a process got ready: route it without waiting

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
	volumes    []*secretVolume   // read and written by sync only
	proc       *Process
	redfish    string
	ipmi       string
	ready      bool
	starts     int
	probe      string // the readiness probe's path
}

// secretVolume is a Secret volume as mounted: its folder and the data last
// written there.
type secretVolume struct {
	secret types.NamespacedName
	dir    string
	data   map[string][]byte
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
		bmcs        v1beta1.VirtualMachineBMCList
	)
	if err := s.opts.Client.List(ctx, &deployments, client.MatchingLabels{v1beta1.LabelManagedBy: v1beta1.ManagedByValue}); err != nil {
		return err
	}
	for _, list := range []client.ObjectList{&services, &ingresses, &secretList, &bmcs} {
		if err := s.opts.Client.List(ctx, list); err != nil {
			return err
		}
	}
	secrets := map[types.NamespacedName]map[string][]byte{}
	for _, secret := range secretList.Items {
		secrets[client.ObjectKeyFromObject(&secret)] = secret.Data
	}
	if err := s.syncProcesses(ctx, deployments.Items, secrets); err != nil {
		return err
	}
	s.route(ingresses.Items, services.Items, vmCredentials(bmcs.Items, secrets))
	return nil
}

// syncProcesses starts, replaces and stops processes after the Deployments
// and refreshes the volumes of the ones that keep running.
func (s *Node) syncProcesses(ctx context.Context, deployments []appsv1.Deployment, secrets map[types.NamespacedName]map[string][]byte) error {
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
			if err := refreshVolumes(p, secrets); err != nil {
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
		if err := s.start(ctx, d, template, starts, secrets); err != nil {
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

// start runs the Deployment's one container as its pod would.
func (s *Node) start(ctx context.Context, d *appsv1.Deployment, template string, starts int, secrets map[types.NamespacedName]map[string][]byte) error {
	pod := d.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		return fmt.Errorf("want one container, got %d", len(pod.Containers))
	}
	container := pod.Containers[0]
	key := client.ObjectKeyFromObject(d)
	p := &bmcProcess{deployment: key, labels: d.Spec.Template.Labels, template: template, starts: starts, probe: "/"}
	if name := d.Labels[v1beta1.LabelVM]; name != "" {
		p.vm = maas.VMRef{Namespace: d.Namespace, Name: name}
	}
	if probe := container.ReadinessProbe; probe != nil && probe.HTTPGet != nil {
		p.probe = probe.HTTPGet.Path
	}

	mounts, err := s.mountVolumes(d, pod, container, p, secrets)
	if err != nil {
		return err
	}
	args := slices.Clone(container.Args)
	for i := 0; i < len(args); i++ {
		for from, to := range mounts {
			if args[i] == from || strings.HasPrefix(args[i], from+"/") {
				args[i] = to + strings.TrimPrefix(args[i], from)
			}
		}
		if i+1 >= len(args) {
			continue
		}
		switch args[i] {
		case "--listen":
			port, err := FreePort("tcp")
			if err != nil {
				return err
			}
			p.redfish = fmt.Sprintf("127.0.0.1:%d", port)
			args[i+1] = p.redfish
		case "--metrics-listen":
			port, err := FreePort("tcp")
			if err != nil {
				return err
			}
			args[i+1] = fmt.Sprintf("127.0.0.1:%d", port)
		case "--ipmi-listen":
			port, err := FreePort("udp")
			if err != nil {
				return err
			}
			p.ipmi = fmt.Sprintf("127.0.0.1:%d", port)
			args[i+1] = p.ipmi
		}
	}
	if p.redfish == "" {
		return fmt.Errorf("no --listen in %q", container.Args)
	}
	kubeconfig, err := s.opts.Kubeconfig(d.Namespace, pod.ServiceAccountName)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.opts.Binary, args...)
	cmd.Env = []string{"KUBECONFIG=" + kubeconfig, "HOME=" + s.opts.Dir}
	logs, err := s.opts.Log("bmc-" + d.Namespace + "-" + d.Name)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logs, logs
	if p.proc, err = StartProcess(cmd); err != nil {
		return err
	}
	s.mu.Lock()
	s.running[key] = p
	s.mu.Unlock()
	go s.awaitReady(ctx, key, p)
	return nil
}

// mountVolumes writes the pod's Secret volumes into folders, as the kubelet
// mounts them, and returns mount path → folder.
func (s *Node) mountVolumes(d *appsv1.Deployment, pod corev1.PodSpec, container corev1.Container, p *bmcProcess, secrets map[types.NamespacedName]map[string][]byte) (map[string]string, error) {
	mounts := map[string]string{}
	for _, mount := range container.VolumeMounts {
		var secretName string
		for _, v := range pod.Volumes {
			if v.Name == mount.Name && v.Secret != nil {
				secretName = v.Secret.SecretName
			}
		}
		if secretName == "" {
			return nil, fmt.Errorf("volume %s is not a Secret; the node mounts only Secrets", mount.Name)
		}
		secret := types.NamespacedName{Namespace: d.Namespace, Name: secretName}
		data, ok := secrets[secret]
		if !ok {
			return nil, fmt.Errorf("volume %s: Secret %s not found", mount.Name, secret)
		}
		v := &secretVolume{secret: secret, dir: filepath.Join(s.opts.Dir, "volumes", d.Namespace, d.Name, mount.Name)}
		if err := os.RemoveAll(v.dir); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(v.dir, 0o700); err != nil {
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

// refreshVolumes writes what changed in the process's Secrets into its
// volumes, as the kubelet does while the pod runs; a deleted Secret leaves
// its volume as it was.
func refreshVolumes(p *bmcProcess, secrets map[types.NamespacedName]map[string][]byte) error {
	for _, v := range p.volumes {
		if data, ok := secrets[v.secret]; ok {
			if err := v.write(data); err != nil {
				return err
			}
		}
	}
	return nil
}

// write brings the folder from the data last written to data: each changed
// file is written aside and renamed into place, so that a reader sees the
// old file or the new one, never half of one; removed keys go.
func (v *secretVolume) write(data map[string][]byte) error {
	for name, value := range data {
		if old, ok := v.data[name]; ok && bytes.Equal(old, value) {
			continue
		}
		if err := writeFileAtomic(filepath.Join(v.dir, name), value); err != nil {
			return err
		}
	}
	for name := range v.data {
		if _, ok := data[name]; !ok {
			if err := os.Remove(filepath.Join(v.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	v.data = data
	return nil
}

// writeFileAtomic writes a read-only file through a hidden temporary one in
// the same folder (readers of a Secret volume skip dot files, as they skip
// the kubelet's ..data).
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after a failure; gone after the rename
	_, err = f.Write(data)
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o400)
	}
	if err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// awaitReady is the container's readiness probe: the process's hosts
// resolve once it passes.
func (s *Node) awaitReady(ctx context.Context, key types.NamespacedName, p *bmcProcess) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-p.proc.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := WaitHTTP(ctx, "https://"+p.redfish+p.probe, 2*time.Minute); err != nil {
		return
	}
	s.mu.Lock()
	if s.running[key] == p {
		p.ready = true
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
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
}

// BMCs lists the BMCs of the VMs whose Ingress leads to a process.
func (s *Node) BMCs() []BMC {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []BMC
	for vm, b := range s.vms {
		out = append(out, BMC{VM: vm, Host: b.host, Server: b.proc.deployment.String(), Redfish: "https://" + b.proc.redfish,
			IPMI: b.proc.ipmi, Username: b.username, Password: b.password, Ready: b.ready, Starts: b.proc.starts})
	}
	slices.SortFunc(out, func(a, b BMC) int { return strings.Compare(a.VM.String(), b.VM.String()) })
	return out
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
