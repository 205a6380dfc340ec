package kubevirt

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/virtmetal/virtmetal/machine"
)

var _ machine.StateStore = (*Backend)(nil)

// LoadState reads key of the state Secret. A Secret that is missing or
// that the BMC may not read means there is nowhere to keep state
// (ErrNotSupported): a BMC deployed by hand, or by an older controller.
func (b *Backend) LoadState(ctx context.Context, key string) ([]byte, error) {
	if b.stateSecret == "" {
		return nil, machine.Errorf(machine.ErrNotSupported, "no state Secret configured")
	}
	if loads := b.informers.stateLoads; loads != nil {
		select {
		case loads <- struct{}{}:
			defer func() { <-loads }()
		case <-ctx.Done():
			return nil, machine.Errorf(machine.ErrUnavailable, "reading the state Secret %s/%s: %v", b.namespace, b.stateSecret, ctx.Err())
		}
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	secret := &corev1.Secret{}
	err := b.api.core.Get().Namespace(b.namespace).Resource("secrets").Name(b.stateSecret).Do(ctx).Into(secret)
	if err != nil {
		return nil, b.stateError(err, "reading")
	}
	return secret.Data[key], nil
}

// SaveState sets key of the state Secret with a merge patch, which leaves
// its other keys, and a concurrent writer of them, alone.
func (b *Backend) SaveState(ctx context.Context, key string, data []byte) error {
	if b.stateSecret == "" {
		return machine.Errorf(machine.ErrNotSupported, "no state Secret configured")
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	patch, err := json.Marshal(map[string]any{"data": map[string][]byte{key: data}})
	if err != nil {
		return err
	}
	err = b.api.core.Patch(types.MergePatchType).Namespace(b.namespace).Resource("secrets").Name(b.stateSecret).Body(patch).Do(ctx).Error()
	return b.stateError(err, "writing")
}

func (b *Backend) stateError(err error, doing string) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err), apierrors.IsForbidden(err):
		return machine.Errorf(machine.ErrNotSupported, "%s the state Secret %s/%s: %v", doing, b.namespace, b.stateSecret, err)
	default:
		return b.apiError(fmt.Errorf("%s the state Secret %s: %w", doing, b.stateSecret, err), doing+" the state of")
	}
}
