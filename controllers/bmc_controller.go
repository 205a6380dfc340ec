package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/deploy/bmc"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
)

// legacyClusterRBACFinalizer held a VirtualMachineBMC until its cluster
// RBAC was deleted, in versions before that RBAC was owned by the
// Namespace (clusterrbac.go). The controller removes it where it is left.
const legacyClusterRBACFinalizer = "bmc.virtmetal.io/cluster-rbac"

// +kubebuilder:rbac:groups=bmc.virtmetal.io,resources=virtualmachinebmcs,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=bmc.virtmetal.io,resources=virtualmachinebmcs/status,verbs=patch
// +kubebuilder:rbac:groups=bmc.virtmetal.io,resources=virtualmachinebmcs/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=services;serviceaccounts,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=ingresses,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles;clusterrolebindings,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
//
// The Role a BMC gets can only be granted by a holder of its permissions
// (Kubernetes refuses privilege escalation), so the controller holds exactly
// those of deploy/bmc/rbac.yaml.tmpl:
// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachines,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachineinstances,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=subresources.kubevirt.io,resources=virtualmachines/start;virtualmachines/stop;virtualmachines/restart,verbs=update
// +kubebuilder:rbac:groups=subresources.kubevirt.io,resources=virtualmachineinstances/console;virtualmachineinstances/vnc,verbs=get
// +kubebuilder:rbac:groups=cdi.kubevirt.io,resources=datavolumes,verbs=create;get;delete
// +kubebuilder:rbac:groups=instancetype.kubevirt.io,resources=virtualmachineinstancetypes;virtualmachineclusterinstancetypes,verbs=get
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get

// BMCReconciler gives each VirtualMachineBMC its workload: credentials,
// RBAC, the bmc-server Deployment, Service and Ingress; it keeps them as
// wanted and reports their state in the status.
type BMCReconciler struct {
	Client client.Client // the manager's cached client
	// APIReader reads credentials Secrets the user named, which the
	// label-scoped Secret cache does not hold.
	APIReader client.Reader
	Scheme    *runtime.Scheme
	Config    *ConfigSource
	Workload  WorkloadFunc
	Events    events.EventRecorder

	statuses writtenStatuses[v1beta1.VirtualMachineBMCStatus]
	// sharedHealth tells of the shared reconciler's failures (Setup sets it).
	sharedHealth *sharedHealth
}

// bmcScope is what one reconcile of a VirtualMachineBMC read and decided.
// Its phases fill it in order; the status written at the end reports it.
type bmcScope struct {
	bmc      *v1beta1.VirtualMachineBMC
	config   Config
	vm       *kubevirtv1.VirtualMachine
	workload Workload
	applied  map[string]client.Object // the workload as the API server holds it, by Go type
	status   *statusBuilder
	result   ctrl.Result
}

// bmcPhase is one step of a reconcile. done ends the reconcile without an
// error: the status says why it cannot go on.
type bmcPhase func(ctx context.Context, s *bmcScope) (done bool, err error)

// Reconcile implements reconcile.Reconciler.
func (r *BMCReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	b := &v1beta1.VirtualMachineBMC{}
	if err := r.Client.Get(ctx, req.NamespacedName, b); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		r.statuses.forget(req.NamespacedName)
		// The BMC is named after its VM.
		if err := deleteClusterRBAC(ctx, r.Client, bmc.ClusterRBACName(req.Namespace, req.Name), req.Namespace, req.Name); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, deleteLegacyClusterRBAC(ctx, r.Client, req.Namespace, req.Name)
	}
	if controllerutil.RemoveFinalizer(b, legacyClusterRBACFinalizer) {
		return ctrl.Result{}, r.Client.Update(ctx, b) // its update event brings it back
	}
	if !b.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil // the garbage collector takes its objects; the NotFound above its cluster RBAC
	}
	s := &bmcScope{bmc: b, status: newStatus(b)}
	// Every return records what this reconcile reached, a failure
	// included, so a failed apply never leaves the last success showing.
	// A conflict is a stale cache, not a failure: its retry reports.
	defer func() {
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
			return
		}
		if err != nil {
			s.status.keepUnreached()
		}
		err = errors.Join(err, r.writeStatus(ctx, b, s.status))
	}()
	for _, phase := range []bmcPhase{r.readConfig, r.findVM, r.reconcileCredentials, r.renderWorkload, r.applyWorkload, r.reportWorkload} {
		if done, err := phase(ctx, s); err != nil || done {
			return s.result, err
		}
	}
	return s.result, nil
}

