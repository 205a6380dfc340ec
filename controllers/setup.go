package controllers

import (
	"context"
	"maps"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/controllers/vmidentity"
)

// managedSelector selects what the controller creates.
var managedSelector = labels.SelectorFromSet(labels.Set{v1beta1.LabelManagedBy: v1beta1.ManagedByValue})

// CacheOptions scopes the manager's cache to what the controller reads:
// only the objects it created (by label) of the kinds it creates, only the
// one config ConfigMap, VMs without their managed fields, and VMIs trimmed
// to their identity. That keeps the controller's memory to its own
// objects, not the cluster's Secrets.
func CacheOptions(configMap types.NamespacedName) cache.Options {
	byObject := map[client.Object]cache.ByObject{
		&kubevirtv1.VirtualMachine{}: {Transform: cache.TransformStripManagedFields()},
		// Every VMI, for the identity indexes: only what they read.
		&kubevirtv1.VirtualMachineInstance{}: {Transform: vmidentity.TrimInstance},
		&v1beta1.VirtualMachineBMC{}:         {Transform: cache.TransformStripManagedFields()},
	}
	for _, obj := range slices.Concat([]client.Object{&corev1.Secret{}}, workloadKinds(), clusterRBACKinds()) {
		byObject[obj] = cache.ByObject{Label: managedSelector}
	}
	if configMap.Name != "" {
		byObject[&corev1.ConfigMap{}] = cache.ByObject{
			Namespaces: map[string]cache.Config{configMap.Namespace: {}},
			Field:      fields.OneTermEqualSelector("metadata.name", configMap.Name),
		}
	}
	return cache.Options{ByObject: byObject}
}

// Options wires the reconcilers.
type Options struct {
	Config   *ConfigSource
	Identity IdentityStamper
	// Workload defaults to Shared, which is PodPerVM unless the Config in
	// force says "shared".
	Workload WorkloadFunc
	// MaxConcurrentReconciles per controller; zero means 4.
	MaxConcurrentReconciles int
	// SharedResync is how often a shared bmc-server's user-named
	// credentials Secrets are read again; zero means a minute.
	SharedResync time.Duration
}

// Setup registers the enrolment, BMC and shared reconcilers with mgr and
// returns the enrolment reconciler, whose Enrolled the admission webhook asks.
func Setup(mgr ctrl.Manager, opts Options) (*EnrolmentReconciler, error) {
	if opts.Workload == nil {
		opts.Workload = Shared
	}
	if opts.SharedResync == 0 {
		opts.SharedResync = time.Minute
	}
	if opts.MaxConcurrentReconciles == 0 {
		opts.MaxConcurrentReconciles = 4
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1beta1.VirtualMachineBMC{}, indexCustomHost, customHost); err != nil {
		return nil, err
	}
	m := mappers{c: mgr.GetClient()}
	recorder := mgr.GetEventRecorder("virtmetal-controller")
	enrolment := &EnrolmentReconciler{
		Client: m.c, Config: opts.Config, Identity: opts.Identity, Events: recorder,
	}
	if err := enrolment.setup(mgr, m, opts); err != nil {
		return nil, err
	}
	health := newSharedHealth()
	bmcs := &BMCReconciler{
		Client: m.c, APIReader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(), Config: opts.Config,
		Workload: opts.Workload, Events: recorder, sharedHealth: health,
	}
	if err := bmcs.setup(mgr, m, opts); err != nil {
		return nil, err
	}
	shared := &SharedReconciler{
		Client: m.c, APIReader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(), Config: opts.Config,
		Resync: opts.SharedResync, Events: recorder, health: health,
	}
	if err := shared.setup(mgr, m, opts); err != nil {
		return nil, err
	}
	return enrolment, nil
}

func concurrency(opts Options) controller.Options {
	return controller.Options{MaxConcurrentReconciles: opts.MaxConcurrentReconciles}
}

