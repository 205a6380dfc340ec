package controllers

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/deploy/bmc"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
)

const (
	// sharedName names every namespaced object of a namespace's shared
	// bmc-server. It is deploy/bmc's shared ServiceAccount, so that the
	// rendered RBAC and the Deployment agree.
	sharedName = bmc.SharedServiceAccount
	// sharedVMsMountPath is where the shared bmc-server reads its VMs: one
	// file per VM, from the Secret sharedName.
	sharedVMsMountPath = "/etc/virtmetal/vms"
	// sharedBatchDelay gathers the events about a namespace (1,000 VMs
	// enrolled at once) into one reconcile, so that the shared Secret and
	// Role are written once per batch rather than once per VM. The queue
	// keeps one entry per namespace, at the earliest time asked.
	sharedBatchDelay = time.Second
	// sharedAdditionsSpacing: while VMs keep arriving in a namespace
	// (enrolling an existing one on a busy API server takes minutes), its
	// shared Secret and Role are rewritten at most this often for VMs
	// added alone, rather than at every batch. A VM leaving, or changing
	// its credentials or host, is written at once.
	sharedAdditionsSpacing = 5 * time.Second
)

// sharedVM is a VM the shared bmc-server serves.
type sharedVM struct {
	name                              string
	credentials                       bmcspec.SharedVM // its entry of the Secret sharedName
	instancetype, clusterInstancetype string
	claims                            []string // whose size its bmc-server reads
	// ingress is its Ingress as bmcIngress renders it, whose rule and
	// certificate the Ingress sharedName carries; nil when it has an
	// Ingress of its own (inSharedIngress).
	ingress *networkingv1.Ingress
}

func sharedLabels() map[string]string {
	return map[string]string{v1beta1.LabelManagedBy: v1beta1.ManagedByValue, v1beta1.LabelShared: "true"}
}

// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=delete
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=delete

// SharedReconciler keeps, per namespace with VirtualMachineBMCs in the shared
// mode (see Shared), the one bmc-server that serves them: the Secret of
// their credentials and hosts, a Deployment, Service and least-privilege
// RBAC for exactly those VMs, all named virtmetal-bmcs; and deletes them
// when no such VirtualMachineBMC is left. Its key is the namespace (the
// request's name is sharedName).
type SharedReconciler struct {
	Client client.Client // the manager's cached client
	// APIReader reads credentials Secrets the user named, which the
	// label-scoped Secret cache does not hold.
	APIReader client.Reader
	Scheme    *runtime.Scheme
	Config    *ConfigSource
	// Resync is how often a namespace is read again while it serves a VM
	// whose credentials are in a user-named Secret: the cache holds only
	// the controller's Secrets, so no event tells of that one's change.
	Resync time.Duration
	// Events tells each VirtualMachineBMC the server serves of a failure.
	Events events.EventRecorder

	health *sharedHealth // Setup shares it with the BMC reconciler

	mu          sync.Mutex
	secretWrote map[string]time.Time // by namespace: when its shared Secret was last written
}

