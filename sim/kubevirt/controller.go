// Package kubevirt simulates KubeVirt's control plane on a bare API server
// (envtest), for tests that need what the real one
// (internal/kubetest/realkubevirt) cannot give: injected virt-api faults,
// starts held mid-way, recorded boots, many VMs on one process. Simulator
// stands in for virt-controller: it watches VirtualMachines and acts on
// their runStrategy and status.stateChangeRequests the way KubeVirt does
// (Always replaces an ended VMI; RerunOnFailure removes one and starts anew
// only after a failure or a start request; Manual starts only on request).
// It creates and deletes VMIs, moves the VM's printableStatus through
// Starting, Running, Stopping and Stopped and the VMI's phase from Pending
// to Running (Succeeded when a test shuts the guest down), records the
// strategy it acted on in status.runStrategy, persists a firmware UUID, and
// records the device every guest boots from (sim/guest's BootDevice) when
// its VMI reaches Running. VirtAPI stands in for virt-api's start, stop and
// restart subresources. Not modelled: virt-handler and virt-launcher (no
// pods, no domain), status conditions, migration, pause, snapshots,
// DataVolumes, virt-api's other subresources (console, VNC), and the guest
// itself (sim/guest). Importers name it virtsim, as machine/kubevirt is the
// real backend.
package kubevirt

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/virtmetal/virtmetal/internal/kubescheme"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/sim/guest"
)

// shutdownFinalizer keeps a deleted VMI visible while it "shuts down", as
// KubeVirt's own finalizers do.
const shutdownFinalizer = "virtsim.virtmetal.io/shutdown"

// HoldStartAnnotation on a VM keeps its VMI Pending (VM Starting, the
// guest not booted) until removed: a VM caught mid-start.
const HoldStartAnnotation = "virtsim.virtmetal.io/hold-start"

// Options sets how long transitions take.
type Options struct {
	// StartDelay is how long a new VMI stays Pending (VM Starting).
	StartDelay time.Duration
	// StopDelay is how long a graceful shutdown takes (VM Stopping). A VMI
	// whose spec.terminationGracePeriodSeconds is 0 goes at once, as with
	// virt-handler (a delete's own grace period means nothing for a custom
	// resource: the API server always records 0).
	StopDelay time.Duration
	// Workers is how many VMs are reconciled at once; 1 when 0. A real
	// virt-controller runs several workers, so that one VM's start does not
	// wait behind every other's; a VM is never reconciled by two at once.
	Workers int
	Logger  logr.Logger
}

// Simulator is the simulated virt-controller.
type Simulator struct {
	mgr  ctrl.Manager
	api  client.Client // reads bypass the cache: the sim must see the template as of now
	opts Options

	mu    sync.Mutex
	boots map[types.NamespacedName][]machine.BootTarget
}

// New creates a simulator acting on every VM the config can see.
func New(cfg *rest.Config, opts Options) (*Simulator, error) {
	skip := true
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:     kubescheme.New(),
		Logger:     opts.Logger,
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: &skip},
	})
	if err != nil {
		return nil, err
	}
	api, err := client.New(cfg, client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		return nil, err
	}
	s := &Simulator{mgr: mgr, api: api, opts: opts, boots: map[types.NamespacedName][]machine.BootTarget{}}
	err = ctrl.NewControllerManagedBy(mgr).
		For(&kubevirtv1.VirtualMachine{}).
		Owns(&kubevirtv1.VirtualMachineInstance{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(opts.Workers, 1)}).
		Complete(s)
	return s, err
}

// Start runs the simulator until ctx ends.
func (s *Simulator) Start(ctx context.Context) error { return s.mgr.Start(ctx) }

// Boots returns the device each guest of the VM booted from so far (one
// per VMI that reached Running).
func (s *Simulator) Boots(namespace, name string) []machine.BootTarget {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.boots[types.NamespacedName{Namespace: namespace, Name: name}])
}