func (r *EnrolmentReconciler) setup(mgr ctrl.Manager, m mappers, opts Options) error {
	b := ctrl.NewControllerManagedBy(mgr).Named("enrolment").
		For(&kubevirtv1.VirtualMachine{}).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(m.vmsOfNamespace), builder.WithPredicates(predicate.LabelChangedPredicate{})).
		// Enrolment cares whether the VM's VirtualMachineBMC exists and is
		// its own (a label), not about its spec or status.
		Watches(&v1beta1.VirtualMachineBMC{}, handler.EnqueueRequestsFromMapFunc(sameName), builder.WithPredicates(predicate.LabelChangedPredicate{})).
		// The BMC reconciler may recreate credentials from a stale cache
		// after enrolment removed them: enrolment looks again.
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(byVMLabel)).
		WithOptions(concurrency(opts))
	if opts.Config.ConfigMap.Name != "" {
		b = b.Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(m.allVMs))
	}
	return b.Complete(r)
}

func (r *BMCReconciler) setup(mgr ctrl.Manager, m mappers, opts Options) error {
	b := ctrl.NewControllerManagedBy(mgr).Named("virtualmachinebmc").
		For(&v1beta1.VirtualMachineBMC{}).
		Watches(&kubevirtv1.VirtualMachine{}, handler.EnqueueRequestsFromMapFunc(sameName)).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(m.bmcsOfSecret)).
		Watches(&appsv1.Deployment{}, handler.EnqueueRequestsFromMapFunc(m.bmcsOfNamespace), sharedAvailability).
		WithOptions(concurrency(opts))
	for _, obj := range workloadKinds() {
		b = b.Owns(obj)
	}
	for _, obj := range clusterRBACKinds() {
		b = b.Watches(obj, handler.EnqueueRequestsFromMapFunc(byVMLabel))
	}
	if r.sharedHealth != nil {
		b = b.WatchesRawSource(source.Channel(r.sharedHealth.changed, handler.EnqueueRequestsFromMapFunc(m.bmcsOfNamespace)))
	}
	if opts.Config.ConfigMap.Name != "" {
		b = b.Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(m.allBMCs))
	}
	return b.Complete(r)
}

// setup: every event about a namespace's BMCs reaches the shared
// reconciler late (delayed), so a thousand of them make one reconcile.
func (r *SharedReconciler) setup(mgr ctrl.Manager, m mappers, opts Options) error {
	b := ctrl.NewControllerManagedBy(mgr).Named("shared").
		Watches(&v1beta1.VirtualMachineBMC{}, delayed(ownNamespace), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&kubevirtv1.VirtualMachine{}, delayed(ownNamespace), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Secret{}, delayed(ownNamespace)).
		WithOptions(concurrency(opts))
	for _, obj := range workloadKinds() {
		b = b.Watches(obj, delayed(ownNamespace), sharedOnly)
	}
	for _, obj := range clusterRBACKinds() {
		b = b.Watches(obj, delayed(labelledNamespace), sharedOnly)
	}
	if opts.Config.ConfigMap.Name != "" {
		b = b.Watches(&corev1.ConfigMap{}, delayed(m.namespacesWithBMCs))
	}
	return b.Complete(r)
}

// mappers turn a watched object into the requests it concerns, reading
// the manager's cache.
type mappers struct{ c client.Client }

func (m mappers) vmsOfNamespace(ctx context.Context, ns client.Object) []reconcile.Request {
	return m.vms(ctx, ns.GetName())
}

// allVMs: the config changed, every VM is enrolled again.
func (m mappers) allVMs(ctx context.Context, _ client.Object) []reconcile.Request {
	return m.vms(ctx, "")
}

func (m mappers) vms(ctx context.Context, namespace string) []reconcile.Request {
	var vms kubevirtv1.VirtualMachineList
	if err := m.c.List(ctx, &vms, client.InNamespace(namespace)); err != nil {
		return nil
	}
	requests := make([]reconcile.Request, 0, len(vms.Items))
	for _, vm := range vms.Items {
		requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&vm)})
	}
	return requests
}

func (m mappers) allBMCs(ctx context.Context, _ client.Object) []reconcile.Request {
	return m.bmcs(ctx)
}

