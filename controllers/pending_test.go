package controllers

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/internal/kubescheme"
)

func TestPendingCreationsWait(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "vm"}
	start := time.Unix(1000, 0)
	tests := []struct {
		name     string
		created  bool
		observed bool
		owner    types.UID
		at       time.Duration // after the creation
		want     time.Duration
	}{
		{"never created: create", false, false, "a", 0, 0},
		{"just created: wait the allowance", true, false, "a", 0, cacheLagAllowance},
		{"created a second ago: wait the rest", true, false, "a", time.Second, cacheLagAllowance - time.Second},
		{"allowance over: create again", true, false, "a", cacheLagAllowance, 0},
		{"created for an owner since replaced: create", true, false, "b", 0, 0},
		{"observed in the cache since: create if it goes", true, true, "a", 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var p pendingCreations
			if tc.created {
				p.add(key, "a", start)
			}
			if tc.observed {
				p.observed(key)
			}
			if got := p.wait(key, tc.owner, start.Add(tc.at)); got != tc.want {
				t.Errorf("wait = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestEnrolmentDoesNotCreateTwiceWhileTheCacheLags: reconciles that run
// before the cache shows the VirtualMachineBMC just created send no second
// create, and ask to be run again when the allowance is over.
func TestEnrolmentDoesNotCreateTwiceWhileTheCacheLags(t *testing.T) {
	scheme := kubescheme.New()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns", Labels: map[string]string{"enrolled": "yes"}}}
	vm := &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ns", UID: "vm-uid"}}
	var creates atomic.Int64
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(ns, vm).WithInterceptorFuncs(interceptor.Funcs{
		// A cache that has not seen any VirtualMachineBMC yet.
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*v1beta1.VirtualMachineBMC); ok {
				return apierrors.NewNotFound(v1beta1.GroupVersion.WithResource("virtualmachinebmcs").GroupResource(), key.Name)
			}
			return c.Get(ctx, key, obj, opts...)
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*v1beta1.VirtualMachineBMC); ok {
				creates.Add(1)
			}
			return c.Create(ctx, obj, opts...)
		},
	}).Build()
	r := &EnrolmentReconciler{
		Client:   c,
		Config:   &ConfigSource{Defaults: Config{NamespaceSelector: labels.SelectorFromSet(labels.Set{"enrolled": "yes"})}, Reader: c},
		Identity: stampNothing{},
		Events:   events.NewFakeRecorder(10),
	}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(vm)}
	for i := range 3 {
		result, err := r.Reconcile(t.Context(), req)
		if err != nil {
			t.Fatalf("reconcile %d: %v", i, err)
		}
		if i > 0 && (result.RequeueAfter <= 0 || result.RequeueAfter > cacheLagAllowance) {
			t.Errorf("reconcile %d: RequeueAfter %v, want a wait within %v for the cache", i, result.RequeueAfter, cacheLagAllowance)
		}
	}
	if n := creates.Load(); n != 1 {
		t.Errorf("%d creates of the VirtualMachineBMC while the cache lagged, want 1", n)
	}
}

type stampNothing struct{}

func (stampNothing) Stamp(context.Context, *kubevirtv1.VirtualMachine) ([]string, error) {
	return nil, nil
}

func TestWrittenStatusesSkipOnlyAReadOfTheSameVersion(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "vm"}
	same := func(a, b string) bool { return a == b }
	tests := []struct {
		name   string
		wrote  bool
		readAt string // the resourceVersion the next reconcile reads
		status string
		forget bool
		skip   bool
	}{
		{name: "nothing written", readAt: "5", status: "ready", skip: false},
		{name: "stale read, same status", wrote: true, readAt: "5", status: "ready", skip: true},
		{name: "stale read, other status", wrote: true, readAt: "5", status: "not ready", skip: false},
		{name: "the cache moved on", wrote: true, readAt: "6", status: "ready", skip: false},
		{name: "object deleted and recreated", wrote: true, forget: true, readAt: "5", status: "ready", skip: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var w writtenStatuses[string]
			if tc.wrote {
				w.wrote(key, "5", "ready")
			}
			if tc.forget {
				w.forget(key)
			}
			if got := w.unchanged(key, tc.readAt, tc.status, same); got != tc.skip {
				t.Fatalf("unchanged = %v, want %v", got, tc.skip)
			}
		})
	}
	t.Run("a newer version ends the memory", func(t *testing.T) {
		var w writtenStatuses[string]
		w.wrote(key, "5", "ready")
		w.unchanged(key, "6", "ready", same)
		if w.unchanged(key, "5", "ready", same) {
			t.Fatal("remembered a write the cache has already shown")
		}
	})
}
