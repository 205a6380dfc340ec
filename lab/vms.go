package lab

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

// CreateNamespace creates a namespace opted in to virtmetal.
func (l *Lab) CreateNamespace(ctx context.Context, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{enrolmentLabel: "true"}}}
	if err := l.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// VMOptions shape a lab VM.
type VMOptions struct {
	// IPMI asks for a BMC that serves IPMI too: the lab writes the
	// VirtualMachineBMC itself before the VM, as a user would.
	IPMI bool
	// Halted creates the VM powered off.
	Halted bool
	// OldScriptAddress enlists the VM as the commissioning script before
	// issue 23 did: its power address https://<vm>.<namespace>.<domain>,
	// which the lab's MaaS (the newest shape) stores. The reconciler must
	// rewrite it to the bare form.
	OldScriptAddress bool
	// DiskBoot puts the disk first in the boot order: the VM never boots
	// from the network, so MaaS never sees it.
	DiskBoot bool
}

// CreateVM creates a VM as a user of MaaS would: its NIC first in the boot
// order (it PXE boots), a disk second, powered on unless Halted. Its MAC,
// serial and firmware UUID are left to virtmetal and KubeVirt.
func (l *Lab) CreateVM(ctx context.Context, vm maas.VMRef, opts VMOptions) error {
	if opts.OldScriptAddress {
		l.rack.UseOldScriptAddress(vm)
	}
	if opts.IPMI {
		on := true
		bmc := &v1beta1.VirtualMachineBMC{
			ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: vm.Name},
			Spec:       v1beta1.VirtualMachineBMCSpec{VMName: vm.Name, IPMI: v1beta1.IPMISpec{Enabled: &on}},
		}
		if err := l.Client.Create(ctx, bmc); err != nil {
			return fmt.Errorf("creating the VirtualMachineBMC: %w", err)
		}
	}
	nicOrder, diskOrder := uint(1), uint(2)
	if opts.DiskBoot {
		nicOrder, diskOrder = 2, 1
	}
	strategy := kubevirtv1.RunStrategyAlways
	if opts.Halted {
		strategy = kubevirtv1.RunStrategyHalted
	}
	memory := resource.MustParse("2Gi")
	var noGrace int64
	object := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: vm.Name},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &strategy,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{
					CPU:    &kubevirtv1.CPU{Cores: 2},
					Memory: &kubevirtv1.Memory{Guest: &memory},
					Devices: kubevirtv1.Devices{
						Interfaces: []kubevirtv1.Interface{{
							Name: "pxe", BootOrder: &nicOrder,
							InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}},
						}},
						Disks: []kubevirtv1.Disk{{Name: "root", BootOrder: &diskOrder, DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}}},
					},
					Resources: kubevirtv1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: memory}},
				},
				TerminationGracePeriodSeconds: &noGrace,
				Networks:                      []kubevirtv1.Network{{Name: "pxe", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
				Volumes:                       []kubevirtv1.Volume{{Name: "root", VolumeSource: kubevirtv1.VolumeSource{EmptyDisk: &kubevirtv1.EmptyDiskSource{Capacity: resource.MustParse("20Gi")}}}},
			}},
		},
	}
	if err := l.Client.Create(ctx, object); err != nil {
		return err
	}
	l.progress.record(vm, StepVMCreated, fmt.Sprintf("runStrategy %s", strategy))
	// The admission webhook stamps the identity into the VM as created;
	// record it now, before the VM can boot (watchProgress notices VMs the
	// reconcile loop stamps later).
	if mac, serial, proof := identity(object); mac != "" && serial != "" && proof {
		l.progress.record(vm, StepIdentity, fmt.Sprintf("MAC %s, serial %s, a machine proof", mac, serial))
	}
	return nil
}

// StartVM powers a halted VM on, as its user would.
func (l *Lab) StartVM(ctx context.Context, vm maas.VMRef) error {
	return l.setRunStrategy(ctx, vm, kubevirtv1.RunStrategyAlways)
}

// StopVM powers a VM off, as its user would.
func (l *Lab) StopVM(ctx context.Context, vm maas.VMRef) error {
	return l.setRunStrategy(ctx, vm, kubevirtv1.RunStrategyHalted)
}

func (l *Lab) setRunStrategy(ctx context.Context, vm maas.VMRef, strategy kubevirtv1.VirtualMachineRunStrategy) error {
	patch := fmt.Appendf(nil, `{"spec":{"runStrategy":%q}}`, strategy)
	return l.Client.Patch(ctx, &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: vm.Name}},
		rawMerge(patch))
}

// WaitVMI waits until the VM's instance is Running (running true) or gone
// (false), as the lab's watches see it.
func (l *Lab) WaitVMI(ctx context.Context, vm maas.VMRef, running bool) error {
	return Poll(ctx, func() (bool, error) {
		var vmi kubevirtv1.VirtualMachineInstance
		err := l.watched.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name}, &vmi)
		if apierrors.IsNotFound(err) {
			return !running, nil
		}
		return running && vmi.Status.Phase == kubevirtv1.Running, err
	})
}

// WaitIdentity waits until the controller has stamped the VM's MAC and
// serial.
func (l *Lab) WaitIdentity(ctx context.Context, vm maas.VMRef) error {
	return Poll(ctx, func() (bool, error) {
		var got kubevirtv1.VirtualMachine
		if err := l.Client.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name}, &got); err != nil {
			return false, client404(err)
		}
		mac, serial, proof := identity(&got)
		return mac != "" && serial != "" && proof, nil
	})
}

// Machine is the VM's MaaS machine: the one whose power address names its
// BMC; ok is false while there is none.
func (l *Lab) Machine(vm maas.VMRef) (m maassim.Machine, ok bool) {
	for _, candidate := range l.MaaS.Machines() {
		if ref, claims := maas.ParseBMCAddress(candidate.PowerParameters["power_address"], l.Domain); claims && ref == vm {
			return candidate, true
		}
	}
	return maassim.Machine{}, false
}

// WaitReady waits until every VM's machine is Ready in MaaS.
func (l *Lab) WaitReady(ctx context.Context, vms ...maas.VMRef) error {
	err := Poll(ctx, func() (bool, error) {
		for _, vm := range vms {
			if _, ready := l.TimeToReady(vm); !ready {
				return false, nil
			}
		}
		return true, nil
	})
	if err == nil {
		return nil
	}
	// Where each VM still waiting stopped, and what the lab last said.
	var waiting []string
	for _, vm := range vms {
		if _, ready := l.TimeToReady(vm); ready {
			continue
		}
		last := "nothing"
		if steps := l.Timeline(vm); len(steps) > 0 {
			last = steps[len(steps)-1].Step.String()
		}
		status := "no machine"
		if m, ok := l.Machine(vm); ok {
			status = fmt.Sprintf("machine %s status %d", m.SystemID, m.Status)
		}
		waiting = append(waiting, fmt.Sprintf("%s (last step %s, %s)", vm, last, status))
	}
	return fmt.Errorf("%w: %d of %d not Ready: %s; the lab's last messages: %q",
		err, len(waiting), len(vms), strings.Join(waiting, ", "), l.recent.all())
}

// Poll calls done every 50 ms until it is true, fails, or ctx ends.
func Poll(ctx context.Context, done func() (bool, error)) error {
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// client404 lets a poll go on while an object does not exist yet.
func client404(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func rawMerge(patch []byte) client.Patch { return client.RawPatch(types.MergePatchType, patch) }
