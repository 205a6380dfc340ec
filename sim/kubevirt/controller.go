// Package kubevirt simulates KubeVirt's control plane, which cannot run
// here (envtest serves KubeVirt's CRDs, nothing acts on them). Simulator
// stands in for virt-controller: it watches VirtualMachines and acts on
// their runStrategy the way KubeVirt does. It creates and deletes VMIs,
// moves the VM's printableStatus through Starting, Running, Stopping and
// Stopped and the VMI's phase from Pending to Running, persists a firmware
// UUID, and records the device every guest boots from (sim/guest's
// BootDevice) when its VMI reaches Running. VirtAPI stands in for virt-api's
// stop and restart subresources. Not modelled: virt-handler and
// virt-launcher (no pods, no domain), status conditions, migration, pause,
// snapshots, DataVolumes, virt-api's other subresources (start, console,
// VNC), and the guest itself (sim/guest). Importers name it virtsim, as
// machine/kubevirt is the real backend.
package kubevirt

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/uuid"
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
	run := strategy == kubevirtv1.RunStrategyAlways || strategy == kubevirtv1.RunStrategyRerunOnFailure
	stop := strategy == kubevirtv1.RunStrategyHalted

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
	case vmi != nil && stop:
		status = kubevirtv1.VirtualMachineStatusStopping
		if err := s.api.Delete(ctx, vmi); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
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
	case run:
		status = kubevirtv1.VirtualMachineStatusStarting
		if err := s.createVMI(ctx, vm); err != nil {
			return ctrl.Result{}, err
		}
		result.RequeueAfter = s.opts.StartDelay
	default:
		status = kubevirtv1.VirtualMachineStatusStopped
	}
	return result, s.setStatus(ctx, vm, status)
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

func (s *Simulator) setStatus(ctx context.Context, vm *kubevirtv1.VirtualMachine, status kubevirtv1.VirtualMachinePrintableStatus) error {
	ready := status == kubevirtv1.VirtualMachineStatusRunning
	if vm.Status.PrintableStatus == status && vm.Status.Ready == ready {
		return nil
	}
	vm.Status.PrintableStatus = status
	vm.Status.Ready = ready
	vm.Status.Created = status != kubevirtv1.VirtualMachineStatusStopped
	return s.api.Status().Update(ctx, vm)
}
