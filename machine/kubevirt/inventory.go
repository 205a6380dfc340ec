package kubevirt

import (
	"context"
	"maps"
	"net"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
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
		Disks:        disks(vm, func(claim string) int64 { return m.b.claimSize(ctx, claim) }),
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
// template makes, or an emptyDisk's capacity), else, for a disk on a claim
// the VM names but does not make, what claimSize says of it, else 0; and
// their bus.
func disks(vm *kubevirtv1.VirtualMachine, claimSize func(claim string) int64) []machine.Disk {
	spec := &vm.Spec.Template.Spec
	capacity := map[string]int64{}
	templates := templateSizes(vm)
	claims := referencedClaims(vm)
	for _, v := range spec.Volumes {
		switch {
		case v.EmptyDisk != nil:
			capacity[v.Name] = v.EmptyDisk.Capacity.Value()
		case claimOf(v) != "":
			size, ok := templates[claimOf(v)]
			if _, referenced := claims[v.Name]; !ok && referenced {
				size = claimSize(claimOf(v))
			}
			capacity[v.Name] = size
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

// templateSizes are the requests of the VM's DataVolume templates, by the
// name of the DataVolume and its claim.
func templateSizes(vm *kubevirtv1.VirtualMachine) map[string]int64 {
	sizes := map[string]int64{}
	for _, t := range vm.Spec.DataVolumeTemplates {
		switch {
		case t.Spec.Storage != nil:
			sizes[t.Name] = storageRequest(t.Spec.Storage.Resources.Requests)
		case t.Spec.PVC != nil:
			sizes[t.Name] = storageRequest(t.Spec.PVC.Resources.Requests)
		}
	}
	return sizes
}

// claimOf is the PersistentVolumeClaim a volume is: a persistentVolumeClaim
// volume's claim, or a dataVolume volume's DataVolume's, which CDI names
// after the DataVolume; "" for other volumes.
func claimOf(v kubevirtv1.Volume) string {
	switch {
	case v.PersistentVolumeClaim != nil:
		return v.PersistentVolumeClaim.ClaimName
	case v.DataVolume != nil:
		return v.DataVolume.Name
	}
	return ""
}

// referencedClaims maps the VM's volumes that its disks (not CD-ROMs: the
// media DataVolume is one) read from a claim its DataVolume templates do not
// make, to that claim. A name that cannot be a claim's is left out: no
// such claim exists, and the Role could not name it.
func referencedClaims(vm *kubevirtv1.VirtualMachine) map[string]string {
	if vm.Spec.Template == nil {
		return nil
	}
	spec := &vm.Spec.Template.Spec
	templates := templateSizes(vm)
	onDisk := map[string]bool{}
	for _, d := range spec.Domain.Devices.Disks {
		onDisk[d.Name] = d.CDRom == nil
	}
	claims := map[string]string{}
	for _, v := range spec.Volumes {
		claim := claimOf(v)
		if _, made := templates[claim]; claim == "" || made || !onDisk[v.Name] || len(validation.IsDNS1123Subdomain(claim)) > 0 {
			continue
		}
		claims[v.Name] = claim
	}
	return claims
}

// ReferencedClaims are the PersistentVolumeClaims of the VM's namespace
// whose size Inventory reads: those its disks name and its DataVolume
// templates do not make. A BMC's Role grants get on exactly these names,
// so it reads no other claim (bmc-controller renders them, and again when
// the VM's volumes change).
func ReferencedClaims(vm *kubevirtv1.VirtualMachine) []string {
	return slices.Compact(slices.Sorted(maps.Values(referencedClaims(vm))))
}

func storageRequest(requests corev1.ResourceList) int64 {
	q, ok := requests[corev1.ResourceStorage]
	if !ok {
		return 0
	}
	return q.Value()
}