// Reconcile implements reconcile.Reconciler for a namespace. A failure is
// told on the namespace's shared VirtualMachineBMCs, as a condition (the
// BMC reconciler's, through sharedHealth) and, once per new failure, an
// Event on each.
func (r *SharedReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	cfg, err := r.Config.Get(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	var list v1beta1.VirtualMachineBMCList
	if err := r.Client.List(ctx, &list, client.InNamespace(req.Namespace)); err != nil {
		return ctrl.Result{}, err
	}
	result, err := r.reconcile(ctx, cfg, req.Namespace, list.Items)
	if r.health != nil && r.health.record(ctx, req.Namespace, err) && err != nil && r.Events != nil {
		for i := range list.Items {
			if b := &list.Items[i]; servedShared(b, cfg) {
				r.Events.Eventf(b, nil, corev1.EventTypeWarning, string(reasonSharedServerFailed), "Apply", "shared bmc-server %s: %v", sharedName, err)
			}
		}
	}
	return result, err
}

func (r *SharedReconciler) reconcile(ctx context.Context, cfg Config, namespace string, bmcs []v1beta1.VirtualMachineBMC) (ctrl.Result, error) {
	// The Secret as the cache has it is read once: the entries kept come
	// from it and its replacement carries its resourceVersion, so a cache
	// behind the last write is a conflict and a retry, never credentials
	// generated or rotated a second time.
	current := &corev1.Secret{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: sharedName}, current); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		current = nil
	}
	vms, unwatched, err := r.served(ctx, cfg, bmcs, current)
	if err != nil {
		return ctrl.Result{}, err
	}
	leaving := leavingNames(bmcs, cfg)
	if len(vms) == 0 {
		return ctrl.Result{}, r.remove(ctx, namespace, leaving)
	}
	wait, err := r.apply(ctx, cfg, namespace, vms, current, leaving)
	if err != nil {
		return ctrl.Result{}, err
	}
	if unwatched && (wait == 0 || r.Resync < wait) {
		wait = r.Resync
	}
	return ctrl.Result{RequeueAfter: wait}, nil
}

// served returns the VMs the namespace's shared bmc-server serves, by name,
// and whether any has credentials outside the cache. Everything comes from
// the namespace's own VirtualMachineBMCs, VMs and Secrets (current is its
// shared Secret, nil when there is none), and a host only from
// ingressHost, which keeps it inside the namespace's zone: nothing a
// tenant writes reaches another namespace's VM or host. A VM left out for
// its Secret or host says why in its own status (the BMC reconciler's
// conditions).
func (r *SharedReconciler) served(ctx context.Context, cfg Config, bmcs []v1beta1.VirtualMachineBMC, current *corev1.Secret) ([]sharedVM, bool, error) {
	// The older VirtualMachineBMC keeps a host both ask for, as the BMC
	// reconciler decides (it tells the other one, in its status).
	slices.SortFunc(bmcs, func(a, b v1beta1.VirtualMachineBMC) int { return olderClaim(&a, &b) })
	var vms []sharedVM
	unwatched := false
	claimed := map[string]bool{} // hosts, by the older BMC of any mode
	for i := range bmcs {
		b := &bmcs[i]
		if !b.DeletionTimestamp.IsZero() {
			continue
		}
		host, err := ingressHost(b, cfg.Domain)
		if err != nil || claimed[host] {
			continue
		}
		claimed[host] = true
		if !servedShared(b, cfg) || b.Spec.CredentialsSecret == sharedName {
			continue
		}
		vm := &kubevirtv1.VirtualMachine{}
		if err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: b.Spec.VMName}, vm); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, false, err
		}
		var reader client.Reader = r.Client
		if b.Spec.CredentialsSecret != "" {
			reader, unwatched = r.APIReader, true
		}
		var credentials bmcspec.SharedVM
		secret := &corev1.Secret{}
		switch err := reader.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: credentialsSecretName(b)}, secret); {
		case apierrors.IsNotFound(err) && inSharedEntry(b, cfg):
			credentials = entryCredentials(current, b)
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, false, err
		default:
			user, password, ok := v1beta1.CredentialsOf(secret)
			if !ok {
				continue
			}
			credentials = bmcspec.SharedVM{Username: user, Password: password}
		}
		credentials.Hosts, credentials.StateSecret = []string{host}, bmcspec.SharedStateSecret
		instancetype, clusterInstancetype := instancetypes(vm)
		served := sharedVM{
			name:                b.Spec.VMName,
			credentials:         credentials,
			instancetype:        instancetype,
			clusterInstancetype: clusterInstancetype,
			claims:              kubevirt.ReferencedClaims(vm),
		}
		if inSharedIngress(b) {
			if served.ingress, _, err = bmcIngress(WorkloadInput{BMC: b, VM: vm, Config: cfg}, metav1.ObjectMeta{Name: sharedName, Namespace: b.Namespace}); err != nil {
				return nil, false, err
			}
		}
		vms = append(vms, served)
	}
	slices.SortFunc(vms, func(a, b sharedVM) int { return cmp.Compare(a.name, b.name) })
	return vms, unwatched, nil
}

