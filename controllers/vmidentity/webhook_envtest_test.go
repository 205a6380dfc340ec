package vmidentity

import (
	"context"
	"strings"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/bmcspec"
)

// warningCollector records the warnings the API server passes on.
type warningCollector struct {
	mu       sync.Mutex
	warnings []string
}

func (w *warningCollector) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.warnings = append(w.warnings, text)
}

func (w *warningCollector) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.warnings...)
}

// clientWithWarnings is an admin client that collects the warnings the
// API server passes on.
func (s *webhookSuite) clientWithWarnings(t *testing.T) (client.Client, *warningCollector) {
	t.Helper()
	warnings := &warningCollector{}
	cfg := *s.env.Config
	cfg.WarningHandlerWithContext = warnings
	c, err := client.New(&cfg, client.Options{Scheme: s.env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c, warnings
}

// clusterVM is a VM the API server's schema accepts: one pod network
// interface, MAC given or not.
func clusterVM(namespace, name, serial, mac string) *kubevirtv1.VirtualMachine {
	vm := newVM(namespace, name, withSerial(serial), withInterface("default", mac))
	if serial == "" {
		vm.Spec.Template.Spec.Domain.Firmware = nil
	}
	halted := kubevirtv1.RunStrategyHalted
	vm.Spec.RunStrategy = &halted
	vm.Spec.Template.Spec.Domain.Devices.Interfaces[0].Masquerade = &kubevirtv1.InterfaceMasquerade{}
	vm.Spec.Template.Spec.Networks = []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}}
	return vm
}

