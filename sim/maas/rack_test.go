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

// TestRackStoresTheScriptOutput: a guest's enlistment runs the real
// bmc-config script on its SMBIOS, and the region keeps the script's
// stdout as the machine's commissioning result, where the reconciler's
// client reads the machine proof the guest's chassis asset tag holds.
func TestRackStoresTheScriptOutput(t *testing.T) {
	const domain = "bmc.example.org"
	source, err := os.ReadFile("../../deploy/maas/virtmetal-bmc-config.py")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "50-virtmetal-bmc-config")
	if err := os.WriteFile(script, []byte(strings.ReplaceAll(string(source), "@VIRTMETAL_BMC_DOMAIN@", domain)), 0o700); err != nil {
		t.Fatal(err)
	}
	s := maassim.New(t)
	rack := maassim.NewRack(maassim.RackOptions{Region: s, Domain: domain, Script: script, Dir: dir})
	proof := bmcspec.NewMachineProof()
	rack.NetworkBoot(context.Background(), guest.NetBoot{Namespace: "tenant-a", Name: "web1", MACs: []string{"02:00:00:00:00:01"},
		Serial: "web1.tenant-a", UUID: "6a1f0b8e-2d6c-4f1e-9a53-0c2b7e4d9f10", ChassisAsset: proof})
	machines := s.Machines()
	if len(machines) != 1 {
		t.Fatalf("machines %+v", machines)
	}
	output, err := s.Client(t).BMCConfigOutput(context.Background(), machines[0].SystemID)
	if err != nil || bmcspec.ProofFromReport(output) != proof {
		t.Fatalf("stored output %q (%v) does not carry the guest's proof", output, err)
	}
	if got := machines[0].PowerParameters["power_address"]; got != maas.BMCAddress(maas.VMRef{Namespace: "tenant-a", Name: "web1"}, domain) {
		t.Errorf("power address %q", got)
	}
}
