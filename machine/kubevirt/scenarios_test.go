package kubevirt_test

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	instancetypev1beta1 "kubevirt.io/api/instancetype/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/deploy/bmc"
	"github.com/virtmetal/virtmetal/internal/kubescheme"
	"github.com/virtmetal/virtmetal/internal/kubetest"
	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
)

func mustMachine(t *testing.T, b *kubevirt.Backend, id string) machine.Machine {
	t.Helper()
	m, err := b.Machine(t.Context(), id)
	if err != nil {
		t.Fatalf("Machine(%q): %v", id, err)
	}
	return m
}

func waitPower(t *testing.T, m machine.Machine, want machine.PowerState) {
	t.Helper()
	poll.True(t, "power "+string(want), func() bool {
		st, err := m.PowerState(t.Context())
		return err == nil && st == want
	})
}

// TestBootOrderTranslation checks the bootOrder a Once Pxe override writes
// on the VM and that the previous order (here: explicit) comes back.
func TestBootOrderTranslation(t *testing.T) {
	ns := cluster.NewNamespace(t)
	one, two := uint(1), uint(2)
	newVM(t, ns, "vm", func(vm *kubevirtv1.VirtualMachine) {
		spec := &vm.Spec.Template.Spec
		spec.Domain.Devices.Disks[0].BootOrder = &one
		spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, kubevirtv1.Disk{
			Name: "data", BootOrder: &two, DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}},
		})
		spec.Volumes = append(spec.Volumes, kubevirtv1.Volume{Name: "data", VolumeSource: kubevirtv1.VolumeSource{EmptyDisk: &kubevirtv1.EmptyDiskSource{Capacity: resource.MustParse("1Gi")}}})
	})
	m := mustMachine(t, kubevirttest.StartBackend(t, cluster.Config, ns, "vm", kubevirt.Options{}), "vm")
	ctx := t.Context()
	if err := m.SetBootOverride(ctx, machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce, Mode: machine.BootModeUEFI}); err != nil {
		t.Fatalf("SetBootOverride: %v", err)
	}
	orders := func() (nic, root, data *uint) {
		spec := getVM(t, ns, "vm").Spec.Template.Spec
		return spec.Domain.Devices.Interfaces[0].BootOrder, spec.Domain.Devices.Disks[0].BootOrder, spec.Domain.Devices.Disks[1].BootOrder
	}
	if nic, root, data := orders(); nic == nil || *nic != 1 || root == nil || *root != 2 || data == nil || *data != 3 {
		t.Fatalf("bootOrder with Once Pxe: nic %v root %v data %v; want 1 2 3", deref(nic), deref(root), deref(data))
	}
	if err := m.Reset(ctx, machine.ResetOn); err != nil {
		t.Fatalf("Reset On: %v", err)
	}
	waitPower(t, m, machine.PowerOn)
	// The node stand-in records a boot once its write of the VMI's Running
	// phase returns, which the backend may have seen already.
	poll.True(t, "one boot, from the network", func() bool {
		return slices.Equal(cluster.Boots(ns, "vm"), []machine.BootTarget{machine.BootPxe})
	})
	poll.True(t, "previous bootOrder restored", func() bool {
		nic, root, data := orders()
		return nic == nil && root != nil && *root == 1 && data != nil && *data == 2
	})
	if _, ok := getVM(t, ns, "vm").Annotations["virtmetal.io/boot-override"]; ok {
		t.Fatalf("override annotation left after the Once boot")
	}
}

