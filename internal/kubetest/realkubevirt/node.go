package realkubevirt

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/bounded"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/sim/guest"
)

// HoldStartAnnotation on a VM keeps its VMIs Scheduled (the VM Starting,
// the guest not booted) until it is removed: a VM caught mid-start, as
// sim/kubevirt's annotation of the same purpose does.
const HoldStartAnnotation = "realkubevirt.virtmetal.io/hold-start"

// Node is the stand-in for what runs on a node: the scheduler, the kubelet
// and virt-handler, as small as they can be. It watches pods, VMIs and VMs,
// as they do, and every 200 ms goes over what it has seen:
//   - binds every unbound virt-launcher pod to itself (the scheduler);
//   - marks its bound pods Running with every container started and ready,
//     and deletes its terminating pods at once (the kubelet);
//   - moves its VMIs from Scheduled to Running, and a deleted VMI to
//     Succeeded, writing status as virt-handler does, with virt-handler's
//     ServiceAccount token bound to a virt-handler pod on this node (so
//     virt-api's node restriction applies to it as to the real one);
//   - keeps the Node's kubevirt.io/heartbeat fresh;
//   - gives each boot of a VMI a serial console and a screen (sim/console),
//     which virt-api reaches as virt-handler's (consoles.go), and ends
//     their streams when the boot ends.
//
// No guest runs: a VMI is Running as soon as its pod is, unless its VM
// holds HoldStartAnnotation; what it boots is sim/guest's BootDevice, told
// to NodeOptions.OnBoot.
type Node struct {
	Name string
	// HandlerConfig authenticates as virt-handler on this node.
	HandlerConfig *rest.Config

	c       *Cluster
	opts    NodeOptions
	handler client.Client
	// watched is what the node reads: an informer cache, so that going over
	// every pod and VMI five times a second costs the API server nothing,
	// as the watches of a kubelet and a virt-handler do.
	watched cache.Cache
	cancel  context.CancelFunc
	done    chan struct{}

	mu       sync.Mutex
	lastErr  error
	shutdown map[types.NamespacedName]bool     // VMIs whose guest powered off
	boots    map[types.NamespacedName][]string // what each VMI name booted, in order
	targets  map[types.NamespacedName][]machine.BootTarget
	// starting holds the VMIs whose Running write is in flight; each
	// channel closes once the write returned and its boot is recorded.
	starting map[types.NamespacedName]chan struct{}
}

// NodeOptions are what a node's stand-in tells.
type NodeOptions struct {
	// OnBoot, when set, is told every boot of a guest on the node (a VMI
	// reaching Running, a guest reboot), with the VMI as it booted and the
	// device it booted from: where a simulated guest starts. It is called
	// on the stand-in's loop, which it must not hold up.
	OnBoot func(vmi *kubevirtv1.VirtualMachineInstance, device machine.BootTarget)
}

// StartNode registers a Node and starts its stand-in; Stop (or the
// cluster's Stop) ends it.
func (c *Cluster) StartNode(ctx context.Context, name string, opts NodeOptions) (*Node, error) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"kubernetes.io/hostname":  name,
		"kubernetes.io/arch":      "amd64",
		"kubevirt.io/schedulable": "true",
	}, Annotations: map[string]string{"kubevirt.io/heartbeat": time.Now().UTC().Format(time.RFC3339)}}}
	if err := c.Client.Create(ctx, node); err != nil {
		return nil, fmt.Errorf("creating Node %s: %w", name, err)
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods: resource.MustParse("1000"),
	}
	node.Status = corev1.NodeStatus{
		Capacity: capacity, Allocatable: capacity,
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: c.ns.IP}, {Type: corev1.NodeHostName, Address: name}},
	}
	if err := c.Client.Status().Update(ctx, node); err != nil {
		return nil, fmt.Errorf("Node %s status: %w", name, err)
	}
	// The virt-handler pod of the node, so that its token names the node.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "virt-handler-" + name, Namespace: Namespace, Labels: map[string]string{"kubevirt.io": "virt-handler"}},
		Spec: corev1.PodSpec{
			NodeName: name, ServiceAccountName: "kubevirt-handler",
			Containers: []corev1.Container{{Name: "virt-handler", Image: "virt-handler"}},
		},
	}
	if err := c.Client.Create(ctx, pod); err != nil {
		return nil, fmt.Errorf("creating the virt-handler pod: %w", err)
	}
	if err := c.startConsoles(); err != nil {
		return nil, fmt.Errorf("virt-handler's console server: %w", err)
	}
	// Its IP is where virt-api dials it for consoles: the console server's.
	if err := c.markRunning(ctx, pod, c.ns.HostIP); err != nil {
		return nil, err
	}
	tr, err := c.Kube.CoreV1().ServiceAccounts(Namespace).CreateToken(ctx, "kubevirt-handler", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](48 * 3600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("virt-handler token bound to %s: %w", pod.Name, err)
	}
	n := &Node{
		Name: name, c: c, opts: opts, done: make(chan struct{}), shutdown: map[types.NamespacedName]bool{}, boots: map[types.NamespacedName][]string{},
		targets: map[types.NamespacedName][]machine.BootTarget{}, starting: map[types.NamespacedName]chan struct{}{},
		HandlerConfig: &rest.Config{Host: c.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: c.servingCA.certPEM}, BearerToken: tr.Status.Token, QPS: 100, Burst: 200},
	}
	if n.handler, err = client.New(n.HandlerConfig, client.Options{Scheme: c.Client.Scheme()}); err != nil {
		return nil, err
	}
	if n.watched, err = cache.New(c.Config, cache.Options{Scheme: c.Client.Scheme()}); err != nil {
		return nil, err
	}
	loopCtx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go func() { _ = n.watched.Start(loopCtx) }()
	go n.run(loopCtx)
	c.nodes = append(c.nodes, n)
	return n, nil
}