func (m mappers) bmcsOfNamespace(ctx context.Context, obj client.Object) []reconcile.Request {
	return m.bmcs(ctx, client.InNamespace(obj.GetNamespace()))
}

// bmcsOfSecret: a Secret made for a VM concerns its BMC; the shared Secret
// concerns the namespace's BMCs whose rotation of credentials it may have
// done (reportSharedEntry), and no other: it changes with every batch.
func (m mappers) bmcsOfSecret(ctx context.Context, secret client.Object) []reconcile.Request {
	if secret.GetName() != sharedName || !isShared(secret) {
		return byVMLabel(ctx, secret)
	}
	var list v1beta1.VirtualMachineBMCList
	if err := m.c.List(ctx, &list, client.InNamespace(secret.GetNamespace())); err != nil {
		return nil
	}
	var requests []reconcile.Request
	for _, b := range list.Items {
		if want := b.Annotations[v1beta1.AnnotationRotateCredentials]; want != "" && want != b.Status.CredentialsRotation {
			requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&b)})
		}
	}
	return requests
}

func (m mappers) bmcs(ctx context.Context, opts ...client.ListOption) []reconcile.Request {
	var list v1beta1.VirtualMachineBMCList
	if err := m.c.List(ctx, &list, opts...); err != nil {
		return nil
	}
	requests := make([]reconcile.Request, 0, len(list.Items))
	for _, b := range list.Items {
		requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&b)})
	}
	return requests
}

// namespacesWithBMCs are the namespaces that may have a shared
// bmc-server, or should lose one.
func (m mappers) namespacesWithBMCs(ctx context.Context, _ client.Object) []string {
	var bmcs v1beta1.VirtualMachineBMCList
	var secrets corev1.SecretList
	if err := m.c.List(ctx, &bmcs); err != nil {
		return nil
	}
	if err := m.c.List(ctx, &secrets, client.MatchingLabels{v1beta1.LabelShared: "true"}); err != nil {
		return nil
	}
	namespaces := map[string]bool{}
	for _, b := range bmcs.Items {
		namespaces[b.Namespace] = true
	}
	for _, s := range secrets.Items {
		namespaces[s.Namespace] = true
	}
	return slices.Collect(maps.Keys(namespaces))
}

// sameName: a VirtualMachineBMC and its VM share namespace and name.
func sameName(_ context.Context, obj client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(obj)}}
}

// byVMLabel: an object made for a VM names it in a label (and, when
// cluster-scoped, its namespace in another).
func byVMLabel(_ context.Context, obj client.Object) []reconcile.Request {
	vm := obj.GetLabels()[v1beta1.LabelVM]
	if vm == "" {
		return nil
	}
	namespace := obj.GetNamespace()
	if namespace == "" {
		namespace = obj.GetLabels()[v1beta1.LabelNamespace]
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: namespace, Name: vm}}}
}

func ownNamespace(_ context.Context, obj client.Object) []string { return []string{obj.GetNamespace()} }

func labelledNamespace(_ context.Context, obj client.Object) []string {
	return []string{obj.GetLabels()[v1beta1.LabelNamespace]}
}

func isShared(obj client.Object) bool { return obj.GetLabels()[v1beta1.LabelShared] == "true" }

var (
	sharedOnly = builder.WithPredicates(predicate.NewPredicateFuncs(isShared))
	// A BMC's status follows the shared Deployment's availability, not
	// its every status update. A missing Deployment reads as one not
	// available, so creating one (never available yet) changes no status:
	// waking every BMC of the namespace for it would only rewrite statuses
	// from a cache that has not caught up with the last write.
	sharedAvailability = builder.WithPredicates(predicate.NewPredicateFuncs(isShared), predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return deploymentAvailable(e.Object.(*appsv1.Deployment)) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			before, after := e.ObjectOld.(*appsv1.Deployment), e.ObjectNew.(*appsv1.Deployment)
			return deploymentAvailable(before) != deploymentAvailable(after)
		},
		DeleteFunc:  func(e event.DeleteEvent) bool { return deploymentAvailable(e.Object.(*appsv1.Deployment)) },
		GenericFunc: func(event.GenericEvent) bool { return true },
	})
)
