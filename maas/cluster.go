package maas

import (
	"context"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Credentials are a BMC's Redfish user and password.
type Credentials struct {
	Username string
	Password string
}

// Cluster is the Kubernetes side of the reconciler: where BMC credentials come
// from and where MaaS's view of each VM is reported. Errors wrap
// ErrNotFound when the Secret or VM does not exist.
type Cluster interface {
	// BMCCredentials reads the VM's BMC Secret (BMCSecretName).
	BMCCredentials(ctx context.Context, vm VMRef) (Credentials, error)
	// ReportMachine records the VM's MaaS system_id and status name on the VM.
	ReportMachine(ctx context.Context, vm VMRef, systemID, status string) error
}

// KubeCluster implements Cluster with a controller-runtime client whose scheme
// knows corev1 and KubeVirt's core/v1.
type KubeCluster struct {
	Client client.Client
}

// BMCCredentials implements Cluster.
func (k KubeCluster) BMCCredentials(ctx context.Context, vm VMRef) (Credentials, error) {
	var secret corev1.Secret
	key := types.NamespacedName{Namespace: vm.Namespace, Name: BMCSecretName(vm.Name)}
	if err := k.Client.Get(ctx, key, &secret); err != nil {
		return Credentials{}, kubeError("BMC secret "+key.String(), err)
	}
	username, password := secret.Data[BMCSecretUsernameKey], secret.Data[BMCSecretPasswordKey]
	if len(username) == 0 || len(password) == 0 {
		return Credentials{}, fmt.Errorf("BMC secret %s must have non-empty %q and %q: %w",
			key, BMCSecretUsernameKey, BMCSecretPasswordKey, ErrInvalidArgument)
	}
	return Credentials{Username: string(username), Password: string(password)}, nil
}

// ReportMachine implements Cluster with a merge patch of the two annotations,
// sent only when they differ from what the VM has.
func (k KubeCluster) ReportMachine(ctx context.Context, vm VMRef, systemID, status string) error {
	var current kubevirtv1.VirtualMachine
	key := types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name}
	if err := k.Client.Get(ctx, key, &current); err != nil {
		return kubeError("VirtualMachine "+key.String(), err)
	}
	want := map[string]string{AnnotationSystemID: systemID, AnnotationStatus: status}
	annotations := current.GetAnnotations()
	if annotations[AnnotationSystemID] == systemID && annotations[AnnotationStatus] == status {
		return nil
	}
	patched := current.DeepCopy()
	merged := maps.Clone(annotations)
	if merged == nil {
		merged = map[string]string{}
	}
	maps.Copy(merged, want)
	patched.SetAnnotations(merged)
	if err := k.Client.Patch(ctx, patched, client.MergeFrom(&current)); err != nil {
		return kubeError("annotate VirtualMachine "+key.String(), err)
	}
	return nil
}

func kubeError(what string, err error) error {
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%s: %w", what, ErrNotFound)
	}
	return fmt.Errorf("%s: %w: %w", what, ErrUnavailable, err)
}
