package lab_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/lab"
	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

// The package's one lab. A VM in preNamespace exists before the controller
// starts, as in a cluster where virtmetal is installed later.
var (
	theLab *lab.Lab
	// binaries are bmc-server and bmc-controller, built once for every lab
	// of the package.
	binaries     string
	preExisting  = maas.VMRef{Namespace: "lab-pre", Name: "web1"}
	flowDeadline = 3 * time.Minute
)

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	// Built before the deadline starts: a cold compile takes minutes.
	var err error
	if binaries, err = os.MkdirTemp("", "virtmetal-lab-bin-"); err != nil {
		return 0, err
	}
	defer os.RemoveAll(binaries)
	if err := lab.Build(context.Background(), binaries); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	l, err := lab.Start(ctx, lab.Options{Binaries: binaries})
	if err != nil {
		return 0, err
	}
	defer l.Close()
	if err := l.CreateNamespace(ctx, preExisting.Namespace); err != nil {
		return 0, err
	}
	// It existed before this version: an older commissioning script
	// enlists it with https:// in its power address.
	if err := l.CreateVM(ctx, preExisting, lab.VMOptions{Halted: true, OldScriptAddress: true}); err != nil {
		return 0, err
	}
	if err := l.StartController(ctx); err != nil {
		return 0, err
	}
	theLab = l
	return m.Run(), nil
}

// TestWholeFlow: two namespaces with a VM named web1 each (one of them with
// IPMI), and the VM that existed before the controller, started once
// enrolled: all three end Ready in MaaS, named web1-<namespace> in their
// namespace's pool, commissioned once, their PXE override consumed and off.
func TestWholeFlow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), flowDeadline)
	defer cancel()
	l := theLab
	redfishVM := maas.VMRef{Namespace: "lab-a", Name: "web1"}
	ipmiVM := maas.VMRef{Namespace: "lab-b", Name: "web1"}
	for _, tt := range []struct {
		vm   maas.VMRef
		opts lab.VMOptions
	}{{redfishVM, lab.VMOptions{}}, {ipmiVM, lab.VMOptions{IPMI: true}}} {
		if err := l.CreateNamespace(ctx, tt.vm.Namespace); err != nil {
			t.Fatal(err)
		}
		if err := l.CreateVM(ctx, tt.vm, tt.opts); err != nil {
			t.Fatalf("creating %s: %v", tt.vm, err)
		}
	}
	if err := l.WaitIdentity(ctx, preExisting); err != nil {
		t.Fatalf("the pre-existing VM never got its identity: %v", err)
	}
	if err := l.StartVM(ctx, preExisting); err != nil {
		t.Fatal(err)
	}
	checkFlow(t, ctx, l, redfishVM, ipmiVM, preExisting)
	enlistedWith := map[maas.VMRef]string{}
	for _, vm := range []maas.VMRef{redfishVM, preExisting} {
		for _, e := range l.Timeline(vm) {
			if e.Step == lab.StepPowerConfig {
				enlistedWith[vm] = e.Detail
			}
		}
	}
	if !strings.Contains(enlistedWith[preExisting], "https://") || strings.Contains(enlistedWith[redfishVM], "://") {
		t.Errorf("enlisted with %q (old script) and %q (this one); want https:// and the bare host", enlistedWith[preExisting], enlistedWith[redfishVM])
	}
}

// checkFlow waits until the VMs are Ready in MaaS and checks each one's end
// state.
func checkFlow(t *testing.T, ctx context.Context, l *lab.Lab, vms ...maas.VMRef) {
	t.Helper()
	if err := l.WaitReady(ctx, vms...); err != nil {
		for _, vm := range vms {
			t.Logf("%s: %v", vm, l.Timeline(vm))
		}
		t.Fatalf("not all Ready: %v (logs in %s)", err, l.Dir())
	}
	for _, vm := range vms {
		t.Run(vm.String(), func(t *testing.T) {
			checkReadyMachine(t, ctx, l, vm)
			checkContainer(t, ctx, l, vm)
			took, _ := l.TimeToReady(vm)
			t.Logf("%s Ready %v after its creation", vm, took.Round(time.Millisecond))
		})
	}
}

