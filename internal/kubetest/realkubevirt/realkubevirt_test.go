package realkubevirt_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/virtmetal/virtmetal/internal/kubetest/realkubevirt"
)

var (
	cluster    *realkubevirt.Cluster
	node       *realkubevirt.Node
	namespaces atomic.Int64
)

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	start := time.Now()
	c, err := realkubevirt.Start(ctx, realkubevirt.Options{
		KeepDir: os.Getenv("REALKUBEVIRT_KEEP") != "",
		Logf:    func(f string, args ...any) { fmt.Fprintf(os.Stderr, f+"\n", args...) },
	})
	if err != nil {
		cancel()
		fmt.Fprintln(os.Stderr, "realkubevirt.Start:", err)
		os.Exit(1)
	}
	node, err = c.StartNode(ctx, "node01", realkubevirt.NodeOptions{})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "StartNode:", err)
		_ = c.Stop()
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "realkubevirt: cluster up in %v (dir %s)\n", time.Since(start).Round(time.Millisecond), c.Dir)
	cluster = c
	code := m.Run()
	if err := c.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "realkubevirt.Stop:", err)
		code = 1
	}
	os.Exit(code)
}

func newNamespace(t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("rkv-%d", namespaces.Add(1))}}
	if err := cluster.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}

// tenant returns clients of a user who holds KubeVirt's kubevirt.io:edit
// ClusterRole in the namespace, and nothing more: not a KubeVirt identity.
func tenant(t *testing.T, namespace string) (client.Client, kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	user := "tenant-" + namespace
	if err := cluster.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant-edit", Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "kubevirt.io:edit"},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}},
	}); err != nil {
		t.Fatal(err)
	}
	cfg, err := cluster.ConfigFor(user)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: cluster.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	k, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

func newVM(namespace, name string, strategy kubevirtv1.VirtualMachineRunStrategy) *kubevirtv1.VirtualMachine {
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &strategy,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{
					Resources: kubevirtv1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}},
				},
			}},
		},
	}
}

// eventually polls until cond holds or 30 s pass.
func eventually(t testing.TB, what string, cond func() (bool, error)) {
	t.Helper()
	var last error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		ok, err := cond()
		if ok {
			return
		}
		last = err
	}
	t.Fatalf("%s: not after 30 s (last error: %v; node stand-in: %v)\nvirt-controller log ends:\n%s", what, last, node.Err(), cluster.LogTail("virt-controller", 15))
}

func putSubresource(k kubernetes.Interface, namespace, vm, sub string) error {
	_, err := k.Discovery().RESTClient().Put().
		AbsPath("/apis/subresources.kubevirt.io/v1/namespaces", namespace, "virtualmachines", vm, sub).
		Body([]byte("{}")).SetHeader("Content-Type", "application/json").DoRaw(context.Background())
	return err
}

// virt-controller creates the VMI of a VM with runStrategy Always and the
// VMI's virt-launcher pod; once the node stand-in runs the pod,
// virt-controller schedules the VMI there and the stand-in (as
// virt-handler) reports it Running.
func TestRunStrategyAlwaysCreatesVMIAndLauncherPod(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	c, _ := tenant(t, ns)
	if err := c.Create(ctx, newVM(ns, "vm", kubevirtv1.RunStrategyAlways)); err != nil {
		t.Fatal(err)
	}
	vmi := &kubevirtv1.VirtualMachineInstance{}
	eventually(t, "VMI created by virt-controller", func() (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vm"}, vmi)
		return err == nil, err
	})
	if owner := metav1.GetControllerOf(vmi); owner == nil || owner.Kind != "VirtualMachine" || owner.Name != "vm" {
		t.Errorf("VMI's controller = %+v, want the VM", owner)
	}
	eventually(t, "virt-launcher pod", func() (bool, error) {
		pods := &corev1.PodList{}
		if err := cluster.Client.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{"kubevirt.io/created-by": string(vmi.UID)}); err != nil {
			return false, err
		}
		return len(pods.Items) == 1 && strings.HasPrefix(pods.Items[0].Name, "virt-launcher-vm-"), fmt.Errorf("%d pods", len(pods.Items))
	})
	eventually(t, "VMI Running on node01", func() (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(vmi), vmi)
		return err == nil && vmi.Status.Phase == kubevirtv1.Running && vmi.Status.NodeName == "node01", fmt.Errorf("phase %q node %q, err %v", vmi.Status.Phase, vmi.Status.NodeName, err)
	})
	eventually(t, "VM printableStatus Running", func() (bool, error) {
		vm := &kubevirtv1.VirtualMachine{}
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vm"}, vm)
		return err == nil && vm.Status.PrintableStatus == kubevirtv1.VirtualMachineStatusRunning, fmt.Errorf("printableStatus %q, err %v", vm.Status.PrintableStatus, err)
	})
	// virt-api's VM mutator defaulted the template (as it does on a cluster).
	vm := &kubevirtv1.VirtualMachine{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vm"}, vm); err != nil {
		t.Fatal(err)
	}
	if vm.Spec.Template.Spec.Domain.Machine == nil || vm.Spec.Template.Spec.Domain.Machine.Type == "" {
		t.Errorf("VM template has no machine type: virt-api's mutator did not run")
	}
}

