package kubevirt_test

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
	virtsim "github.com/virtmetal/virtmetal/sim/kubevirt"
)

// subresourceCall is a start, stop or restart call with its grace period.
type subresourceCall struct {
	subresource string
	grace       int64 // -1: none given
}

// forcing sorts the requests the backend made into subresource calls and
// whether it deleted the VMI with grace period 0 (the fallback).
func forcing(requests []virtsim.Request, namespace, name string) (calls []subresourceCall, vmiDeleted bool) {
	vmPath := "/apis/" + kubevirtv1.SubresourceGroupName + "/v1/namespaces/" + namespace + "/virtualmachines/" + name + "/"
	vmiPath := "/apis/kubevirt.io/v1/namespaces/" + namespace + "/virtualmachineinstances/" + name
	for _, r := range requests {
		grace := int64(-1)
		if r.GracePeriod != nil {
			grace = *r.GracePeriod
		}
		switch {
		case r.Method == http.MethodPut && strings.HasPrefix(r.Path, vmPath):
			calls = append(calls, subresourceCall{strings.TrimPrefix(r.Path, vmPath), grace})
		case r.Method == http.MethodDelete && r.Path == vmiPath && grace == 0:
			vmiDeleted = true
		}
	}
	return calls, vmiDeleted
}

// TestForcedPower: ForceOff and ForceRestart go through virt-api's stop and
// restart with grace period 0, fall back to deleting the VMI where no
// virt-api serves them, take its conflicts as "nothing to do", and report
// it being away as ErrUnavailable without changing the VM.
func TestForcedPower(t *testing.T) {
	stop0 := []subresourceCall{{"stop", 0}}
	restart0 := []subresourceCall{{"restart", 0}}
	tests := []struct {
		name       string
		answer     int // the virt-api stand-in's; 0: acts as virt-api
		on         bool
		deleteVM   bool
		reset      machine.ResetType
		wantErr    error
		wantCalls  []subresourceCall
		wantDelete bool // the backend deleted the VMI with grace period 0
		wantPower  machine.PowerState
		wantBoots  int
		wantRun    kubevirtv1.VirtualMachineRunStrategy
	}{
		{"ForceOff calls stop with gracePeriod 0", 0, true, false, machine.ResetForceOff, nil, stop0, false, machine.PowerOff, 1, kubevirtv1.RunStrategyHalted},
		{"ForceOff deletes the VMI where stop is not served", http.StatusNotFound, true, false, machine.ResetForceOff, nil, stop0, true, machine.PowerOff, 1, kubevirtv1.RunStrategyHalted},
		{"ForceOff of an off VM: virt-api's conflict is success", 0, false, false, machine.ResetForceOff, nil, stop0, false, machine.PowerOff, 0, kubevirtv1.RunStrategyHalted},
		{"ForceOff refused by virt-api still ends Halted", http.StatusConflict, true, false, machine.ResetForceOff, nil, stop0, false, machine.PowerOff, 1, kubevirtv1.RunStrategyHalted},
		{"ForceOff with virt-api unavailable changes nothing", http.StatusServiceUnavailable, true, false, machine.ResetForceOff, machine.ErrUnavailable, stop0, false, machine.PowerOn, 1, kubevirtv1.RunStrategyRerunOnFailure},
		{"ForceOff of a deleted VM", 0, false, true, machine.ResetForceOff, machine.ErrNotFound, stop0, false, "", 0, ""},
		{"ForceOff of a deleted VM, stop not served", http.StatusNotFound, false, true, machine.ResetForceOff, machine.ErrNotFound, stop0, false, "", 0, ""},
		{"GracefulRestart calls restart without a grace period", 0, true, false, machine.ResetGracefulRestart, nil, []subresourceCall{{"restart", -1}}, false, machine.PowerOn, 2, kubevirtv1.RunStrategyRerunOnFailure},
		{"ForceRestart calls restart with gracePeriodSeconds 0", 0, true, false, machine.ResetForceRestart, nil, restart0, false, machine.PowerOn, 2, kubevirtv1.RunStrategyRerunOnFailure},
		{"PowerCycle is a forced restart", 0, true, false, machine.ResetPowerCycle, nil, restart0, false, machine.PowerOn, 2, kubevirtv1.RunStrategyRerunOnFailure},
		{"ForceRestart deletes the VMI where restart is not served", http.StatusNotFound, true, false, machine.ResetForceRestart, nil, restart0, true, machine.PowerOn, 2, kubevirtv1.RunStrategyAlways},
		{"ForceRestart refused by virt-api deletes the VMI", http.StatusConflict, true, false, machine.ResetForceRestart, nil, restart0, true, machine.PowerOn, 2, kubevirtv1.RunStrategyAlways},
		{"ForceRestart of an off VM starts it without restart", 0, false, false, machine.ResetForceRestart, nil, nil, false, machine.PowerOn, 1, kubevirtv1.RunStrategyRerunOnFailure},
		{"ForceRestart with virt-api unavailable changes nothing", http.StatusServiceUnavailable, true, false, machine.ResetForceRestart, machine.ErrUnavailable, restart0, false, machine.PowerOn, 1, kubevirtv1.RunStrategyRerunOnFailure},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			ns := cluster.NewNamespace(t)
			vm := newVM(t, ns, "vm", nil)
			api := cluster.NewVirtAPI(t)
			m := mustMachine(t, kubevirttest.StartBackend(t, api.Config(), ns, "vm", kubevirt.Options{}), "vm")
			if tc.on {
				if err := m.Reset(ctx, machine.ResetOn); err != nil {
					t.Fatalf("Reset On: %v", err)
				}
				waitPower(t, m, machine.PowerOn)
			}
			if tc.deleteVM {
				if err := cluster.Client.Delete(ctx, vm); err != nil {
					t.Fatalf("deleting the VM: %v", err)
				}
				// Until virt-controller removes its finalizer, the VM is
				// still there.
				poll.True(t, "the VM gone", func() bool {
					return apierrors.IsNotFound(cluster.Client.Get(ctx, client.ObjectKeyFromObject(vm), &kubevirtv1.VirtualMachine{}))
				})
			}
			api.Answer(tc.answer)
			before := len(api.Requests())

			err := m.Reset(ctx, tc.reset)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Reset(%s) = %v, want %v", tc.reset, err, tc.wantErr)
			}
			calls, deleted := forcing(api.Requests()[before:], ns, "vm")
			if !slices.Equal(calls, tc.wantCalls) {
				t.Errorf("subresource calls %v, want %v", calls, tc.wantCalls)
			}
			if deleted != tc.wantDelete {
				t.Errorf("backend deleted the VMI with grace 0: %t, want %t", deleted, tc.wantDelete)
			}
			if tc.deleteVM {
				return
			}
			if got := getVM(t, ns, "vm").Spec.RunStrategy; got == nil || *got != tc.wantRun {
				t.Errorf("runStrategy %v, want %s", got, tc.wantRun)
			}
			waitPower(t, m, tc.wantPower)
			poll.True(t, "the boots", func() bool { return len(cluster.Boots(ns, "vm")) == tc.wantBoots })
		})
	}
}

