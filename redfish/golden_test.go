package redfish_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/redfish"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.json from the current output")

// TestGoldenBodies pins the exact JSON of each resource type. Run with
// -update after an intended change and review the diff.
func TestGoldenBodies(t *testing.T) {
	get := func(path string) request { return asAdmin("GET", path, "") }
	tests := []struct {
		name       string
		setup      func(*fixture)
		req        request
		wantStatus int
	}{
		{"service_root", nil, get("/redfish/v1/"), 200},
		{"systems", nil, get("/redfish/v1/Systems"), 200},
		{"system", func(f *fixture) {
			f.do(asAdmin("PATCH", system0, `{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once"}}`))
		}, get(system0), 200},
		{"ethernet_interface", nil, get(system0 + "/EthernetInterfaces/default"), 200},
		{"simple_storage", nil, get(system0 + "/SimpleStorage/1"), 200},
		{"processors", nil, get(system0 + "/Processors"), 200},
		{"processor", nil, get(system0 + "/Processors/1"), 200},
		{"memory_collection", nil, get(system0 + "/Memory"), 200},
		{"memory", nil, get(system0 + "/Memory/1"), 200},
		{"storage_collection", nil, get(system0 + "/Storage"), 200},
		{"storage", nil, get(system0 + "/Storage/1"), 200},
		{"drives", nil, get("/redfish/v1/Chassis/vm-0/Drives"), 200},
		{"drive", nil, get("/redfish/v1/Chassis/vm-0/Drives/1"), 200},
		{"storage_controllers", nil, get(system0 + "/Storage/1/Controllers"), 200},
		{"storage_controller", nil, get(system0 + "/Storage/1/Controllers/virtio"), 200},
		{"volumes", nil, get(system0 + "/Storage/1/Volumes"), 200},
		{"volume", nil, get(system0 + "/Storage/1/Volumes/1"), 200},
		{"bios", nil, get(system0 + "/Bios"), 200},
		{"bios_running_pending", func(f *fixture) {
			f.do(asAdmin("POST", system0+"/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`))
			f.do(asAdmin("PATCH", system0+"/Bios/Settings", `{"Attributes":{"SecureBoot":"Enabled"},"@Redfish.SettingsApplyTime":{"ApplyTime":"OnReset"}}`))
		}, get(system0 + "/Bios"), 200},
		{"bios_settings", func(f *fixture) {
			f.do(asAdmin("PATCH", system0+"/Bios/Settings", `{"Attributes":{"SecureBoot":"Enabled"}}`))
		}, get(system0 + "/Bios/Settings"), 200},
		{"bios_settings_patch_running", func(f *fixture) {
			f.do(asAdmin("POST", system0+"/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`))
		}, asAdmin("PATCH", system0+"/Bios/Settings", `{"Attributes":{"BootMode":"Legacy"}}`), 200},
		{"secure_boot", nil, get(system0 + "/SecureBoot"), 200},
		{"registries", nil, get("/redfish/v1/Registries"), 200},
		{"bios_registry_file", nil, get("/redfish/v1/Registries/BiosAttributeRegistry.1.0.0"), 200},
		{"bios_registry", nil, get("/redfish/v1/Registries/BiosAttributeRegistry.1.0.0/BiosAttributeRegistry.1.0.0"), 200},
		{"error_bios_attributes", nil, asAdmin("PATCH", system0+"/Bios/Settings", `{"Attributes":{"BootMode":1,"MemoryMiB":1,"Turbo":"On"}}`), 400},
		{"manager", nil, get(manager0), 200},
		{"network_protocol", nil, get(manager0 + "/NetworkProtocol"), 200},
		{"system_virtual_media_collection", nil, get(system0 + "/VirtualMedia"), 200},
		{"system_virtual_media", func(f *fixture) {
			f.do(asAdmin("POST", sysInsert0, `{"Image":"`+image+`"}`))
		}, get(sysCD0), 200},
		{"system_virtual_media_empty", nil, get(sysCD0), 200},
		{"manager_virtual_media", func(f *fixture) {
			f.do(asAdmin("POST", manager0+"/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia", `{"Image":"`+image+`"}`))
		}, get(manager0 + "/VirtualMedia/Cd"), 200},
		{"insert_media_action_info", nil, get(sysCD0 + "/InsertMediaActionInfo"), 200},
		{"reset_action_info", nil, get(system0 + "/ResetActionInfo"), 200},
		{"task_service", nil, get("/redfish/v1/TaskService"), 200},
		{"insert_media_refused_destination", nil, asAdmin("POST", sysInsert0, `{"Image":"http://[64:ff9b::a9fe:a9fe]/latest/meta-data/"}`), 400},
		{"insert_media_accepted", slowMedia, asAdmin("POST", sysInsert0, `{"Image":"`+image+`"}`), 202},
		{"tasks", func(f *fixture) {
			slowMedia(f)
			f.do(asAdmin("POST", sysInsert0, `{"Image":"`+image+`"}`))
		}, get("/redfish/v1/TaskService/Tasks"), 200},
		{"task_running", func(f *fixture) {
			slowMedia(f)
			f.do(asAdmin("POST", sysInsert0, `{"Image":"`+image+`"}`))
			f.clock.Advance(importTime / 4)
		}, get(task1), 200},
		{"task_exception", func(f *fixture) {
			slowMedia(f)
			f.do(asAdmin("POST", sysInsert0, `{"Image":"`+image+`"}`))
			f.backend.Get("vm-0").FailMediaImport("HTTP 404 Not Found")
		}, get(task1), 200},
		{"error_task_monitor_exception", func(f *fixture) {
			slowMedia(f)
			f.do(asAdmin("POST", sysInsert0, `{"Image":"`+image+`"}`))
			f.backend.Get("vm-0").FailMediaImport("HTTP 404 Not Found")
		}, get(taskMonitor1), 500},
		{"chassis", nil, get("/redfish/v1/Chassis/vm-0"), 200},
		{"session_service", nil, get("/redfish/v1/SessionService"), 200},
		{"account_service", nil, get("/redfish/v1/AccountService"), 200},
		{"account", nil, get("/redfish/v1/AccountService/Accounts/2"), 200},
		{"role", nil, get("/redfish/v1/AccountService/Roles/Operator"), 200},
		{"log_service", nil, get(manager0 + "/LogServices/Log"), 200},
		{"log_entries", func(f *fixture) {
			f.do(asAdmin("POST", system0+"/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`))
			f.do(request{method: "GET", path: system0, user: adminUser, pass: "wrong", remote: "192.0.2.7:40000"})
		}, get(manager0 + "/LogServices/Log/Entries"), 200},
		{"log_entry_action", func(f *fixture) {
			f.do(asAdmin("POST", system0+"/Actions/ComputerSystem.Reset", `{"ResetType":"ForceOff"}`))
		}, get(system0 + "/LogServices/Log/Entries/1"), 200},
		{"log_entry_login_failures", func(f *fixture) {
			for range 2 {
				f.do(request{method: "GET", path: system0, user: "root", pass: "guess", remote: "192.0.2.7:40000"})
				f.clock.Advance(time.Second)
			}
		}, get(manager0 + "/LogServices/Log/Entries/1"), 200},
		{"event_service", nil, get("/redfish/v1/EventService"), 200},
		{"event_subscription", func(f *fixture) {
			f.do(asAdmin("POST", "/redfish/v1/EventService/Subscriptions", `{"Destination":"https://receiver.example/events","Protocol":"Redfish",`+
				`"Context":"rack 7","RegistryPrefixes":["ResourceEvent"],"HttpHeaders":[{"Authorization":"Bearer secret"}]}`))
		}, get("/redfish/v1/EventService/Subscriptions/1"), 200},
		{"event_subscriptions", func(f *fixture) {
			f.do(asAdmin("POST", "/redfish/v1/EventService/Subscriptions", `{"Destination":"https://receiver.example/events","Protocol":"Redfish"}`))
		}, get("/redfish/v1/EventService/Subscriptions"), 200},
		{"error_subscription", nil, asAdmin("POST", "/redfish/v1/EventService/Subscriptions",
			`{"Destination":"http://169.254.169.254/latest","Protocol":"FTP","Colour":"red"}`), 400},
		{"error_not_in_list", nil, asAdmin("PATCH", system0, `{"Boot":{"BootSourceOverrideTarget":"Floppy"}}`), 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, func(c *redfish.Config, _ *stubBackend) {
				c.FirmwareVersion = "v0.0.0-golden"
				c.NetworkProtocol = redfish.NetworkProtocol{RedfishPort: 8443, IPMIPort: 623, IPMIMachine: "vm-0", FQDN: "vm-0.team-a.bmc.example.org"}
			})
			if tt.setup != nil {
				tt.setup(f)
			}
			res := f.do(tt.req)
			if res.status != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", res.status, tt.wantStatus, res.raw)
			}
			var pretty bytes.Buffer
			if err := json.Indent(&pretty, res.raw, "", "  "); err != nil {
				t.Fatal(err)
			}
			pretty.WriteByte('\n')
			file := filepath.Join("testdata", tt.name+".golden.json")
			if *update {
				if err := os.WriteFile(file, pretty.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			golden, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("%v (run go test ./redfish -run TestGoldenBodies -update to create it)", err)
			}
			if !bytes.Equal(golden, pretty.Bytes()) {
				t.Errorf("%s %s differs from %s:\ngot:\n%s", tt.req.method, tt.req.path, file, pretty.Bytes())
			}
		})
	}
}
