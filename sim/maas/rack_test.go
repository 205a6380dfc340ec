package maas_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/maas"
	"github.com/virtmetal/virtmetal/sim/guest"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

// TestRackEnlistsAsMaaSRunner: a guest's enlistment is MaaS's runner's
// (docs/maas-region.md, "Enlistment by MaaS's own runner"): the real
// bmc-config script runs on its SMBIOS when the region's enlistment runs it
// (its "enlisting" tag under enlist_commissioning, any bmc-config script
// without), the machine is created with commission=true (Commissioning,
// a current set) and the script's power settings, and ends New with that
// set current: its stdout, with the guest's machine proof, is where the
// reconciler's client reads it. Empty Redfish credentials, as the script
// wrote before, are refused: the machine enlists unpowered, Failed
// commissioning, the script's result Failed.
func TestRackEnlistsAsMaaSRunner(t *testing.T) {
	const domain = "bmc.example.org"
	vm := maas.VMRef{Namespace: "tenant-a", Name: "web1"}
	source, err := os.ReadFile("../../deploy/maas/virtmetal-bmc-config.py")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name                string
		edit                func(script string) string
		enlistCommissioning bool
		wantRun, wantPower  bool
		wantStatus          int
	}{
		{name: "as uploaded", edit: func(s string) string { return s }, enlistCommissioning: true, wantRun: true, wantPower: true, wantStatus: maassim.StatusNew},
		{name: "without the enlisting tag", edit: func(s string) string {
			return strings.Replace(s, "# tags: bmc-config, enlisting", "# tags: bmc-config", 1)
		},
			enlistCommissioning: true, wantStatus: maassim.StatusNew},
		{name: "without the tag, enlist_commissioning off", edit: func(s string) string {
			return strings.Replace(s, "# tags: bmc-config, enlisting", "# tags: bmc-config", 1)
		},
			wantRun: true, wantPower: true, wantStatus: maassim.StatusNew},
		{name: "empty credentials", edit: func(s string) string {
			s = strings.Replace(s, `"power_user": PLACEHOLDER_USER,`, `"power_user": "",`, 1)
			return strings.Replace(s, `"power_pass": secrets.token_urlsafe(24),`, `"power_pass": "",`, 1)
		}, enlistCommissioning: true, wantRun: true, wantStatus: maassim.StatusFailedCommissioning},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			script := filepath.Join(dir, "50-virtmetal-bmc-config")
			filled := tt.edit(strings.ReplaceAll(string(source), "@VIRTMETAL_BMC_DOMAIN@", domain))
			if err := os.WriteFile(script, []byte(filled), 0o700); err != nil {
				t.Fatal(err)
			}
			s := maassim.New(t).WithEnlistCommissioning(tt.enlistCommissioning)
			var during []maassim.Machine
			rack := maassim.NewRack(maassim.RackOptions{Region: s, Domain: domain, Script: script, Dir: dir, Tell: func(e maassim.RackEvent) {
				if e.Step == maassim.RackEnlisted {
					m, _ := s.Machine(e.SystemID)
					during = append(during, m)
				}
			}})
			proof := bmcspec.NewMachineProof()
			rack.NetworkBoot(context.Background(), guest.NetBoot{Namespace: vm.Namespace, Name: vm.Name, MACs: []string{"02:00:00:00:00:01"},
				Serial: "web1.tenant-a", UUID: "6a1f0b8e-2d6c-4f1e-9a53-0c2b7e4d9f10", ChassisAsset: proof})
			machines := s.Machines()
			if len(machines) != 1 || len(during) != 1 {
				t.Fatalf("machines %+v", machines)
			}
			m := machines[0]
			if during[0].Status != maassim.StatusCommissioning || during[0].Commissioning == nil {
				t.Errorf("while enlisting: %+v, want Commissioning with a current set", during[0])
			}
			if m.Status != tt.wantStatus || m.Commissioning == nil || m.HardwareUUID == "" {
				t.Errorf("after enlisting: %+v, want status %d, its set current, the inventory's UUID", m, tt.wantStatus)
			}
			output, err := s.Client(t).BMCConfigOutput(context.Background(), m.SystemID)
			if err != nil || (bmcspec.ProofFromReport(output) == proof) != tt.wantRun {
				t.Errorf("stored output %q (%v); want the guest's proof: %v", output, err, tt.wantRun)
			}
			address := m.PowerParameters["power_address"]
			if tt.wantPower != (address == maas.BMCAddress(vm, domain)) {
				t.Errorf("power %s %v, want set: %v", m.PowerType, m.PowerParameters, tt.wantPower)
			}
			if tt.wantPower && (m.PowerParameters["power_user"] != maas.PlaceholderUser || m.PowerParameters["power_pass"] == "") {
				t.Errorf("credentials %v, want the placeholders", m.PowerParameters)
			}
			if tt.wantStatus == maassim.StatusFailedCommissioning && (m.Commissioning[0].Status != maassim.ScriptFailed || m.Commissioning[0].ExitStatus != 1) {
				t.Errorf("result %+v, want Failed, exit 1", m.Commissioning[0])
			}
		})
	}
}