// start and stop go through kube-apiserver's aggregation layer to virt-api,
// which rewrites the VM's runStrategy; virt-controller then creates or
// deletes the VMI.
func TestStartStopSubresources(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	c, k := tenant(t, ns)
	if err := c.Create(ctx, newVM(ns, "vm", kubevirtv1.RunStrategyHalted)); err != nil {
		t.Fatal(err)
	}
	runStrategy := func() kubevirtv1.VirtualMachineRunStrategy {
		vm := &kubevirtv1.VirtualMachine{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vm"}, vm); err != nil {
			t.Fatal(err)
		}
		return *vm.Spec.RunStrategy
	}
	if err := putSubresource(k, ns, "vm", "start"); err != nil {
		t.Fatalf("PUT start: %v", err)
	}
	if got := runStrategy(); got != kubevirtv1.RunStrategyAlways {
		t.Errorf("runStrategy after start = %s, want Always", got)
	}
	eventually(t, "VMI created after start", func() (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vm"}, &kubevirtv1.VirtualMachineInstance{})
		return err == nil, err
	})
	// A second start of a started VM is refused by virt-api.
	if err := putSubresource(k, ns, "vm", "start"); err == nil {
		t.Errorf("second PUT start: no error, want one (VM already running)")
	} else {
		t.Logf("second PUT start: %v", err)
	}
	if err := putSubresource(k, ns, "vm", "stop"); err != nil {
		t.Fatalf("PUT stop: %v", err)
	}
	if got := runStrategy(); got != kubevirtv1.RunStrategyHalted {
		t.Errorf("runStrategy after stop = %s, want Halted", got)
	}
	eventually(t, "VMI gone after stop", func() (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vm"}, &kubevirtv1.VirtualMachineInstance{})
		return apierrors.IsNotFound(err), err
	})
}

// Without virt-api's APIService the subresources do not exist: a client
// of start gets 404, nothing else answers in virt-api's place.
func TestSubresourcesFailWithoutVirtAPI(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	if err := cluster.Client.Create(ctx, newVM(ns, "vm", kubevirtv1.RunStrategyHalted)); err != nil {
		t.Fatal(err)
	}
	if err := cluster.UnregisterVirtAPI(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.RegisterVirtAPI(ctx); err != nil {
			t.Errorf("registering virt-api again: %v", err)
		}
	})
	err := putSubresource(cluster.Kube, ns, "vm", "start")
	if !apierrors.IsNotFound(err) {
		t.Fatalf("PUT start without virt-api registered: %v, want 404 Not Found", err)
	}
	vm := &kubevirtv1.VirtualMachine{}
	if err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vm"}, vm); err != nil {
		t.Fatal(err)
	}
	if *vm.Spec.RunStrategy != kubevirtv1.RunStrategyHalted {
		t.Errorf("runStrategy = %s after a failed start, want Halted", *vm.Spec.RunStrategy)
	}
}

