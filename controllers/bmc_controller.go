package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
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
)

// clusterRBACFinalizer holds a VirtualMachineBMC until its cluster-scoped
// RBAC (for a VM with a cluster instancetype), which no owner reference can
// collect, is deleted.
const clusterRBACFinalizer = "bmc.virtmetal.io/cluster-rbac"

// Event reasons.
const (
	reasonCredentialsCreated = "CredentialsCreated"
	reasonCredentialsRotated = "CredentialsRotated"
	reasonWorkloadFailed     = "WorkloadFailed"
	reasonHostNotAllowed     = "HostNotAllowed"
	reasonVMNotFound         = "VMNotFound"
	reasonSecretNotAllowed   = "SecretNotAllowed"
)

// +kubebuilder:rbac:groups=bmc.virtmetal.io,resources=virtualmachinebmcs,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=bmc.virtmetal.io,resources=virtualmachinebmcs/status,verbs=patch
// +kubebuilder:rbac:groups=bmc.virtmetal.io,resources=virtualmachinebmcs/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=services;serviceaccounts,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=ingresses,verbs=get;list;watch;create;patch;delete
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
// +kubebuilder:rbac:groups=subresources.kubevirt.io,resources=virtualmachines/stop;virtualmachines/restart,verbs=update
// +kubebuilder:rbac:groups=cdi.kubevirt.io,resources=datavolumes,verbs=create;get;delete
// +kubebuilder:rbac:groups=instancetype.kubevirt.io,resources=virtualmachineinstancetypes;virtualmachineclusterinstancetypes,verbs=get

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
}