func (r *BMCReconciler) readConfig(ctx context.Context, s *bmcScope) (bool, error) {
	cfg, err := r.Config.Get(ctx)
	if err != nil {
		return false, s.status.fail(conditionDeploymentAvailable, reasonConfigInvalid, err)
	}
	s.config = cfg
	return false, nil
}

func (r *BMCReconciler) findVM(ctx context.Context, s *bmcScope) (bool, error) {
	b, vm := s.bmc, &kubevirtv1.VirtualMachine{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: b.Spec.VMName}, vm); err != nil {
		if !apierrors.IsNotFound(err) {
			return false, s.status.fail(conditionVMFound, reasonReadFailed, err)
		}
		// The VM's watch brings the BMC back here when it appears.
		s.status.set(conditionVMFound, false, reasonVMNotFound, "VirtualMachine %s does not exist", b.Spec.VMName)
		r.warn(b, nil, reasonVMNotFound, "Reconcile", "VirtualMachine %s does not exist", b.Spec.VMName)
		return true, nil
	}
	s.vm = vm
	s.status.set(conditionVMFound, true, reasonFound, "VirtualMachine %s exists", vm.Name)
	return false, nil
}

func (r *BMCReconciler) reconcileCredentials(ctx context.Context, s *bmcScope) (bool, error) {
	// The shared bmc-server's Secret holds every VM's credentials: a
	// tenant's BMC must not mount or serve it as its own.
	if s.bmc.Spec.CredentialsSecret == sharedName {
		s.status.set(conditionCredentialsReady, false, reasonSecretNotAllowed, "Secret %s is the shared bmc-server's, not credentials", sharedName)
		r.warn(s.bmc, nil, reasonSecretNotAllowed, "Reconcile", "Secret %s is the shared bmc-server's, not credentials", sharedName)
		return true, nil
	}
	if err := r.ensureCredentials(ctx, s.bmc, s.vm, s.config, s.status); err != nil {
		return false, s.status.fail(conditionCredentialsReady, reasonCredentialsFailed, err)
	}
	return false, nil
}

func (r *BMCReconciler) renderWorkload(ctx context.Context, s *bmcScope) (bool, error) {
	takenBy, err := r.olderClaimOfHost(ctx, s.bmc, s.config)
	if err != nil {
		return false, s.status.fail(conditionIngressReady, reasonReadFailed, err)
	}
	w, err := r.Workload(WorkloadInput{BMC: s.bmc, VM: s.vm, Config: s.config, HostTakenBy: takenBy})
	if err != nil {
		r.warn(s.bmc, s.vm, reasonWorkloadFailed, "Render", "%v", err)
		return false, s.status.fail(conditionDeploymentAvailable, reasonWorkloadFailed, err)
	}
	s.workload = w
	return false, nil
}