func deref(p *uint) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestOnceSurvivesBMCRestart: the BMC that set a Once override is gone when
// the VM boots; a new one on the same VM still restores the order.
func TestOnceSurvivesBMCRestart(t *testing.T) {
	ns := cluster.NewNamespace(t)
	newVM(t, ns, "vm", nil)
	ctx := t.Context()

	first, err := kubevirt.New(cluster.Config, ns, "vm", kubevirt.Options{})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	firstCtx, stopFirst := context.WithCancel(ctx)
	firstDone := make(chan struct{})
	go func() { defer close(firstDone); _ = first.Start(firstCtx) }()
	if !first.WaitForCacheSync(ctx) {
		t.Fatalf("cache did not sync")
	}
	m := mustMachine(t, first, "vm")
	once := machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce, Mode: machine.BootModeUEFI}
	if err := m.SetBootOverride(ctx, once); err != nil {
		t.Fatalf("SetBootOverride: %v", err)
	}
	stopFirst()
	<-firstDone

	// The VM boots while no BMC runs (someone else powers it on).
	powerOnBehindTheBMC(t, ns, "vm")
	poll.True(t, "the Pxe boot", func() bool { return len(cluster.Boots(ns, "vm")) == 1 })
	if got := cluster.Boots(ns, "vm")[0]; got != machine.BootPxe {
		t.Fatalf("booted %s with a Once Pxe override", got)
	}
	if _, ok := getVM(t, ns, "vm").Annotations["virtmetal.io/boot-override"]; !ok {
		t.Fatalf("override state vanished with no BMC running")
	}

	second := mustMachine(t, kubevirttest.StartBackend(t, cluster.Config, ns, "vm", kubevirt.Options{}), "vm")
	poll.True(t, "restored boot order", func() bool {
		vm := getVM(t, ns, "vm")
		_, pending := vm.Annotations["virtmetal.io/boot-override"]
		return !pending && vm.Spec.Template.Spec.Domain.Devices.Interfaces[0].BootOrder == nil
	})
	cleared := machine.BootOverride{Target: machine.BootNone, Enabled: machine.BootDisabled, Mode: machine.BootModeUEFI}
	if got, err := second.BootOverride(ctx); err != nil || got != cleared {
		t.Fatalf("BootOverride = %+v, %v; want %+v", got, err, cleared)
	}
	if err := second.Reset(ctx, machine.ResetForceRestart); err != nil {
		t.Fatalf("ForceRestart: %v", err)
	}
	poll.True(t, "the second boot", func() bool { return len(cluster.Boots(ns, "vm")) == 2 })
	if got := cluster.Boots(ns, "vm")[1]; got != machine.BootHdd {
		t.Fatalf("second boot from %s, want the disk", got)
	}
}

// TestVMDeleted: a deleted VM is ErrNotFound, as is any other machine ID.
func TestVMDeleted(t *testing.T) {
	ns := cluster.NewNamespace(t)
	vm := newVM(t, ns, "vm", nil)
	b := kubevirttest.StartBackend(t, cluster.Config, ns, "vm", kubevirt.Options{})
	m := mustMachine(t, b, "vm")
	ctx := t.Context()
	if _, err := b.Machine(ctx, "other"); !errors.Is(err, machine.ErrNotFound) {
		t.Fatalf("Machine(other) = %v, want ErrNotFound", err)
	}
	if err := cluster.Client.Delete(ctx, vm); err != nil {
		t.Fatalf("deleting VM: %v", err)
	}
	poll.True(t, "ErrNotFound", func() bool {
		_, err := m.PowerState(ctx)
		return errors.Is(err, machine.ErrNotFound)
	})
	calls := map[string]func() error{
		"Machine":   func() error { _, err := b.Machine(ctx, "vm"); return err },
		"Inventory": func() error { _, err := m.Inventory(ctx); return err },
		"Reset":     func() error { return m.Reset(ctx, machine.ResetOn) },
		"SetBootOverride": func() error {
			return m.SetBootOverride(ctx, machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce, Mode: machine.BootModeUEFI})
		},
		"InsertMedia": func() error { return m.InsertMedia(ctx, "http://images.example/a.iso") },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if err := call(); !errors.Is(err, machine.ErrNotFound) {
				t.Fatalf("error = %v, want ErrNotFound", err)
			}
		})
	}
}

