package kubevirt_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
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

// sharedState is the state Secret of the tests of Options.StateEntry, as
// the shared bmc-server names it (bmcspec.SharedStateSecret).
const sharedState = "virtmetal-bmcs-state"

// newSharedState creates a namespace whose state Secret holds data.
func newSharedState(t *testing.T, data map[string][]byte) string {
	t.Helper()
	ns := cluster.NewNamespace(t)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sharedState}, Data: data}
	if err := cluster.Client.Create(t.Context(), secret); err != nil {
		t.Fatal(err)
	}
	return ns
}

// entryBackend is the backend of vm keeping its state in its entry of the
// namespace's state Secret, reaching the API server with cfg.
func entryBackend(t *testing.T, cfg *rest.Config, ns, vm string) *kubevirt.Backend {
	t.Helper()
	b, err := kubevirt.New(cfg, ns, vm, kubevirt.Options{StateSecret: sharedState, StateEntry: vm})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sharedStateData is the state Secret's data, its keys as stored.
func sharedStateData(t *testing.T, ns string) map[string][]byte {
	t.Helper()
	var secret corev1.Secret
	if err := cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: sharedState}, &secret); err != nil {
		t.Fatal(err)
	}
	return secret.Data
}

// entries decodes the state Secret's entries, each a JSON object of base64
// values, with its other keys as they are.
func entries(t *testing.T, ns string) (decoded map[string]map[string]string, others map[string]string) {
	t.Helper()
	decoded, others = map[string]map[string]string{}, map[string]string{}
	for key, raw := range sharedStateData(t, ns) {
		if !strings.HasPrefix(key, "vm-") {
			others[key] = string(raw)
			continue
		}
		var entry map[string][]byte
		if err := json.Unmarshal(raw, &entry); err != nil {
			t.Fatalf("entry %s is not a JSON object of base64 values: %v (%s)", key, err, raw)
		}
		decoded[key] = map[string]string{}
		for k, v := range entry {
			decoded[key][k] = string(v)
		}
	}
	return decoded, others
}

