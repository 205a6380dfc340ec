package kubevirt

import (
	"context"
	"net"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	kubevirtv1 "kubevirt.io/api/core/v1"
	instancetypev1beta1 "kubevirt.io/api/instancetype/v1beta1"

	"github.com/virtmetal/virtmetal/machine"
)

// Inventory describes the VM from its spec, its instancetype and the VMI's
// status (MACs KubeVirt assigned, IPs).
func (m *Machine) Inventory(ctx context.Context) (machine.Inventory, error) {
	vm, vmi, err := m.b.read(ctx)
	if err != nil {
		return machine.Inventory{}, err
	}
	it, err := m.b.instancetype(ctx, vm.Spec.Instancetype)
	if err != nil {
		return machine.Inventory{}, err
	}
	spec := &vm.Spec.Template.Spec
	inv := machine.Inventory{
		Name:         vm.Name,
		Manufacturer: "KubeVirt",
		Model:        "VirtualMachine",
		CPU:          cpuOf(spec, it),
		MemoryMiB:    memoryMiB(spec, it),
		NICs:         nics(spec, vmi),
		Disks:        disks(vm),
	}
	if fw := spec.Domain.Firmware; fw != nil {
		inv.UUID = strings.ToLower(string(fw.UUID))
		inv.SerialNumber = fw.Serial
	}
	if inv.UUID == "" && vmi != nil && vmi.Spec.Domain.Firmware != nil {
		inv.UUID = strings.ToLower(string(vmi.Spec.Domain.Firmware.UUID))
	}
	if inv.UUID == "" {
		// virt-controller writes firmware.uuid into every VM it syncs.
		return machine.Inventory{}, machine.Errorf(machine.ErrUnavailable, "VirtualMachine %s/%s has no firmware UUID yet", vm.Namespace, vm.Name)
	}
	return inv, nil
}

// cpuOf is the topology virt-launcher gives the guest: an instancetype's
// guest CPUs as sockets (KubeVirt's default preferSockets; preferences are
// not read), else the domain's sockets, cores and threads (each 1 when
// unset), else as many sockets as the CPU limit or request, rounded up.
func cpuOf(spec *kubevirtv1.VirtualMachineInstanceSpec, it *instancetypev1beta1.VirtualMachineInstancetypeSpec) machine.CPU {
	c := machine.CPU{Sockets: 1, Cores: 1, Threads: 1, Architecture: architecture(spec.Architecture)}
	cpu := spec.Domain.CPU
	if cpu != nil {
		c.Model = cpu.Model
	}
	switch {
	case it != nil && it.CPU.Guest > 0:
		c.Sockets = int(it.CPU.Guest)
		if it.CPU.Model != nil && c.Model == "" {
			c.Model = *it.CPU.Model
		}
	case cpu != nil && cpu.Sockets+cpu.Cores+cpu.Threads > 0:
		c.Sockets, c.Cores, c.Threads = int(max(cpu.Sockets, 1)), int(max(cpu.Cores, 1)), int(max(cpu.Threads, 1))
	default:
		resources := spec.Domain.Resources
		q, ok := resources.Limits[corev1.ResourceCPU]
		if !ok {
			q, ok = resources.Requests[corev1.ResourceCPU]
		}
		if ok {
			c.Sockets = int(max(q.Value(), 1)) // Value rounds up
		}
	}
	return c
}

// architecture maps the VM's spec.architecture; a VM that names none runs
// on the cluster's default, amd64 unless KubeVirt is configured otherwise.
func architecture(arch string) machine.Architecture {
	if arch == "" {
		return machine.ArchAMD64
	}
	return machine.Architecture(arch)
}

func memoryMiB(spec *kubevirtv1.VirtualMachineInstanceSpec, it *instancetypev1beta1.VirtualMachineInstancetypeSpec) int64 {
	var q *resource.Quantity
	switch {
	case spec.Domain.Memory != nil && spec.Domain.Memory.Guest != nil:
		q = spec.Domain.Memory.Guest
	case it != nil && !it.Memory.Guest.IsZero():
		q = &it.Memory.Guest
	default:
		if r, ok := spec.Domain.Resources.Requests[corev1.ResourceMemory]; ok {
			q = &r
		} else if r, ok := spec.Domain.Resources.Limits[corev1.ResourceMemory]; ok {
			q = &r
		}
	}
	if q == nil {
		return 0
	}
	return q.Value() >> 20
}

