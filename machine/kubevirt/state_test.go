package kubevirt_test

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
)

// TestStateSecret: the backend keeps state under a key of the VM's state
// Secret without touching its other keys, and reports ErrNotSupported
// where it has nowhere to keep it. Loading needs no started informers.
func TestStateSecret(t *testing.T) {
	ns := cluster.NewNamespace(t)
	ctx := t.Context()
	name := "vm-bmc-state"
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Data:       map[string][]byte{"someone-else": []byte("theirs")},
	}
	if err := cluster.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	b, err := kubevirt.New(cluster.Config, ns, "vm", kubevirt.Options{StateSecret: name})
	if err != nil {
		t.Fatal(err)
	}
	if data, err := b.LoadState(ctx, "redfish"); err != nil || data != nil {
		t.Fatalf("LoadState of an empty key = %q, %v; want nil, nil", data, err)
	}
	for _, kept := range []string{`{"version":1}`, `{"version":1,"lastId":2}`} {
		if err := b.SaveState(ctx, "redfish", []byte(kept)); err != nil {
			t.Fatalf("SaveState: %v", err)
		}
		if data, err := b.LoadState(ctx, "redfish"); err != nil || string(data) != kept {
			t.Errorf("LoadState = %q, %v; want %s", data, err, kept)
		}
	}
	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(secret), secret); err != nil {
		t.Fatal(err)
	}
	if string(secret.Data["someone-else"]) != "theirs" {
		t.Errorf("the Secret's other key is %q, want it untouched", secret.Data["someone-else"])
	}

	for _, tc := range []struct{ name, secret string }{
		{"no state Secret configured", ""},
		{"state Secret missing", "other-bmc-state"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := kubevirt.New(cluster.Config, ns, "vm", kubevirt.Options{StateSecret: tc.secret})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.LoadState(ctx, "redfish"); !errors.Is(err, machine.ErrNotSupported) {
				t.Errorf("LoadState = %v, want ErrNotSupported", err)
			}
			if err := b.SaveState(ctx, "redfish", []byte("x")); !errors.Is(err, machine.ErrNotSupported) {
				t.Errorf("SaveState = %v, want ErrNotSupported", err)
			}
		})
	}
}