// TestInventory covers instancetypes (namespaced and cluster), CPU
// topology, BIOS firmware and MACs/IPs from the VMI status.
func TestInventory(t *testing.T) {
	ctx := t.Context()
	ns := cluster.NewNamespace(t)
	it := &instancetypev1beta1.VirtualMachineInstancetype{
		ObjectMeta: metav1.ObjectMeta{Name: "large", Namespace: ns},
		Spec: instancetypev1beta1.VirtualMachineInstancetypeSpec{
			CPU: instancetypev1beta1.CPUInstancetype{Guest: 8}, Memory: instancetypev1beta1.MemoryInstancetype{Guest: resource.MustParse("16Gi")},
		},
	}
	cit := &instancetypev1beta1.VirtualMachineClusterInstancetype{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-small"},
		Spec: instancetypev1beta1.VirtualMachineInstancetypeSpec{
			CPU: instancetypev1beta1.CPUInstancetype{Guest: 1}, Memory: instancetypev1beta1.MemoryInstancetype{Guest: resource.MustParse("512Mi")},
		},
	}
	for _, obj := range []client.Object{it, cit} {
		if err := cluster.Client.Create(ctx, obj); err != nil {
			t.Fatalf("creating %T: %v", obj, err)
		}
	}
	withInstancetype := func(kind, name string) func(*kubevirtv1.VirtualMachine) {
		return func(vm *kubevirtv1.VirtualMachine) {
			vm.Spec.Instancetype = &kubevirtv1.InstancetypeMatcher{Kind: kind, Name: name}
			vm.Spec.Template.Spec.Domain.CPU = nil
			vm.Spec.Template.Spec.Domain.Memory = nil
		}
	}
	amd64 := func(sockets, cores, threads int, model string) machine.CPU {
		return machine.CPU{Sockets: sockets, Cores: cores, Threads: threads, Model: model, Architecture: machine.ArchAMD64}
	}
	tests := []struct {
		name      string
		change    func(*kubevirtv1.VirtualMachine)
		cpu       machine.CPU
		memoryMiB int64
		mode      machine.BootMode
	}{
		{"domain cores and guest memory", nil, amd64(1, 2, 1, ""), 1024, machine.BootModeUEFI},
		{"namespaced instancetype", withInstancetype("VirtualMachineInstancetype", "large"), amd64(8, 1, 1, ""), 16384, machine.BootModeUEFI},
		{"cluster instancetype", withInstancetype("", cit.Name), amd64(1, 1, 1, ""), 512, machine.BootModeUEFI},
		{"sockets cores threads, BIOS", func(vm *kubevirtv1.VirtualMachine) {
			vm.Spec.Template.Spec.Domain.CPU = &kubevirtv1.CPU{Sockets: 2, Cores: 3, Threads: 2, Model: "host-passthrough"}
			vm.Spec.Template.Spec.Domain.Firmware.Bootloader = &kubevirtv1.Bootloader{BIOS: &kubevirtv1.BIOS{}}
		}, amd64(2, 3, 2, "host-passthrough"), 1024, machine.BootModeLegacy},
		{"CPU limit as sockets, arm64", func(vm *kubevirtv1.VirtualMachine) {
			vm.Spec.Template.Spec.Architecture = "arm64"
			vm.Spec.Template.Spec.Domain.CPU = nil
			vm.Spec.Template.Spec.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2500m")}
			vm.Spec.Template.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
		}, machine.CPU{Sockets: 3, Cores: 1, Threads: 1, Architecture: machine.ArchARM64}, 1024, machine.BootModeUEFI},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := "vm-" + string(rune('a'+i))
			newVM(t, ns, name, tc.change)
			b := kubevirttest.StartBackend(t, cluster.Config, ns, name, kubevirt.Options{})
			m := mustMachine(t, b, name)
			inv, err := m.Inventory(ctx)
			if err != nil {
				t.Fatalf("Inventory: %v", err)
			}
			if inv.CPU != tc.cpu || inv.MemoryMiB != tc.memoryMiB {
				t.Errorf("CPU %+v memory %d MiB; want %+v and %d", inv.CPU, inv.MemoryMiB, tc.cpu, tc.memoryMiB)
			}
			if inv.UUID != "5ad0b6e3-6a5d-4c7e-9f1b-3c2d1e0f9a8b" || inv.SerialNumber != "serial-"+name || inv.Name != name {
				t.Errorf("identity: %+v", inv)
			}
			if len(inv.NICs) != 1 || inv.NICs[0].MAC != "02:ab:cd:00:00:01" {
				t.Errorf("NICs = %+v", inv.NICs)
			}
			if want := []machine.Disk{{Name: "root", Kind: machine.DiskKindDisk, Bus: machine.DiskBusVirtio}}; !slices.Equal(inv.Disks, want) {
				t.Errorf("Disks = %+v, want %+v", inv.Disks, want)
			}
			caps := m.Capabilities()
			// KubeVirt's SeaBIOS is amd64's only.
			wantModes := []machine.BootMode{machine.BootModeUEFI, machine.BootModeLegacy}
			if inv.CPU.Architecture != machine.ArchAMD64 {
				wantModes = []machine.BootMode{tc.mode}
			}
			if !slices.Equal(caps.BootModes, wantModes) || caps.SupportsReset(machine.ResetNmi) {
				t.Errorf("capabilities %+v", caps)
			}
			if o, err := m.BootOverride(ctx); err != nil || o.Mode != tc.mode {
				t.Errorf("BootOverride = %+v, %v; want mode %s", o, err, tc.mode)
			}
		})
	}
	t.Run("MAC and IPs from the VMI status", func(t *testing.T) {
		newVM(t, ns, "dynamic", func(vm *kubevirtv1.VirtualMachine) {
			vm.Spec.Template.Spec.Domain.Devices.Interfaces[0].MacAddress = ""
		})
		m := mustMachine(t, kubevirttest.StartBackend(t, cluster.Config, ns, "dynamic", kubevirt.Options{}), "dynamic")
		if err := m.Reset(ctx, machine.ResetOn); err != nil {
			t.Fatalf("Reset: %v", err)
		}
		waitPower(t, m, machine.PowerOn)
		err := cluster.UpdateVMIStatus(ctx, ns, "dynamic", func(status *kubevirtv1.VirtualMachineInstanceStatus) {
			status.Interfaces = []kubevirtv1.VirtualMachineInstanceNetworkInterface{{
				Name: "default", MAC: "02:00:00:AA:BB:CC", IP: "10.0.0.7", IPs: []string{"10.0.0.7", "fd00::7"},
			}}
		})
		if err != nil {
			t.Fatalf("update VMI status: %v", err)
		}
		poll.True(t, "NIC from status", func() bool {
			inv, err := m.Inventory(ctx)
			return err == nil && len(inv.NICs) == 1 && inv.NICs[0].MAC == "02:00:00:aa:bb:cc" && slices.Equal(inv.NICs[0].IPs, []string{"10.0.0.7", "fd00::7"})
		})
	})
	t.Run("missing instancetype is an error, not a missing machine", func(t *testing.T) {
		newVM(t, ns, "orphan", withInstancetype("VirtualMachineInstancetype", "gone"))
		m := mustMachine(t, kubevirttest.StartBackend(t, cluster.Config, ns, "orphan", kubevirt.Options{}), "orphan")
		if _, err := m.Inventory(ctx); err == nil || errors.Is(err, machine.ErrNotFound) {
			t.Fatalf("Inventory = %v; want a plain error", err)
		}
	})
}

