package kubevirt

import (
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/machine"
)

func TestPowerState(t *testing.T) {
	manual, rerun := kubevirtv1.RunStrategyManual, poweredOn
	tests := []struct {
		name     string
		strategy *kubevirtv1.VirtualMachineRunStrategy
		status   kubevirtv1.VirtualMachinePrintableStatus
		vmi      *kubevirtv1.VirtualMachineInstance
		want     machine.PowerState
	}{
		{"running", &always, kubevirtv1.VirtualMachineStatusRunning, nil, machine.PowerOn},
		{"stopped", &halted, kubevirtv1.VirtualMachineStatusStopped, nil, machine.PowerOff},
		{"starting", &always, kubevirtv1.VirtualMachineStatusStarting, nil, machine.PoweringOn},
		{"provisioning", &always, kubevirtv1.VirtualMachineStatusProvisioning, nil, machine.PoweringOn},
		// A media import shows a halted VM as Provisioning too.
		{"halted while its media imports", &halted, kubevirtv1.VirtualMachineStatusProvisioning, nil, machine.PowerOff},
		{"halted, its media import failed", &halted, kubevirtv1.VirtualMachineStatusDataVolumeError, nil, machine.PowerOff},
		{"halted while its volume binds, VMI still stopping", &halted, kubevirtv1.VirtualMachineStatusWaitingForVolumeBinding,
			&kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Running}}, machine.PoweringOff},
		{"stopping", &halted, kubevirtv1.VirtualMachineStatusStopping, nil, machine.PoweringOff},
		{"terminating", &halted, kubevirtv1.VirtualMachineStatusTerminating, nil, machine.PoweringOff},
		{"paused", &always, kubevirtv1.VirtualMachineStatusPaused, nil, machine.Paused},
		{"asked on, status not there yet", &always, kubevirtv1.VirtualMachineStatusStopped, nil, machine.PoweringOn},
		{"asked off, status not there yet", &halted, kubevirtv1.VirtualMachineStatusRunning, nil, machine.PoweringOff},
		{"paused and asked off", &halted, kubevirtv1.VirtualMachineStatusPaused, nil, machine.PoweringOff},
		{"manual follows the status", &manual, kubevirtv1.VirtualMachineStatusRunning, nil, machine.PowerOn},
		{"VMI being deleted in a restart", &always, kubevirtv1.VirtualMachineStatusRunning,
			&kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &metav1.Time{Time: time.Now()}}}, machine.PoweringOff},
		{"no status, VMI running", &manual, "", &kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Running}}, machine.PowerOn},
		{"no status, VMI scheduling", &manual, "", &kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Scheduling}}, machine.PoweringOn},
		{"no status, VMI succeeded", &manual, "", &kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Succeeded}}, machine.PowerOff},
		{"no status, no VMI", &manual, "", nil, machine.PowerOff},
		// virt-controller's status lags the VMI's under load.
		{"starting, VMI already running", &always, kubevirtv1.VirtualMachineStatusStarting, runningVMI(false), machine.PowerOn},
		{"starting after On, VMI already running", &rerun, kubevirtv1.VirtualMachineStatusStarting, runningVMI(false), machine.PowerOn},
		{"stopped, VMI already running", &always, kubevirtv1.VirtualMachineStatusStopped, runningVMI(false), machine.PowerOn},
		{"stopped, VMI already running, asked off", &halted, kubevirtv1.VirtualMachineStatusStopped, runningVMI(false), machine.PoweringOff},
		{"stopped, VMI scheduling", &always, kubevirtv1.VirtualMachineStatusStopped,
			&kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Scheduling}}, machine.PoweringOn},
		{"starting, VMI already running and paused", &always, kubevirtv1.VirtualMachineStatusStarting, runningVMI(true), machine.Paused},
		{"starting, VMI scheduled", &always, kubevirtv1.VirtualMachineStatusStarting,
			&kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Scheduled}}, machine.PoweringOn},
		{"no status, VMI running and paused", &manual, "", runningVMI(true), machine.Paused},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vm := &kubevirtv1.VirtualMachine{Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: tc.strategy}}
			vm.Status.PrintableStatus = tc.status
			if got := powerState(vm, tc.vmi); got != tc.want {
				t.Fatalf("powerState = %s, want %s", got, tc.want)
			}
		})
	}
}

