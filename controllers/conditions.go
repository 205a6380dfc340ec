package controllers

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/api/v1beta1"
)

// conditionType is a condition of the controller's part of a
// VirtualMachineBMC status; the names are the API's.
type conditionType string

// The controller's conditions.
const (
	conditionReady               conditionType = v1beta1.ConditionReady
	conditionVMFound             conditionType = v1beta1.ConditionVMFound
	conditionCredentialsReady    conditionType = v1beta1.ConditionCredentialsReady
	conditionDeploymentAvailable conditionType = v1beta1.ConditionDeploymentAvailable
	conditionServiceReady        conditionType = v1beta1.ConditionServiceReady
	conditionIngressReady        conditionType = v1beta1.ConditionIngressReady
)

// reason says why a condition is what it is, or why an Event was sent.
// Users' alerts and scripts match these words: they never change.
type reason string

// Condition reasons.
const (
	reasonFound             reason = "Found"
	reasonCreated           reason = "Created"
	reasonDisabled          reason = "Disabled"
	reasonShared            reason = "Shared"
	reasonAvailable         reason = "Available"
	reasonUnavailable       reason = "Unavailable"
	reasonReady             reason = "Ready"
	reasonNotReady          reason = "NotReady"
	reasonVMNotFound        reason = "VMNotFound"
	reasonSecretNotFound    reason = "SecretNotFound"
	reasonSecretInvalid     reason = "SecretInvalid"
	reasonSecretNotAllowed  reason = "SecretNotAllowed"
	reasonRotationRefused   reason = "RotationRefused"
	reasonHostNotAllowed    reason = "HostNotAllowed"
	reasonHostTaken         reason = "HostTaken" // two VMs asked for one host name
	reasonWorkloadFailed    reason = "WorkloadFailed"
	reasonConfigInvalid     reason = "ConfigInvalid"     // the controller's ConfigMap cannot be read or used
	reasonReadFailed        reason = "ReadFailed"        // the API server did not answer a read
	reasonCredentialsFailed reason = "CredentialsFailed" // creating or rotating the Secret failed
	// reasonSharedServerFailed: the namespace's shared bmc-server could
	// not be kept (also an Event on each VirtualMachineBMC it serves).
	reasonSharedServerFailed reason = "SharedServerFailed"
)

// Event-only reasons.
const (
	reasonCredentialsCreated reason = "CredentialsCreated"
	reasonCredentialsRotated reason = "CredentialsRotated"
	reasonEnrolled           reason = "Enrolled"
	reasonUnenrolled         reason = "Unenrolled"
	reasonIdentityRepaired   reason = "IdentityRepaired"
)

// controllerConditions are the conditions the BMC reconciler owns, which
// Ready sums up.
var controllerConditions = []conditionType{
	conditionVMFound, conditionCredentialsReady, conditionDeploymentAvailable,
	conditionServiceReady, conditionIngressReady,
}

// conditionOfKind is the condition that reports a workload object's
// failure.
func conditionOfKind(obj client.Object) conditionType {
	switch obj.(type) {
	case *corev1.Service:
		return conditionServiceReady
	case *networkingv1.Ingress:
		return conditionIngressReady
	}
	return conditionDeploymentAvailable
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

func (s *statusBuilder) set(t conditionType, ok bool, why reason, format string, args ...any) {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	c := metav1.Condition{
		Type: string(t), Status: status, Reason: string(why),
		Message: fmt.Sprintf(format, args...), ObservedGeneration: s.generation,
	}
	// Keep the transition time of a condition whose status did not change.
	if old := meta.FindStatusCondition(s.previous, string(t)); old != nil && old.Status == status {
		c.LastTransitionTime = old.LastTransitionTime
	} else {
		c.LastTransitionTime = metav1.Now()
	}
	meta.SetStatusCondition(&s.status.Conditions, c)
}

// fail reports err on conditionType and returns it.
func (s *statusBuilder) fail(t conditionType, why reason, err error) error {
	s.set(t, false, why, "%v", err)
	return err
}

// keepUnreached carries over the previous value of every controller
// condition this reconcile did not reach: a failure part way through
// learned nothing new about them.
func (s *statusBuilder) keepUnreached() {
	for _, t := range controllerConditions {
		if meta.FindStatusCondition(s.status.Conditions, string(t)) != nil {
			continue
		}
		if old := meta.FindStatusCondition(s.previous, string(t)); old != nil {
			meta.SetStatusCondition(&s.status.Conditions, *old)
		}
	}
}

func (s *statusBuilder) deployment(obj client.Object) {
	// A Deployment created by this reconcile (nil) is not available either:
	// one message for both, so the next reconcile writes no status.
	d, _ := obj.(*appsv1.Deployment)
	if d == nil || !deploymentAvailable(d) {
		s.set(conditionDeploymentAvailable, false, reasonUnavailable, "bmc-server is not available yet")
		return
	}
	s.set(conditionDeploymentAvailable, true, reasonAvailable, "bmc-server is available")
}

func deploymentAvailable(d *appsv1.Deployment) bool {
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