// Stop ends the stand-in (the Node object stays).
func (n *Node) Stop() {
	n.cancel()
	<-n.done
}

// Err is the last error of a round of the stand-in, nil if the last round
// went through.
func (n *Node) Err() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.lastErr
}

// ShutdownGuest acts as the guest of a Running VMI powering itself off:
// the VMI becomes Succeeded and its pod's containers exit.
func (n *Node) ShutdownGuest(namespace, name string) {
	n.mu.Lock()
	n.shutdown[types.NamespacedName{Namespace: namespace, Name: name}] = true
	n.mu.Unlock()
}

// RebootGuest acts as the guest of a Running VMI rebooting itself. Under
// the default rebootPolicy (Reboot) the VMI stays, and the guest boots
// again from the same domain (its spec's boot order). Under rebootPolicy
// Terminate, virt-launcher's domain has libvirt's on_reboot destroy: the
// domain shuts off (reason Shutdown), which virt-handler reports as it
// reports a guest power-off, the VMI Succeeded (KubeVirt 1.9.0's
// calculateVmPhaseForStatusReason); virt-controller then starts a new VMI
// only under runStrategy Always.
func (n *Node) RebootGuest(ctx context.Context, namespace, name string) error {
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := n.c.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, vmi); err != nil {
		return err
	}
	if vmi.Status.Phase != kubevirtv1.Running || vmi.Status.NodeName != n.Name {
		return fmt.Errorf("VMI %s/%s is %s on %q, not Running on %s", namespace, name, vmi.Status.Phase, vmi.Status.NodeName, n.Name)
	}
	if p := vmi.Spec.Domain.RebootPolicy; p != nil && *p == kubevirtv1.RebootPolicyTerminate {
		n.ShutdownGuest(namespace, name)
		return nil
	}
	n.boot(types.NamespacedName{Namespace: namespace, Name: name}, vmi)
	return nil
}

// Boots says what each boot of the VMIs of that name booted first, oldest
// first: "disk/NAME" or "interface/NAME" (the device with the lowest
// bootOrder, else the first disk, as libvirt does), "" if nothing.
func (n *Node) Boots(namespace, name string) []string {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	n.lockSettled(key)
	defer n.mu.Unlock()
	return append([]string(nil), n.boots[key]...)
}

// BootTargets says what kind of device each boot of the VMIs of that name
// booted from, oldest first, as sim/guest's BootDevice tells it: the
// machine contract's view of Boots.
func (n *Node) BootTargets(namespace, name string) []machine.BootTarget {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	n.lockSettled(key)
	defer n.mu.Unlock()
	return append([]machine.BootTarget(nil), n.targets[key]...)
}

// lockSettled locks n.mu once no Running write of the VMI key is in
// flight: a test that has seen the VMI Running (in any cache) then finds
// its boot.
func (n *Node) lockSettled(key types.NamespacedName) {
	n.mu.Lock()
	for {
		done, ok := n.starting[key]
		if !ok {
			return
		}
		n.mu.Unlock()
		<-done
		n.mu.Lock()
	}
}

func (n *Node) boot(key types.NamespacedName, vmi *kubevirtv1.VirtualMachineInstance) {
	n.c.bootConsoles(n.Name, vmi)
	n.mu.Lock()
	n.record(key, vmi)
	n.mu.Unlock()
	n.tell(vmi)
}