func (r *BMCReconciler) applyWorkload(ctx context.Context, s *bmcScope) (bool, error) {
	b, w := s.bmc, s.workload
	if err := ownByNamespace(ctx, r.Client, b.Namespace, w.ClusterObjects); err != nil {
		return false, s.status.fail(conditionDeploymentAvailable, reasonReadFailed, err)
	}
	if !w.Shared {
		if err := r.keepSharedState(ctx, b); err != nil {
			return false, s.status.fail(conditionDeploymentAvailable, reasonWorkloadFailed, err)
		}
	}
	s.applied = map[string]client.Object{}
	for _, obj := range slices.Concat(w.Objects, w.ClusterObjects) {
		got, err := (applier{r.Client, r.Scheme}).ensure(ctx, obj)
		if err != nil {
			r.warn(b, nil, reasonWorkloadFailed, "Apply", "%v", err)
			return false, s.status.fail(conditionOfKind(obj), reasonWorkloadFailed, err)
		}
		s.applied[fmt.Sprintf("%T", obj)] = got
	}
	return false, r.removeUnwanted(ctx, s)
}

// reportWorkload sets the conditions of the applied workload.
func (r *BMCReconciler) reportWorkload(ctx context.Context, s *bmcScope) (bool, error) {
	b, vm, w, st := s.bmc, s.vm, s.workload, s.status
	st.status.RedfishURL = w.RedfishURL
	st.status.IPMIAddress = w.IPMIAddress
	_, hasService := s.applied[fmt.Sprintf("%T", &corev1.Service{})]
	switch {
	case w.Shared:
		// The shared reconciler creates it; its availability event
		// brings this BMC back.
		d := &appsv1.Deployment{}
		if err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: sharedName}, d); client.IgnoreNotFound(err) != nil {
			return false, st.fail(conditionDeploymentAvailable, reasonReadFailed, err)
		}
		if err := r.sharedHealth.failure(b.Namespace); err != nil {
			st.set(conditionDeploymentAvailable, false, reasonSharedServerFailed, "shared bmc-server %s: %v", sharedName, err)
		} else {
			st.deployment(d)
		}
		st.set(conditionServiceReady, true, reasonShared, "Service %s serves the BMC", sharedName)
	case hasService:
		st.deployment(s.applied[fmt.Sprintf("%T", &appsv1.Deployment{})])
		st.set(conditionServiceReady, true, reasonCreated, "Service %s serves the BMC", workloadName(vm.Name))
	default:
		st.deployment(s.applied[fmt.Sprintf("%T", &appsv1.Deployment{})])
		st.set(conditionServiceReady, true, reasonDisabled, "neither Redfish nor IPMI is on")
	}
	switch {
	case errors.Is(w.IngressProblem, errHostTaken):
		// No event tells of the holder going: look again now and then.
		s.result.RequeueAfter = time.Minute
		r.warn(b, nil, reasonHostTaken, "Render", "%v", w.IngressProblem)
		st.set(conditionIngressReady, false, reasonHostTaken, "%v", w.IngressProblem)
	case w.IngressProblem != nil:
		r.warn(b, nil, reasonHostNotAllowed, "Render", "%v", w.IngressProblem)
		st.set(conditionIngressReady, false, reasonHostNotAllowed, "%v", w.IngressProblem)
	case w.RedfishURL == "":
		st.set(conditionIngressReady, true, reasonDisabled, "Redfish is off")
	default:
		st.set(conditionIngressReady, true, reasonCreated, "Redfish is served at %s", w.RedfishURL)
	}
	return false, nil
}

// warn records a Warning Event on the VirtualMachineBMC.
func (r *BMCReconciler) warn(b *v1beta1.VirtualMachineBMC, related runtime.Object, why reason, action, format string, args ...any) {
	r.Events.Eventf(b, related, corev1.EventTypeWarning, string(why), action, format, args...)
}

// olderClaimOfHost names the older VirtualMachineBMC of the namespace
// that keeps the host b asks for (one host, one BMC), or "" when b holds
// it, serves no Redfish, or asks for a host it may not have (the render
// says why).
func (r *BMCReconciler) olderClaimOfHost(ctx context.Context, b *v1beta1.VirtualMachineBMC, cfg Config) (string, error) {
	if !redfishEnabled(b) {
		return "", nil
	}
	host, err := ingressHost(b, cfg.Domain)
	if err != nil {
		return "", nil
	}
	holder, err := hostHolder(ctx, r.Client, b, host, cfg.Domain)
	if err != nil || holder.Name == b.Name {
		return "", err
	}
	return holder.Name, nil
}