// proxy is a TCP relay the test can cut and restore, to make the API server
// unreachable for one client only.
type proxy struct {
	target string
	addr   string

	mu       sync.Mutex
	listener net.Listener
	conns    []net.Conn
	// dropping: bytes are read and thrown away, connections stay open, as
	// through a firewall that drops packets without a reset.
	dropping bool
}

func newProxy(t *testing.T, target string) *proxy {
	p := &proxy{target: target}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	p.addr = l.Addr().String()
	p.serve(l)
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) serve(l net.Listener) {
	p.mu.Lock()
	p.listener = l
	p.mu.Unlock()
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", p.target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(p.gate(out), in); out.Close() }()
			go func() { _, _ = io.Copy(p.gate(in), out); in.Close() }()
		}
	}()
}

// gate passes writes to w until the proxy starts dropping.
func (p *proxy) gate(w io.Writer) io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		p.mu.Lock()
		dropping := p.dropping
		p.mu.Unlock()
		if dropping {
			return len(b), nil
		}
		return w.Write(b)
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// blackhole drops all traffic from now on, on open and new connections.
func (p *proxy) blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropping = true
}

// cut closes the listener and every relayed connection.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.listener != nil {
		p.listener.Close()
		p.listener = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// restore listens on the same address again.
func (p *proxy) restore(t *testing.T) {
	l, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatalf("re-listen on %s: %v", p.addr, err)
	}
	p.serve(l)
}

