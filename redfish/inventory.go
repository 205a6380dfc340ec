package redfish

import (
	"net/http"
	"slices"
	"strconv"

	"github.com/virtmetal/virtmetal/machine"
)

// The inventory collections show what the backend says the machine is and
// nothing more: a property the backend does not know is left out.

func processorsPath(systemID string) string { return systemPath(systemID) + "/Processors" }
func memoryPath(systemID string) string     { return systemPath(systemID) + "/Memory" }
func storagePath(systemID string) string    { return systemPath(systemID) + "/Storage/" + storageID }

// Drives live under the chassis: Redfish deprecates them under Storage.
func drivesPath(chassisID string) string { return chassisPath(chassisID) + "/Drives" }
func drivePath(chassisID string, n int) string {
	return drivesPath(chassisID) + "/" + strconv.Itoa(n)
}
func volumePath(systemID string, n int) string {
	return storagePath(systemID) + "/Volumes/" + strconv.Itoa(n)
}

// storageID names the one storage subsystem each system shows, as
// SimpleStorage does; memoryModuleID the one memory module.
const (
	storageID      = "1"
	memoryModuleID = "1"
)

// member resolves a 1-based member number of a path variable to an index
// below n; anything else is a 404 about resourceType.
func member(c *call, idVar, resourceType string, n int) (int, error) {
	id := c.vars[idVar]
	i, err := strconv.Atoi(id)
	if err != nil || i < 1 || i > n || strconv.Itoa(i) != id {
		return 0, newError(http.StatusNotFound, msgResourceNotFound, resourceType, id)
	}
	return i - 1, nil
}

// processorArchitectures maps each architecture to Redfish's
// ProcessorArchitecture and InstructionSet; s390x has neither.
var processorArchitectures = map[machine.Architecture][2]string{
	machine.ArchAMD64:   {"x86", "x86-64"},
	machine.ArchARM64:   {"ARM", "ARM-A64"},
	machine.ArchPPC64LE: {"Power", "PowerISA"},
}

// processorSummary is ComputerSystem's ProcessorSummary: Count is the
// Processor members, one per socket.
func processorSummary(cpu machine.CPU) map[string]any {
	summary := map[string]any{
		"Count":                 cpu.Sockets,
		"CoreCount":             cpu.Sockets * cpu.Cores,
		"LogicalProcessorCount": cpu.LogicalProcessors(),
	}
	if cpu.Model != "" {
		summary["Model"] = cpu.Model
	}
	return summary
}

func (s *Server) getProcessors(c *call) (result, error) {
	m, inv, err := s.systemInventory(c)
	if err != nil {
		return result{}, err
	}
	members := make([]string, inv.CPU.Sockets)
	for i := range members {
		members[i] = processorsPath(m.ID()) + "/" + strconv.Itoa(i+1)
	}
	return result{body: collection(typeProcessorCollection, processorsPath(m.ID()), "Processor Collection", members)}, nil
}

func (s *Server) getProcessor(c *call) (result, error) {
	m, inv, err := s.systemInventory(c)
	if err != nil {
		return result{}, err
	}
	i, err := member(c, "processorID", "Processor", inv.CPU.Sockets)
	if err != nil {
		return result{}, err
	}
	id := strconv.Itoa(i + 1)
	body := resource(typeProcessor, processorsPath(m.ID())+"/"+id, id, "Processor "+id)
	body["ProcessorType"] = "CPU"
	if arch, ok := processorArchitectures[inv.CPU.Architecture]; ok {
		body["ProcessorArchitecture"] = arch[0]
		body["InstructionSet"] = arch[1]
	}
	if inv.CPU.Model != "" {
		body["Model"] = inv.CPU.Model
	}
	body["TotalCores"] = inv.CPU.Cores
	body["TotalThreads"] = inv.CPU.Cores * inv.CPU.Threads
	body["Status"] = statusOK()
	return result{body: body}, nil
}

// The guest's memory is one module: KubeVirt states guest NUMA nodes only
// as a mapping of the host's, which the VM's spec does not count.
func (s *Server) getMemoryCollection(c *call) (result, error) {
	m, inv, err := s.systemInventory(c)
	if err != nil {
		return result{}, err
	}
	var members []string
	if inv.MemoryMiB > 0 {
		members = append(members, memoryPath(m.ID())+"/"+memoryModuleID)
	}
	return result{body: collection(typeMemoryCollection, memoryPath(m.ID()), "Memory Collection", members)}, nil
}