// ensureCredentials makes the credentials Secret exist and rotates it when
// the rotate annotation asks for it. Enrolment creates the default Secret
// with the VirtualMachineBMC; this creates it for a VirtualMachineBMC made
// by hand, and again when it was deleted. A VM of the shared bmc-server
// without one has its credentials in the shared Secret instead
// (inSharedEntry).
func (r *BMCReconciler) ensureCredentials(ctx context.Context, b *v1beta1.VirtualMachineBMC, vm *kubevirtv1.VirtualMachine, cfg Config, st *statusBuilder) error {
	name := credentialsSecretName(b)
	key := types.NamespacedName{Namespace: b.Namespace, Name: name}
	secret := &corev1.Secret{}
	var reader client.Reader = r.Client
	if b.Spec.CredentialsSecret != "" {
		reader = r.APIReader
	}
	err := reader.Get(ctx, key, secret)
	switch {
	case apierrors.IsNotFound(err) && inSharedEntry(b, cfg):
		return r.reportSharedEntry(ctx, b, st)
	case apierrors.IsNotFound(err) && b.Spec.CredentialsSecret == "":
		secret = newCredentialsSecret(vm)
		if err := r.keepSharedEntry(ctx, b, secret); err != nil {
			return err
		}
		switch err := r.Client.Create(ctx, secret); {
		case apierrors.IsAlreadyExists(err):
			// Enrolment created it and the cache has not shown it yet.
			if err := r.APIReader.Get(ctx, key, secret); err != nil {
				return err
			}
		case err != nil:
			return err
		default:
			r.Events.Eventf(b, secret, corev1.EventTypeNormal, string(reasonCredentialsCreated), "Create", "created credentials Secret %s", name)
		}
	case apierrors.IsNotFound(err):
		st.set(conditionCredentialsReady, false, reasonSecretNotFound, "Secret %s does not exist", name)
		return nil
	case err != nil:
		return err
	}
	if _, _, ok := v1beta1.CredentialsOf(secret); !ok {
		st.set(conditionCredentialsReady, false, reasonSecretInvalid, "Secret %s needs non-empty %q and %q", name, v1beta1.SecretUsernameKey, v1beta1.SecretPasswordKey)
		return nil
	}
	st.set(conditionCredentialsReady, true, reasonFound, "Secret %s holds the credentials", name)

	want := b.Annotations[v1beta1.AnnotationRotateCredentials]
	if want == "" || want == b.Status.CredentialsRotation {
		return nil
	}
	if secret.Annotations[v1beta1.AnnotationRotatedFor] == want {
		st.status.CredentialsRotation = want // done; the status write was lost or is not cached yet
		return nil
	}
	if secret.Labels[v1beta1.LabelManagedBy] != v1beta1.ManagedByValue {
		st.set(conditionCredentialsReady, true, reasonRotationRefused, "Secret %s is not managed by virtmetal: rotate it yourself", name)
		return nil
	}
	// The user name stays: bmc-server accepts the previous password for a
	// while, so MaaS keeps power control until the MaaS reconciler has
	// given it the new one.
	// The update carries the cached resourceVersion: a Secret rotated since
	// is a conflict and a retry, never a second new password.
	rotated := secret.DeepCopy()
	rotated.Data[v1beta1.SecretPasswordKey] = []byte(newPassword())
	metav1.SetMetaDataAnnotation(&rotated.ObjectMeta, v1beta1.AnnotationRotatedFor, want)
	if err := r.Client.Update(ctx, rotated); err != nil {
		return err
	}
	st.status.CredentialsRotation = want
	r.Events.Eventf(b, secret, corev1.EventTypeNormal, string(reasonCredentialsRotated), "Rotate", "new password in Secret %s", name)
	return nil
}