// Reconcile drives one VM one step towards its runStrategy.
func (s *Simulator) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	vm := &kubevirtv1.VirtualMachine{}
	vmi := &kubevirtv1.VirtualMachineInstance{}
	vmErr := s.api.Get(ctx, req.NamespacedName, vm)
	vmiErr := s.api.Get(ctx, req.NamespacedName, vmi)
	if vmErr != nil && !apierrors.IsNotFound(vmErr) {
		return ctrl.Result{}, vmErr
	}
	if vmiErr != nil && !apierrors.IsNotFound(vmiErr) {
		return ctrl.Result{}, vmiErr
	}
	if apierrors.IsNotFound(vmiErr) {
		vmi = nil
	}
	if apierrors.IsNotFound(vmErr) {
		// envtest has no garbage collector: remove the orphan ourselves.
		if vmi != nil {
			return ctrl.Result{}, s.finalize(ctx, vmi)
		}
		return ctrl.Result{}, nil
	}
	if vm.Spec.Template.Spec.Domain.Firmware == nil || vm.Spec.Template.Spec.Domain.Firmware.UUID == "" {
		return ctrl.Result{}, s.persistUUID(ctx, vm)
	}
	strategy, err := vm.RunStrategy()
	if err != nil {
		return ctrl.Result{}, err
	}
	before := vm.Status.DeepCopy()
	var result ctrl.Result
	var status kubevirtv1.VirtualMachinePrintableStatus
	switch {
	case vmi != nil && vmi.DeletionTimestamp != nil:
		status = kubevirtv1.VirtualMachineStatusStopping
		left := s.opts.StopDelay - time.Since(vmi.DeletionTimestamp.Time)
		if grace := vmi.Spec.TerminationGracePeriodSeconds; grace != nil && *grace == 0 || left <= 0 {
			if err := s.finalize(ctx, vmi); err != nil {
				return ctrl.Result{}, err
			}
			return ctrl.Result{Requeue: true}, nil // then start a new one, or report Stopped
		}
		result.RequeueAfter = left
	case vmi != nil && (stopRequested(vm, vmi.UID) || endsVMI(strategy, vmi.Status.Phase)):
		status = kubevirtv1.VirtualMachineStatusStopping
		if vmi.IsFinal() {
			status = kubevirtv1.VirtualMachineStatusStopped
		}
		if err := s.api.Delete(ctx, vmi); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		if strategy == kubevirtv1.RunStrategyRerunOnFailure && vmi.Status.Phase == kubevirtv1.Failed {
			vm.Status.StateChangeRequests = append(vm.Status.StateChangeRequests, kubevirtv1.VirtualMachineStateChangeRequest{Action: kubevirtv1.StartRequest})
		}
	case vmi != nil && vmi.IsFinal():
		status = kubevirtv1.VirtualMachineStatusStopped
	case vmi != nil && vmi.Status.Phase == kubevirtv1.Running:
		status = kubevirtv1.VirtualMachineStatusRunning
	case vmi != nil:
		status = kubevirtv1.VirtualMachineStatusStarting
		if left := s.opts.StartDelay - time.Since(vmi.CreationTimestamp.Time); left > 0 {
			result.RequeueAfter = left
		} else if _, held := vm.Annotations[HoldStartAnnotation]; !held {
			vmi.Status.Phase = kubevirtv1.Running
			if err := s.api.Update(ctx, vmi); err != nil {
				return ctrl.Result{}, err
			}
			// The guest boots now, from the VMI's own bootOrder.
			key := client.ObjectKeyFromObject(vm)
			s.mu.Lock()
			s.boots[key] = append(s.boots[key], guest.BootDevice(&vmi.Spec))
			s.mu.Unlock()
			status = kubevirtv1.VirtualMachineStatusRunning
		}
	case startsVMI(vm, strategy):
		status = kubevirtv1.VirtualMachineStatusStarting
		if err := s.createVMI(ctx, vm); err != nil {
			return ctrl.Result{}, err
		}
		vm.Status.StateChangeRequests = nil
		result.RequeueAfter = s.opts.StartDelay
	default:
		status = kubevirtv1.VirtualMachineStatusStopped
	}
	if vmi == nil {
		// Stop requests name a VMI; with none left they are done.
		vm.Status.StateChangeRequests = slices.DeleteFunc(vm.Status.StateChangeRequests, func(r kubevirtv1.VirtualMachineStateChangeRequest) bool {
			return r.Action == kubevirtv1.StopRequest
		})
	}
	vm.Status.RunStrategy = strategy
	return result, s.setStatus(ctx, vm, before, status)
}

// endsVMI reports whether virt-controller removes a VMI in that phase under
// the strategy: Halted stops every VMI; Always replaces one that ended;
// RerunOnFailure removes one that ended (and starts anew only after a
// failure). Manual and Once leave an ended VMI in place.
func endsVMI(strategy kubevirtv1.VirtualMachineRunStrategy, phase kubevirtv1.VirtualMachineInstancePhase) bool {
	switch strategy {
	case kubevirtv1.RunStrategyHalted:
		return true
	case kubevirtv1.RunStrategyAlways, kubevirtv1.RunStrategyRerunOnFailure:
		return phase == kubevirtv1.Succeeded || phase == kubevirtv1.Failed
	}
	return false
}

