package kubevirt

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/machine"
)

var _ machine.StateStore = (*Backend)(nil)

// LoadState reads key of the state Secret, or of the backend's entry in it
// (Options.StateEntry). A Secret that is missing or that the BMC may not
// read means there is nowhere to keep state (ErrNotSupported): a BMC
// deployed by hand, or by an older controller.
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
	secret, err := b.readStateSecret(ctx)
	if err != nil {
		return nil, err
	}
	if b.stateEntry == "" {
		return secret.Data[key], nil
	}
	entry, err := b.entryOf(secret)
	if err != nil {
		return nil, err
	}
	return entry[key], nil
}

// SaveState sets key of the state Secret, or of the backend's entry in it,
// with a merge patch of that one key of the Secret, which leaves its other
// keys, and a concurrent writer of them, alone: in the Secret a shared
// bmc-server keeps all its VMs' state in, the other VMs' entries.
func (b *Backend) SaveState(ctx context.Context, key string, data []byte) error {
	if b.stateSecret == "" {
		return machine.Errorf(machine.ErrNotSupported, "no state Secret configured")
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	if b.stateEntry != "" {
		b.stateEntryMu.Lock()
		defer b.stateEntryMu.Unlock()
		secret, err := b.readStateSecret(ctx)
		if err != nil {
			return err
		}
		entry, err := b.entryOf(secret)
		if err != nil {
			return err
		}
		if entry == nil {
			entry = map[string][]byte{}
		}
		entry[key] = data
		if data, err = bmcspec.EncodeStateEntry(entry); err != nil {
			return err
		}
		key = b.stateEntry
	}
	patch, err := json.Marshal(map[string]any{"data": map[string][]byte{key: data}})
	if err != nil {
		return err
	}
	err = b.api.core.Patch(types.MergePatchType).Namespace(b.namespace).Resource("secrets").Name(b.stateSecret).Body(patch).Do(ctx).Error()
	return b.stateError(err, "writing")
}

// readStateSecret reads the state Secret from the API server: the backend
// neither caches nor watches Secrets.
func (b *Backend) readStateSecret(ctx context.Context) (*corev1.Secret, error) {
	secret := &corev1.Secret{}
	err := b.api.core.Get().Namespace(b.namespace).Resource("secrets").Name(b.stateSecret).Do(ctx).Into(secret)
	if err != nil {
		return nil, b.stateError(err, "reading")
	}
	return secret, nil
}

// entryOf decodes the backend's entry of secret, nil when it has none. An
// entry it cannot read is ErrNotSupported, as a missing Secret is: the
// protocol then runs without kept state and overwrites nothing, leaving
// the entry for someone to look at.
func (b *Backend) entryOf(secret *corev1.Secret) (map[string][]byte, error) {
	raw, ok := secret.Data[b.stateEntry]
	if !ok {
		return nil, nil
	}
	entry, err := bmcspec.DecodeStateEntry(raw)
	if err != nil {
		return nil, machine.Errorf(machine.ErrNotSupported, "key %s of the state Secret %s/%s is not a JSON object of base64 values: %v",
			b.stateEntry, b.namespace, b.stateSecret, err)
	}
	return entry, nil
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
