package conformance_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/schemas"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

// getRecorder remembers the path of every GET it passes on.
type getRecorder struct {
	next http.Handler
	mu   sync.Mutex
	seen map[string]bool
}

func (g *getRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		g.mu.Lock()
		g.seen[strings.TrimSuffix(r.URL.Path, "/")] = true
		g.mu.Unlock()
	}
	g.next.ServeHTTP(w, r)
}

func (g *getRecorder) visited(path string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.seen[strings.TrimSuffix(path, "/")]
}

// TestGofishWalksTheWholeTree goes through the whole tree with gofish's
// own accessors (service root, systems with their interfaces, storage and
// virtual media, managers, chassis, the session and account services with
// accounts, roles and sessions, and every link between them) and checks
// that each answer holds what the backend and the configuration hold.
// Last, every resource a raw crawl finds must have been reached by gofish.
func TestGofishWalksTheWholeTree(t *testing.T) {
	const (
		serviceUUID     = "0d6f2a1c-4b7e-4e58-9a3c-1f2e3d4c5b6a"
		firmwareVersion = "v9.9.9-tree"
		image           = "http://127.0.0.1:8080/tree.iso"
	)
	backend := memory.New(memory.Options{Machines: 2})
	vm0 := backend.Get("vm-0")
	if err := vm0.Reset(t.Context(), machine.ResetOn); err != nil {
		t.Fatal(err)
	}
	if err := vm0.SetBootOverride(t.Context(), machine.BootOverride{Target: machine.BootPxe, Enabled: machine.BootOnce, Mode: machine.BootModeUEFI}); err != nil {
		t.Fatal(err)
	}
	if err := vm0.InsertMedia(t.Context(), image); err != nil {
		t.Fatal(err)
	}
	accounts := []redfish.Account{
		{Username: suiteUser, Password: suitePass, Role: redfish.RoleAdministrator},
		{Username: "operator", Password: "operator-secret", Role: redfish.RoleOperator},
		{Username: "reader", Password: "reader-secret", Role: redfish.RoleReadOnly},
	}
	cfg := redfish.Config{
		Backend:         backend,
		Accounts:        accounts,
		Logger:          logr.Discard(),
		ServiceUUID:     serviceUUID,
		FirmwareVersion: firmwareVersion,
		SessionTimeout:  10 * time.Minute,
	}
	server, err := redfish.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	recorder := &getRecorder{next: server, seen: map[string]bool{}}
	ts := httptest.NewTLSServer(recorder)
	t.Cleanup(ts.Close)

	client, err := gofish.Connect(gofish.ClientConfig{Endpoint: ts.URL, Username: suiteUser, Password: suitePass, Insecure: true, HTTPClient: ts.Client()})
	if err != nil {
		t.Fatalf("connect (session auth): %v", err)
	}
	defer client.Logout()
	ctx := t.Context()
	check := func(what string, got, want any) {
		t.Helper()
		if gotJSON, wantJSON := mustJSON(t, got), mustJSON(t, want); gotJSON != wantJSON {
			t.Errorf("%s = %s, want %s", what, gotJSON, wantJSON)
		}
	}
	ids := func(list any) []string {
		t.Helper()
		var objs []struct {
			ID string `json:"Id"`
		}
		if err := json.Unmarshal([]byte(mustJSON(t, list)), &objs); err != nil {
			t.Fatal(err)
		}
		out := make([]string, len(objs))
		for i, o := range objs {
			out[i] = o.ID
		}
		return out
	}

	service := client.Service
	check("ServiceRoot UUID", service.UUID, serviceUUID)
	check("ServiceRoot Vendor/Product", []string{service.Vendor, service.Product}, []string{"virtmetal", "virtmetal BMC"})

	// Systems and everything under them.
	systems, err := service.Systems()
	if err != nil {
		t.Fatalf("Systems: %v", err)
	}
	check("system ids", ids(systems), []string{"vm-0", "vm-1"})
	systemUUIDs := map[string]string{}
	for _, sys := range systems {
		m := backend.Get(sys.ID)
		inv, _ := m.Inventory(ctx)
		power, _ := m.PowerState(ctx)
		override, _ := m.BootOverride(ctx)
		systemUUIDs[sys.ID] = sys.UUID
		check(sys.ID+" identity", []string{sys.UUID, sys.SerialNumber, sys.Manufacturer, sys.Model, sys.Name},
			[]string{inv.UUID, inv.SerialNumber, inv.Manufacturer, inv.Model, inv.Name})
		check(sys.ID+" PowerState", sys.PowerState, power)
		check(sys.ID+" ProcessorSummary", []any{sys.ProcessorSummary.Count, sys.ProcessorSummary.CoreCount, sys.ProcessorSummary.LogicalProcessorCount},
			[]any{inv.CPU.Sockets, inv.CPU.Sockets * inv.CPU.Cores, inv.CPU.LogicalProcessors()})
		check(sys.ID+" TotalSystemMemoryGiB", sys.MemorySummary.TotalSystemMemoryGiB, float64(inv.MemoryMiB)/1024)
		check(sys.ID+" Boot", []string{string(sys.Boot.BootSourceOverrideTarget), string(sys.Boot.BootSourceOverrideEnabled), string(sys.Boot.BootSourceOverrideMode)},
			[]string{string(override.Target), string(override.Enabled), string(override.Mode)})
		resetTypes, err := sys.GetSupportedResetTypes()
		if err != nil {
			t.Errorf("%s GetSupportedResetTypes: %v", sys.ID, err)
		}
		check(sys.ID+" ResetTypes", resetTypes, m.Capabilities().ResetTypes)

		nics, err := sys.EthernetInterfaces()
		if err != nil {
			t.Errorf("%s EthernetInterfaces: %v", sys.ID, err)
		}
		var gotMACs, wantMACs []string
		for _, nic := range nics {
			gotMACs = append(gotMACs, strings.ToLower(nic.MACAddress))
		}
		for _, nic := range inv.NICs {
			wantMACs = append(wantMACs, nic.MAC)
		}
		check(sys.ID+" NIC MACs", gotMACs, wantMACs)

		storages, err := sys.SimpleStorage()
		if err != nil || len(storages) != 1 {
			t.Fatalf("%s SimpleStorage: %v, %d controllers, want 1", sys.ID, err, len(storages))
		}
		var gotDisks, wantDisks []string
		for _, d := range storages[0].Devices {
			gotDisks = append(gotDisks, d.Name)
		}
		for _, d := range inv.Disks {
			if d.Kind == machine.DiskKindDisk {
				wantDisks = append(wantDisks, d.Name)
			}
		}
		check(sys.ID+" SimpleStorage devices", gotDisks, wantDisks)

		processors, err := sys.Processors()
		if err != nil || len(processors) != inv.CPU.Sockets {
			t.Fatalf("%s Processors: %v, %d, want one per socket (%d)", sys.ID, err, len(processors), inv.CPU.Sockets)
		}
		for _, p := range processors {
			check(sys.ID+" processor "+p.ID, []any{p.ProcessorType, p.ProcessorArchitecture, p.InstructionSet, p.Model, p.TotalCores, p.TotalThreads},
				[]any{"CPU", "x86", "x86-64", inv.CPU.Model, inv.CPU.Cores, inv.CPU.Cores * inv.CPU.Threads})
		}
		modules, err := sys.Memory()
		if err != nil || len(modules) != 1 {
			t.Fatalf("%s Memory: %v, %d modules, want 1", sys.ID, err, len(modules))
		}
		check(sys.ID+" memory CapacityMiB", modules[0].CapacityMiB, inv.MemoryMiB)
		subsystems, err := sys.Storage()
		if err != nil || len(subsystems) != 1 {
			t.Fatalf("%s Storage: %v, %d subsystems, want 1", sys.ID, err, len(subsystems))
		}
		drives, err := subsystems[0].Drives()
		if err != nil {
			t.Fatalf("%s Drives: %v", sys.ID, err)
		}
		var gotDrives, wantDrives []any
		for _, d := range drives {
			volumes, err := d.Volumes()
			if err != nil {
				t.Errorf("%s drive %s Volumes: %v", sys.ID, d.ID, err)
			}
			for _, v := range volumes {
				back, err := v.Drives()
				if err != nil {
					t.Errorf("%s volume %s Drives: %v", sys.ID, v.ID, err)
				}
				check(sys.ID+" volume "+v.ID, []any{v.Name, v.CapacityBytes, ids(back)}, []any{d.Name, d.CapacityBytes, []string{d.ID}})
			}
			gotDrives = append(gotDrives, []any{d.Name, d.CapacityBytes, d.Protocol, len(volumes)})
		}
		for _, d := range inv.Disks {
			if d.Kind != machine.DiskKindDisk {
				continue // a CD-ROM is no Drive
			}
			var capacity *int64
			volumes := 0 // a disk of unknown size is no Volume
			if d.CapacityBytes > 0 {
				capacity, volumes = &d.CapacityBytes, 1
			}
			protocol := map[machine.DiskBus]string{machine.DiskBusVirtio: "PCIe", machine.DiskBusSATA: "SATA", machine.DiskBusUSB: "USB"}[d.Bus]
			wantDrives = append(wantDrives, []any{d.Name, capacity, protocol, volumes})
		}
		check(sys.ID+" drives", gotDrives, wantDrives)
		controllers, err := subsystems[0].Controllers()
		if err != nil {
			t.Errorf("%s Storage Controllers: %v", sys.ID, err)
		}
		var gotBuses, wantBuses []string
		for _, c := range controllers {
			gotBuses = append(gotBuses, c.ID)
			check(sys.ID+" controller "+c.ID+" RAID types", len(c.SupportedRAIDTypes), 0)
		}
		for _, d := range inv.Disks {
			if d.Bus != "" && !slices.Contains(wantBuses, string(d.Bus)) {
				wantBuses = append(wantBuses, string(d.Bus))
			}
		}
		check(sys.ID+" storage controllers", gotBuses, wantBuses)
		storageVolumes, err := subsystems[0].Volumes()
		if err != nil {
			t.Errorf("%s Storage Volumes: %v", sys.ID, err)
		}
		check(sys.ID+" Storage Volumes", len(storageVolumes), volumesOf(inv.Disks))

		media, err := sys.VirtualMedia()
		if err != nil || len(media) != 1 {
			t.Fatalf("%s VirtualMedia: %v, %d drives, want 1", sys.ID, err, len(media))
		}
		state, _ := m.VirtualMedia(ctx)
		check(sys.ID+" media", []any{media[0].Image, *media[0].Inserted, *media[0].WriteProtected}, []any{state.Image, state.Inserted, state.WriteProtected})

		managedBy, err := sys.ManagedBy()
		if err != nil {
			t.Errorf("%s ManagedBy: %v", sys.ID, err)
		}
		check(sys.ID+" ManagedBy", ids(managedBy), []string{sys.ID})
		chassis, err := sys.Chassis()
		if err != nil {
			t.Errorf("%s Chassis: %v", sys.ID, err)
		}
		check(sys.ID+" Chassis", ids(chassis), []string{sys.ID})
	}
	check("vm-0 media image (set before the walk)", systemsMedia(t, systems[0]), image)

	// Managers.
	managers, err := service.Managers()
	if err != nil {
		t.Fatalf("Managers: %v", err)
	}
	check("manager ids", ids(managers), []string{"vm-0", "vm-1"})
	managerUUIDs := map[string]bool{}
	for _, mgr := range managers {
		check(mgr.ID+" FirmwareVersion", mgr.FirmwareVersion, firmwareVersion)
		check(mgr.ID+" ManagerType", mgr.ManagerType, schemas.BMCManagerType)
		if !uuidLike(mgr.UUID) || mgr.UUID == systemUUIDs[mgr.ID] || managerUUIDs[mgr.UUID] {
			t.Errorf("%s UUID %q: want a UUID of its own (system's %q)", mgr.ID, mgr.UUID, systemUUIDs[mgr.ID])
		}
		managerUUIDs[mgr.UUID] = true
		servers, err := mgr.ManagerForServers()
		if err != nil {
			t.Errorf("%s ManagerForServers: %v", mgr.ID, err)
		}
		check(mgr.ID+" ManagerForServers", ids(servers), []string{mgr.ID})
		chassis, err := mgr.ManagerForChassis()
		if err != nil {
			t.Errorf("%s ManagerForChassis: %v", mgr.ID, err)
		}
		check(mgr.ID+" ManagerForChassis", ids(chassis), []string{mgr.ID})
		resetTypes, err := mgr.GetSupportedResetTypes()
		if err != nil {
			t.Errorf("%s GetSupportedResetTypes: %v", mgr.ID, err)
		}
		check(mgr.ID+" ResetTypes", resetTypes, []string{"GracefulRestart", "ForceRestart"})
	}

	// Chassis.
	chassis, err := service.Chassis()
	if err != nil {
		t.Fatalf("Chassis: %v", err)
	}
	check("chassis ids", ids(chassis), []string{"vm-0", "vm-1"})
	for _, ch := range chassis {
		m := backend.Get(ch.ID)
		inv, _ := m.Inventory(ctx)
		power, _ := m.PowerState(ctx)
		check(ch.ID+" chassis identity", []string{ch.SerialNumber, ch.Manufacturer, ch.Model, string(ch.PowerState), ch.UUID},
			[]string{inv.SerialNumber, inv.Manufacturer, inv.Model, string(power), inv.UUID})
		systems, err := ch.ComputerSystems()
		if err != nil {
			t.Errorf("%s ComputerSystems: %v", ch.ID, err)
		}
		check(ch.ID+" ComputerSystems", ids(systems), []string{ch.ID})
		managedBy, err := ch.ManagedBy()
		if err != nil {
			t.Errorf("%s ManagedBy: %v", ch.ID, err)
		}
		check(ch.ID+" chassis ManagedBy", ids(managedBy), []string{ch.ID})
	}

	// Session service: gofish's own session is listed, as its user's.
	sessionService, err := service.SessionService()
	if err != nil {
		t.Fatalf("SessionService: %v", err)
	}
	check("SessionTimeout", sessionService.SessionTimeout, cfg.SessionTimeout/time.Second)
	check("SessionService ServiceEnabled", sessionService.ServiceEnabled, true)
	sessions, err := sessionService.Sessions()
	if err != nil {
		t.Fatalf("Sessions: %v", err)
	}
	if len(sessions) != 1 || sessions[0].UserName != suiteUser {
		t.Errorf("sessions = %s, want gofish's one, user %s", mustJSON(t, sessions), suiteUser)
	}

	// Account service, accounts and roles.
	accountService, err := service.AccountService()
	if err != nil {
		t.Fatalf("AccountService: %v", err)
	}
	// Accounts are never locked: failed logins throttle their source.
	check("lockout", accountService.AccountLockoutThreshold, 0)
	gotAccounts, err := accountService.Accounts()
	if err != nil {
		t.Fatalf("Accounts: %v", err)
	}
	if len(gotAccounts) != len(accounts) {
		t.Fatalf("%d accounts, want %d", len(gotAccounts), len(accounts))
	}
	for i, acc := range gotAccounts {
		check("account "+acc.ID, []any{acc.UserName, acc.RoleID, acc.Enabled, acc.Locked}, []any{accounts[i].Username, string(accounts[i].Role), true, false})
		role, err := acc.Role()
		if err != nil || role == nil {
			t.Errorf("account %s Role: %v", acc.ID, err)
			continue
		}
		check("account "+acc.ID+" role link", role.RoleID, string(accounts[i].Role))
	}
	// The privileges of DSP0266's standard roles.
	wantRoles := map[string][]string{
		"Administrator": {"Login", "ConfigureManager", "ConfigureUsers", "ConfigureComponents", "ConfigureSelf"},
		"Operator":      {"Login", "ConfigureComponents", "ConfigureSelf"},
		"ReadOnly":      {"Login", "ConfigureSelf"},
	}
	roles, err := accountService.Roles()
	if err != nil {
		t.Fatalf("Roles: %v", err)
	}
	check("role ids", ids(roles), []string{"Administrator", "Operator", "ReadOnly"})
	for _, role := range roles {
		got := []string{}
		for _, p := range role.AssignedPrivileges {
			got = append(got, string(p))
		}
		slices.Sort(got)
		want := slices.Sorted(slices.Values(wantRoles[role.ID]))
		check(role.ID+" privileges", got, want)
		check(role.ID+" IsPredefined", role.IsPredefined, true)
	}

	// Every resource a raw crawl reaches, gofish reached too.
	for _, path := range crawlTree(t, ts) {
		if !recorder.visited(path) {
			t.Errorf("gofish's walk never read %s", path)
		}
	}
}

