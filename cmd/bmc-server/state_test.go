package main

import (
	"cmp"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
)

// subscriptionsKey is the state key Redfish keeps its subscriptions under.
const subscriptionsKey = "redfish-subscriptions"

// writeVMSpec writes spec as a --vms-dir file as one rename, as the
// kubelet swaps a Secret's files.
func writeVMSpec(t *testing.T, dir, name string, spec bmcspec.SharedVM) {
	t.Helper()
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "."+name)
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// stateFixture is a namespace of VMs web1 and web2 with every Secret their
// state may be kept in: each VM's own, as older controllers made, and the
// namespace's bmcspec.SharedStateSecret; and a shared bmc-server's
// --vms-dir for them.
type stateFixture struct {
	env       *kubevirttest.Cluster
	namespace string
	dir       string
	hosts     map[string]string
	client    *http.Client
}

func newStateFixture(t *testing.T, env *kubevirttest.Cluster, prefix string) *stateFixture {
	t.Helper()
	// The package's API server outlives a run: -count=N must not meet
	// the previous run's namespace.
	f := &stateFixture{env: env, namespace: prefix + "-" + strconv.FormatInt(time.Now().UnixNano(), 36), dir: t.TempDir(),
		hosts: map[string]string{}, client: &http.Client{Timeout: 15 * time.Second}}
	if err := env.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.namespace}}); err != nil {
		t.Fatal(err)
	}
	secrets := []string{bmcspec.SharedStateSecret}
	for i, vm := range []string{"web1", "web2"} {
		createVM(t, env.Client, f.namespace, vm, "6a1c2a3e-1b2d-4c5e-8f90-a1b2c3d4e5f"+strconv.Itoa(i+1), "02:00:00:00:02:0"+strconv.Itoa(i+1))
		f.hosts[vm] = vm + "." + f.namespace + ".bmc.example.com"
		secrets = append(secrets, bmcspec.StateSecretName(vm))
	}
	for _, name := range secrets {
		if err := env.Client.Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// writeVM writes vm's file, its state kept in stateSecret.
func (f *stateFixture) writeVM(t *testing.T, vm, stateSecret string) {
	t.Helper()
	writeVMSpec(t, f.dir, vm, bmcspec.SharedVM{Username: "maas-" + vm, Password: "pw-" + vm, Hosts: []string{f.hosts[vm]}, StateSecret: stateSecret})
}

func (f *stateFixture) start(t *testing.T) *started {
	t.Helper()
	return startServer(t, []string{"--backend", "kubevirt", "--namespace", f.namespace, "--vms-dir", f.dir,
		"--listen", "127.0.0.1:0", "--insecure-http"}, nil, fastTuning)
}

// at sends a request to vm's host with its credentials.
func (f *stateFixture) at(t *testing.T, s *started, vm, method, path, body string) hostResponse {
	t.Helper()
	return doAtHost(t, f.client, method, s.base+path, f.hosts[vm], "maas-"+vm, "pw-"+vm, body)
}

// subscriptions are the Contexts of vm's subscriptions, once its service
// has loaded them; a member gone between the collection and its own read
// (the service restarted meanwhile) has the collection read again.
func (f *stateFixture) subscriptions(t *testing.T, s *started, vm string) []string {
	t.Helper()
	var contexts []string
	poll.True(t, vm+"'s subscriptions loaded", func() bool {
		res := f.at(t, s, vm, "GET", "/redfish/v1/EventService/Subscriptions", "")
		switch res.status {
		case http.StatusServiceUnavailable:
			return false
		case http.StatusOK:
		default:
			t.Fatalf("Subscriptions at %s: %d %s", f.hosts[vm], res.status, res.body)
		}
		contexts = []string{}
		for _, id := range memberIDs(res.body) {
			member := f.at(t, s, vm, "GET", id, "")
			if member.status == http.StatusNotFound {
				return false
			}
			var sub struct{ Context string }
			if err := json.Unmarshal(member.body, &sub); member.status != http.StatusOK || err != nil {
				t.Fatalf("GET %s at %s: %d %s", id, f.hosts[vm], member.status, member.body)
			}
			contexts = append(contexts, sub.Context)
		}
		return true
	})
	return contexts
}

// subscribe makes a subscription of vm's with the given Context, to a
// name refused when a delivery dials it (loopback), so the test sends
// nothing anywhere.
func (f *stateFixture) subscribe(t *testing.T, s *started, vm, context string) {
	t.Helper()
	created := f.at(t, s, vm, "POST", "/redfish/v1/EventService/Subscriptions",
		`{"Destination":"https://localhost:9/events","Protocol":"Redfish","Context":"`+context+`"}`)
	if created.status != http.StatusCreated {
		t.Fatalf("POST at %s's host: %d %s", vm, created.status, created.body)
	}
}

// kept is what vm's subscriptions are as kept in stateSecret: its own
// Secret's key, or, in the namespace's Secret, its entry's.
func (f *stateFixture) kept(t *testing.T, vm, stateSecret string) string {
	t.Helper()
	name := cmp.Or(stateSecret, bmcspec.StateSecretName(vm))
	var secret corev1.Secret
	if err := f.env.Client.Get(t.Context(), client.ObjectKey{Namespace: f.namespace, Name: name}, &secret); err != nil {
		t.Fatal(err)
	}
	if stateSecret == "" {
		return string(secret.Data[subscriptionsKey])
	}
	raw, ok := secret.Data[vm]
	if !ok {
		return ""
	}
	var entry map[string][]byte
	if err := json.Unmarshal(raw, &entry); err != nil {
		t.Fatalf("%s's entry of %s is not a JSON object of base64 values: %v (%s)", vm, name, err, raw)
	}
	return string(entry[subscriptionsKey])
}

// TestSubscriptionsSurviveARestart runs the shared bmc-server of two VMs
// on KubeVirt's real control plane, their state kept where their files say:
// each in its own Secret (older controllers), or each under its name in
// the namespace's one Secret. A subscription made at one VM's host is there
// again after the process restarts, at that host only, and kept there
// only: not in the other VM's state, nor in the place the files do not
// name.
func TestSubscriptionsSurviveARestart(t *testing.T) {
	env := useAPIServer(t)
	for _, tc := range []struct{ name, stateSecret string }{
		{"in each VM's own Secret", ""},
		{"in the namespace's Secret", bmcspec.SharedStateSecret},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newStateFixture(t, env, "team-s")
			f.writeVM(t, "web1", tc.stateSecret)
			f.writeVM(t, "web2", tc.stateSecret)

			first := f.start(t)
			f.subscriptions(t, first, "web1")
			f.subscribe(t, first, "web1", "web1 only")
			first.cancel()
			err := <-first.done
			first.done <- err // for the cleanup's check

			second := f.start(t)
			if got := f.subscriptions(t, second, "web1"); !slices.Equal(got, []string{"web1 only"}) {
				t.Errorf("web1's subscriptions after the restart: %q, want the one made", got)
			}
			if got := f.subscriptions(t, second, "web2"); len(got) != 0 {
				t.Errorf("web2's subscriptions: %q, want none: web1's are its own", got)
			}
			for _, vm := range []string{"web1", "web2"} {
				for _, place := range []string{"", bmcspec.SharedStateSecret} {
					want := vm == "web1" && place == tc.stateSecret
					if got := f.kept(t, vm, place); strings.Contains(got, "web1 only") != want {
						t.Errorf("%s's state in %q holds web1's subscription: %v, want %v (%s)", vm, cmp.Or(place, "its own Secret"), !want, want, got)
					}
				}
			}
		})
	}
}

