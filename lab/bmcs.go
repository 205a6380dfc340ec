package lab

import (
	"context"
	"encoding/json"
	"fmt"
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
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/maas"
	"github.com/virtmetal/virtmetal/maas/maastest"
)

// bmcSupervisor plays the kubelet and the Ingress for the controller's BMC
// Deployments: one bmc-server process per Deployment, started with the
// container's arguments, its Secret volume written to a folder, a
// kubeconfig of the pod's ServiceAccount, and loopback ports in place of the
// container ports. A process that exits is started again, as its pod would
// be; a changed pod template replaces it. Its Redfish port is reachable
// under the Ingress host name through dial, its IPMI port through
// ipmiAddress.
type bmcSupervisor struct {
	l *Lab

	mu      sync.Mutex
	running map[types.NamespacedName]*bmcProcess
	hosts   map[string]string     // Ingress host → 127.0.0.1:port, while ready
	ipmi    map[maas.VMRef]string // → 127.0.0.1:port, while ready
}

type bmcProcess struct {
	vm       maas.VMRef
	template string // what the process was started from
	host     string // the Ingress host, "" without one
	proc     *process
	redfish  string
	ipmi     string
	ready    bool
	starts   int
	username string
	password string
	probe    string // the readiness probe's path
}

func newBMCSupervisor(l *Lab) *bmcSupervisor {
	return &bmcSupervisor{l: l, running: map[types.NamespacedName]*bmcProcess{}, hosts: map[string]string{}, ipmi: map[maas.VMRef]string{}}
}

func (s *bmcSupervisor) run(ctx context.Context) {
	for {
		if err := s.sync(ctx); err != nil && ctx.Err() == nil {
			s.l.logf("bmc supervisor: %v", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// sync brings the processes in line with the Deployments.
func (s *bmcSupervisor) sync(ctx context.Context) error {
	var list appsv1.DeploymentList
	if err := s.l.Client.List(ctx, &list, client.MatchingLabels{v1beta1.LabelManagedBy: v1beta1.ManagedByValue}); err != nil {
		return err
	}
	wanted := map[types.NamespacedName]bool{}
	for i := range list.Items {
		d := &list.Items[i]
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
			p.proc.stop()
		case p.proc.exited():
			s.remove(key, p)
		default:
			s.route(ctx, key, p)
			continue
		}
		if d.Spec.Replicas != nil && *d.Spec.Replicas == 0 {
			continue
		}
		starts := 1
		if p != nil {
			starts = p.starts + 1
		}
		if err := s.start(ctx, d, template, starts); err != nil {
			s.l.logf("starting bmc-server for %s: %v", key, err)
		}
	}
	s.mu.Lock()
	var gone []*bmcProcess
	for key, p := range s.running {
		if !wanted[key] {
			s.removeLocked(key, p)
			gone = append(gone, p)
		}
	}
	s.mu.Unlock()
	for _, p := range gone {
		p.proc.stop()
	}
	return nil
}

func (s *bmcSupervisor) remove(key types.NamespacedName, p *bmcProcess) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removeLocked(key, p)
}

func (s *bmcSupervisor) removeLocked(key types.NamespacedName, p *bmcProcess) {
	if s.running[key] == p {
		delete(s.running, key)
	}
	if p.host != "" && s.hosts[p.host] == p.redfish {
		delete(s.hosts, p.host)
	}
	if s.ipmi[p.vm] == p.ipmi {
		delete(s.ipmi, p.vm)
	}
}

// start runs the Deployment's one container as its pod would.
func (s *bmcSupervisor) start(ctx context.Context, d *appsv1.Deployment, template string, starts int) error {
	pod := d.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		return fmt.Errorf("want one container, got %d", len(pod.Containers))
	}
	container := pod.Containers[0]
	vm := maas.VMRef{Namespace: d.Namespace, Name: d.Labels[v1beta1.LabelVM]}
	p := &bmcProcess{vm: vm, template: template, starts: starts, probe: "/"}
	if probe := container.ReadinessProbe; probe != nil && probe.HTTPGet != nil {
		p.probe = probe.HTTPGet.Path
	}

	mounts, err := s.mountVolumes(ctx, d, pod, container, p)
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
			port, err := freePort("tcp")
			if err != nil {
				return err
			}
			p.redfish = fmt.Sprintf("127.0.0.1:%d", port)
			args[i+1] = p.redfish
		case "--ipmi-listen":
			port, err := freePort("udp")
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
	kubeconfig, err := s.l.kubeconfig(d.Namespace, pod.ServiceAccountName)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(s.l.bins, "bmc-server"), args...)
	cmd.Env = []string{"KUBECONFIG=" + kubeconfig, "HOME=" + s.l.dir}
	logs, err := s.l.logFile("bmc-" + d.Namespace + "-" + d.Name)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logs, logs
	if p.proc, err = startProcess(cmd); err != nil {
		return err
	}
	key := client.ObjectKeyFromObject(d)
	s.mu.Lock()
	s.running[key] = p
	s.mu.Unlock()
	go s.awaitReady(key, p)
	return nil
}

