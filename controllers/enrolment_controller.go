package controllers

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/api/v1beta1"
)

// IdentityStamper makes a VM's identity fields (SMBIOS serial and UUID,
// MACs) what an enrolled VM must carry, in place, and says what it replaced.
type IdentityStamper interface {
	Stamp(ctx context.Context, vm *kubevirtv1.VirtualMachine) (warnings []string, err error)
}

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch

// EnrolmentReconciler enrols every VM of an opted-in namespace: it gives it
// a VirtualMachineBMC (the BMC reconciler does the rest) and stamps its
// identity, and takes the VirtualMachineBMC away again when the namespace
// or the VM opts out. The webhook stamps identity at admission; this loop
// repairs VMs that existed before, or were admitted without the webhook.
type EnrolmentReconciler struct {
	Client   client.Client // the manager's cached client
	Config   *ConfigSource
	Identity IdentityStamper
	Events   events.EventRecorder

	mu       sync.Mutex
	enrolled map[types.NamespacedName]bool
	// patchedFrom is, by VM, the resourceVersion its last identity patch
	// was computed from, until the cache shows another: a reconcile that
	// reads the VM as it was before that patch (its VirtualMachineBMC's
	// creation can bring it back first) waits for the patch's own update
	// event instead of sending a patch that can only conflict.
	patchedFrom map[types.NamespacedName]string
	pending     pendingCreations
}

// Enrolled says whether vm should have a BMC: its namespace matches the
// selector in force and it has not opted out.
func (r *EnrolmentReconciler) Enrolled(ctx context.Context, vm *kubevirtv1.VirtualMachine) (bool, error) {
	if strings.EqualFold(vm.Annotations[v1beta1.AnnotationBMC], v1beta1.BMCDisabled) {
		return false, nil
	}
	cfg, err := r.Config.Get(ctx)
	if err != nil {
		return false, err
	}
	ns := &corev1.Namespace{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: vm.Namespace}, ns); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return cfg.NamespaceSelector.Matches(labels.Set(ns.Labels)), nil
}

// Reconcile implements reconcile.Reconciler for a VirtualMachine.
func (r *EnrolmentReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	vm := &kubevirtv1.VirtualMachine{}
	if err := r.Client.Get(ctx, req.NamespacedName, vm); err != nil {
		if apierrors.IsNotFound(err) {
			r.count(req.NamespacedName, false)
			r.mu.Lock()
			delete(r.patchedFrom, req.NamespacedName)
			r.mu.Unlock()
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !vm.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil // owner references take the rest
	}
	enrolled, err := r.Enrolled(ctx, vm)
	if err != nil {
		return ctrl.Result{}, err
	}
	r.count(req.NamespacedName, enrolled)
	if !enrolled {
		return ctrl.Result{}, r.unenrol(ctx, vm)
	}
	// The identity patch and the creations touch different objects and
	// read only the cached VM: sent together, a VM's enrolment waits for
	// two round trips to the API server instead of three, which is what
	// bounds enrolling a fleet on a busy API server.
	var (
		repaired  string
		replaced  bool
		repairErr error
		repairing = make(chan struct{})
	)
	go func() {
		defer close(repairing)
		repaired, replaced, repairErr = r.repairIdentity(ctx, vm)
	}()
	created, wait, err := r.ensureBMC(ctx, vm)
	<-repairing
	if err := errors.Join(repairErr, err); err != nil {
		return ctrl.Result{}, err
	}
	// At most one Event for what this reconcile did. Enrolment that
	// replaced nothing of the VM's owner says nothing the objects do not
	// (the VirtualMachineBMC, labelled enrolled, and the stamped fields):
	// an Event a VM would be a seventh of the writes of enrolling a fleet.
	// Values replaced, and an enrolled VM's edit put back, are told.
	switch {
	case created != "" && replaced:
		r.Events.Eventf(vm, nil, corev1.EventTypeNormal, string(reasonEnrolled), "Enrol", "created %s; %s", created, repaired)
	case created == "" && repaired != "":
		r.Events.Eventf(vm, nil, corev1.EventTypeNormal, string(reasonIdentityRepaired), "Stamp", "%s", repaired)
	}
	return ctrl.Result{RequeueAfter: wait}, nil
}

// ensureBMC creates the VM's VirtualMachineBMC, and its default credentials
// Secret unless the shared bmc-server keeps them (inSharedEntry), when it
// has none, and says what it created. One it created that
// the cache does not show yet is not created again: it returns how long to
// wait for the cache instead. Creating the Secret here, not in the BMC
// reconciler, lets one Event tell the VM's owner both.
func (r *EnrolmentReconciler) ensureBMC(ctx context.Context, vm *kubevirtv1.VirtualMachine) (string, time.Duration, error) {
	key := types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name}
	err := r.Client.Get(ctx, key, &v1beta1.VirtualMachineBMC{})
	if !apierrors.IsNotFound(err) {
		if err == nil {
			r.pending.observed(key)
		}
		return "", 0, err // present (the user's or ours, as it is), or a real error
	}
	if wait := r.pending.wait(key, vm.UID, time.Now()); wait > 0 {
		return "", wait, nil
	}
	bmcLabels := childLabels(vm.Name)
	bmcLabels[v1beta1.LabelEnrolled] = "true"
	b := &v1beta1.VirtualMachineBMC{
		ObjectMeta: metav1.ObjectMeta{Name: vm.Name, Namespace: vm.Namespace, Labels: bmcLabels},
		Spec:       v1beta1.VirtualMachineBMCSpec{VMName: vm.Name},
	}
	setOwner(b, vmKind, vm, controlledBy)
	cfg, err := r.Config.Get(ctx)
	if err != nil {
		return "", 0, err
	}
	var created []string
	// A VM of the shared bmc-server gets its credentials in the shared
	// Secret's batches instead (inSharedEntry).
	if !inSharedEntry(b, cfg) {
		secretKey := types.NamespacedName{Namespace: vm.Namespace, Name: v1beta1.CredentialsSecretName(vm.Name)}
		if err := r.Client.Get(ctx, secretKey, &corev1.Secret{}); apierrors.IsNotFound(err) {
			secret := newCredentialsSecret(vm)
			switch err := r.Client.Create(ctx, secret); {
			case err == nil:
				created = append(created, "credentials Secret "+secret.Name)
			case !apierrors.IsAlreadyExists(err):
				return "", 0, err
			}
		} else if err != nil {
			return "", 0, err
		}
	}
	err = r.Client.Create(ctx, b)
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return "", 0, err
	}
	r.pending.add(key, vm.UID, time.Now())
	if err == nil {
		created = append([]string{"VirtualMachineBMC " + b.Name}, created...)
	}
	return strings.Join(created, " and "), 0, nil
}