// entryCredentials are the credentials of b's entry of the shared Secret
// current: those it holds, with a new password when the rotate annotation
// asks for one the entry has not answered; new ones when it holds none.
// The user name stays at a rotation: the bmc-server accepts the previous
// password for a while, so MaaS keeps power control until the MaaS
// reconciler has given it the new one.
func entryCredentials(current *corev1.Secret, b *v1beta1.VirtualMachineBMC) bmcspec.SharedVM {
	want := b.Annotations[v1beta1.AnnotationRotateCredentials]
	var data map[string][]byte
	if current != nil {
		data = current.Data
	}
	kept, ok := bmcspec.ParseCredentials(data[b.Spec.VMName])
	switch {
	case !ok:
		// New credentials answer any rotation asked for so far.
		return bmcspec.SharedVM{Username: newUsername(), Password: newPassword(), RotatedFor: want}
	case want != "" && want != kept.RotatedFor:
		kept.Password, kept.RotatedFor = newPassword(), want
	}
	return bmcspec.SharedVM{Username: kept.Username, Password: kept.Password, RotatedFor: kept.RotatedFor}
}

func namespaceOf(bmcs []v1beta1.VirtualMachineBMC) string {
	if len(bmcs) == 0 {
		return ""
	}
	return bmcs[0].Namespace
}

// apply makes the shared objects serve exactly vms, or, when that only
// adds VMs to a Secret written less than sharedAdditionsSpacing ago, says
// how long to wait before it does.
func (r *SharedReconciler) apply(ctx context.Context, cfg Config, namespace string, vms []sharedVM, current *corev1.Secret, leaving map[string]bool) (time.Duration, error) {
	data := make(map[string][]byte, len(vms))
	params := bmc.RBACParams{Namespace: namespace}
	for _, vm := range vms {
		entry, err := json.Marshal(vm.credentials)
		if err != nil {
			return 0, err
		}
		data[vm.name] = entry
		params.VMs = append(params.VMs, vm.name)
		if vm.instancetype != "" {
			params.Instancetypes = append(params.Instancetypes, vm.instancetype)
		}
		if vm.clusterInstancetype != "" {
			params.ClusterInstancetypes = append(params.ClusterInstancetypes, vm.clusterInstancetype)
		}
		params.Claims = append(params.Claims, vm.claims...)
	}
	for _, names := range []*[]string{&params.Instancetypes, &params.ClusterInstancetypes, &params.Claims} {
		slices.Sort(*names)
		*names = slices.Compact(*names)
	}

	if wait := r.additionsWait(namespace, current, data); wait > 0 {
		return wait, nil
	}
	// The state is in place before the Secret points the server to it.
	if err := r.ensureStateSecret(ctx, namespace, vms, leaving); err != nil {
		return 0, err
	}
	if err := r.ensureSecret(ctx, namespace, current, data); err != nil {
		return 0, err
	}
	objects, clusterObjects, err := rbacObjects(params)
	if err != nil {
		return 0, err
	}
	if err := ownByNamespace(ctx, r.Client, namespace, clusterObjects); err != nil {
		return 0, err
	}
	if len(clusterObjects) == 0 {
		if err := deleteClusterRBAC(ctx, r.Client, bmc.ClusterRBACName(namespace, ""), namespace, ""); err != nil {
			return 0, err
		}
	}
	if err := deleteLegacyClusterRBAC(ctx, r.Client, namespace, ""); err != nil {
		return 0, err
	}
	meta := metav1.ObjectMeta{Name: sharedName, Namespace: namespace, Labels: sharedLabels()}
	objects = append(objects,
		bmcDeployment(meta, bmcPod{
			namespace:      namespace,
			serviceAccount: sharedName,
			image:          cfg.BMCImage,
			serves:         []string{"--vms-dir", sharedVMsMountPath},
			ports:          []corev1.ContainerPort{redfishContainerPortSpec()},
			resources:      sharedResources(len(vms)),
			secret:         sharedName,
			mountPath:      sharedVMsMountPath,

			eventDestinationsDenied: cfg.EventDestinationsDenied,
			trustedProxies:          cfg.TrustedProxies,
		}),
		bmcService(meta, []corev1.ServicePort{redfishServicePortSpec()}),
	)
	if cfg.NetworkPolicy.Enabled {
		policy, err := bmcNetworkPolicy(meta, false, cfg)
		if err != nil {
			return 0, err
		}
		objects = append(objects, policy)
	} else if err := r.deleteShared(ctx, types.NamespacedName{Namespace: namespace, Name: sharedName}, &networkingv1.NetworkPolicy{}); err != nil {
		return 0, err
	}
	if ingress := sharedIngress(meta, vms); ingress != nil {
		objects = append(objects, ingress)
	} else if err := r.deleteShared(ctx, types.NamespacedName{Namespace: namespace, Name: sharedName}, &networkingv1.Ingress{}); err != nil {
		return 0, err
	}
	for _, obj := range slices.Concat(objects, clusterObjects) {
		if _, err := (applier{r.Client, r.Scheme}).ensure(ctx, obj); err != nil {
			return 0, err
		}
	}
	return 0, nil
}