func (s *Server) getMemory(c *call) (result, error) {
	m, inv, err := s.systemInventory(c)
	if err != nil {
		return result{}, err
	}
	if id := c.vars["memoryID"]; id != memoryModuleID || inv.MemoryMiB <= 0 {
		return result{}, newError(http.StatusNotFound, msgResourceNotFound, "Memory", id)
	}
	body := resource(typeMemory, memoryPath(m.ID())+"/"+memoryModuleID, memoryModuleID, "Guest memory")
	body["CapacityMiB"] = inv.MemoryMiB
	body["Status"] = statusOK()
	return result{body: body}, nil
}

func (s *Server) getStorageCollection(c *call) (result, error) {
	m, err := s.machineFor(c, "systemID", "ComputerSystem")
	if err != nil {
		return result{}, err
	}
	return result{body: collection(typeStorageCollection, systemPath(m.ID())+"/Storage", "Storage Collection", []string{storagePath(m.ID())})}, nil
}

// storageInventory is systemInventory for the paths under Storage/1.
func (s *Server) storageInventory(c *call) (machine.Machine, machine.Inventory, error) {
	m, inv, err := s.systemInventory(c)
	if err != nil {
		return nil, machine.Inventory{}, err
	}
	if id := c.vars["storageID"]; id != storageID {
		return nil, machine.Inventory{}, newError(http.StatusNotFound, msgResourceNotFound, "Storage", id)
	}
	return m, inv, nil
}

func (s *Server) getStorage(c *call) (result, error) {
	m, inv, err := s.storageInventory(c)
	if err != nil {
		return result{}, err
	}
	drives := drivePaths(m.ID(), inv.Disks)
	body := resource(typeStorage, storagePath(m.ID()), storageID, "Virtual disk controller")
	body["Drives"] = links(drives...)
	body["Drives@odata.count"] = len(drives)
	body["Volumes"] = link(storagePath(m.ID()) + "/Volumes")
	body["Controllers"] = link(controllersPath(m.ID()))
	body["Status"] = statusOK()
	return result{body: body}, nil
}

func controllersPath(systemID string) string { return storagePath(systemID) + "/Controllers" }

// storageController is what the guest sees of one disk bus: the PCIe
// device its disks hang on (an AHCI controller for SATA, virtio-scsi for
// SCSI, xHCI for USB; virtio disks are PCIe functions of their own, shown
// as one controller for their bus, as SimpleStorage shows one for all).
type storageController struct {
	name            string
	deviceProtocols []string // what its disks speak; empty when Redfish has no name for it
}

// storageControllers are keyed by bus, which is also the member's Id.
var storageControllers = map[machine.DiskBus]storageController{
	machine.DiskBusVirtio: {"VirtIO block", []string{"PCIe"}},
	machine.DiskBusSATA:   {"SATA (AHCI)", []string{"SATA"}},
	machine.DiskBusSCSI:   {"VirtIO SCSI", nil},
	machine.DiskBusUSB:    {"USB (xHCI)", []string{"USB"}},
}

// controllerBuses lists the buses the machine's disks use, each once, in
// the order of the disks.
func controllerBuses(disks []machine.Disk) []machine.DiskBus {
	var buses []machine.DiskBus
	for _, d := range disks {
		if _, known := storageControllers[d.Bus]; known && !slices.Contains(buses, d.Bus) {
			buses = append(buses, d.Bus)
		}
	}
	return buses
}

func (s *Server) getStorageControllers(c *call) (result, error) {
	m, inv, err := s.storageInventory(c)
	if err != nil {
		return result{}, err
	}
	var members []string
	for _, bus := range controllerBuses(inv.Disks) {
		members = append(members, controllersPath(m.ID())+"/"+string(bus))
	}
	return result{body: collection(typeStorageControllerColl, controllersPath(m.ID()), "Storage Controller Collection", members)}, nil
}

func (s *Server) getStorageController(c *call) (result, error) {
	m, inv, err := s.storageInventory(c)
	if err != nil {
		return result{}, err
	}
	bus := machine.DiskBus(c.vars["controllerID"])
	if !slices.Contains(controllerBuses(inv.Disks), bus) {
		return result{}, newError(http.StatusNotFound, msgResourceNotFound, "StorageController", string(bus))
	}
	ctrl := storageControllers[bus]
	body := resource(typeStorageController, controllersPath(m.ID())+"/"+string(bus), string(bus), ctrl.name)
	body["SupportedControllerProtocols"] = []string{"PCIe"}
	if ctrl.deviceProtocols != nil {
		body["SupportedDeviceProtocols"] = ctrl.deviceProtocols
	}
	// No RAID: each disk is its own volume.
	body["SupportedRAIDTypes"] = []string{}
	body["Status"] = statusOK()
	return result{body: body}, nil
}

// driveProtocols maps the buses Redfish's Protocol names: a virtio disk
// is a PCIe function of its own; SCSI (virtio-scsi) has no value, so its
// drives leave Protocol out.
var driveProtocols = map[machine.DiskBus]string{
	machine.DiskBusVirtio: "PCIe",
	machine.DiskBusSATA:   "SATA",
	machine.DiskBusUSB:    "USB",
}