// TestWebhooks runs the generated webhook configurations against a real
// API server: what a tenant's kubectl sees.
func TestWebhooks(t *testing.T) {
	s := sharedSuite(t)
	ctx := context.Background()
	s.namespace(t, "team-a", true)
	s.namespace(t, "team-b", true)
	s.namespace(t, "free", false)

	created := func(t *testing.T, c client.Client, vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachine {
		t.Helper()
		if err := c.Create(ctx, vm); err != nil {
			t.Fatalf("creating %s/%s: %v", vm.Namespace, vm.Name, err)
		}
		got := &kubevirtv1.VirtualMachine{}
		if err := s.env.Client.Get(ctx, client.ObjectKeyFromObject(vm), got); err != nil {
			t.Fatal(err)
		}
		return got
	}

	webA := created(t, s.env.Client, clusterVM("team-a", "web1", "", ""))
	t.Run("enrolled VM gets serial, UUID and MAC on create", func(t *testing.T) {
		fw := webA.Spec.Template.Spec.Domain.Firmware
		if fw == nil || fw.Serial != "web1.team-a" || string(fw.UUID) != DerivedUUID("team-a", "web1", 0) {
			t.Fatalf("firmware = %+v", fw)
		}
		if mac := macs(webA)[0]; !strings.HasPrefix(mac, "02:00:00:") {
			t.Fatalf("MAC = %q, not from %s", mac, testRange)
		}
	})

	t.Run("enrolled VM gets a machine proof on create; a copy of its YAML gets its own", func(t *testing.T) {
		proof := webA.Spec.Template.Spec.Domain.Chassis
		if proof == nil || !bmcspec.IsMachineProof(proof.Asset) {
			t.Fatalf("chassis = %+v, want a machine proof", proof)
		}
		copied := clusterVM("team-a", "web1-copy", "", "")
		copied.Spec.Template.Spec.Domain.Chassis = &kubevirtv1.Chassis{Asset: proof.Asset}
		got := created(t, s.env.Client, copied).Spec.Template.Spec.Domain.Chassis
		if got == nil || !bmcspec.IsMachineProof(got.Asset) || got.Asset == proof.Asset {
			t.Fatalf("the copy carries %+v, want a proof of its own", got)
		}
	})

	t.Run("web1 in another enrolled namespace gets its own UUID and MAC", func(t *testing.T) {
		webB := created(t, s.env.Client, clusterVM("team-b", "web1", "", ""))
		fa, fb := webA.Spec.Template.Spec.Domain.Firmware, webB.Spec.Template.Spec.Domain.Firmware
		if fb.Serial != "web1.team-b" || fa.UUID == fb.UUID || macs(webA)[0] == macs(webB)[0] {
			t.Fatalf("team-a/web1 %+v %v, team-b/web1 %+v %v", fa, macs(webA), fb, macs(webB))
		}
	})

	t.Run("user serial replaced, the warning reaches the client", func(t *testing.T) {
		c, warnings := s.clientWithWarnings(t)
		vm := created(t, c, clusterVM("team-a", "db", "SN-0042", ""))
		if got := vm.Spec.Template.Spec.Domain.Firmware.Serial; got != "db.team-a" {
			t.Fatalf("serial = %q", got)
		}
		got := warnings.all()
		if len(got) != 1 || !strings.Contains(got[0], `"SN-0042" replaced by "db.team-a"`) {
			t.Fatalf("warnings = %q", got)
		}
	})

	t.Run("a MAC already set is kept", func(t *testing.T) {
		vm := created(t, s.env.Client, clusterVM("team-a", "fixed", "", "02:00:00:ab:cd:ef"))
		if got := macs(vm)[0]; got != "02:00:00:ab:cd:ef" {
			t.Fatalf("MAC = %q", got)
		}
	})

	// From here on the manager's cache holds team-a/web1: an update of it
	// must not be refused as a duplicate of itself, a copy must be.
	s.waitCached(t, webA)
	t.Run("update of an enrolled VM keeps its identity", func(t *testing.T) {
		vm := webA.DeepCopy()
		vm.Labels = map[string]string{"tier": "web"}
		if err := s.env.Client.Update(ctx, vm); err != nil {
			t.Fatalf("updating team-a/web1: %v", err)
		}
		if vm.Spec.Template.Spec.Domain.Firmware.UUID != webA.Spec.Template.Spec.Domain.Firmware.UUID || macs(vm)[0] != macs(webA)[0] {
			t.Fatalf("identity changed on update: %+v %v", vm.Spec.Template.Spec.Domain.Firmware, macs(vm))
		}
		if *vm.Spec.Template.Spec.Domain.Chassis != *webA.Spec.Template.Spec.Domain.Chassis {
			t.Fatal("machine proof changed on update")
		}
	})

	t.Run("an update that omits the machine proof keeps it", func(t *testing.T) {
		vm := &kubevirtv1.VirtualMachine{}
		if err := s.env.Client.Get(ctx, client.ObjectKeyFromObject(webA), vm); err != nil {
			t.Fatal(err)
		}
		vm.Spec.Template.Spec.Domain.Chassis = nil // as a GitOps apply of the original YAML sends it
		if err := s.env.Client.Update(ctx, vm); err != nil {
			t.Fatalf("updating team-a/web1: %v", err)
		}
		if got := vm.Spec.Template.Spec.Domain.Chassis; got == nil || *got != *webA.Spec.Template.Spec.Domain.Chassis {
			t.Fatal("machine proof dropped or rotated on update")
		}
	})

	refusals := []struct {
		name string
		vm   *kubevirtv1.VirtualMachine
		want string
	}{
		{"serial of team-a/web1 from a namespace not enrolled", clusterVM("free", "web1", "web1.team-a", ""), `serial "web1.team-a" names VM team-a/web1`},
		{"serial of team-a/web1 from an enrolled namespace's opted-out VM", func() *kubevirtv1.VirtualMachine {
			vm := clusterVM("team-b", "web2", "web1.team-a", "")
			optedOut(vm)
			return vm
		}(), `serial "web1.team-a" names VM team-a/web1`},
		{"MAC of team-a/web1", clusterVM("free", "copy", "", macs(webA)[0]), "macAddress " + macs(webA)[0] + " is used by VM team-a/web1"},
	}
	for _, tc := range refusals {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			err := s.env.Client.Create(ctx, tc.vm)
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Create = %v, want Forbidden with %q", err, tc.want)
			}
		})
	}

	t.Run("a VM of a namespace not enrolled is left alone", func(t *testing.T) {
		vm := created(t, s.env.Client, clusterVM("free", "web1", "", ""))
		if vm.Spec.Template.Spec.Domain.Firmware != nil || macs(vm)[0] != "" {
			t.Fatalf("stamped: %+v %v", vm.Spec.Template.Spec.Domain.Firmware, macs(vm))
		}
	})
}