// sharedIngress is the namespace's Ingress to the shared Service: a rule
// and a certificate entry for each VM of vms that has no Ingress of its
// own, with the class and issuer all of those share (the controller's);
// nil when there is none. A VM's own Ingress would cost a write a VM at
// enrolment; this one is written with the shared Secret, in batches.
func sharedIngress(meta metav1.ObjectMeta, vms []sharedVM) *networkingv1.Ingress {
	var ingress *networkingv1.Ingress
	for _, vm := range vms {
		switch {
		case vm.ingress == nil:
		case ingress == nil:
			ingress = vm.ingress.DeepCopy()
			ingress.Labels = meta.Labels
		default:
			ingress.Spec.Rules = append(ingress.Spec.Rules, vm.ingress.Spec.Rules...)
			ingress.Spec.TLS = append(ingress.Spec.TLS, vm.ingress.Spec.TLS...)
		}
	}
	return ingress
}

// additionsWait is how long to wait before writing data into the
// namespace's shared Secret: zero unless data only adds VMs to the Secret
// the cache holds and that was written less than sharedAdditionsSpacing
// ago. The shared objects stay as they are meanwhile, serving the VMs they
// served; nothing is removed or changed late.
func (r *SharedReconciler) additionsWait(namespace string, current *corev1.Secret, data map[string][]byte) time.Duration {
	r.mu.Lock()
	since := time.Since(r.secretWrote[namespace])
	r.mu.Unlock()
	if since >= sharedAdditionsSpacing || current == nil || !onlyAdds(current.Data, data) {
		return 0
	}
	return sharedAdditionsSpacing - since
}