// unenrol deletes what enrolment made: the VirtualMachineBMC it created and
// the credentials the controller generated. A user's own are left alone.
func (r *EnrolmentReconciler) unenrol(ctx context.Context, vm *kubevirtv1.VirtualMachine) error {
	b := &v1beta1.VirtualMachineBMC{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name}, b)
	if apierrors.IsNotFound(err) || (err == nil && b.Labels[v1beta1.LabelEnrolled] != "true") {
		return nil
	}
	if err != nil {
		return err
	}
	if err := r.Client.Delete(ctx, b); client.IgnoreNotFound(err) != nil {
		return err
	}
	secret := &corev1.Secret{}
	err = r.Client.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: v1beta1.CredentialsSecretName(vm.Name)}, secret)
	if err == nil && secret.Labels[v1beta1.LabelManagedBy] == v1beta1.ManagedByValue {
		err = r.Client.Delete(ctx, secret)
	}
	if client.IgnoreNotFound(err) != nil {
		return err
	}
	r.Events.Eventf(vm, nil, corev1.EventTypeNormal, string(reasonUnenrolled), "Unenrol", "removed VirtualMachineBMC %s", vm.Name)
	return nil
}

// repairIdentity stamps the VM's identity and patches what differs, and
// says what it did ("" for nothing) and whether that replaced a value the
// VM had (a serial, UUID or MAC not its own). The patch carries the resourceVersion
// it was computed from, so a concurrent edit is retried on fresh data
// rather than overwritten.
func (r *EnrolmentReconciler) repairIdentity(ctx context.Context, vm *kubevirtv1.VirtualMachine) (string, bool, error) {
	if r.cacheBehindPatch(vm) {
		return "", false, nil
	}
	stamped := vm.DeepCopy()
	warnings, err := r.Identity.Stamp(ctx, stamped)
	if err != nil {
		return "", false, err
	}
	if equality.Semantic.DeepEqual(stamped.Spec, vm.Spec) {
		return "", false, nil
	}
	if err := r.Client.Patch(ctx, stamped, client.MergeFromWithOptions(vm, client.MergeFromWithOptimisticLock{})); err != nil {
		return "", false, err
	}
	r.mu.Lock()
	if r.patchedFrom == nil {
		r.patchedFrom = map[types.NamespacedName]string{}
	}
	r.patchedFrom[client.ObjectKeyFromObject(vm)] = vm.ResourceVersion
	r.mu.Unlock()
	note := "set SMBIOS serial, UUID, MACs and machine proof"
	if len(warnings) > 0 {
		note += ": " + strings.Join(warnings, "; ")
	}
	return note, len(warnings) > 0, nil
}

// cacheBehindPatch says whether vm is the version the last identity patch
// was computed from (patchedFrom), and forgets that patch once it is not.
func (r *EnrolmentReconciler) cacheBehindPatch(vm *kubevirtv1.VirtualMachine) bool {
	key := client.ObjectKeyFromObject(vm)
	r.mu.Lock()
	defer r.mu.Unlock()
	from, ok := r.patchedFrom[key]
	if ok && from == vm.ResourceVersion {
		return true
	}
	delete(r.patchedFrom, key)
	return false
}

// count keeps the enrolled-VMs gauge.
func (r *EnrolmentReconciler) count(vm types.NamespacedName, enrolled bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.enrolled == nil {
		r.enrolled = map[types.NamespacedName]bool{}
	}
	if enrolled {
		r.enrolled[vm] = true
	} else {
		delete(r.enrolled, vm)
	}
	enrolledVMs.Set(float64(len(r.enrolled)))
}
