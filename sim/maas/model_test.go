package maas_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

func redfishMachine(systemID, address, user string) maassim.Machine {
	return maassim.Machine{SystemID: systemID, Hostname: "host-" + systemID, PowerType: "redfish",
		PowerParameters: map[string]string{"power_address": address, "power_user": user, "power_pass": "p", "node_id": systemID}}
}

// TestSharedBMCRows: redfish machines of one address and user share one
// BMC row, so a power write on one reaches the others; power type manual
// moves a machine to a row of its own; other power types never share.
func TestSharedBMCRows(t *testing.T) {
	ctx := context.Background()
	s := maassim.New(t).
		WithMachine(redfishMachine("a", "vm.ns.bmc.test", "u")).
		WithMachine(redfishMachine("b", "vm.ns.bmc.test", "u")).
		WithMachine(redfishMachine("c", "vm.ns.bmc.test", "other-user")).
		WithMachine(maassim.Machine{SystemID: "i1", Hostname: "i1", PowerType: "ipmi", PowerParameters: map[string]string{"power_address": "10.0.0.1"}}).
		WithMachine(maassim.Machine{SystemID: "i2", Hostname: "i2", PowerType: "ipmi", PowerParameters: map[string]string{"power_address": "10.0.0.1"}})
	c := s.Client(t)
	if s.BMCID("a") != s.BMCID("b") || s.BMCID("a") == s.BMCID("c") || s.BMCID("i1") == s.BMCID("i2") {
		t.Fatalf("rows: a %d, b %d, c %d, i1 %d, i2 %d", s.BMCID("a"), s.BMCID("b"), s.BMCID("c"), s.BMCID("i1"), s.BMCID("i2"))
	}

	if _, err := c.UpdateMachine(ctx, "a", maas.MachineUpdate{PowerType: "redfish", PowerParameters: map[string]string{"power_pass": "first"}}); err != nil {
		t.Fatal(err)
	}
	if b, _ := s.Machine("b"); b.PowerParameters["power_pass"] != "first" {
		t.Errorf("a write on a did not reach b on the shared row: %v", b.PowerParameters)
	}
	if !slices.Contains(s.PasswordsHeld("b"), "first") || slices.Contains(s.PasswordsHeld("c"), "first") {
		t.Errorf("passwords held: b %v, c %v", s.PasswordsHeld("b"), s.PasswordsHeld("c"))
	}

	shared := s.BMCID("a")
	if _, err := c.UpdateMachine(ctx, "b", maas.MachineUpdate{PowerType: "manual"}); err != nil {
		t.Fatal(err)
	}
	if s.BMCID("b") == shared || s.BMCID("a") != shared {
		t.Errorf("manual: b on row %d, a on row %d, shared row %d", s.BMCID("b"), s.BMCID("a"), shared)
	}
	if b, _ := s.Machine("b"); b.PowerType != "manual" || b.PowerParameters["power_pass"] != "" {
		t.Errorf("detached machine = %+v", b)
	}
	if _, err := c.UpdateMachine(ctx, "a", maas.MachineUpdate{PowerType: "redfish", PowerParameters: map[string]string{"power_pass": "second"}}); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(s.PasswordsHeld("b"), "second") {
		t.Error("a write after the detach reached b")
	}
	if !slices.Equal(s.PasswordsHeld("a"), []string{"p", "first", "second"}) {
		t.Errorf("a held %v", s.PasswordsHeld("a"))
	}

	// A machine already on a redfish row of its own moved onto another
	// row's address and user is refused (409), nothing changed; a machine
	// of another power type joins the row, its parameters become the
	// row's, and node_id stays each machine's own (docs/maas-region.md, 4).
	_, err := c.UpdateMachine(ctx, "c", maas.MachineUpdate{PowerType: "redfish", PowerParameters: map[string]string{"power_user": "u", "power_pass": "third"}})
	if apiErr, ok := errors.AsType[*maas.APIError](err); !ok || apiErr.StatusCode != http.StatusConflict {
		t.Errorf("own row onto another: err = %v, want 409", err)
	}
	if a, _ := s.Machine("a"); s.BMCID("c") == shared || a.PowerParameters["power_pass"] != "second" || slices.Contains(s.PasswordsHeld("c"), "second") {
		t.Errorf("a refused move changed something: c on row %d (shared %d), a's password %q", s.BMCID("c"), shared, a.PowerParameters["power_pass"])
	}
	if _, err := c.UpdateMachine(ctx, "b", maas.MachineUpdate{PowerType: "redfish", PowerParameters: map[string]string{
		"power_address": "vm.ns.bmc.test", "power_user": "u", "power_pass": "third", "node_id": "b-node"}}); err != nil {
		t.Fatal(err)
	}
	a, _ := s.Machine("a")
	if b, _ := s.Machine("b"); s.BMCID("b") != shared || a.PowerParameters["power_pass"] != "third" || a.PowerParameters["node_id"] != "a" || b.PowerParameters["node_id"] != "b-node" {
		t.Errorf("b on row %d (shared %d); a = %v, b = %v", s.BMCID("b"), shared, a.PowerParameters, b.PowerParameters)
	}
	if !s.Delete("a") || s.Delete("a") {
		t.Error("Delete did not report the machine once")
	}
	if _, ok := s.Machine("a"); ok {
		t.Error("deleted machine still there")
	}
}