// onlyAdds says whether want has every entry of current, unchanged, and
// more.
func onlyAdds(current, want map[string][]byte) bool {
	if len(want) <= len(current) {
		return false
	}
	for k, v := range current {
		if w, ok := want[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}

// wroteSecret records that the namespace's shared Secret was written now.
func (r *SharedReconciler) wroteSecret(namespace string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.secretWrote == nil {
		r.secretWrote = map[string]time.Time{}
	}
	r.secretWrote[namespace] = time.Now()
}

// sharedMemoryPerVM is what each VM adds to the shared bmc-server's
// memory: 35 to 62 KB measured idle from 100 to 2,000 VMs (cmd/bmc-server
// BenchmarkSharedRSS: the namespace's informers and API clients are
// shared, each VM has its backend and Redfish service), with headroom for
// the requests, sessions and event streams of busy VMs and for the cached
// VMs of the namespace that are not served.
var sharedMemoryPerVM = resource.MustParse("256Ki")

// sharedResources sizes the shared bmc-server for vms VMs: one BMC pod's
// resources plus sharedMemoryPerVM for each VM, counted in powers of two
// (16 at least) so that enrolling a namespace restarts the pod a few
// times, not at every batch.
func sharedResources(vms int) corev1.ResourceRequirements {
	slots := int64(16)
	for slots < int64(vms) {
		slots *= 2
	}
	r := defaultResources()
	for _, list := range []corev1.ResourceList{r.Requests, r.Limits} {
		memory := list[corev1.ResourceMemory]
		memory.Add(*resource.NewQuantity(slots*sharedMemoryPerVM.Value(), resource.BinarySI))
		list[corev1.ResourceMemory] = memory
	}
	return r
}

// ensureStateSecret makes the namespace's state Secret (whose data is the
// bmc-server's: bmcspec.SharedStateSecret) exist before the shared Secret
// points the server to it. It moves in the state a served VM kept in a
// Secret of its own (when a bmc-server of its own served it, or an older
// controller's shared one did), deleting that Secret once the move is in
// the cache, and drops the entries of VMs no longer served but those still
// leaving (statePending). It sends a merge patch of those keys alone,
// which leaves the server's concurrent saves of other VMs' entries as they
// are.
func (r *SharedReconciler) ensureStateSecret(ctx context.Context, namespace string, vms []sharedVM, leaving map[string]bool) error {
	state := &corev1.Secret{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: bmcspec.SharedStateSecret}, state)
	missing := apierrors.IsNotFound(err)
	if err != nil && !missing {
		return err
	}
	changes := map[string]any{}
	served := make(map[string]bool, len(vms))
	for _, vm := range vms {
		served[vm.name] = true
		own := &corev1.Secret{}
		switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: bmcspec.StateSecretName(vm.name)}, own); {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return err
		case own.Labels[v1beta1.LabelManagedBy] != v1beta1.ManagedByValue:
			continue
		}
		if _, moved := state.Data[vm.name]; !moved && len(own.Data) > 0 {
			entry, err := bmcspec.EncodeStateEntry(own.Data)
			if err != nil {
				return err
			}
			changes[vm.name] = entry
			continue
		}
		if err := r.Client.Delete(ctx, own); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	for name := range state.Data {
		if served[name] {
			continue
		}
		pending, err := r.statePending(ctx, namespace, name, leaving)
		if err != nil {
			return err
		}
		if !pending {
			changes[name] = nil
		}
	}
	if missing {
		state = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: bmcspec.SharedStateSecret, Namespace: namespace, Labels: sharedLabels()},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{},
		}
		for name, entry := range changes {
			state.Data[name] = entry.([]byte)
		}
		// One the cache does not show yet exists: its creation event
		// brings the namespace back.
		if err := r.Client.Create(ctx, state); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		return nil
	}
	if len(changes) == 0 {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"data": changes})
	if err != nil {
		return err
	}
	return r.Client.Patch(ctx, state, client.RawPatch(types.MergePatchType, patch))
}

// leavingNames are the VMs of bmcs, not being deleted, that a pod of their
// own serves, or will: what the shared bmc-server kept for them moves to
// their own state Secret.
func leavingNames(bmcs []v1beta1.VirtualMachineBMC, cfg Config) map[string]bool {
	leaving := map[string]bool{}
	for i := range bmcs {
		if b := &bmcs[i]; b.DeletionTimestamp.IsZero() && !servedShared(b, cfg) {
			leaving[b.Spec.VMName] = true
		}
	}
	return leaving
}

// statePending says whether the state Secret's entry of vm must stay: its
// VM leaves the shared bmc-server for a pod of its own, whose state Secret
// the BMC reconciler has not yet made from that entry (keepSharedState).
func (r *SharedReconciler) statePending(ctx context.Context, namespace, vm string, leaving map[string]bool) (bool, error) {
	if !leaving[vm] {
		return false, nil
	}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: bmcspec.StateSecretName(vm)}, &corev1.Secret{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	return false, err
}