// nics lists the interfaces with the MAC from the spec, else the one the
// VMI reports, and the VMI's IPs.
func nics(spec *kubevirtv1.VirtualMachineInstanceSpec, vmi *kubevirtv1.VirtualMachineInstance) []machine.NIC {
	status := map[string]kubevirtv1.VirtualMachineInstanceNetworkInterface{}
	if vmi != nil {
		for _, s := range vmi.Status.Interfaces {
			status[s.Name] = s
		}
	}
	var out []machine.NIC
	for _, iface := range spec.Domain.Devices.Interfaces {
		s := status[iface.Name]
		mac := iface.MacAddress
		if mac == "" {
			mac = s.MAC
		}
		ips := s.IPs
		if len(ips) == 0 && s.IP != "" {
			ips = []string{s.IP}
		}
		out = append(out, machine.NIC{Name: iface.Name, MAC: normalizeMAC(mac), IPs: ips, Link: linkState(iface, s, vmi)})
	}
	return out
}

// linkState is what virt-handler reports of the guest's link, else what
// the spec asks for (an interface set down), else Down for a VM that has no
// running instance: nothing to carry a link.
func linkState(iface kubevirtv1.Interface, status kubevirtv1.VirtualMachineInstanceNetworkInterface, vmi *kubevirtv1.VirtualMachineInstance) machine.LinkState {
	switch {
	case status.LinkState == "up":
		return machine.LinkUp
	case status.LinkState == "down", iface.State == kubevirtv1.InterfaceStateLinkDown:
		return machine.LinkDown
	case vmi == nil || vmi.Status.Phase != kubevirtv1.Running:
		return machine.LinkDown
	}
	return ""
}

func normalizeMAC(mac string) string {
	if hw, err := net.ParseMAC(mac); err == nil {
		return hw.String()
	}
	return strings.ToLower(mac)
}

// disks lists disks and CD-ROMs with the capacity the spec states (a
// DataVolume template's request, for a dataVolume volume or a claim the
// template makes, or an emptyDisk's capacity), else 0, and their bus.
func disks(vm *kubevirtv1.VirtualMachine) []machine.Disk {
	spec := &vm.Spec.Template.Spec
	capacity := map[string]int64{}
	templates := map[string]int64{}
	for _, t := range vm.Spec.DataVolumeTemplates {
		switch {
		case t.Spec.Storage != nil:
			templates[t.Name] = storageRequest(t.Spec.Storage.Resources.Requests)
		case t.Spec.PVC != nil:
			templates[t.Name] = storageRequest(t.Spec.PVC.Resources.Requests)
		}
	}
	for _, v := range spec.Volumes {
		switch {
		case v.DataVolume != nil:
			capacity[v.Name] = templates[v.DataVolume.Name]
		case v.PersistentVolumeClaim != nil:
			capacity[v.Name] = templates[v.PersistentVolumeClaim.ClaimName]
		case v.EmptyDisk != nil:
			capacity[v.Name] = v.EmptyDisk.Capacity.Value()
		}
	}
	var out []machine.Disk
	for _, d := range spec.Domain.Devices.Disks {
		disk := machine.Disk{Name: d.Name, Kind: machine.DiskKindDisk, CapacityBytes: capacity[d.Name]}
		switch {
		case d.CDRom != nil:
			disk.Kind = machine.DiskKindCdrom
			disk.Bus = machine.DiskBus(d.CDRom.Bus)
		case d.Disk != nil:
			disk.Bus = machine.DiskBus(d.Disk.Bus)
		case d.LUN != nil:
			disk.Bus = machine.DiskBus(d.LUN.Bus)
		}
		out = append(out, disk)
	}
	return out
}

func storageRequest(requests corev1.ResourceList) int64 {
	q, ok := requests[corev1.ResourceStorage]
	if !ok {
		return 0
	}
	return q.Value()
}