// reportSharedEntry tells where the credentials of b, a VM of the shared
// bmc-server without a credentials Secret, are: its entry of the Secret
// sharedName, which SharedReconciler generates and rotates in its batches.
// A rotation asked for is reported done once the entry answers it.
func (r *BMCReconciler) reportSharedEntry(ctx context.Context, b *v1beta1.VirtualMachineBMC, st *statusBuilder) error {
	st.set(conditionCredentialsReady, true, reasonShared, "the entry %s of Secret %s holds the credentials", b.Spec.VMName, sharedName)
	want := b.Annotations[v1beta1.AnnotationRotateCredentials]
	if want == "" || want == b.Status.CredentialsRotation {
		return nil
	}
	secret := &corev1.Secret{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: sharedName}, secret); err != nil {
		return client.IgnoreNotFound(err)
	}
	if entry, ok := bmcspec.ParseCredentials(secret.Data[b.Spec.VMName]); ok && entry.RotatedFor == want {
		st.status.CredentialsRotation = want
		r.Events.Eventf(b, secret, corev1.EventTypeNormal, string(reasonCredentialsRotated), "Rotate", "new password in the entry %s of Secret %s", b.Spec.VMName, sharedName)
	}
	return nil
}

// keepSharedEntry gives the new credentials Secret of b the credentials of
// its entry of the shared Secret, if any: a VM that leaves the shared
// bmc-server (IPMI turned on) keeps the credentials MaaS has.
func (r *BMCReconciler) keepSharedEntry(ctx context.Context, b *v1beta1.VirtualMachineBMC, secret *corev1.Secret) error {
	shared := &corev1.Secret{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: sharedName}, shared); err != nil {
		return client.IgnoreNotFound(err)
	}
	if entry, ok := bmcspec.ParseCredentials(shared.Data[b.Spec.VMName]); ok && isShared(shared) {
		secret.Data[v1beta1.SecretUsernameKey], secret.Data[v1beta1.SecretPasswordKey] = []byte(entry.Username), []byte(entry.Password)
	}
	return nil
}

// keepSharedState gives the VM of b, served by a pod of its own, the state
// the shared bmc-server kept for it (its entry of the namespace's state
// Secret) when it has no state Secret of its own yet: a VM that leaves the
// shared server (IPMI turned on, or the mode switched) keeps its event
// subscriptions. The Secret is created, not applied, before the
// Deployment, so its own bmc-server reads them as it starts and the
// controller never claims the data the server writes.
func (r *BMCReconciler) keepSharedState(ctx context.Context, b *v1beta1.VirtualMachineBMC) error {
	key := types.NamespacedName{Namespace: b.Namespace, Name: bmcspec.StateSecretName(b.Spec.VMName)}
	if err := r.Client.Get(ctx, key, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		return err
	}
	shared := &corev1.Secret{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: bmcspec.SharedStateSecret}, shared); err != nil {
		return client.IgnoreNotFound(err)
	}
	raw, ok := shared.Data[b.Spec.VMName]
	if !ok || !isShared(shared) {
		return nil
	}
	entry, err := bmcspec.DecodeStateEntry(raw)
	if err != nil {
		return nil
	}
	own := stateSecret(metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, Labels: childLabels(b.Spec.VMName)})
	own.Data = entry
	setOwner(own, bmcKind, b, controlledBy)
	if err := r.Client.Create(ctx, own, FieldOwner); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// removeUnwanted deletes the workload's objects that the spec or the mode
