package controllers

import (
	"context"
	"maps"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
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

	"github.com/virtmetal/virtmetal/api/v1beta1"
)

// managedSelector selects what the controller creates.
var managedSelector = labels.SelectorFromSet(labels.Set{v1beta1.LabelManagedBy: v1beta1.ManagedByValue})

// CacheOptions scopes the manager's cache to what the controller reads:
// only the objects it created (by label) of the kinds it creates, only the
// one config ConfigMap, and VMs without their managed fields. That keeps
// the controller's memory to its own objects, not the cluster's Secrets.
func CacheOptions(configMap types.NamespacedName) cache.Options {
	managed := cache.ByObject{Label: managedSelector}
	byObject := map[client.Object]cache.ByObject{
		&corev1.Secret{}:             managed,
		&corev1.Service{}:            managed,
		&corev1.ServiceAccount{}:     managed,
		&appsv1.Deployment{}:         managed,
		&networkingv1.Ingress{}:      managed,
		&rbacv1.Role{}:               managed,
		&rbacv1.RoleBinding{}:        managed,
		&rbacv1.ClusterRole{}:        managed,
		&rbacv1.ClusterRoleBinding{}: managed,
		&kubevirtv1.VirtualMachine{}: {Transform: cache.TransformStripManagedFields()},
		&v1beta1.VirtualMachineBMC{}: {Transform: cache.TransformStripManagedFields()},
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
	c := mgr.GetClient()
	recorder := mgr.GetEventRecorder("virtmetal-controller")
	enrolment := &EnrolmentReconciler{
		Client: c, Scheme: mgr.GetScheme(), Config: opts.Config, Identity: opts.Identity, Events: recorder,
	}
	bmcs := &BMCReconciler{
		Client: c, APIReader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(), Config: opts.Config,
		Workload: opts.Workload, Events: recorder,
	}
	shared := &SharedReconciler{
		Client: c, APIReader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(), Config: opts.Config,
		Resync: opts.SharedResync,
	}
	concurrency := controller.Options{MaxConcurrentReconciles: opts.MaxConcurrentReconciles}

	allVMs := func(ctx context.Context, namespace string) []reconcile.Request {
		var vms kubevirtv1.VirtualMachineList
		if err := c.List(ctx, &vms, client.InNamespace(namespace)); err != nil {
			return nil
		}
		requests := make([]reconcile.Request, 0, len(vms.Items))
		for _, vm := range vms.Items {
			requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&vm)})
		}
		return requests
	}
	allBMCs := func(ctx context.Context, _ client.Object) []reconcile.Request {
		var list v1beta1.VirtualMachineBMCList
		if err := c.List(ctx, &list); err != nil {
			return nil
		}
		requests := make([]reconcile.Request, 0, len(list.Items))
		for _, b := range list.Items {
			requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&b)})
		}
		return requests
	}
	// A VirtualMachineBMC and its VM share namespace and name.
	sameName := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(obj)}}
	})
	byVMLabel := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		vm := obj.GetLabels()[v1beta1.LabelVM]
		if vm == "" {
			return nil
		}
		namespace := obj.GetNamespace()
		if namespace == "" {
			namespace = obj.GetLabels()[v1beta1.LabelNamespace]
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: namespace, Name: vm}}}
	})
	configChanged := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		return allVMs(ctx, "")
	})
	bmcsInNamespace := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []reconcile.Request {
		var list v1beta1.VirtualMachineBMCList
		if err := c.List(ctx, &list, client.InNamespace(obj.GetNamespace())); err != nil {
			return nil
		}
		requests := make([]reconcile.Request, 0, len(list.Items))
		for _, b := range list.Items {
			requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&b)})
		}
		return requests
	})
	ownNamespace := func(_ context.Context, obj client.Object) []string { return []string{obj.GetNamespace()} }
	labelledNamespace := func(_ context.Context, obj client.Object) []string {
		return []string{obj.GetLabels()[v1beta1.LabelNamespace]}
	}
	// Namespaces that may have a shared bmc-server, or should lose one.
	bmcNamespaces := func(ctx context.Context, _ client.Object) []string {
		var bmcs v1beta1.VirtualMachineBMCList
		var secrets corev1.SecretList
		if err := c.List(ctx, &bmcs); err != nil {
			return nil
		}
		if err := c.List(ctx, &secrets, client.MatchingLabels{v1beta1.LabelShared: "true"}); err != nil {
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
	sharedOnly := builder.WithPredicates(predicate.NewPredicateFuncs(func(obj client.Object) bool {
		return obj.GetLabels()[v1beta1.LabelShared] == "true"
	}))
	// A BMC's status follows the shared Deployment's availability, not
	// its every status update. A missing Deployment reads as one not
	// available, so creating one (never available yet) changes no status:
	// waking every BMC of the namespace for it would only rewrite statuses
	// from a cache that has not caught up with the last write.
	sharedAvailability := builder.WithPredicates(predicate.NewPredicateFuncs(func(obj client.Object) bool {
		return obj.GetLabels()[v1beta1.LabelShared] == "true"
	}), predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return deploymentAvailable(e.Object.(*appsv1.Deployment)) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			before, after := e.ObjectOld.(*appsv1.Deployment), e.ObjectNew.(*appsv1.Deployment)
			return deploymentAvailable(before) != deploymentAvailable(after)
		},
		DeleteFunc:  func(e event.DeleteEvent) bool { return deploymentAvailable(e.Object.(*appsv1.Deployment)) },
		GenericFunc: func(event.GenericEvent) bool { return true },
	})

	enrolmentBuilder := ctrl.NewControllerManagedBy(mgr).Named("enrolment").
		For(&kubevirtv1.VirtualMachine{}).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, ns client.Object) []reconcile.Request {
			return allVMs(ctx, ns.GetName())
		}), builder.WithPredicates(predicate.LabelChangedPredicate{})).
		// Enrolment cares whether the VM's VirtualMachineBMC exists and is
		// its own (a label), not about its spec or status.
		Watches(&v1beta1.VirtualMachineBMC{}, sameName, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		// The BMC reconciler may recreate credentials from a stale cache
		// after enrolment removed them: enrolment looks again.
		Watches(&corev1.Secret{}, byVMLabel).
		WithOptions(concurrency)
	bmcBuilder := ctrl.NewControllerManagedBy(mgr).Named("virtualmachinebmc").
		For(&v1beta1.VirtualMachineBMC{}).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&networkingv1.Ingress{}).
		Owns(&rbacv1.Role{}).
		Owns(&rbacv1.RoleBinding{}).
		Watches(&kubevirtv1.VirtualMachine{}, sameName).
		Watches(&corev1.Secret{}, byVMLabel).
		Watches(&rbacv1.ClusterRole{}, byVMLabel).
		Watches(&rbacv1.ClusterRoleBinding{}, byVMLabel).
		Watches(&appsv1.Deployment{}, bmcsInNamespace, sharedAvailability).
		WithOptions(concurrency)
	// Every event about a namespace's BMCs reaches the shared reconciler
	// late (delayed): a thousand of them make one reconcile.
	sharedBuilder := ctrl.NewControllerManagedBy(mgr).Named("shared").
		Watches(&v1beta1.VirtualMachineBMC{}, delayed(ownNamespace), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&kubevirtv1.VirtualMachine{}, delayed(ownNamespace), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Secret{}, delayed(ownNamespace)).
		Watches(&appsv1.Deployment{}, delayed(ownNamespace), sharedOnly).
		Watches(&corev1.Service{}, delayed(ownNamespace), sharedOnly).
		Watches(&corev1.ServiceAccount{}, delayed(ownNamespace), sharedOnly).
		Watches(&rbacv1.Role{}, delayed(ownNamespace), sharedOnly).
		Watches(&rbacv1.RoleBinding{}, delayed(ownNamespace), sharedOnly).
		Watches(&rbacv1.ClusterRole{}, delayed(labelledNamespace), sharedOnly).
		Watches(&rbacv1.ClusterRoleBinding{}, delayed(labelledNamespace), sharedOnly).
		WithOptions(concurrency)
	if opts.Config.ConfigMap.Name != "" {
		enrolmentBuilder = enrolmentBuilder.Watches(&corev1.ConfigMap{}, configChanged)
		bmcBuilder = bmcBuilder.Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(allBMCs))
		sharedBuilder = sharedBuilder.Watches(&corev1.ConfigMap{}, delayed(bmcNamespaces))
	}
	if err := enrolmentBuilder.Complete(enrolment); err != nil {
		return nil, err
	}
	if err := bmcBuilder.Complete(bmcs); err != nil {
		return nil, err
	}
	if err := sharedBuilder.Complete(shared); err != nil {
		return nil, err
	}
	return enrolment, nil
}