// Reconcile implements reconcile.Reconciler.
func (r *BMCReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	bmcObj := &v1beta1.VirtualMachineBMC{}
	if err := r.Client.Get(ctx, req.NamespacedName, bmcObj); err != nil {
		if apierrors.IsNotFound(err) {
			r.statuses.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !bmcObj.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.finalize(ctx, bmcObj)
	}
	cfg, err := r.Config.Get(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	st := newStatus(bmcObj)

	vm := &kubevirtv1.VirtualMachine{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: bmcObj.Namespace, Name: bmcObj.Spec.VMName}, vm); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		// The VM's watch brings the BMC back here when it appears.
		st.set(v1beta1.ConditionVMFound, false, reasonVMNotFound, "VirtualMachine %s does not exist", bmcObj.Spec.VMName)
		r.Events.Eventf(bmcObj, nil, corev1.EventTypeWarning, reasonVMNotFound, "Reconcile", "VirtualMachine %s does not exist", bmcObj.Spec.VMName)
		return ctrl.Result{}, r.writeStatus(ctx, bmcObj, st)
	}
	st.set(v1beta1.ConditionVMFound, true, "Found", "VirtualMachine %s exists", vm.Name)

	// The shared bmc-server's Secret holds every VM's credentials: a
	// tenant's BMC must not mount or serve it as its own.
	if bmcObj.Spec.CredentialsSecret == sharedName {
		st.set(v1beta1.ConditionCredentialsReady, false, reasonSecretNotAllowed, "Secret %s is the shared bmc-server's, not credentials", sharedName)
		r.Events.Eventf(bmcObj, nil, corev1.EventTypeWarning, reasonSecretNotAllowed, "Reconcile", "Secret %s is the shared bmc-server's, not credentials", sharedName)
		return ctrl.Result{}, r.writeStatus(ctx, bmcObj, st)
	}

	if err := r.ensureCredentials(ctx, bmcObj, vm, st); err != nil {
		return ctrl.Result{}, errors.Join(err, r.writeStatus(ctx, bmcObj, st))
	}

	w, err := r.Workload(WorkloadInput{BMC: bmcObj, VM: vm, Config: cfg})
	if err != nil {
		r.Events.Eventf(bmcObj, vm, corev1.EventTypeWarning, reasonWorkloadFailed, "Render", "%v", err)
		st.set(v1beta1.ConditionDeploymentAvailable, false, reasonWorkloadFailed, "%v", err)
		return ctrl.Result{}, errors.Join(err, r.writeStatus(ctx, bmcObj, st))
	}
	if err := r.keepHostOfOlderClaim(ctx, bmcObj, cfg, &w); err != nil {
		return ctrl.Result{}, err
	}
	if len(w.ClusterObjects) > 0 && controllerutil.AddFinalizer(bmcObj, clusterRBACFinalizer) {
		if err := r.Client.Update(ctx, bmcObj); err != nil {
			return ctrl.Result{}, err
		}
	}
	actual := map[string]client.Object{}
	for _, obj := range slices.Concat(w.Objects, w.ClusterObjects) {
		got, err := (applier{r.Client, r.Scheme}).ensure(ctx, obj)
		if err != nil {
			r.Events.Eventf(bmcObj, nil, corev1.EventTypeWarning, reasonWorkloadFailed, "Apply", "%v", err)
			return ctrl.Result{}, err
		}
		actual[fmt.Sprintf("%T", obj)] = got
	}
	if err := r.removeUnwanted(ctx, bmcObj, w); err != nil {
		return ctrl.Result{}, err
	}

	var result ctrl.Result
	st.status.RedfishURL = w.RedfishURL
	st.status.IPMIAddress = w.IPMIAddress
	_, hasService := actual[fmt.Sprintf("%T", &corev1.Service{})]
	switch {
	case w.Shared:
		// The shared reconciler creates it; its availability event
		// brings this BMC back.
		d := &appsv1.Deployment{}
		if err := r.Client.Get(ctx, types.NamespacedName{Namespace: bmcObj.Namespace, Name: sharedName}, d); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, err
		}
		st.deployment(d)
		st.set(v1beta1.ConditionServiceReady, true, "Shared", "Service %s serves the BMC", sharedName)
	case hasService:
		st.deployment(actual[fmt.Sprintf("%T", &appsv1.Deployment{})])
		st.set(v1beta1.ConditionServiceReady, true, "Created", "Service %s serves the BMC", workloadName(vm.Name))
	default:
		st.deployment(actual[fmt.Sprintf("%T", &appsv1.Deployment{})])
		st.set(v1beta1.ConditionServiceReady, true, "Disabled", "neither Redfish nor IPMI is on")
	}
	switch {
	case errors.Is(w.IngressProblem, errHostTaken):
		// No event tells of the holder going: look again now and then.
		result.RequeueAfter = time.Minute
		r.Events.Eventf(bmcObj, nil, corev1.EventTypeWarning, reasonHostTaken, "Render", "%v", w.IngressProblem)
		st.set(v1beta1.ConditionIngressReady, false, reasonHostTaken, "%v", w.IngressProblem)
	case w.IngressProblem != nil:
		r.Events.Eventf(bmcObj, nil, corev1.EventTypeWarning, reasonHostNotAllowed, "Render", "%v", w.IngressProblem)
		st.set(v1beta1.ConditionIngressReady, false, reasonHostNotAllowed, "%v", w.IngressProblem)
	case w.RedfishURL == "":
		st.set(v1beta1.ConditionIngressReady, true, "Disabled", "Redfish is off")
	default:
		st.set(v1beta1.ConditionIngressReady, true, "Created", "Redfish is served at %s", w.RedfishURL)
	}
	return result, r.writeStatus(ctx, bmcObj, st)
}

// keepHostOfOlderClaim leaves the Ingress out of w when an older
// VirtualMachineBMC of the namespace has its host: one host, one BMC.
func (r *BMCReconciler) keepHostOfOlderClaim(ctx context.Context, b *v1beta1.VirtualMachineBMC, cfg Config, w *Workload) error {
	if w.RedfishURL == "" {
		return nil // no Ingress
	}
	host, err := ingressHost(b, cfg.Domain)
	if err != nil {
		return err
	}
	holder, err := hostHolder(ctx, r.Client, b, host, cfg.Domain)
	if err != nil || holder.Name == b.Name {
		return err
	}
	w.Objects = slices.DeleteFunc(w.Objects, func(o client.Object) bool { _, ok := o.(*networkingv1.Ingress); return ok })
	w.RedfishURL, w.IngressProblem = "", hostTaken(host, holder)
	return nil
}