// TestShapeValidatesPowerAddress: the 3.4 shape answers a power address
// with a scheme with HTTP 500 and stores nothing, by PUT, at enlistment and
// at the end of commissioning; later shapes store it. A bare host is
// stored by every shape.
func TestShapeValidatesPowerAddress(t *testing.T) {
	for _, shape := range maassim.Shapes {
		for _, address := range []string{"vm.ns.bmc.test", "https://vm.ns.bmc.test"} {
			refused := shape == maassim.Shape34 && strings.Contains(address, "://")
			t.Run(string(shape)+" "+address, func(t *testing.T) {
				ctx := context.Background()
				s := maassim.New(t).WithShape(shape).
					WithMachine(redfishMachine("a", "old.ns.bmc.test", "u")).
					WithMachine(redfishMachine("b", "old2.ns.bmc.test", "u")).
					WithMachine(maassim.Machine{SystemID: "c", Hostname: "c", Status: maassim.StatusNew})
				_, err := s.Client(t).UpdateMachine(ctx, "a", maas.MachineUpdate{PowerType: "redfish", PowerParameters: map[string]string{"power_address": address}})
				apiErr, isAPI := errors.AsType[*maas.APIError](err)
				if refused != (err != nil) || (refused && (!isAPI || apiErr.StatusCode != http.StatusInternalServerError || !strings.Contains(apiErr.Message, maassim.Shape34AddressError))) {
					t.Fatalf("PUT: err = %v, want refused %v with HTTP 500", err, refused)
				}
				want := map[bool]string{true: "old.ns.bmc.test", false: address}[refused]
				if m, _ := s.Machine("a"); m.PowerParameters["power_address"] != want {
					t.Errorf("PUT stored %q, want %q", m.PowerParameters["power_address"], want)
				}

				config := map[string]string{"power_type": "redfish", "power_address": address, "power_user": "", "power_pass": ""}
				if err := s.StoreBMCConfig("b", config); refused != (err != nil) {
					t.Errorf("StoreBMCConfig: err = %v, want refused %v", err, refused)
				}
				want = map[bool]string{true: "old2.ns.bmc.test", false: address}[refused]
				if m, _ := s.Machine("b"); m.PowerParameters["power_address"] != want {
					t.Errorf("enlistment stored %q, want %q", m.PowerParameters["power_address"], want)
				}

				// Commissioning's BMC config: the machine is Ready either way.
				s.Update("c", func(m *maassim.Machine) { m.BMCConfig = config })
				if _, err := s.Client(t).Commission(ctx, "c", maas.CommissionOptions{}); err != nil {
					t.Fatal(err)
				}
				s.Step()
				m, _ := s.Machine("c")
				if m.Status != maassim.StatusReady || (m.PowerType == "redfish") == refused {
					t.Errorf("after commissioning: %+v (refused %v)", m, refused)
				}
			})
		}
	}
}

// TestCommissionWithoutBootImages: a region without images refuses every
// commission with a 400 naming the cause, and takes them once it has one.
func TestCommissionWithoutBootImages(t *testing.T) {
	ctx := context.Background()
	s := maassim.New(t).WithoutBootImages(true).WithMachine(maassim.Machine{SystemID: "a", Hostname: "a"})
	_, err := s.Client(t).Commission(ctx, "a", maas.CommissionOptions{})
	if apiErr, ok := errors.AsType[*maas.APIError](err); !ok || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(apiErr.Message, maassim.NoImageError) {
		t.Fatalf("err = %v, want 400 with %q", err, maassim.NoImageError)
	}
	if m, _ := s.Machine("a"); m.Status != maassim.StatusNew {
		t.Errorf("refused commission changed the status to %d", m.Status)
	}
	s.WithoutBootImages(false)
	if _, err := s.Client(t).Commission(ctx, "a", maas.CommissionOptions{}); err != nil {
		t.Fatalf("with an image: %v", err)
	}
}

// TestFaultAddressRejected answers the 3.4 region's 500 whatever the shape.
func TestFaultAddressRejected(t *testing.T) {
	s := maassim.New(t).WithMachine(redfishMachine("a", "vm.ns.bmc.test", "u"))
	s.FailNext(1, maassim.FaultAddressRejected)
	_, err := s.Client(t).UpdateMachine(context.Background(), "a", maas.MachineUpdate{Hostname: "b"})
	if apiErr, ok := errors.AsType[*maas.APIError](err); !ok || apiErr.StatusCode != http.StatusInternalServerError || !strings.Contains(apiErr.Message, maassim.Shape34AddressError) {
		t.Fatalf("err = %v", err)
	}
	if m, _ := s.Machine("a"); m.Hostname != "host-a" {
		t.Errorf("a faulted request changed the machine: %+v", m)
	}
}
