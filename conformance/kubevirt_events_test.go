package conformance_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/internal/ssetest"
)

// TestKubeVirtEventStream: on the KubeVirt backend, against a real API
// server and the simulated virt-controller, a subscriber to the SSE stream
// is told every step of MaaS's power_on (the PXE override set, the power
// coming on, the override used up by that boot), in order and once each;
// and a change made straight on the VirtualMachine, as kubectl would,
// is told too.
func TestKubeVirtEventStream(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	b := startKubeVirtBMC(t, cluster.Config) // a halted VM
	stream, resp := ssetest.Open(t, b.ts.Client(), b.ts.URL+"/redfish/v1/EventService/SSE", maasUser, maasPass, nil)
	if stream == nil {
		t.Fatalf("SSE: %d", resp.StatusCode)
	}
	driver := newMaaSDriver(t, b.ts, "")
	if err := driver.PowerOn(ctx); err != nil {
		t.Fatalf("MaaS power_on: %v", err)
	}
	// The boot override is used up when the VMI has booted from it.
	poll.True(t, "the override used up", func() bool {
		_, _, body := kvRequest(t, b.ts, "GET", b.system, nil, "")
		boot, _ := body["Boot"].(map[string]any)
		return boot["BootSourceOverrideEnabled"] == "Disabled"
	})
	next := func() string {
		t.Helper()
		id, origin := stream.Next(t, 10*time.Second).Record(t)
		if origin != b.system {
			t.Errorf("%s from %s, want from %s", id, origin, b.system)
		}
		return id
	}
	const (
		changed    = "ResourceEvent.1.0.0.ResourceChanged"
		poweringOn = "ResourceEvent.1.3.0.ResourcePoweringOn"
		poweredOn  = "ResourceEvent.1.3.0.ResourcePoweredOn"
	)
	// The PXE override set, then the power coming on (PoweringOn may show
	// on its way) and the override used up by that boot: KubeVirt may
	// tell the VMI's boot before or after it reports Running.
	got := []string{next()}
	for !slices.Contains(got, poweredOn) || len(got) < 3 || slices.Index(got[1:], changed) < 0 {
		got = append(got, next())
	}
	stream.Quiet(t, 500*time.Millisecond)
	t.Logf("power_on told as %v", got)
	rest := got[1:]
	count := func(id string) int {
		return len(slices.DeleteFunc(slices.Clone(rest), func(s string) bool { return s != id }))
	}
	firstPower := slices.IndexFunc(rest, func(s string) bool { return s == poweringOn || s == poweredOn })
	switch {
	case got[0] != changed:
		t.Errorf("first %s, want the override set (%s)", got[0], changed)
	case count(poweredOn) != 1 || count(changed) != 1 || count(poweringOn) > 1 || len(rest) != 2+count(poweringOn):
		t.Errorf("events %v: want PoweredOn and the override used up once each, PoweringOn at most once", got)
	case count(poweringOn) == 1 && slices.Index(rest, poweringOn) > slices.Index(rest, poweredOn):
		t.Errorf("events %v: PoweringOn after PoweredOn", got)
	case slices.Index(rest, changed) < firstPower:
		t.Errorf("events %v: the override used up before the power came on", got)
	}

	// kubectl patch vm --type merge -p '{"spec":{"runStrategy":"Halted"}}'
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"runStrategy":"Halted"}}`))
	vm := &kubevirtv1.VirtualMachine{}
	vm.Namespace, vm.Name = b.namespace, b.machine
	if err := cluster.Client.Patch(ctx, vm, patch); err != nil {
		t.Fatal(err)
	}
	id := next()
	if id == "ResourceEvent.1.3.0.ResourcePoweringOff" {
		id = next()
	}
	if id != "ResourceEvent.1.3.0.ResourcePoweredOff" {
		t.Errorf("after the VM was halted by hand: %s, want ResourcePoweredOff", id)
	}
	stream.Quiet(t, 500*time.Millisecond)
}