// ensureSecret makes the Secret sharedName, which the cache has as current
// (nil: none), hold exactly data. Unlike the applier, it compares every key
// both ways and replaces the whole Secret: a key someone added would be a
// VM (and host) the server serves.
func (r *SharedReconciler) ensureSecret(ctx context.Context, namespace string, current *corev1.Secret, data map[string][]byte) error {
	want := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: sharedName, Namespace: namespace, Labels: sharedLabels()},
		Type:       corev1.SecretTypeOpaque,
		Data:       data,
	}
	switch {
	case current == nil:
		// One the cache does not show yet exists: its creation event
		// brings the namespace back to compare.
		if err := r.Client.Create(ctx, want); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		r.wroteSecret(namespace)
		log.FromContext(ctx).V(1).Info("shared Secret created", "vms", len(data))
		return nil
	case maps.EqualFunc(current.Data, data, bytes.Equal) && maps.Equal(current.Labels, want.Labels):
		return nil
	}
	want.ResourceVersion = current.ResourceVersion
	if err := r.Client.Update(ctx, want); err != nil {
		return err
	}
	r.wroteSecret(namespace)
	log.FromContext(ctx).V(1).Info("shared Secret updated", "vms", len(data))
	return nil
}

// remove deletes the namespace's shared objects; the state Secret once no
// VM leaving for a pod of its own waits for its entry (statePending).
func (r *SharedReconciler) remove(ctx context.Context, namespace string, leaving map[string]bool) error {
	// A namespace that stops sharing leaves no write time behind.
	r.mu.Lock()
	delete(r.secretWrote, namespace)
	r.mu.Unlock()
	for _, obj := range slices.Concat([]client.Object{&corev1.Secret{}}, workloadKinds()) {
		if err := r.deleteShared(ctx, types.NamespacedName{Namespace: namespace, Name: sharedName}, obj); err != nil {
			return err
		}
	}
	state := &corev1.Secret{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: bmcspec.SharedStateSecret}, state); client.IgnoreNotFound(err) != nil {
		return err
	}
	for name := range state.Data {
		if pending, err := r.statePending(ctx, namespace, name, leaving); pending || err != nil {
			return err // its own state Secret's creation brings the namespace back
		}
	}
	if err := r.deleteShared(ctx, types.NamespacedName{Namespace: namespace, Name: bmcspec.SharedStateSecret}, &corev1.Secret{}); err != nil {
		return err
	}
	if err := deleteClusterRBAC(ctx, r.Client, bmc.ClusterRBACName(namespace, ""), namespace, ""); err != nil {
		return err
	}
	return deleteLegacyClusterRBAC(ctx, r.Client, namespace, "")
}

// deleteShared deletes key when the cache shows it as a shared object: an
// absent object costs no request.
func (r *SharedReconciler) deleteShared(ctx context.Context, key types.NamespacedName, obj client.Object) error {
	if err := r.Client.Get(ctx, key, obj); err != nil {
		return client.IgnoreNotFound(err)
	}
	if obj.GetLabels()[v1beta1.LabelShared] != "true" {
		return nil
	}
	if err := r.Client.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
		return err
	}
	log.FromContext(ctx).V(1).Info("shared object deleted", "kind", fmt.Sprintf("%T", obj))
	return nil
}

// delayed enqueues the namespaces that mapFn returns after sharedBatchDelay.
func delayed(mapFn func(context.Context, client.Object) []string) handler.EventHandler {
	add := func(ctx context.Context, obj client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		for _, ns := range mapFn(ctx, obj) {
			q.AddAfter(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: sharedName}}, sharedBatchDelay)
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, e.Object, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, e.ObjectNew, q)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, e.Object, q)
		},
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, e.Object, q)
		},
	}
}