// checkReadyMachine checks one VM's end state in MaaS, Kubernetes and its BMC.
func checkReadyMachine(t *testing.T, ctx context.Context, l *lab.Lab, vm maas.VMRef) {
	t.Helper()
	m, ok := l.Machine(vm)
	if !ok {
		t.Fatalf("no MaaS machine for %s", vm)
	}
	if hostname := vm.Name + "-" + vm.Namespace; m.Status != maassim.StatusReady || m.Hostname != hostname || m.Pool != vm.Namespace {
		t.Errorf("machine %s: status %d, hostname %q, pool %q; want Ready, %s in pool %s",
			m.SystemID, m.Status, m.Hostname, m.Pool, hostname, vm.Namespace)
	}
	if m.PowerType != maas.PowerTypeRedfish || m.PowerParameters["power_user"] == "" || m.PowerParameters["power_pass"] == "" {
		t.Errorf("machine %s: power %s %v, want redfish with the BMC's credentials", m.SystemID, m.PowerType, redact(m.PowerParameters))
	}
	// The bare host, whatever the script that enlisted it wrote: MaaS 3.4
	// refuses a scheme.
	if got, want := m.PowerParameters["power_address"], maas.BMCAddress(vm, l.Domain); got != want {
		t.Errorf("machine %s: power_address %q, want %q", m.SystemID, got, want)
	}
	machines := 0
	for _, other := range l.MaaS.Machines() {
		if ref, claims := maas.ParseBMCAddress(other.PowerParameters["power_address"], l.Domain); claims && ref == vm {
			machines++
		}
	}
	if machines != 1 {
		t.Errorf("%d machines claim %s, want 1", machines, vm)
	}
	// Once, and once more for each commissioning MaaS could not start
	// because the power-on failed (it then returns the machine to New).
	if n, want := countApplied(l, maassim.Match{Method: http.MethodPost, Path: "machines/" + m.SystemID + "/", Op: "commission"}), 1+l.CommissioningStartFailures(m.SystemID); n != want {
		t.Errorf("machine %s commissioned %d times, want %d", m.SystemID, n, want)
	}
	// Bound by its machine proof: the reconciler read what MaaS stored of
	// the bmc-config script's run before it wrote anything.
	if n := countApplied(l, maassim.Match{Method: http.MethodGet, Path: "nodes/" + m.SystemID + "/results/current-commissioning/"}); n == 0 {
		t.Errorf("machine %s was bound without its stored commissioning output read", m.SystemID)
	}
	var bmc v1beta1.VirtualMachineBMC
	if err := l.Client.Get(ctx, client.ObjectKey{Namespace: vm.Namespace, Name: vm.Name}, &bmc); err != nil {
		t.Fatal(err)
	}
	if bmc.Status.MaaS == nil || bmc.Status.MaaS.SystemID != m.SystemID {
		t.Errorf("VirtualMachineBMC status.maas %+v, want machine %s", bmc.Status.MaaS, m.SystemID)
	}
	pools := 0
	for _, p := range l.MaaS.Pools() {
		if p == vm.Namespace {
			pools++
		}
	}
	if pools != 1 {
		t.Errorf("%d pools named %s, want 1", pools, vm.Namespace)
	}

	var got kubevirtv1.VirtualMachine
	if err := l.Client.Get(ctx, client.ObjectKey{Namespace: vm.Namespace, Name: vm.Name}, &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.RunStrategy == nil || *got.Spec.RunStrategy != kubevirtv1.RunStrategyHalted {
		t.Errorf("VM runStrategy %v, want Halted (MaaS powered it off)", got.Spec.RunStrategy)
	}
	// MaaS powered it off as commissioning ended; the VM may still be
	// PoweringOff when MaaS shows Ready.
	poll.Until(t, "the Redfish system Off", func() error {
		system := l.RedfishSystem(ctx, vm)
		if system == nil {
			t.Fatalf("cannot read the Redfish system of %s", vm)
		}
		if system["PowerState"] != "Off" {
			return fmt.Errorf("Redfish system: PowerState %v, want Off", system["PowerState"])
		}
		return nil
	})
	if !l.OnceConsumed(vm) {
		t.Errorf("the Once override was still set after the commissioning's PXE boot")
	}
}

func countApplied(l *lab.Lab, match maassim.Match) int {
	n := 0
	for _, r := range l.MaaS.Requests() {
		if r.Applied && r.Method == match.Method && r.Path == match.Path && r.Op == match.Op {
			n++
		}
	}
	return n
}

func redact(params map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range params {
		if strings.Contains(k, "pass") && v != "" {
			v = "***"
		}
		out[k] = v
	}
	return out
}