// startsVMI reports whether virt-controller starts a VM that has no VMI:
// Always does; RerunOnFailure when coming from another strategy or asked
// to (virt-api's start); Manual only when asked to; Once once, when coming
// from another strategy.
func startsVMI(vm *kubevirtv1.VirtualMachine, strategy kubevirtv1.VirtualMachineRunStrategy) bool {
	asked := slices.ContainsFunc(vm.Status.StateChangeRequests, func(r kubevirtv1.VirtualMachineStateChangeRequest) bool {
		return r.Action == kubevirtv1.StartRequest
	})
	switch strategy {
	case kubevirtv1.RunStrategyAlways:
		return true
	case kubevirtv1.RunStrategyRerunOnFailure, kubevirtv1.RunStrategyOnce:
		return asked || vm.Status.RunStrategy != strategy
	case kubevirtv1.RunStrategyManual:
		return asked
	}
	return false
}

// stopRequested reports whether the VM's status asks for the VMI with that
// UID to stop (virt-api's stop and restart).
func stopRequested(vm *kubevirtv1.VirtualMachine, uid types.UID) bool {
	return slices.ContainsFunc(vm.Status.StateChangeRequests, func(r kubevirtv1.VirtualMachineStateChangeRequest) bool {
		return r.Action == kubevirtv1.StopRequest && r.UID != nil && *r.UID == uid
	})
}

// ShutdownGuest has the VM's guest power itself off: its VMI ends
// Succeeded, as virt-handler reports a domain that shut down.
func (s *Simulator) ShutdownGuest(ctx context.Context, namespace, name string) error {
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := s.api.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, vmi); err != nil {
		return err
	}
	vmi.Status.Phase = kubevirtv1.Succeeded
	return s.api.Update(ctx, vmi)
}

// persistUUID gives the VM a stable firmware UUID, as virt-controller does.
func (s *Simulator) persistUUID(ctx context.Context, vm *kubevirtv1.VirtualMachine) error {
	if vm.Spec.Template.Spec.Domain.Firmware == nil {
		vm.Spec.Template.Spec.Domain.Firmware = &kubevirtv1.Firmware{}
	}
	id := uuid.NewSHA1(uuid.NameSpaceURL, []byte("virtsim:"+vm.Namespace+"/"+vm.Name))
	vm.Spec.Template.Spec.Domain.Firmware.UUID = types.UID(id.String())
	return s.api.Update(ctx, vm)
}

func (s *Simulator) createVMI(ctx context.Context, vm *kubevirtv1.VirtualMachine) error {
	tmpl := vm.Spec.Template
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{
			Name:        vm.Name,
			Namespace:   vm.Namespace,
			Labels:      tmpl.ObjectMeta.Labels,
			Annotations: tmpl.ObjectMeta.Annotations,
			Finalizers:  []string{shutdownFinalizer},
		},
		Spec:   *tmpl.Spec.DeepCopy(),
		Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Pending},
	}
	if err := controllerutil.SetControllerReference(vm, vmi, s.mgr.GetScheme()); err != nil {
		return err
	}
	if err := s.api.Create(ctx, vmi); err != nil {
		return fmt.Errorf("creating VMI: %w", err)
	}
	return nil
}

func (s *Simulator) finalize(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) error {
	if vmi.DeletionTimestamp == nil {
		if err := s.api.Delete(ctx, vmi); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	if controllerutil.RemoveFinalizer(vmi, shutdownFinalizer) {
		if err := s.api.Update(ctx, vmi); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// setStatus writes the VM's status: printableStatus, ready and created as
// given, with whatever Reconcile changed in vm.Status since it read before.
func (s *Simulator) setStatus(ctx context.Context, vm *kubevirtv1.VirtualMachine, before *kubevirtv1.VirtualMachineStatus, status kubevirtv1.VirtualMachinePrintableStatus) error {
	vm.Status.PrintableStatus = status
	vm.Status.Ready = status == kubevirtv1.VirtualMachineStatusRunning
	vm.Status.Created = status != kubevirtv1.VirtualMachineStatusStopped
	if equality.Semantic.DeepEqual(before, &vm.Status) {
		return nil
	}
	return s.api.Status().Update(ctx, vm)
}
