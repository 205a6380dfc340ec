package lab_test

import (
	"context"
	"testing"

	"github.com/virtmetal/virtmetal/lab"
	"github.com/virtmetal/virtmetal/maas"
	"github.com/virtmetal/virtmetal/maas/maastest"
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
	l.MaaS.FailNext(12, maastest.FaultServerError)
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
	checkReadyMachine(t, ctx, vm)
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

func pollTest(ctx context.Context, done func() bool) error {
	return lab.Poll(ctx, func() (bool, error) { return done(), nil })
}