// TestAPIServerUnavailable: while the API server cannot be reached, reads
// and writes fail with ErrUnavailable; afterwards the backend recovers by
// itself and sees what changed meanwhile.
func TestAPIServerUnavailable(t *testing.T) {
	ctx := t.Context()
	ns := cluster.NewNamespace(t)
	newVM(t, ns, "vm", nil)
	apiHost, err := url(cluster.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, apiHost)
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Host = "https://" + p.addr
	b := kubevirttest.StartBackend(t, cfg, ns, "vm", kubevirt.Options{RequestTimeout: time.Second})
	m := mustMachine(t, b, "vm")
	waitPower(t, m, machine.PowerOff)

	p.cut()
	poll.True(t, "ErrUnavailable from PowerState", func() bool {
		_, err := m.PowerState(ctx)
		return errors.Is(err, machine.ErrUnavailable)
	})
	for _, r := range []machine.ResetType{machine.ResetOn, machine.ResetForceOff} {
		if err := m.Reset(ctx, r); !errors.Is(err, machine.ErrUnavailable) {
			t.Fatalf("Reset(%s) while cut: %v, want ErrUnavailable", r, err)
		}
	}
	if _, err := b.Machine(ctx, "vm"); !errors.Is(err, machine.ErrUnavailable) {
		t.Fatalf("Machine while cut: %v, want ErrUnavailable", err)
	}
	// Meanwhile someone powers the VM on.
	powerOnBehindTheBMC(t, ns, "vm")

	p.restore(t)
	waitPower(t, m, machine.PowerOn)
	if err := m.Reset(ctx, machine.ResetForceOff); err != nil {
		t.Fatalf("Reset after recovery: %v", err)
	}
	waitPower(t, m, machine.PowerOff)

	t.Run("never reachable", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		closed := l.Addr().String()
		l.Close()
		cfg := rest.CopyConfig(cluster.Config)
		cfg.Host = "https://" + closed
		b, err := kubevirt.New(cfg, ns, "vm", kubevirt.Options{RequestTimeout: 500 * time.Millisecond})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = b.Start(runCtx) }()
		defer func() { cancel(); <-done }()
		start := time.Now()
		if _, err := b.Machine(ctx, "vm"); !errors.Is(err, machine.ErrUnavailable) {
			t.Fatalf("Machine = %v, want ErrUnavailable", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("ErrUnavailable took %v", d)
		}
	})
}

func url(host string) (string, error) {
	u, _, err := rest.DefaultServerURL(host, "", metav1.SchemeGroupVersion, true)
	if err != nil {
		return "", err
	}
	return u.Host, nil
}

