package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/deploy/bmc"
)

// A BMC whose VM has a cluster instancetype gets a ClusterRole and binding
// to read it, which no namespaced object can own. Both modes keep them one
// way: owned by their Namespace, so they go with it, and deleted by their
// reconciler as soon as nothing wants them (the VirtualMachineBMC is gone
// or its VM changed instancetype; the shared server serves no such VM).
// The controller's watch of them brings a leftover back to its reconciler,
// also after a restart.

// ownByNamespace makes namespace the owner of the cluster objects.
func ownByNamespace(ctx context.Context, c client.Reader, namespace string, objs []client.Object) error {
	if len(objs) == 0 {
		return nil
	}
	ns := &corev1.Namespace{}
	if err := c.Get(ctx, types.NamespacedName{Name: namespace}, ns); err != nil {
		return err
	}
	for _, obj := range objs {
		setOwner(obj, namespaceKind, ns, collectedWith)
	}
	return nil
}

// deleteLegacyClusterRBAC deletes what an earlier version made for the VM
// under bmc.LegacyClusterRBACName (a name two tenants' VMs could share).
func deleteLegacyClusterRBAC(ctx context.Context, c client.Client, namespace, vm string) error {
	return deleteClusterRBAC(ctx, c, bmc.LegacyClusterRBACName(namespace, vm), namespace, vm)
}

// deleteClusterRBAC deletes the cluster RBAC named name when the cache
// shows it as made for namespace's VM vm ("" for the shared server): an
// absent object costs no request, and an object of another VM is left.
func deleteClusterRBAC(ctx context.Context, c client.Client, name, namespace, vm string) error {
	for _, obj := range clusterRBACKinds() {
		if err := c.Get(ctx, types.NamespacedName{Name: name}, obj); err != nil {
			if client.IgnoreNotFound(err) != nil {
				return err
			}
			continue
		}
		labels := obj.GetLabels()
		shared := labels[v1beta1.LabelShared] == "true"
		if labels[v1beta1.LabelNamespace] != namespace || shared != (vm == "") || (vm != "" && labels[v1beta1.LabelVM] != vm) {
			continue
		}
		if err := c.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
			return err
		}
		log.FromContext(ctx).V(1).Info("cluster RBAC deleted", "kind", fmt.Sprintf("%T", obj), "name", name)
	}
	return nil
}