// virt-api's VMI mutator reverts a status write by anyone but KubeVirt's
// own ServiceAccounts; the same write by virt-handler of the VMI's node
// stays.
func TestVMIStatusWriteByNonKubeVirtIdentityIsReverted(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	c, _ := tenant(t, ns)
	if err := c.Create(ctx, newVM(ns, "vm", kubevirtv1.RunStrategyAlways)); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKey{Namespace: ns, Name: "vm"}
	eventually(t, "VMI Running", func() (bool, error) {
		vmi := &kubevirtv1.VirtualMachineInstance{}
		err := c.Get(ctx, key, vmi)
		return err == nil && vmi.Status.Phase == kubevirtv1.Running, err
	})
	handler, err := client.New(node.HandlerConfig, client.Options{Scheme: cluster.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	writeGuestOS := func(cl client.Client, name string) *kubevirtv1.VirtualMachineInstance {
		t.Helper()
		vmi := &kubevirtv1.VirtualMachineInstance{}
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			// Read as admin: virt-handler may list and update VMIs, not get them.
			if err := cluster.Client.Get(ctx, key, vmi); err != nil {
				return err
			}
			vmi.Status.GuestOSInfo.Name = name
			return cl.Update(ctx, vmi)
		})
		if err != nil {
			t.Fatalf("update as %s: %v", name, err)
		}
		return vmi
	}
	if got := writeGuestOS(c, "tenant-wrote").Status.GuestOSInfo.Name; got != "" {
		t.Errorf("tenant's status write: stored guestOSInfo.name %q, want it reverted to \"\"", got)
	}
	if got := writeGuestOS(handler, "handler-wrote").Status.GuestOSInfo.Name; got != "handler-wrote" {
		t.Errorf("virt-handler's status write: stored guestOSInfo.name %q, want \"handler-wrote\"", got)
	}
	// The tenant cannot change a VMI's spec either (virt-api's validator).
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := c.Get(ctx, key, vmi); err != nil {
		t.Fatal(err)
	}
	vmi.Spec.Domain.Resources.Requests[corev1.ResourceMemory] = resource.MustParse("128Mi")
	if err := c.Update(ctx, vmi); err == nil {
		t.Errorf("tenant's VMI spec update: accepted, want it refused by virt-api's validator")
	} else {
		t.Logf("tenant's VMI spec update: %v", err)
	}
}

// virt-api's VM validator refuses an inconsistent spec.
func TestVMValidatorRefusesRunningAndRunStrategy(t *testing.T) {
	ns := newNamespace(t)
	vm := newVM(ns, "vm", kubevirtv1.RunStrategyAlways)
	vm.Spec.Running = ptr.To(true)
	err := cluster.Client.Create(context.Background(), vm)
	if err == nil || !strings.Contains(err.Error(), "denied the request") {
		t.Fatalf("VM with running and runStrategy: %v, want denied by virt-api", err)
	}
	t.Log(err)
}

