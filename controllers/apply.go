package controllers

import (
	"context"
	"fmt"
	"reflect"

	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// FieldOwner is the controller's server-side apply field manager. The MaaS
// reconciler applies the VirtualMachineBMC status under its own.
const FieldOwner = client.FieldOwner("virtmetal-controller")

// applier creates missing objects and puts back drifted ones with
// server-side apply, and sends nothing for an object that is as wanted: an
// idle reconcile costs no API request.
type applier struct {
	client client.Client // reads from the manager's cache
	scheme *runtime.Scheme
}

// ensure makes desired exist as wanted and returns the object as the cache
// had it (nil when it had to be created).
func (a applier) ensure(ctx context.Context, desired client.Object) (client.Object, error) {
	gvk, err := apiutil.GVKForObject(desired, a.scheme)
	if err != nil {
		return nil, err
	}
	fresh, err := a.scheme.New(gvk)
	if err != nil {
		return nil, err
	}
	actual := fresh.(client.Object)
	err = a.client.Get(ctx, client.ObjectKeyFromObject(desired), actual)
	switch {
	case apierrors.IsNotFound(err):
		actual = nil
	case err != nil:
		return nil, err
	case upToDate(desired, actual):
		return actual, nil
	}
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(desired)
	if err != nil {
		return nil, err
	}
	u := applyObject(content)
	u.SetGroupVersionKind(gvk)
	unstructured.RemoveNestedField(u.Object, "status")
	if err := a.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), FieldOwner, client.ForceOwnership); err != nil {
		return nil, fmt.Errorf("apply %s %s: %w", gvk.Kind, client.ObjectKeyFromObject(desired), err)
	}
	return actual, nil
}

// upToDate says whether actual has everything desired sets (fields the API
// server defaulted or others added do not count): labels, annotations and
// owner references, and the body (spec, rules, subjects, ...).
func upToDate(desired, actual client.Object) bool {
	if !equality.Semantic.DeepDerivative(desired.GetLabels(), actual.GetLabels()) ||
		!equality.Semantic.DeepDerivative(desired.GetAnnotations(), actual.GetAnnotations()) ||
		!equality.Semantic.DeepDerivative(desired.GetOwnerReferences(), actual.GetOwnerReferences()) {
		return false
	}
	// RBAC rules get no defaults, and a name too many in a list (which
	// DeepDerivative takes for a longer list's prefix) is a permission
	// too many: they must be equal.
	switch d := desired.(type) {
	case *rbacv1.Role:
		if a, ok := actual.(*rbacv1.Role); !ok || !equality.Semantic.DeepEqual(d.Rules, a.Rules) {
			return false
		}
	case *rbacv1.ClusterRole:
		if a, ok := actual.(*rbacv1.ClusterRole); !ok || !equality.Semantic.DeepEqual(d.Rules, a.Rules) {
			return false
		}
	case *networkingv1.NetworkPolicy:
		// A peer or port too many is a way in or out too many.
		if a, ok := actual.(*networkingv1.NetworkPolicy); !ok || !equality.Semantic.DeepEqual(d.Spec, a.Spec) {
			return false
		}
	case *networkingv1.Ingress:
		// Likewise a host too many: the shared Ingress's rules and
		// certificates are as many as wanted (each compared below).
		if a, ok := actual.(*networkingv1.Ingress); !ok || len(d.Spec.Rules) != len(a.Spec.Rules) || len(d.Spec.TLS) != len(a.Spec.TLS) {
			return false
		}
	}
	// Compare bodies only: give the copy the actual type and object meta.
	body := desired.DeepCopyObject()
	dst, src := reflect.ValueOf(body).Elem(), reflect.ValueOf(actual).Elem()
	for _, field := range []string{"TypeMeta", "ObjectMeta"} {
		dst.FieldByName(field).Set(src.FieldByName(field))
	}
	return equality.Semantic.DeepDerivative(body, actual)
}

// applyObject is an apply request's body without the fields a typed
// object's conversion adds that nobody means to set.
func applyObject(content map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: content}
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	return u
}