// TestPowerStateAfterOn: under the strategy On writes (RerunOnFailure), a
// VM reads Off once virt-controller has settled it off (the guest powered
// off) and PoweringOn while a start is still to come.
func TestPowerStateAfterOn(t *testing.T) {
	succeeded := &kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Succeeded}}
	failed := &kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Failed}}
	tests := []struct {
		name       string
		actedOn    kubevirtv1.VirtualMachineRunStrategy // status.runStrategy
		startAsked bool
		vmi        *kubevirtv1.VirtualMachineInstance
		want       machine.PowerState
	}{
		{"virt-controller not there yet", halted, false, nil, machine.PoweringOn},
		{"the guest powered off", poweredOn, false, nil, machine.PowerOff},
		{"the guest powered off, VMI not removed yet", poweredOn, false, succeeded, machine.PowerOff},
		{"start requested after the guest powered off", poweredOn, true, nil, machine.PoweringOn},
		{"the VMI failed: KubeVirt restarts it", poweredOn, false, failed, machine.PoweringOn},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vm := &kubevirtv1.VirtualMachine{Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: &poweredOn}}
			vm.Status.PrintableStatus = kubevirtv1.VirtualMachineStatusStopped
			vm.Status.RunStrategy = tc.actedOn
			if tc.startAsked {
				vm.Status.StateChangeRequests = []kubevirtv1.VirtualMachineStateChangeRequest{{Action: kubevirtv1.StartRequest}}
			}
			if got := powerState(vm, tc.vmi); got != tc.want {
				t.Fatalf("powerState = %s, want %s", got, tc.want)
			}
		})
	}
}

func order(n uint) *uint { return &n }

// bootOrders lists the disks' then the interfaces' bootOrder (0 for none).
func bootOrders(spec *kubevirtv1.VirtualMachineInstanceSpec) []uint {
	var out []uint
	for _, d := range spec.Domain.Devices.Disks {
		out = append(out, deref(d.BootOrder))
	}
	for _, n := range spec.Domain.Devices.Interfaces {
		out = append(out, deref(n.BootOrder))
	}
	return out
}

func deref(p *uint) uint {
	if p == nil {
		return 0
	}
	return *p
}

func testSpec(withCdrom bool) *kubevirtv1.VirtualMachineInstanceSpec {
	spec := &kubevirtv1.VirtualMachineInstanceSpec{}
	devices := &spec.Domain.Devices
	devices.Disks = []kubevirtv1.Disk{
		{Name: "root", BootOrder: order(5), DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{}}},
		{Name: "data"},
	}
	if withCdrom {
		devices.Disks = append(devices.Disks, kubevirtv1.Disk{Name: "cd", DiskDevice: kubevirtv1.DiskDevice{CDRom: &kubevirtv1.CDRomTarget{}}})
	}
	devices.Interfaces = []kubevirtv1.Interface{{Name: "pxe"}, {Name: "other", BootOrder: order(9)}}
	return spec
}

func TestOrderFor(t *testing.T) {
	tests := []struct {
		name   string
		cdrom  bool
		target machine.BootTarget
		want   []uint // disks (root, data[, cd]) then interfaces (pxe, other)
		err    error
	}{
		{"pxe: first NIC, disks, cdrom", true, machine.BootPxe, []uint{2, 3, 4, 1, 0}, nil},
		{"hdd: disks, first NIC, cdrom", true, machine.BootHdd, []uint{1, 2, 4, 3, 0}, nil},
		{"cd: cdrom, disks, first NIC", true, machine.BootCd, []uint{2, 3, 1, 4, 0}, nil},
		{"cd without a cdrom", false, machine.BootCd, nil, machine.ErrConflict},
		{"uefi http", false, machine.BootUefiHttp, nil, machine.ErrNotSupported},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := testSpec(tc.cdrom)
			err := orderFor(spec, tc.target)
			if !errors.Is(err, tc.err) {
				t.Fatalf("orderFor error = %v, want %v", err, tc.err)
			}
			if err != nil {
				return
			}
			if got := bootOrders(spec); !equal(got, tc.want) {
				t.Fatalf("bootOrders = %v, want %v", got, tc.want)
			}
			if got := firstBootDevice(spec); got != tc.target {
				t.Fatalf("firstBootDevice = %s, want %s", got, tc.target)
			}
		})
	}
}

func equal(a, b []uint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestFirstBootDeviceDefaults(t *testing.T) {
	tests := []struct {
		name string
		spec kubevirtv1.VirtualMachineInstanceSpec
		want machine.BootTarget
	}{
		{"first disk without bootOrder", *testSpecNoOrders(false), machine.BootHdd},
		{"first disk is a cdrom", kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{
			Disks: []kubevirtv1.Disk{{Name: "cd", DiskDevice: kubevirtv1.DiskDevice{CDRom: &kubevirtv1.CDRomTarget{}}}},
		}}}, machine.BootCd},
		{"diskless", kubevirtv1.VirtualMachineInstanceSpec{}, machine.BootPxe},
		{"lowest order wins", *testSpec(false), machine.BootHdd},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := firstBootDevice(&tc.spec); got != tc.want {
				t.Fatalf("firstBootDevice = %s, want %s", got, tc.want)
			}
		})
	}
}

