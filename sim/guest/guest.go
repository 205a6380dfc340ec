// Package guest simulates what runs inside a KubeVirt VM, which cannot run
// here: the guest's firmware and the hardware it reports. Each time a VM
// instance's guest boots (where the node runs it: realkubevirt's node
// stand-in tells each boot), it boots from its device of lowest bootOrder
// (BootDevice); when that is a NIC it asks the network for a boot, with the
// NIC MACs and SMBIOS the instance's spec gives (NetBootOf); and dmidecode
// inside it answers with that SMBIOS (Dmidecode). Nothing boots for real:
// no DHCP, TFTP or kernel, no disk contents, no guest OS.
package guest

import (
	"strings"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/machine"
)

// BootDevice is what the "hardware" boots: the device with the lowest
// bootOrder; without any, the first disk; without disks, the network.
func BootDevice(spec *kubevirtv1.VirtualMachineInstanceSpec) machine.BootTarget {
	var lowest *uint
	target := machine.BootTarget("")
	for _, d := range spec.Domain.Devices.Disks {
		if d.BootOrder != nil && (lowest == nil || *d.BootOrder < *lowest) {
			lowest, target = d.BootOrder, diskKind(d)
		}
	}
	for _, n := range spec.Domain.Devices.Interfaces {
		if n.BootOrder != nil && (lowest == nil || *n.BootOrder < *lowest) {
			lowest, target = n.BootOrder, machine.BootPxe
		}
	}
	switch {
	case target != "":
		return target
	case len(spec.Domain.Devices.Disks) > 0:
		return diskKind(spec.Domain.Devices.Disks[0])
	default:
		return machine.BootPxe
	}
}

func diskKind(d kubevirtv1.Disk) machine.BootTarget {
	if d.CDRom != nil {
		return machine.BootCd
	}
	return machine.BootHdd
}

// NetBoot is one VM instance's network boot: what a PXE server learns of
// the guest, and the SMBIOS its hardware reports.
type NetBoot struct {
	Namespace, Name string // the VM's (and its instance's)
	// MACs are the instance's interface MACs as its spec gives them, in
	// order; interfaces without one are left out.
	MACs []string
	// Serial and UUID are the firmware's SMBIOS serial and system UUID;
	// "" when the spec has none.
	Serial, UUID string
	// ChassisAsset is the SMBIOS chassis asset tag (spec chassis.asset),
	// where virtmetal puts the VM's machine proof; "" when the spec has
	// none. Only the guest reads it: it is in no boot request.
	ChassisAsset string
}

// NetBootOf is the network boot the instance makes.
func NetBootOf(vmi *kubevirtv1.VirtualMachineInstance) NetBoot {
	b := NetBoot{Namespace: vmi.Namespace, Name: vmi.Name}
	for _, iface := range vmi.Spec.Domain.Devices.Interfaces {
		if iface.MacAddress != "" {
			b.MACs = append(b.MACs, iface.MacAddress)
		}
	}
	if fw := vmi.Spec.Domain.Firmware; fw != nil {
		b.Serial, b.UUID = fw.Serial, string(fw.UUID)
	}
	if chassis := vmi.Spec.Domain.Chassis; chassis != nil {
		b.ChassisAsset = chassis.Asset
	}
	return b
}

// Dmidecode is a dmidecode for the guest's hardware, as a shell script:
// -s system-manufacturer, system-serial-number, system-uuid and
// chassis-asset-tag answer as KubeVirt's SMBIOS does (manufacturer
// "KubeVirt" unless the cluster configures another; dmidecode's
// placeholders where the spec has no serial, UUID or asset tag); any other
// keyword fails as dmidecode does.
func (b NetBoot) Dmidecode() string {
	serial, uuid, asset := "Not Specified", "Not Settable", "Not Specified"
	if b.Serial != "" {
		serial = b.Serial
	}
	if b.UUID != "" {
		uuid = b.UUID
	}
	if b.ChassisAsset != "" {
		asset = b.ChassisAsset
	}
	return "#!/bin/sh\n[ \"$1\" = -s ] || exit 2\ncase \"$2\" in\n" +
		"system-manufacturer) echo 'KubeVirt' ;;\n" +
		"system-serial-number) echo '" + shellSafe(serial) + "' ;;\n" +
		"system-uuid) echo '" + shellSafe(uuid) + "' ;;\n" +
		"chassis-asset-tag) echo '" + shellSafe(asset) + "' ;;\n" +
		"*) echo \"Invalid string keyword: $2\" >&2; exit 2 ;;\nesac\n"
}

// shellSafe keeps a value inside single quotes.
func shellSafe(s string) string { return strings.ReplaceAll(s, "'", "") }