// TestForcedPowerFallbackLog: a cluster without virt-api is worth one V(1)
// line, not one per ForceOff; virt-api's own 404 (the VM is gone) is not
// taken for a missing API.
func TestForcedPowerFallbackLog(t *testing.T) {
	tests := []struct {
		name      string
		answer    int // the virt-api stand-in's; 0: acts as virt-api
		deleteVM  bool
		wantErr   error
		wantLines int
	}{
		{"not served: one line for two ForceOffs", http.StatusNotFound, false, nil, 1},
		{"served, VM deleted: no line", 0, true, machine.ErrNotFound, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			ns := cluster.NewNamespace(t)
			vm := newVM(t, ns, "vm", nil)
			api := cluster.NewVirtAPI(t)
			api.Answer(tc.answer)
			var mu sync.Mutex
			var notServed []string
			logger := funcr.New(func(_, args string) {
				mu.Lock()
				defer mu.Unlock()
				if strings.Contains(args, "not served") {
					notServed = append(notServed, args)
				}
			}, funcr.Options{Verbosity: 1})
			m := mustMachine(t, kubevirttest.StartBackend(t, api.Config(), ns, "vm", kubevirt.Options{Logger: logger}), "vm")
			if tc.deleteVM {
				if err := cluster.Client.Delete(ctx, vm); err != nil {
					t.Fatalf("deleting the VM: %v", err)
				}
				// Until virt-controller removes its finalizer, the VM is
				// still there.
				poll.True(t, "the VM gone", func() bool {
					return apierrors.IsNotFound(cluster.Client.Get(ctx, client.ObjectKeyFromObject(vm), &kubevirtv1.VirtualMachine{}))
				})
			}
			for range 2 {
				if !tc.deleteVM {
					if err := m.Reset(ctx, machine.ResetOn); err != nil {
						t.Fatalf("Reset On: %v", err)
					}
					waitPower(t, m, machine.PowerOn)
				}
				if err := m.Reset(ctx, machine.ResetForceOff); !errors.Is(err, tc.wantErr) {
					t.Fatalf("ForceOff = %v, want %v", err, tc.wantErr)
				}
				if !tc.deleteVM {
					waitPower(t, m, machine.PowerOff)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if len(notServed) != tc.wantLines {
				t.Fatalf("log lines about the missing subresource API: %q, want %d", notServed, tc.wantLines)
			}
			for _, l := range notServed {
				if !strings.Contains(l, `"level"=1`) {
					t.Errorf("logged at another level than V(1): %s", l)
				}
			}
		})
	}
}

// TestGuestPowerOffStaysOff: a guest that powers itself off leaves the
// machine Off, as a server's OS does (MaaS's enlistment and commissioning
// environments end with poweroff); On then starts it through virt-api's
// start, or, where no virt-api serves start, through runStrategy Always.
func TestGuestPowerOffStaysOff(t *testing.T) {
	tests := []struct {
		name    string
		answer  int // the virt-api stand-in's; 0: acts as virt-api
		wantRun kubevirtv1.VirtualMachineRunStrategy
	}{
		{"start served", 0, kubevirtv1.RunStrategyRerunOnFailure},
		{"start not served", http.StatusNotFound, kubevirtv1.RunStrategyAlways},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			ns := cluster.NewNamespace(t)
			newVM(t, ns, "vm", nil)
			api := cluster.NewVirtAPI(t)
			m := mustMachine(t, kubevirttest.StartBackend(t, api.Config(), ns, "vm", kubevirt.Options{}), "vm")
			if err := m.Reset(ctx, machine.ResetOn); err != nil {
				t.Fatalf("Reset On: %v", err)
			}
			waitPower(t, m, machine.PowerOn)
			if err := cluster.ShutdownGuest(ctx, ns, "vm"); err != nil {
				t.Fatalf("ShutdownGuest: %v", err)
			}
			waitPower(t, m, machine.PowerOff)
			// Settled: virt-controller acted on the strategy, removed the
			// VMI and has no start to act on, so nothing starts the VM.
			poll.True(t, "the VM settled off", func() bool {
				vm := getVM(t, ns, "vm")
				err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vm"}, &kubevirtv1.VirtualMachineInstance{})
				return apierrors.IsNotFound(err) && vm.Status.RunStrategy == kubevirtv1.RunStrategyRerunOnFailure &&
					vm.Status.PrintableStatus == kubevirtv1.VirtualMachineStatusStopped && len(vm.Status.StateChangeRequests) == 0
			})
			if st, err := m.PowerState(ctx); err != nil || st != machine.PowerOff {
				t.Errorf("PowerState after the guest powered off = %s, %v; want Off", st, err)
			}
			if boots := cluster.Boots(ns, "vm"); len(boots) != 1 {
				t.Errorf("boots %v after the guest powered off, want the first one only", boots)
			}

			api.Answer(tc.answer)
			before := len(api.Requests())
			if err := m.Reset(ctx, machine.ResetOn); err != nil {
				t.Fatalf("Reset On after the guest powered off: %v", err)
			}
			if calls, _ := forcing(api.Requests()[before:], ns, "vm"); !slices.Equal(calls, []subresourceCall{{"start", -1}}) {
				t.Errorf("subresource calls %v, want one start", calls)
			}
			waitPower(t, m, machine.PowerOn)
			poll.True(t, "a second boot", func() bool { return len(cluster.Boots(ns, "vm")) == 2 })
			if got := getVM(t, ns, "vm").Spec.RunStrategy; got == nil || *got != tc.wantRun {
				t.Errorf("runStrategy %v, want %s", got, tc.wantRun)
			}
		})
	}
}
