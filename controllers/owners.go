package controllers

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/api/v1beta1"
)

// ownership is how an object the controller makes depends on its owner.
// Either way the garbage collector deletes it with the owner.
type ownership bool

const (
	// controlledBy: the owner's reconciler keeps the object, and a
	// foreground deletion of the owner waits for it.
	controlledBy ownership = true
	// collectedWith: the object only goes with the owner (a VM's
	// credentials, which outlive its VirtualMachineBMC; cluster RBAC,
	// which no namespaced object can own, with its Namespace).
	collectedWith ownership = false
)

var (
	bmcKind       = v1beta1.GroupVersion.WithKind("VirtualMachineBMC")
	vmKind        = kubevirtv1.VirtualMachineGroupVersionKind
	namespaceKind = corev1.SchemeGroupVersion.WithKind("Namespace")
)

// setOwner makes owner, of kind, obj's only owner: every owner reference
// the controller writes is made here.
func setOwner(obj client.Object, kind schema.GroupVersionKind, owner metav1.Object, how ownership) {
	ref := metav1.OwnerReference{APIVersion: kind.GroupVersion().String(), Kind: kind.Kind, Name: owner.GetName(), UID: owner.GetUID()}
	if how == controlledBy {
		yes := true
		ref.Controller, ref.BlockOwnerDeletion = &yes, &yes
	}
	obj.SetOwnerReferences([]metav1.OwnerReference{ref})
}
