package lab_test

import (
	"context"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/lab"
	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

// TestFlowSurvivesFaults: the MaaS API answers 503 for a while and the
// VM's bmc-server is killed as soon as it is ready; the lab starts it again
// as its Deployment would, and the machine still ends Ready, with one
// machine, one pool and one commissioning.
func TestFlowSurvivesFaults(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), flowDeadline)
	defer cancel()
	l := theLab
	vm := maas.VMRef{Namespace: "lab-faults", Name: "web1"}
	if err := l.CreateNamespace(ctx, vm.Namespace); err != nil {
		t.Fatal(err)
	}
	// The reconciler's next requests fail, for several cycles.
	l.MaaS.FailNext(12, maassim.FaultServerError)
	if err := l.CreateVM(ctx, vm, lab.VMOptions{}); err != nil {
		t.Fatal(err)
	}
	var killed bool
	if err := pollTest(ctx, func() bool {
		for _, b := range l.BMCs() {
			if b.VM == vm && b.Ready {
				killed = l.KillBMC(vm)
				return true
			}
		}
		return false
	}); err != nil || !killed {
		t.Fatalf("the BMC never got ready to be killed: %v", err)
	}
	if err := l.WaitReady(ctx, vm); err != nil {
		t.Fatalf("not Ready after the faults: %v; steps %v", err, l.Timeline(vm))
	}
	checkReadyMachine(t, ctx, l, vm)
	// The container started again is the image's, as hardened.
	checkContainer(t, ctx, l, vm)
	failed := 0
	for _, r := range l.MaaS.Requests() {
		if r.StatusCode == 503 {
			failed++
		}
	}
	if failed != 12 {
		t.Errorf("%d requests got 503, want the 12 injected", failed)
	}
	for _, b := range l.BMCs() {
		if b.VM == vm && b.Starts < 2 {
			t.Errorf("bmc-server of %s started %d times; the kill must have restarted it", vm, b.Starts)
		}
	}
}

// TestCommissioningRetriedWhenPowerOnFails: MaaS cannot power the VM on
// for its first two commissionings (its BMC does not answer), so it puts
// the machine back to New each time, as MaaS does; the reconciler
// commissions it again and it ends Ready.
func TestCommissioningRetriedWhenPowerOnFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), flowDeadline)
	defer cancel()
	l := theLab
	vm := maas.VMRef{Namespace: "lab-poweron", Name: "web1"}
	if err := l.CreateNamespace(ctx, vm.Namespace); err != nil {
		t.Fatal(err)
	}
	l.FailPowerOn(vm, 2)
	if err := l.CreateVM(ctx, vm, lab.VMOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := l.WaitReady(ctx, vm); err != nil {
		t.Fatalf("not Ready: %v; steps %v", err, l.Timeline(vm))
	}
	m, _ := l.Machine(vm)
	if n := l.CommissioningStartFailures(m.SystemID); n != 2 {
		t.Errorf("%d commissionings of %s could not power it on, want the 2 injected", n, m.SystemID)
	}
	checkReadyMachine(t, ctx, l, vm)
}

func pollTest(ctx context.Context, done func() bool) error {
	return lab.Poll(ctx, func() (bool, error) { return done(), nil })
}

// TestFlowSurvivesAPIServerRestart: kube-apiserver stops and starts again
// (etcd, virt-api and virt-controller keep running) once MaaS has the VM's power config and before the
// reconciler names it, while every process holds watches and clients on it.
// The machine still ends Ready, with one machine, one pool and one
// commissioning.
func TestFlowSurvivesAPIServerRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), flowDeadline)
	defer cancel()
	l := theLab
	vm := maas.VMRef{Namespace: "lab-restart", Name: "web1"}
	if err := l.CreateNamespace(ctx, vm.Namespace); err != nil {
		t.Fatal(err)
	}
	if err := l.CreateVM(ctx, vm, lab.VMOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := pollTest(ctx, func() bool { return reached(l, vm, lab.StepPowerConfig) }); err != nil {
		t.Fatalf("no power config: %v; steps %v", err, l.Timeline(vm))
	}
	if reached(l, vm, lab.StepReady) {
		t.Fatalf("already Ready before the restart: steps %v", l.Timeline(vm))
	}
	restart := time.Now()
	if err := l.Cluster.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver restarted in %v", time.Since(restart).Round(time.Millisecond))
	if err := l.WaitReady(ctx, vm); err != nil {
		t.Fatalf("not Ready after the restart: %v; steps %v", err, l.Timeline(vm))
	}
	checkReadyMachine(t, ctx, l, vm)
}

func reached(l *lab.Lab, vm maas.VMRef, step lab.Step) bool {
	for _, e := range l.Timeline(vm) {
		if e.Step == step {
			return true
		}
	}
	return false
}