func testSpecNoOrders(cdrom bool) *kubevirtv1.VirtualMachineInstanceSpec {
	spec := testSpec(cdrom)
	spec.Domain.Devices.Disks[0].BootOrder = nil
	spec.Domain.Devices.Interfaces[1].BootOrder = nil
	return spec
}

// TestOverrideLifecycle: set, re-set, consume and clear on a VM object.
func TestOverrideLifecycle(t *testing.T) {
	vm := &kubevirtv1.VirtualMachine{Spec: kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: *testSpec(false)}}}
	before := bootOrders(&vm.Spec.Template.Spec)
	running := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{UID: "old"}, Spec: *testSpec(false)}
	once := machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce}

	if changed, err := applyOverride(vm, running, once); err != nil || !changed {
		t.Fatalf("applyOverride = %v, %v", changed, err)
	}
	if changed, err := applyOverride(vm, running, once); err != nil || changed {
		t.Fatalf("applying the same override again changed the VM (%v, %v)", changed, err)
	}
	if onceConsumed(vm, running) {
		t.Fatalf("the VMI running when the override was set consumed it")
	}
	fromTemplateBefore := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{UID: "raced"}, Spec: *testSpec(false)}
	if onceConsumed(vm, fromTemplateBefore) {
		t.Fatalf("a new VMI still booting from disk consumed a Pxe override")
	}
	booted := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{UID: "new"}, Spec: *vm.Spec.Template.Spec.DeepCopy()}
	if !consumeOnce(vm, booted) {
		t.Fatalf("a VMI booted from the NIC did not consume the override")
	}
	if got := bootOrders(&vm.Spec.Template.Spec); !equal(got, before) {
		t.Fatalf("bootOrders after consumption = %v, want the original %v", got, before)
	}
	if len(vm.Annotations) != 0 {
		t.Fatalf("annotations left: %v", vm.Annotations)
	}

	continuous := machine.BootOverride{Target: machine.BootHdd, Enabled: machine.BootContinuous}
	if _, err := applyOverride(vm, nil, continuous); err != nil {
		t.Fatal(err)
	}
	if consumeOnce(vm, booted) {
		t.Fatalf("a Continuous override was consumed")
	}
	if changed, err := applyOverride(vm, nil, machine.BootOverride{Target: machine.BootNone, Enabled: machine.BootDisabled}); err != nil || !changed {
		t.Fatalf("clearing = %v, %v", changed, err)
	}
	if got := bootOrders(&vm.Spec.Template.Spec); !equal(got, before) {
		t.Fatalf("bootOrders after clearing = %v, want %v", got, before)
	}
}

func TestAPIError(t *testing.T) {
	b := &Backend{namespace: "ns", vmName: "vm"}
	gr := kubevirtv1.Resource("virtualmachines")
	tests := []struct {
		name string
		err  error
		want error // nil: a plain error, no sentinel
	}{
		{"not found", apiNotFound(gr), machine.ErrNotFound},
		{"timeout", apiTimeout(), machine.ErrUnavailable},
		{"connection refused", errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), machine.ErrUnavailable},
		{"forbidden", apiForbidden(gr), nil},
		{"sentinel passes through", machine.Errorf(machine.ErrConflict, "x"), machine.ErrConflict},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := b.apiError(tc.err, "doing")
			if tc.want == nil {
				if got == nil || isMachineError(got) {
					t.Fatalf("apiError = %v, want a plain error", got)
				}
				return
			}
			if !errors.Is(got, tc.want) {
				t.Fatalf("apiError = %v, want %v", got, tc.want)
			}
		})
	}
}

func apiNotFound(gr schema.GroupResource) error { return apierrors.NewNotFound(gr, "vm") }
func apiTimeout() error                         { return apierrors.NewTimeoutError("slow", 1) }
func apiForbidden(gr schema.GroupResource) error {
	return apierrors.NewForbidden(gr, "vm", errors.New("no"))
}

func runningVMI(paused bool) *kubevirtv1.VirtualMachineInstance {
	vmi := &kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Running}}
	if paused {
		vmi.Status.Conditions = []kubevirtv1.VirtualMachineInstanceCondition{{Type: kubevirtv1.VirtualMachineInstancePaused, Status: corev1.ConditionTrue}}
	}
	return vmi
}