// A guest that powers itself off: with runStrategy Always KubeVirt starts
// a new VMI (issue 22's first finding), with RerunOnFailure the VM stays
// stopped. A guest that reboots under rebootPolicy Terminate (a beta
// feature gate of KubeVirt 1.9.0, on unless disabled) ends its VMI the same
// way, Succeeded: KubeVirt cannot tell it from a power-off, and a
// RerunOnFailure VM stays stopped (as KubeVirt's own functional test
// "should not-recreate VMI on guest reboot" has it).
func TestGuestShutdown(t *testing.T) {
	terminate := kubevirtv1.RebootPolicyTerminate
	for _, tc := range []struct {
		name     string
		strategy kubevirtv1.VirtualMachineRunStrategy
		policy   *kubevirtv1.RebootPolicy
		reboot   bool // the guest reboots rather than powers off
		restarts bool
	}{
		{"poweroff/Always", kubevirtv1.RunStrategyAlways, nil, false, true},
		{"poweroff/RerunOnFailure", kubevirtv1.RunStrategyRerunOnFailure, nil, false, false},
		{"reboot-terminate/Always", kubevirtv1.RunStrategyAlways, &terminate, true, true},
		{"reboot-terminate/RerunOnFailure", kubevirtv1.RunStrategyRerunOnFailure, &terminate, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			ns := newNamespace(t)
			vm := newVM(ns, "vm", tc.strategy)
			vm.Spec.Template.Spec.Domain.RebootPolicy = tc.policy
			if err := cluster.Client.Create(ctx, vm); err != nil {
				t.Fatal(err)
			}
			key := client.ObjectKey{Namespace: ns, Name: "vm"}
			vmi := &kubevirtv1.VirtualMachineInstance{}
			eventually(t, "VMI Running", func() (bool, error) {
				err := cluster.Client.Get(ctx, key, vmi)
				return err == nil && vmi.Status.Phase == kubevirtv1.Running, err
			})
			first := vmi.UID
			if tc.reboot {
				if err := node.RebootGuest(ctx, ns, "vm"); err != nil {
					t.Fatal(err)
				}
			} else {
				node.ShutdownGuest(ns, "vm")
			}
			if tc.restarts {
				eventually(t, "a new VMI Running", func() (bool, error) {
					err := cluster.Client.Get(ctx, key, vmi)
					return err == nil && vmi.UID != first && vmi.Status.Phase == kubevirtv1.Running, err
				})
				return
			}
			eventually(t, "VM Stopped", func() (bool, error) {
				vm := &kubevirtv1.VirtualMachine{}
				err := cluster.Client.Get(ctx, key, vm)
				return err == nil && vm.Status.PrintableStatus == kubevirtv1.VirtualMachineStatusStopped, fmt.Errorf("printableStatus %q, err %v", vm.Status.PrintableStatus, err)
			})
			time.Sleep(2 * time.Second)
			if err := cluster.Client.Get(ctx, key, vmi); err == nil && vmi.UID != first {
				t.Errorf("a new VMI %s (phase %s) after the guest's VMI ended, want none", vmi.UID, vmi.Status.Phase)
			}
		})
	}
}

// The node stand-in records what each boot boots first: the lowest
// bootOrder of the VMI's spec, again on a guest reboot (the VMI stays).
func TestNodeRecordsBootDevice(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	vm := newVM(ns, "vm", kubevirtv1.RunStrategyAlways)
	spec := &vm.Spec.Template.Spec
	spec.Domain.Devices.Disks = []kubevirtv1.Disk{{Name: "root", BootOrder: ptr.To[uint](2), DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}}}
	spec.Volumes = []kubevirtv1.Volume{{Name: "root", VolumeSource: kubevirtv1.VolumeSource{ContainerDisk: &kubevirtv1.ContainerDiskSource{Image: "example.invalid/disk"}}}}
	spec.Domain.Devices.Interfaces = []kubevirtv1.Interface{{Name: "default", BootOrder: ptr.To[uint](1), InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}}}}
	spec.Networks = []kubevirtv1.Network{*kubevirtv1.DefaultPodNetwork()}
	if err := cluster.Client.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	eventually(t, "first boot", func() (bool, error) { return len(node.Boots(ns, "vm")) == 1, nil })
	if err := node.RebootGuest(ctx, ns, "vm"); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(node.Boots(ns, "vm"), ","), "interface/default,interface/default"; got != want {
		t.Errorf("boots = %s, want %s", got, want)
	}
}

// virt-controller runs with leader election: killed and started again, it
// leads again and goes on reconciling.
func TestVirtControllerRestart(t *testing.T) {
	ctx := context.Background()
	start := time.Now()
	if err := cluster.RestartVirtController(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("virt-controller leading again after %v", time.Since(start).Round(time.Millisecond))
	ns := newNamespace(t)
	if err := cluster.Client.Create(ctx, newVM(ns, "vm", kubevirtv1.RunStrategyAlways)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "VMI Running after the restart", func() (bool, error) {
		vmi := &kubevirtv1.VirtualMachineInstance{}
		err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vm"}, vmi)
		return err == nil && vmi.Status.Phase == kubevirtv1.Running, err
	})
}