// startGuest writes the VMI Running, as virt-handler does once its domain
// runs, and records the guest's boot; Boots waits while the write is in
// flight (lockSettled). A conflicting write is left to the next round.
func (n *Node) startGuest(ctx context.Context, key types.NamespacedName, vmi *kubevirtv1.VirtualMachineInstance) error {
	// The guest's consoles are there before anyone sees it Running (a
	// failed write's are replaced at the next attempt, or end with it).
	n.c.bootConsoles(n.Name, vmi)
	done := make(chan struct{})
	n.mu.Lock()
	n.starting[key] = done
	n.mu.Unlock()
	err := n.handler.Update(ctx, vmi)
	n.mu.Lock()
	if err == nil {
		n.record(key, vmi)
	}
	delete(n.starting, key)
	close(done)
	n.mu.Unlock()
	switch {
	case apierrors.IsConflict(err):
		return nil
	case err != nil:
		return fmt.Errorf("VMI %s Running: %w", key, err)
	}
	n.tell(vmi)
	return nil
}

// record notes a boot of the VMI; n.mu is held.
func (n *Node) record(key types.NamespacedName, vmi *kubevirtv1.VirtualMachineInstance) {
	n.boots[key] = append(n.boots[key], BootDevice(&vmi.Spec))
	n.targets[key] = append(n.targets[key], guest.BootDevice(&vmi.Spec))
}

// tell passes a boot to NodeOptions.OnBoot.
func (n *Node) tell(vmi *kubevirtv1.VirtualMachineInstance) {
	if n.opts.OnBoot != nil {
		n.opts.OnBoot(vmi.DeepCopy(), guest.BootDevice(&vmi.Spec))
	}
}

// held says whether the VMI's VM holds its start.
func (n *Node) held(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) (bool, error) {
	vm := &kubevirtv1.VirtualMachine{}
	if err := n.watched.Get(ctx, types.NamespacedName{Namespace: vmi.Namespace, Name: vmi.Name}, vm); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	_, ok := vm.Annotations[HoldStartAnnotation]
	return ok, nil
}

// BootDevice is what a VMI of this spec boots first: the disk or interface
// with the lowest bootOrder, else the first disk.
func BootDevice(spec *kubevirtv1.VirtualMachineInstanceSpec) string {
	best, bestOrder := "", ^uint(0)
	for _, d := range spec.Domain.Devices.Disks {
		if d.BootOrder != nil && *d.BootOrder < bestOrder {
			best, bestOrder = "disk/"+d.Name, *d.BootOrder
		}
	}
	for _, i := range spec.Domain.Devices.Interfaces {
		if i.BootOrder != nil && *i.BootOrder < bestOrder {
			best, bestOrder = "interface/"+i.Name, *i.BootOrder
		}
	}
	if best == "" && len(spec.Domain.Devices.Disks) > 0 {
		best = "disk/" + spec.Domain.Devices.Disks[0].Name
	}
	return best
}