// mountVolumes writes the pod's Secret volumes into folders, as the kubelet
// mounts them, and returns mount path → folder. The credentials Secret's
// values are kept for the lab's printout.
func (s *bmcSupervisor) mountVolumes(ctx context.Context, d *appsv1.Deployment, pod corev1.PodSpec, container corev1.Container, p *bmcProcess) (map[string]string, error) {
	mounts := map[string]string{}
	for _, mount := range container.VolumeMounts {
		var secretName string
		for _, v := range pod.Volumes {
			if v.Name == mount.Name && v.Secret != nil {
				secretName = v.Secret.SecretName
			}
		}
		if secretName == "" {
			return nil, fmt.Errorf("volume %s is not a Secret; the lab mounts only Secrets", mount.Name)
		}
		var secret corev1.Secret
		if err := s.l.Client.Get(ctx, types.NamespacedName{Namespace: d.Namespace, Name: secretName}, &secret); err != nil {
			return nil, fmt.Errorf("volume %s: %w", mount.Name, err)
		}
		dir := filepath.Join(s.l.dir, "volumes", d.Namespace, d.Name, mount.Name)
		if err := os.RemoveAll(dir); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		for name, value := range secret.Data {
			if err := os.WriteFile(filepath.Join(dir, name), value, 0o400); err != nil {
				return nil, err
			}
		}
		p.username = string(secret.Data[v1beta1.SecretUsernameKey])
		p.password = string(secret.Data[v1beta1.SecretPasswordKey])
		mounts[mount.MountPath] = dir
	}
	return mounts, nil
}

// awaitReady is the container's readiness probe: the process's hosts
// resolve once it passes.
func (s *bmcSupervisor) awaitReady(key types.NamespacedName, p *bmcProcess) {
	ctx, cancel := context.WithCancel(s.l.ctx)
	defer cancel()
	go func() {
		select {
		case <-p.proc.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := waitHTTP(ctx, "https://"+p.redfish+p.probe, 2*time.Minute); err != nil {
		return
	}
	s.mu.Lock()
	if s.running[key] != p {
		s.mu.Unlock()
		return
	}
	p.ready = true
	if p.ipmi != "" {
		s.ipmi[p.vm] = p.ipmi
	}
	s.mu.Unlock()
	s.route(s.l.ctx, key, p)
	s.l.progress.record(p.vm, StepBMCReady, fmt.Sprintf("bmc-server at %s (start %d)", p.redfish, p.starts))
}

// route is the Ingress controller: once the BMC's Ingress exists, its host
// leads to the ready process.
func (s *bmcSupervisor) route(ctx context.Context, key types.NamespacedName, p *bmcProcess) {
	s.mu.Lock()
	routed := p.host != "" || !p.ready
	s.mu.Unlock()
	if routed {
		return
	}
	var ingress networkingv1.Ingress
	if err := s.l.Client.Get(ctx, key, &ingress); err != nil || len(ingress.Spec.Rules) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running[key] == p {
		p.host = strings.ToLower(ingress.Spec.Rules[0].Host)
		s.hosts[p.host] = p.redfish
	}
}

// dial resolves the BMCs' Ingress host names to their processes; any other
// name does not resolve, as a BMC whose pod is not ready is not routed.
func (s *bmcSupervisor) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	target, ok := s.hosts[strings.ToLower(host)]
	s.mu.Unlock()
	if !ok {
		return nil, &net.DNSError{Err: "no such host (no ready BMC)", Name: host, IsNotFound: true}
	}
	var d net.Dialer
	return d.DialContext(ctx, network, target)
}

// ipmiAddress is where the VM's IPMI BMC answers, while it is ready.
func (s *bmcSupervisor) ipmiAddress(vm maas.VMRef) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	addr, ok := s.ipmi[vm]
	return addr, ok
}

// BMC is what a user needs to reach one VM's BMC in the lab.
type BMC struct {
	VM       maas.VMRef
	Host     string // the Ingress host
	Redfish  string // https://127.0.0.1:port
	IPMI     string // 127.0.0.1:port, "" when off
	Username string
	Password string
	Ready    bool
	Starts   int // how often its process was started
}

// BMCs lists the BMC processes.
func (l *Lab) BMCs() []BMC {
	l.bmcs.mu.Lock()
	defer l.bmcs.mu.Unlock()
	var out []BMC
	for _, p := range l.bmcs.running {
		out = append(out, BMC{VM: p.vm, Host: p.host, Redfish: "https://" + p.redfish, IPMI: p.ipmi,
			Username: p.username, Password: p.password, Ready: p.ready, Starts: p.starts})
	}
	slices.SortFunc(out, func(a, b BMC) int { return strings.Compare(a.VM.String(), b.VM.String()) })
	return out
}

// KillBMC kills the VM's bmc-server process, as a crash would; the lab
// starts it again as its Deployment would. It reports whether one ran.
func (l *Lab) KillBMC(vm maas.VMRef) bool {
	l.bmcs.mu.Lock()
	var victim *bmcProcess
	for _, p := range l.bmcs.running {
		if p.vm == vm {
			victim = p
		}
	}
	l.bmcs.mu.Unlock()
	if victim == nil {
		return false
	}
	victim.proc.kill()
	return true
}

func (s *bmcSupervisor) stopAll() {
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
			p.proc.stop()
		}()
	}
	wg.Wait()
}

// RedfishSystem reads the VM's ComputerSystem through its BMC, by its host
// name, with its credentials; nil when it cannot.
func (l *Lab) RedfishSystem(ctx context.Context, vm maas.VMRef) map[string]any {
	for _, b := range l.BMCs() {
		if b.VM != vm || !b.Ready {
			continue
		}
		d := newRedfishDriver("https://"+b.Host, b.Username, b.Password, vm.Name, l.bmcs.dial)
		system, _, err := d.Request(ctx, "GET", maastest.SystemURI(vm.Name), "", "")
		if err != nil {
			l.logf("reading the system of %s: %v", vm, err)
			return nil
		}
		return system
	}
	return nil
}