// isDrive says whether a disk is a Drive: hard disks are; a CD-ROM is not,
// since Drive's MediaType has no value for optical media (it stays in
// SimpleStorage and VirtualMedia). Drives keep the disk's number, so a
// drive's URI does not move when a CD-ROM comes or goes before it.
func isDrive(d machine.Disk) bool { return d.Kind == machine.DiskKindDisk }

// isVolume says whether a disk is also a Volume: every drive of known size
// is one volume of its own (no RAID between them), numbered as its drive.
// One of unknown size (a containerDisk) is none: a Volume's capacity is what
// clients read it for, and sushy's sum of them fails on a missing one.
func isVolume(d machine.Disk) bool { return isDrive(d) && d.CapacityBytes > 0 }

// chassisInventory is systemInventory for the paths under a chassis: a VM
// is one system in one chassis, both named after it.
func (s *Server) chassisInventory(c *call) (machine.Machine, machine.Inventory, error) {
	return s.inventoryOf(c, "chassisID", "Chassis")
}

func (s *Server) getDrives(c *call) (result, error) {
	m, inv, err := s.chassisInventory(c)
	if err != nil {
		return result{}, err
	}
	return result{body: collection(typeDriveCollection, drivesPath(m.ID()), "Drive Collection", drivePaths(m.ID(), inv.Disks))}, nil
}

func drivePaths(chassisID string, disks []machine.Disk) []string {
	var paths []string
	for i, d := range disks {
		if isDrive(d) {
			paths = append(paths, drivePath(chassisID, i+1))
		}
	}
	return paths
}

func (s *Server) getDrive(c *call) (result, error) {
	m, inv, err := s.chassisInventory(c)
	if err != nil {
		return result{}, err
	}
	i, err := member(c, "driveID", "Drive", len(inv.Disks))
	if err == nil && !isDrive(inv.Disks[i]) {
		err = newError(http.StatusNotFound, msgResourceNotFound, "Drive", c.vars["driveID"])
	}
	if err != nil {
		return result{}, err
	}
	d := inv.Disks[i]
	body := resource(typeDrive, drivePath(m.ID(), i+1), strconv.Itoa(i+1), d.Name)
	if d.CapacityBytes > 0 {
		body["CapacityBytes"] = d.CapacityBytes
	}
	if p, ok := driveProtocols[d.Bus]; ok {
		body["Protocol"] = p
	}
	// What the guest's OS sees: QEMU reports no rotation rate for its
	// disks, so Linux (lsblk ROTA), and MaaS's commissioning after it,
	// count them as rotational.
	body["MediaType"] = "HDD"
	body["Status"] = statusOK()
	var volumes []string
	if isVolume(d) {
		volumes = append(volumes, volumePath(m.ID(), i+1))
	}
	body["Links"] = map[string]any{"Volumes": links(volumes...), "Volumes@odata.count": len(volumes)}
	return result{body: body}, nil
}

// Volumes are numbered as the drives that hold them, so Volumes/2 is on
// Drives/2.
func (s *Server) getVolumes(c *call) (result, error) {
	m, inv, err := s.storageInventory(c)
	if err != nil {
		return result{}, err
	}
	var members []string
	for i, d := range inv.Disks {
		if isVolume(d) {
			members = append(members, volumePath(m.ID(), i+1))
		}
	}
	body := collection(typeVolumeCollection, storagePath(m.ID())+"/Volumes", "Volume Collection", members)
	// Volumes cannot be created or deleted (POST is not offered), so no
	// apply time can be asked for either.
	body["@Redfish.OperationApplyTimeSupport"] = map[string]any{
		"@odata.type":     "#" + typeSettings.versionedNamespace() + ".OperationApplyTimeSupport",
		"SupportedValues": []string{},
	}
	return result{body: body}, nil
}

func (s *Server) getVolume(c *call) (result, error) {
	m, inv, err := s.storageInventory(c)
	if err != nil {
		return result{}, err
	}
	i, err := member(c, "volumeID", "Volume", len(inv.Disks))
	if err == nil && !isVolume(inv.Disks[i]) {
		err = newError(http.StatusNotFound, msgResourceNotFound, "Volume", c.vars["volumeID"])
	}
	if err != nil {
		return result{}, err
	}
	d := inv.Disks[i]
	body := resource(typeVolume, volumePath(m.ID(), i+1), strconv.Itoa(i+1), d.Name)
	body["CapacityBytes"] = d.CapacityBytes
	body["Status"] = statusOK()
	body["Links"] = map[string]any{"Drives": links(drivePath(m.ID(), i+1)), "Drives@odata.count": 1}
	return result{body: body}, nil
}