// no longer asks for: the Service and Ingress when their protocols are off,
// the Deployment, Service and RBAC of a VM the shared bmc-server serves,
// cluster RBAC when the VM no longer has a cluster instancetype.
func (r *BMCReconciler) removeUnwanted(ctx context.Context, s *bmcScope) error {
	b, w := s.bmc, s.workload
	name := types.NamespacedName{Namespace: b.Namespace, Name: workloadName(b.Spec.VMName)}
	for _, candidate := range workloadKinds() {
		if slices.ContainsFunc(w.Objects, func(o client.Object) bool { return fmt.Sprintf("%T", o) == fmt.Sprintf("%T", candidate) }) {
			continue
		}
		if err := r.Client.Get(ctx, name, candidate); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return s.status.fail(conditionOfKind(candidate), reasonReadFailed, err)
		}
		if metav1.IsControlledBy(candidate, b) {
			if err := r.Client.Delete(ctx, candidate); client.IgnoreNotFound(err) != nil {
				return s.status.fail(conditionOfKind(candidate), reasonWorkloadFailed, err)
			}
		}
	}
	if len(w.ClusterObjects) == 0 {
		if err := deleteClusterRBAC(ctx, r.Client, bmc.ClusterRBACName(b.Namespace, b.Spec.VMName), b.Namespace, b.Spec.VMName); err != nil {
			return s.status.fail(conditionDeploymentAvailable, reasonWorkloadFailed, err)
		}
	}
	if err := deleteLegacyClusterRBAC(ctx, r.Client, b.Namespace, b.Spec.VMName); err != nil {
		return s.status.fail(conditionDeploymentAvailable, reasonWorkloadFailed, err)
	}
	return nil
}

// writeStatus applies the controller's part of the status (server-side
// apply, so the MaaS reconciler's fields stay), and sends nothing when it
// is what the object already says.
func (r *BMCReconciler) writeStatus(ctx context.Context, b *v1beta1.VirtualMachineBMC, s *statusBuilder) error {
	var notReady []string
	for _, t := range controllerConditions {
		if c := meta.FindStatusCondition(s.status.Conditions, string(t)); c == nil || c.Status != metav1.ConditionTrue {
			notReady = append(notReady, string(t))
		}
	}
	if len(notReady) == 0 {
		s.set(conditionReady, true, reasonReady, "the BMC serves its VM")
	} else {
		s.set(conditionReady, false, reasonNotReady, "not yet: %v", notReady)
	}
	s.status.ObservedGeneration = b.Generation
	key := client.ObjectKeyFromObject(b)
	if statusUpToDate(b.Status, s.status) || r.statuses.unchanged(key, b.ResourceVersion, s.status, statusUpToDate) {
		return nil
	}
	patch := &v1beta1.VirtualMachineBMC{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1beta1.GroupVersion.String(), Kind: "VirtualMachineBMC"},
		ObjectMeta: metav1.ObjectMeta{Name: b.Name, Namespace: b.Namespace},
		Status:     s.status,
	}
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(patch)
	if err != nil {
		return err
	}
	u := applyObject(content)
	delete(u.Object, "spec")
	if err := r.Client.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), FieldOwner, client.ForceOwnership); err != nil {
		return fmt.Errorf("status of %s: %w", key, err)
	}
	r.statuses.wrote(key, b.ResourceVersion, s.status)
	log.FromContext(ctx).V(1).Info("status written", "ready", len(notReady) == 0, "notReady", notReady)
	return nil
}

func statusUpToDate(current, want v1beta1.VirtualMachineBMCStatus) bool {
	if current.ObservedGeneration != want.ObservedGeneration || current.RedfishURL != want.RedfishURL ||
		current.IPMIAddress != want.IPMIAddress || current.CredentialsRotation != want.CredentialsRotation {
		return false
	}
	for _, t := range controllerConditions {
		if meta.FindStatusCondition(current.Conditions, string(t)) != nil && meta.FindStatusCondition(want.Conditions, string(t)) == nil {
			return false
		}
	}
	for _, c := range want.Conditions {
		old := meta.FindStatusCondition(current.Conditions, c.Type)
		if old == nil || old.Status != c.Status || old.Reason != c.Reason || old.Message != c.Message || old.ObservedGeneration != c.ObservedGeneration {
			return false
		}
	}
	return true
}