// TestRBAC runs the backend as the ServiceAccount deploy/bmc grants: it
// works on its VM (forced power through the fallback: envtest serves no
// virt-api) and cannot touch another one, subresources included.
func TestRBAC(t *testing.T) {
	ctx := t.Context()
	ns := cluster.NewNamespace(t)
	newVM(t, ns, "mine", nil)
	newVM(t, ns, "other", nil)
	objs, err := bmc.RBACObjects(bmc.RBACParams{Namespace: ns, VMName: "mine"})
	if err != nil {
		t.Fatalf("RBACObjects: %v", err)
	}
	for _, obj := range objs {
		if err := cluster.Client.Create(ctx, obj); err != nil {
			t.Fatalf("creating %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
	cfg, err := cluster.ConfigFor(kubetest.ServiceAccountUser(ns, "bmc-mine"), "system:serviceaccounts", "system:serviceaccounts:"+ns)
	if err != nil {
		t.Fatalf("ConfigFor: %v", err)
	}
	m := mustMachine(t, kubevirttest.StartBackend(t, cfg, ns, "mine", kubevirt.Options{}), "mine")

	if _, err := m.Inventory(ctx); err != nil {
		t.Fatalf("Inventory: %v", err)
	}
	if err := m.SetBootOverride(ctx, machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce, Mode: machine.BootModeUEFI}); err != nil {
		t.Fatalf("SetBootOverride: %v", err)
	}
	for _, r := range []machine.ResetType{machine.ResetOn, machine.ResetForceRestart, machine.ResetForceOff} {
		if err := m.Reset(ctx, r); err != nil {
			t.Fatalf("Reset(%s): %v", r, err)
		}
		if r == machine.ResetOn {
			waitPower(t, m, machine.PowerOn)
		}
	}
	waitPower(t, m, machine.PowerOff)
	if err := m.InsertMedia(ctx, "http://images.example/installer.iso"); err != nil {
		t.Fatalf("InsertMedia: %v", err)
	}
	if err := m.EjectMedia(ctx); err != nil {
		t.Fatalf("EjectMedia: %v", err)
	}

	as, err := client.New(cfg, client.Options{Scheme: kubescheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	// The VM is off: virt-api refuses to stop or restart it (409), which it
	// does only for a request the API server authorized.
	forcing := subresourceClient(t, cfg)
	force := func(vm, subresource string) error {
		return forcing.Put().Namespace(ns).Resource("virtualmachines").Name(vm).SubResource(subresource).Body([]byte(`{}`)).Do(ctx).Error()
	}
	for _, subresource := range []string{"stop", "restart"} {
		if err := force("mine", subresource); !apierrors.IsConflict(err) {
			t.Fatalf("%s on its own VM: %v, want virt-api's Conflict (authorized)", subresource, err)
		}
	}
	other := client.ObjectKey{Namespace: ns, Name: "other"}
	forbidden := map[string]func() error{
		"stop other VM":    func() error { return force("other", "stop") },
		"restart other VM": func() error { return force("other", "restart") },
		"get other VM":     func() error { return as.Get(ctx, other, &kubevirtv1.VirtualMachine{}) },
		"update other VM": func() error {
			vm := getVM(t, ns, "other")
			vm.Spec.RunStrategy = new(kubevirtv1.RunStrategyAlways)
			return as.Update(ctx, vm)
		},
		"delete other VMI": func() error {
			vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other"}}
			return as.Delete(ctx, vmi)
		},
		"list all VMs":  func() error { return as.List(ctx, &kubevirtv1.VirtualMachineList{}, client.InNamespace(ns)) },
		"delete own VM": func() error { return as.Delete(ctx, getVM(t, ns, "mine")) },
		"create a VM": func() error {
			return as.Create(ctx, &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "new"}})
		},
		"get own VM elsewhere": func() error {
			return as.Get(ctx, client.ObjectKey{Namespace: "default", Name: "mine"}, &kubevirtv1.VirtualMachine{})
		},
	}
	for name, call := range forbidden {
		t.Run(name, func(t *testing.T) {
			if err := call(); !apierrors.IsForbidden(err) {
				t.Fatalf("error = %v, want Forbidden", err)
			}
		})
	}
}

// subresourceClient calls KubeVirt's subresource API group as cfg's user.
func subresourceClient(t *testing.T, cfg *rest.Config) rest.Interface {
	t.Helper()
	cfg = rest.CopyConfig(cfg)
	cfg.APIPath = "/apis"
	cfg.GroupVersion = &schema.GroupVersion{Group: kubevirtv1.SubresourceGroupName, Version: "v1"}
	cfg.NegotiatedSerializer = clientgoscheme.Codecs.WithoutConversion()
	c, err := rest.RESTClientFor(cfg)
	if err != nil {
		t.Fatalf("REST client: %v", err)
	}
	return c
}

// TestMediaWithoutCDI: on a cluster without CDI the machine says it has no
// virtual media, and InsertMedia fails at once with ErrNotSupported.
func TestMediaWithoutCDI(t *testing.T) {
	bare, err := kubetest.Start(kubetest.Options{WithoutCDI: true})
	if err != nil {
		t.Fatalf("envtest without CDI: %v", err)
	}
	t.Cleanup(func() { _ = bare.Stop() })
	vm := newVMObject("default", "vm")
	if err := bare.Client.Create(t.Context(), vm); err != nil {
		t.Fatalf("creating VM: %v", err)
	}
	m := mustMachine(t, kubevirttest.StartBackend(t, bare.Config, "default", "vm", kubevirt.Options{}), "vm")
	if m.Capabilities().VirtualMedia {
		t.Fatalf("VirtualMedia capability without CDI")
	}
	err = m.InsertMedia(t.Context(), "http://images.example/installer.iso")
	if !errors.Is(err, machine.ErrNotSupported) || !strings.Contains(err.Error(), "DataVolume") {
		t.Fatalf("InsertMedia = %v, want ErrNotSupported naming the missing DataVolume API", err)
	}
	if media, err := m.VirtualMedia(t.Context()); err != nil || media.Inserted {
		t.Fatalf("VirtualMedia = %+v, %v", media, err)
	}
}

// TestBlackholedAPIServerDetected: an API server whose traffic is silently
// dropped (no reset, connections stay open) is noticed within the probe
// interval plus the request timeout: the backend is no longer ready and
// reads fail with ErrUnavailable instead of hanging.
func TestBlackholedAPIServerDetected(t *testing.T) {
	ctx := t.Context()
	ns := cluster.NewNamespace(t)
	newVM(t, ns, "vm", nil)
	apiHost, err := url(cluster.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, apiHost)
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Host = "https://" + p.addr
	const timeout, probe = 500 * time.Millisecond, 200 * time.Millisecond
	b := kubevirttest.StartBackend(t, cfg, ns, "vm", kubevirt.Options{RequestTimeout: timeout, ProbeInterval: probe})
	m := mustMachine(t, b, "vm")
	poll.True(t, "ready", func() bool { return b.Ready() == nil })

	p.blackhole()
	start := time.Now()
	for b.Ready() == nil {
		if time.Since(start) > 4*(timeout+probe) {
			t.Fatalf("still ready %v after the API server went silent", time.Since(start))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !errors.Is(b.Ready(), machine.ErrUnavailable) {
		t.Fatalf("Ready = %v, want ErrUnavailable", b.Ready())
	}
	readStart := time.Now()
	if _, err := m.PowerState(ctx); !errors.Is(err, machine.ErrUnavailable) {
		t.Fatalf("PowerState through a blackhole: %v, want ErrUnavailable", err)
	}
	if d := time.Since(readStart); d > 2*timeout+time.Second {
		t.Fatalf("PowerState took %v, want about the request timeout", d)
	}
}