// systemsMedia re-reads a system's CD image through gofish.
func systemsMedia(t *testing.T, sys *schemas.ComputerSystem) string {
	t.Helper()
	media, err := sys.VirtualMedia()
	if err != nil || len(media) == 0 {
		t.Fatalf("VirtualMedia: %v", err)
	}
	return media[0].Image
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func uuidLike(s string) bool {
	parts := strings.Split(s, "-")
	return len(s) == 36 && len(parts) == 5 && s == strings.ToLower(s)
}

// crawlTree follows every @odata.id from the service root with raw GETs
// and returns the resources found (not $metadata or the OData document,
// which gofish does not read).
func crawlTree(t *testing.T, ts *httptest.Server) []string {
	t.Helper()
	seen := map[string]bool{"/redfish/v1": true}
	queue := []string{"/redfish/v1"}
	for len(queue) > 0 {
		path := queue[0]
		queue = queue[1:]
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, ts.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.SetBasicAuth(suiteUser, suitePass)
		res, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body any
		err = json.NewDecoder(res.Body).Decode(&body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || err != nil {
			t.Fatalf("crawl GET %s: %d %v", path, res.StatusCode, err)
		}
		var walk func(any)
		walk = func(v any) {
			switch v := v.(type) {
			case map[string]any:
				for k, child := range v {
					if id, ok := child.(string); ok && k == "@odata.id" {
						id = strings.TrimSuffix(strings.SplitN(id, "#", 2)[0], "/")
						if !seen[id] {
							seen[id] = true
							queue = append(queue, id)
						}
						continue
					}
					walk(child)
				}
			case []any:
				for _, child := range v {
					walk(child)
				}
			}
		}
		walk(body)
	}
	return slices.Sorted(func(yield func(string) bool) {
		for p := range seen {
			if !yield(p) {
				return
			}
		}
	})
}

// volumesOf counts the disks that hold a Volume: the hard disks.
func volumesOf(disks []machine.Disk) int {
	n := 0
	for _, d := range disks {
		if d.Kind == machine.DiskKindDisk && d.CapacityBytes > 0 {
			n++
		}
	}
	return n
}