// afterSecretRead runs do once, after the first read of the state Secret
// that goes through the returned config and before its answer is used.
func afterSecretRead(do func()) *rest.Config {
	cfg := rest.CopyConfig(cluster.Config)
	var once sync.Once
	cfg.Wrap(func(next http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			res, err := next.RoundTrip(req)
			if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/secrets/"+sharedState) {
				once.Do(do)
			}
			return res, err
		})
	})
	return cfg
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// TestSharedStateSecret: backends whose VMs share one state Secret
// (Options.StateEntry, as the shared bmc-server runs them) keep their state
// keys in their own entry of it, a JSON object, and never change another
// VM's entry or the Secret's other keys, not even when saving at once.
func TestSharedStateSecret(t *testing.T) {
	t.Run("each VM its own entry", func(t *testing.T) {
		ns := newSharedState(t, map[string][]byte{"someone-else": []byte("theirs")})
		ctx := t.Context()
		a, b := entryBackend(t, cluster.Config, ns, "vm-a"), entryBackend(t, cluster.Config, ns, "vm-b")
		for _, save := range []struct {
			backend   *kubevirt.Backend
			key, data string
		}{
			{a, "redfish", "a's first"},
			{b, "redfish", "b's"},
			{a, "other", "a's other"},
			{a, "redfish", "a's second"},
		} {
			if err := save.backend.SaveState(ctx, save.key, []byte(save.data)); err != nil {
				t.Fatalf("SaveState(%s, %q): %v", save.key, save.data, err)
			}
		}
		for _, load := range []struct {
			name    string
			backend *kubevirt.Backend
			key     string
			want    []byte
		}{
			{"a's key", a, "redfish", []byte("a's second")},
			{"a's other key", a, "other", []byte("a's other")},
			{"b's key", b, "redfish", []byte("b's")},
			{"a key b never saved", b, "other", nil},
			{"a VM without an entry", entryBackend(t, cluster.Config, ns, "vm-c"), "redfish", nil},
		} {
			t.Run(load.name, func(t *testing.T) {
				data, err := load.backend.LoadState(ctx, load.key)
				if err != nil || string(data) != string(load.want) || (data == nil) != (load.want == nil) {
					t.Errorf("LoadState(%s) = %q, %v; want %q, nil", load.key, data, err, load.want)
				}
			})
		}
		got, others := entries(t, ns)
		want := map[string]map[string]string{
			"vm-a": {"redfish": "a's second", "other": "a's other"},
			"vm-b": {"redfish": "b's"},
		}
		if !maps.EqualFunc(got, want, maps.Equal) {
			t.Errorf("entries %v, want %v", got, want)
		}
		if !maps.Equal(others, map[string]string{"someone-else": "theirs"}) {
			t.Errorf("the Secret's other keys are %v, want someone-else's untouched", others)
		}
	})

	t.Run("a save between another's read and write", func(t *testing.T) {
		ns := newSharedState(t, nil)
		ctx := t.Context()
		b := entryBackend(t, cluster.Config, ns, "vm-b")
		if err := b.SaveState(ctx, "redfish", []byte("b's first")); err != nil {
			t.Fatal(err)
		}
		// vm-b saves after vm-a has read the Secret: what vm-a writes
		// must not carry vm-b's entry as it read it.
		var between error
		a := entryBackend(t, afterSecretRead(func() { between = b.SaveState(ctx, "redfish", []byte("b's second")) }), ns, "vm-a")
		if err := a.SaveState(ctx, "redfish", []byte("a's")); err != nil {
			t.Fatal(err)
		}
		if between != nil {
			t.Fatalf("vm-b's save: %v", between)
		}
		got, _ := entries(t, ns)
		want := map[string]map[string]string{"vm-a": {"redfish": "a's"}, "vm-b": {"redfish": "b's second"}}
		if !maps.EqualFunc(got, want, maps.Equal) {
			t.Errorf("entries %v, want %v", got, want)
		}
	})

	t.Run("concurrent saves", func(t *testing.T) {
		ns := newSharedState(t, nil)
		ctx := t.Context()
		const vms, keys, rounds = 4, 2, 10
		var wg sync.WaitGroup
		var failed atomic.Bool
		want := map[string]map[string]string{}
		for v := range vms {
			vm := fmt.Sprintf("vm-%d", v)
			b := entryBackend(t, cluster.Config, ns, vm)
			want[vm] = map[string]string{}
			for k := range keys {
				key := fmt.Sprintf("key-%d", k)
				want[vm][key] = fmt.Sprintf("%s %s %d", vm, key, rounds-1)
				wg.Go(func() {
					for r := range rounds {
						if err := b.SaveState(ctx, key, fmt.Appendf(nil, "%s %s %d", vm, key, r)); err != nil && !failed.Swap(true) {
							t.Errorf("%s SaveState(%s): %v", vm, key, err)
						}
					}
				})
			}
		}
		wg.Wait()
		got, _ := entries(t, ns)
		if !maps.EqualFunc(got, want, maps.Equal) {
			t.Errorf("entries %v, want each VM's last saves %v", got, want)
		}
	})

	t.Run("malformed entry", func(t *testing.T) {
		for _, tc := range []struct{ name, entry string }{
			{"not JSON", "redfish=x"},
			{"a JSON list", `["eyJ2ZXJzaW9uIjoxfQ=="]`},
			{"a JSON string", `"eyJ2ZXJzaW9uIjoxfQ=="`},
			{"values not base64", `{"redfish":"{\"version\":1}"}`},
			{"values not strings", `{"redfish":{"version":1}}`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ns := newSharedState(t, map[string][]byte{"vm-a": []byte(tc.entry)})
				ctx := t.Context()
				a := entryBackend(t, cluster.Config, ns, "vm-a")
				if data, err := a.LoadState(ctx, "redfish"); !errors.Is(err, machine.ErrNotSupported) || !strings.Contains(err.Error(), "not a JSON object") {
					t.Errorf("LoadState = %q, %v; want ErrNotSupported saying the entry is not a JSON object", data, err)
				}
				if err := a.SaveState(ctx, "redfish", []byte("a's")); !errors.Is(err, machine.ErrNotSupported) {
					t.Errorf("SaveState = %v, want ErrNotSupported", err)
				}
				if err := entryBackend(t, cluster.Config, ns, "vm-b").SaveState(ctx, "redfish", []byte("b's")); err != nil {
					t.Errorf("vm-b's SaveState beside vm-a's malformed entry: %v", err)
				}
				if got := string(sharedStateData(t, ns)["vm-a"]); got != tc.entry {
					t.Errorf("vm-a's malformed entry became %q, want it left as it was", got)
				}
			})
		}
	})

	t.Run("state Secret missing", func(t *testing.T) {
		a := entryBackend(t, cluster.Config, cluster.NewNamespace(t), "vm-a")
		if _, err := a.LoadState(t.Context(), "redfish"); !errors.Is(err, machine.ErrNotSupported) {
			t.Errorf("LoadState = %v, want ErrNotSupported", err)
		}
		if err := a.SaveState(t.Context(), "redfish", []byte("x")); !errors.Is(err, machine.ErrNotSupported) {
			t.Errorf("SaveState = %v, want ErrNotSupported", err)
		}
	})
}