// TestSubscriptionsFollowTheirStateSecret: when a served VM's file names
// another Secret for its state, its service restarts and reads and keeps
// its subscriptions there, and the other VM's service carries on.
func TestSubscriptionsFollowTheirStateSecret(t *testing.T) {
	env := useAPIServer(t)
	f := newStateFixture(t, env, "team-m")
	f.writeVM(t, "web1", "")
	f.writeVM(t, "web2", bmcspec.SharedStateSecret)
	s := f.start(t)
	f.subscriptions(t, s, "web2")
	f.subscribe(t, s, "web2", "web2's")
	f.subscriptions(t, s, "web1")
	f.subscribe(t, s, "web1", "in its own Secret")

	for _, step := range []struct {
		name, stateSecret string
		subscribe         string   // a subscription made once the service reads from stateSecret
		want              []string // the Contexts of web1's subscriptions, read from stateSecret
	}{
		{"to the namespace's Secret", bmcspec.SharedStateSecret, "in the namespace's Secret", []string{}},
		{"back to its own Secret", "", "", []string{"in its own Secret"}},
	} {
		t.Run(step.name, func(t *testing.T) {
			f.writeVM(t, "web1", step.stateSecret)
			poll.True(t, "web1's service reading its subscriptions from the new place", func() bool {
				return slices.Equal(f.subscriptions(t, s, "web1"), step.want)
			})
			if step.subscribe != "" {
				f.subscribe(t, s, "web1", step.subscribe)
			}
		})
	}
	for _, place := range []struct{ stateSecret, want, notWant string }{
		{"", "in its own Secret", "in the namespace's Secret"},
		{bmcspec.SharedStateSecret, "in the namespace's Secret", "in its own Secret"},
	} {
		got := f.kept(t, "web1", place.stateSecret)
		if !strings.Contains(got, place.want) || strings.Contains(got, place.notWant) {
			t.Errorf("web1's state in %q: %s; want %q there, and not %q", cmp.Or(place.stateSecret, "its own Secret"), got, place.want, place.notWant)
		}
	}
	if got := f.subscriptions(t, s, "web2"); !slices.Equal(got, []string{"web2's"}) {
		t.Errorf("web2's subscriptions: %q, want its one, kept as they were", got)
	}
	if got := f.kept(t, "web2", bmcspec.SharedStateSecret); !strings.Contains(got, "web2's") {
		t.Errorf("web2's entry of the namespace's Secret: %s, want its subscription", got)
	}
}