func (n *Node) run(ctx context.Context) {
	defer close(n.done)
	lastBeat := time.Now()
	for {
		err := n.round(ctx)
		if time.Since(lastBeat) > 30*time.Second {
			lastBeat = time.Now()
			patch := fmt.Sprintf(`{"metadata":{"annotations":{"kubevirt.io/heartbeat":%q}}}`, lastBeat.UTC().Format(time.RFC3339))
			_ = n.c.Client.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}, client.RawPatch(types.MergePatchType, []byte(patch)))
		}
		n.mu.Lock()
		n.lastErr = err
		n.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (n *Node) round(ctx context.Context) error {
	c := n.c
	pods := &corev1.PodList{}
	if err := n.watched.List(ctx, pods, client.MatchingLabels{"kubevirt.io": "virt-launcher"}); err != nil {
		return err
	}
	err := eachAtOnce(len(pods.Items), func(i int) error {
		pod := &pods.Items[i]
		switch {
		case pod.DeletionTimestamp != nil:
			if pod.Spec.NodeName == n.Name || pod.Spec.NodeName == "" {
				err := c.Client.Delete(ctx, pod, client.GracePeriodSeconds(0))
				if err != nil && !apierrors.IsNotFound(err) {
					return err
				}
			}
		case pod.Spec.NodeName == "":
			if err := c.Kube.CoreV1().Pods(pod.Namespace).Bind(ctx, &corev1.Binding{
				ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
				Target:     corev1.ObjectReference{Kind: "Node", Name: n.Name},
			}, metav1.CreateOptions{}); err != nil && !apierrors.IsConflict(err) {
				return fmt.Errorf("binding %s/%s: %w", pod.Namespace, pod.Name, err)
			}
		case pod.Spec.NodeName == n.Name && pod.Status.Phase == corev1.PodPending:
			return c.markRunning(ctx, pod, launcherPodIP)
		}
		return nil
	})
	if err != nil {
		return err
	}
	vmis := &kubevirtv1.VirtualMachineInstanceList{}
	if err := n.watched.List(ctx, vmis); err != nil {
		return err
	}
	// A guest whose VMI ended, went or was replaced has no consoles.
	alive := map[types.UID]bool{}
	for _, vmi := range vmis.Items {
		alive[vmi.UID] = vmi.Status.NodeName == n.Name && !vmi.IsFinal() && vmi.DeletionTimestamp == nil
	}
	c.endConsoles(n.Name, func(_ types.NamespacedName, uid types.UID) bool { return alive[uid] })
	return eachAtOnce(len(vmis.Items), func(i int) error {
		vmi := &vmis.Items[i]
		if vmi.Status.NodeName != n.Name || vmi.IsFinal() {
			return nil
		}
		key := types.NamespacedName{Namespace: vmi.Namespace, Name: vmi.Name}
		n.mu.Lock()
		off := n.shutdown[key]
		n.mu.Unlock()
		switch {
		case vmi.DeletionTimestamp != nil || off:
			c.endConsoles(n.Name, func(k types.NamespacedName, _ types.UID) bool { return k != key })
			setPhase(vmi, kubevirtv1.Succeeded)
			if err := n.handler.Update(ctx, vmi); err != nil && !apierrors.IsConflict(err) {
				return fmt.Errorf("VMI %s Succeeded: %w", key, err)
			}
			n.mu.Lock()
			delete(n.shutdown, key)
			n.mu.Unlock()
			if err := n.podsExited(ctx, vmi); err != nil {
				return err
			}
		case vmi.Status.Phase == kubevirtv1.Scheduled:
			if held, err := n.held(ctx, vmi); err != nil || held {
				return err
			}
			setPhase(vmi, kubevirtv1.Running)
			vmi.Status.Conditions = append(vmi.Status.Conditions, kubevirtv1.VirtualMachineInstanceCondition{
				Type: kubevirtv1.VirtualMachineInstanceReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now(),
			})
			return n.startGuest(ctx, key, vmi)
		}
		return nil
	})
}

// standInWorkers is how many pods, and then VMIs, a round works on at once,
// as a kubelet and virt-handler handle each independently: one slow or
// failing object holds up no other.
const standInWorkers = 8

// eachAtOnce calls work for 0..n-1, standInWorkers at a time, and joins
// their errors.
func eachAtOnce(n int, work func(i int) error) error {
	var (
		mu   sync.Mutex
		errs []error
	)
	bounded.Each(n, standInWorkers, func(i int) {
		if err := work(i); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	})
	return errors.Join(errs...)
}

// launcherPodIP is every virt-launcher pod's IP: nothing dials it.
const launcherPodIP = "10.244.0.10"

// markRunning writes a pod's status as the kubelet does once its
// containers started.
func (c *Cluster) markRunning(ctx context.Context, pod *corev1.Pod, podIP string) error {
	now := metav1.Now()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP = podIP
	pod.Status.HostIP = c.ns.IP
	pod.Status.StartTime = &now
	pod.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	pod.Status.ContainerStatuses = nil
	for _, ctr := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: ctr.Name, Image: ctr.Image, ImageID: ctr.Image, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	if err := c.Client.Status().Update(ctx, pod); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("pod %s/%s Running: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// podsExited marks the VMI's launcher pods Succeeded, as the kubelet does
// when virt-launcher exits after the domain ended.
func (n *Node) podsExited(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) error {
	pods := &corev1.PodList{}
	if err := n.watched.List(ctx, pods, client.InNamespace(vmi.Namespace), client.MatchingLabels{"kubevirt.io/created-by": string(vmi.UID)}); err != nil {
		return err
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		now := metav1.Now()
		pod.Status.Phase = corev1.PodSucceeded
		for j := range pod.Status.ContainerStatuses {
			pod.Status.ContainerStatuses[j].Ready = false
			pod.Status.ContainerStatuses[j].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", FinishedAt: now}}
		}
		if err := n.c.Client.Status().Update(ctx, pod); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// setPhase moves a VMI to a phase and records when, as virt-handler does
// (virt-controller counts a VMI that ends without a Running timestamp as a
// failed start, and backs off).
func setPhase(vmi *kubevirtv1.VirtualMachineInstance, phase kubevirtv1.VirtualMachineInstancePhase) {
	vmi.Status.Phase = phase
	vmi.Status.PhaseTransitionTimestamps = append(vmi.Status.PhaseTransitionTimestamps, kubevirtv1.VirtualMachineInstancePhaseTransitionTimestamp{
		Phase: phase, PhaseTransitionTimestamp: metav1.Now(),
	})
}
