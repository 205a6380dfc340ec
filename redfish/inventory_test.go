package redfish_test

import (
	"net/http"
	"reflect"
	"testing"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/redfish"
)

// TestInventoryResources: the collections follow the backend's topology and
// disks, and what the backend does not know is left out, not "" or 0.
func TestInventoryResources(t *testing.T) {
	f := newFixture(t, func(_ *redfish.Config, b *stubBackend) {
		b.replaced["vm-0"] = &stubMachine{Machine: b.Get("vm-0"), decorate: func(inv *machine.Inventory) {
			inv.CPU = machine.CPU{Sockets: 2, Cores: 3, Threads: 2, Architecture: machine.ArchARM64}
			inv.Disks = []machine.Disk{
				{Name: "root", Kind: machine.DiskKindDisk, Bus: machine.DiskBusSCSI},
				{Name: "cd", Kind: machine.DiskKindCdrom},
				{Name: "data", Kind: machine.DiskKindDisk, Bus: machine.DiskBusSATA, CapacityBytes: 1 << 30},
			}
		}}
		b.replaced["vm-1"] = &stubMachine{Machine: b.Get("vm-1"), decorate: func(inv *machine.Inventory) {
			inv.CPU.Architecture = machine.ArchS390X
		}}
	})
	storage, drives := system0+"/Storage/1", "/redfish/v1/Chassis/vm-0/Drives"
	tests := []struct {
		path string
		want map[string]any // properties and their values; nil: left out
	}{
		{system0, map[string]any{
			"ProcessorSummary": map[string]any{"Count": 2.0, "CoreCount": 6.0, "LogicalProcessorCount": 12.0},
			"Processors":       map[string]any{"@odata.id": system0 + "/Processors"},
			"Memory":           map[string]any{"@odata.id": system0 + "/Memory"},
			"Storage":          map[string]any{"@odata.id": system0 + "/Storage"},
		}},
		{system0 + "/Processors", map[string]any{"Members@odata.count": 2.0}},
		{system0 + "/Processors/2", map[string]any{
			"ProcessorArchitecture": "ARM", "InstructionSet": "ARM-A64", "TotalCores": 3.0, "TotalThreads": 6.0, "Model": nil,
		}},
		{"/redfish/v1/Systems/vm-1/Processors/1", map[string]any{"ProcessorArchitecture": nil, "InstructionSet": nil, "ProcessorType": "CPU"}},
		{system0 + "/Memory/1", map[string]any{"CapacityMiB": 4096.0, "MemoryDeviceType": nil}},
		// The CD-ROM is no Drive; the drives keep their disks' numbers.
		{storage, map[string]any{"Drives@odata.count": 2.0, "Controllers": map[string]any{"@odata.id": storage + "/Controllers"}}},
		{drives, map[string]any{"Members": []any{
			map[string]any{"@odata.id": drives + "/1"}, map[string]any{"@odata.id": drives + "/3"},
		}}},
		{"/redfish/v1/Chassis/vm-0", map[string]any{"Drives": map[string]any{"@odata.id": drives}}},
		{drives + "/1", map[string]any{"Name": "root", "Protocol": nil, "CapacityBytes": nil, "MediaType": "HDD"}},
		{drives + "/3", map[string]any{"Protocol": "SATA", "CapacityBytes": float64(1 << 30)}},
		// One controller a bus, the CD-ROM's (unknown) not among them.
		{storage + "/Controllers", map[string]any{"Members": []any{
			map[string]any{"@odata.id": storage + "/Controllers/scsi"}, map[string]any{"@odata.id": storage + "/Controllers/sata"},
		}}},
		{storage + "/Controllers/scsi", map[string]any{"SupportedDeviceProtocols": nil, "SupportedControllerProtocols": []any{"PCIe"}, "SupportedRAIDTypes": []any{}}},
		{storage + "/Controllers/sata", map[string]any{"SupportedDeviceProtocols": []any{"SATA"}}},
		// The root disk's size is unknown: a Drive, but no Volume.
		{drives + "/1", map[string]any{"Links": map[string]any{"Volumes": []any{}, "Volumes@odata.count": 0.0}}},
		{storage + "/Volumes", map[string]any{"Members": []any{
			map[string]any{"@odata.id": storage + "/Volumes/3"},
		}}},
		{storage + "/Volumes/3", map[string]any{"Name": "data", "CapacityBytes": float64(1 << 30),
			"Links": map[string]any{"Drives": []any{map[string]any{"@odata.id": drives + "/3"}}, "Drives@odata.count": 1.0}}},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			res := f.do(asAdmin("GET", tt.path, ""))
			if res.status != http.StatusOK {
				t.Fatalf("status %d: %s", res.status, res.raw)
			}
			for property, want := range tt.want {
				got, ok := res.json[property]
				if want == nil && ok {
					t.Errorf("%s = %v, want it left out", property, got)
				} else if want != nil && !reflect.DeepEqual(got, want) {
					t.Errorf("%s = %#v, want %#v", property, got, want)
				}
			}
		})
	}
}

func TestInventoryMembersNotFound(t *testing.T) {
	f := newFixture(t, nil)
	for _, path := range []string{
		system0 + "/Processors/0",
		system0 + "/Processors/2", // the default machine has one socket
		system0 + "/Processors/01",
		system0 + "/Memory/2",
		system0 + "/Storage/2",
		system0 + "/Storage/1/Drives/1",     // drives live under the chassis
		"/redfish/v1/Chassis/vm-0/Drives/2", // the CD-ROM is no Drive
		"/redfish/v1/Chassis/vm-0/Drives/3",
		system0 + "/Storage/1/Controllers/usb", // no disk on that bus
		system0 + "/Storage/1/Controllers/ide",
		"/redfish/v1/Chassis/vm-0/Drives/x",
		"/redfish/v1/Chassis/vm-9/Drives",
		system0 + "/Storage/1/Volumes/2", // the CD-ROM holds no volume
		"/redfish/v1/Systems/vm-9/Processors",
	} {
		t.Run(path, func(t *testing.T) {
			if res := f.do(asAdmin("GET", path, "")); res.status != http.StatusNotFound {
				t.Errorf("status %d, want 404: %s", res.status, res.raw)
			}
		})
	}
}