// ensureCredentials makes the credentials Secret exist and rotates it when
// the rotate annotation asks for it. Enrolment creates the default Secret
// with the VirtualMachineBMC; this creates it for a VirtualMachineBMC made
// by hand, and again when it was deleted.
func (r *BMCReconciler) ensureCredentials(ctx context.Context, b *v1beta1.VirtualMachineBMC, vm *kubevirtv1.VirtualMachine, st *statusBuilder) error {
	name := credentialsSecretName(b)
	key := types.NamespacedName{Namespace: b.Namespace, Name: name}
	secret := &corev1.Secret{}
	var reader client.Reader = r.Client
	if b.Spec.CredentialsSecret != "" {
		reader = r.APIReader
	}
	err := reader.Get(ctx, key, secret)
	switch {
	case apierrors.IsNotFound(err) && b.Spec.CredentialsSecret == "":
		if secret, err = newCredentialsSecret(vm, r.Scheme); err != nil {
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
			r.Events.Eventf(b, secret, corev1.EventTypeNormal, reasonCredentialsCreated, "Create", "created credentials Secret %s", name)
		}
	case apierrors.IsNotFound(err):
		st.set(v1beta1.ConditionCredentialsReady, false, "SecretNotFound", "Secret %s does not exist", name)
		return nil
	case err != nil:
		return err
	}
	if len(secret.Data[v1beta1.SecretUsernameKey]) == 0 || len(secret.Data[v1beta1.SecretPasswordKey]) == 0 {
		st.set(v1beta1.ConditionCredentialsReady, false, "SecretInvalid", "Secret %s needs non-empty %q and %q", name, v1beta1.SecretUsernameKey, v1beta1.SecretPasswordKey)
		return nil
	}
	st.set(v1beta1.ConditionCredentialsReady, true, "Found", "Secret %s holds the credentials", name)

	want := b.Annotations[v1beta1.AnnotationRotateCredentials]
	if want == "" || want == b.Status.CredentialsRotation {
		return nil
	}
	if secret.Annotations[v1beta1.AnnotationRotatedFor] == want {
		st.status.CredentialsRotation = want // done; the status write was lost or is not cached yet
		return nil
	}
	if secret.Labels[v1beta1.LabelManagedBy] != v1beta1.ManagedByValue {
		st.set(v1beta1.ConditionCredentialsReady, true, "RotationRefused", "Secret %s is not managed by virtmetal: rotate it yourself", name)
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
	r.Events.Eventf(b, secret, corev1.EventTypeNormal, reasonCredentialsRotated, "Rotate", "new password in Secret %s", name)
	return nil
}

// removeUnwanted deletes the workload's objects that the spec or the mode
// no longer asks for: the Service and Ingress when their protocols are off,
// the Deployment, Service and RBAC of a VM the shared bmc-server serves,
// cluster RBAC when the VM no longer has a cluster instancetype.
func (r *BMCReconciler) removeUnwanted(ctx context.Context, b *v1beta1.VirtualMachineBMC, w Workload) error {
	name := types.NamespacedName{Namespace: b.Namespace, Name: workloadName(b.Spec.VMName)}
	for _, candidate := range []client.Object{&appsv1.Deployment{}, &corev1.Service{}, &networkingv1.Ingress{},
		&corev1.ServiceAccount{}, &rbacv1.Role{}, &rbacv1.RoleBinding{}} {
		if slices.ContainsFunc(w.Objects, func(o client.Object) bool { return fmt.Sprintf("%T", o) == fmt.Sprintf("%T", candidate) }) {
			continue
		}
		if err := r.Client.Get(ctx, name, candidate); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return err
		}
		if metav1.IsControlledBy(candidate, b) {
			if err := r.Client.Delete(ctx, candidate); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	if len(w.ClusterObjects) == 0 && controllerutil.ContainsFinalizer(b, clusterRBACFinalizer) {
		return r.finalize(ctx, b)
	}
	return nil
}

// finalize deletes the BMC's cluster-scoped RBAC and lets it go.
func (r *BMCReconciler) finalize(ctx context.Context, b *v1beta1.VirtualMachineBMC) error {
	if !controllerutil.ContainsFinalizer(b, clusterRBACFinalizer) {
		return nil
	}
	name := bmc.ClusterRBACName(b.Namespace, b.Spec.VMName)
	for _, obj := range []client.Object{&rbacv1.ClusterRoleBinding{}, &rbacv1.ClusterRole{}} {
		obj.SetName(name)
		if err := r.Client.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	controllerutil.RemoveFinalizer(b, clusterRBACFinalizer)
	return r.Client.Update(ctx, b)
}

// statusBuilder collects the controller's part of a status.
type statusBuilder struct {
	generation int64
	status     v1beta1.VirtualMachineBMCStatus // only the controller's fields
	previous   []metav1.Condition
}

func newStatus(b *v1beta1.VirtualMachineBMC) *statusBuilder {
	return &statusBuilder{
		generation: b.Generation,
		previous:   b.Status.Conditions,
		status:     v1beta1.VirtualMachineBMCStatus{CredentialsRotation: b.Status.CredentialsRotation},
	}
}

func (s *statusBuilder) set(conditionType string, ok bool, reason, format string, args ...any) {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	c := metav1.Condition{
		Type: conditionType, Status: status, Reason: reason,
		Message: fmt.Sprintf(format, args...), ObservedGeneration: s.generation,
	}
	// Keep the transition time of a condition whose status did not change.
	if old := meta.FindStatusCondition(s.previous, conditionType); old != nil && old.Status == status {
		c.LastTransitionTime = old.LastTransitionTime
	} else {
		c.LastTransitionTime = metav1.Now()
	}
	meta.SetStatusCondition(&s.status.Conditions, c)
}

func (s *statusBuilder) deployment(obj client.Object) {
	// A Deployment created by this reconcile (nil) is not available either:
	// one message for both, so the next reconcile writes no status.
	d, _ := obj.(*appsv1.Deployment)
	if d == nil || !deploymentAvailable(d) {
		s.set(v1beta1.ConditionDeploymentAvailable, false, "Unavailable", "bmc-server is not available yet")
		return
	}
	s.set(v1beta1.ConditionDeploymentAvailable, true, "Available", "bmc-server is available")
}

func deploymentAvailable(d *appsv1.Deployment) bool {
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// controllerConditions are the conditions Ready sums up.
var controllerConditions = []string{
	v1beta1.ConditionVMFound, v1beta1.ConditionCredentialsReady, v1beta1.ConditionDeploymentAvailable,
	v1beta1.ConditionServiceReady, v1beta1.ConditionIngressReady,
}

// writeStatus applies the controller's part of the status (server-side
// apply, so the MaaS reconciler's fields stay), and sends nothing when it
// is what the object already says.
func (r *BMCReconciler) writeStatus(ctx context.Context, b *v1beta1.VirtualMachineBMC, s *statusBuilder) error {
	var notReady []string
	for _, t := range controllerConditions {
		if c := meta.FindStatusCondition(s.status.Conditions, t); c == nil || c.Status != metav1.ConditionTrue {
			notReady = append(notReady, t)
		}
	}
	if len(notReady) == 0 {
		s.set(v1beta1.ConditionReady, true, "Ready", "the BMC serves its VM")
	} else {
		s.set(v1beta1.ConditionReady, false, "NotReady", "not yet: %v", notReady)
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
		if meta.FindStatusCondition(current.Conditions, t) != nil && meta.FindStatusCondition(want.Conditions, t) == nil {
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
