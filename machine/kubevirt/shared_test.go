package kubevirt_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/deploy/bmc"
	"github.com/virtmetal/virtmetal/internal/kubescheme"
	"github.com/virtmetal/virtmetal/internal/kubetest"
	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
	"github.com/virtmetal/virtmetal/sim/console"
)

// startInformers runs namespace-wide informers, as a shared bmc-server
// does, until the test ends.
func startInformers(t *testing.T, cfg *rest.Config, namespace string, opts kubevirt.InformersOptions) *kubevirt.Informers {
	t.Helper()
	informers, err := kubevirt.NewInformers(cfg, namespace, opts)
	if err != nil {
		t.Fatalf("NewInformers: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); informers.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return informers
}

// sharedNamespace creates the served VMs web1 and web2 and the unserved
// VM other, and the shared bmc-server's RBAC for the served ones; it
// returns the namespace and the config of the shared server's identity.
func sharedNamespace(t *testing.T) (string, *rest.Config) {
	t.Helper()
	ns := cluster.NewNamespace(t)
	for _, name := range []string{"web1", "web2", "other"} {
		newVM(t, ns, name, nil)
	}
	objs, err := bmc.RBACObjects(bmc.RBACParams{Namespace: ns, VMs: []string{"web1", "web2"}})
	if err != nil {
		t.Fatalf("RBACObjects: %v", err)
	}
	for _, obj := range objs {
		if err := cluster.Client.Create(t.Context(), obj); err != nil {
			t.Fatalf("creating %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
	cfg, err := cluster.ConfigFor(kubetest.ServiceAccountUser(ns, bmc.SharedServiceAccount), "system:serviceaccounts", "system:serviceaccounts:"+ns)
	if err != nil {
		t.Fatalf("ConfigFor: %v", err)
	}
	return ns, cfg
}

// TestSharedInformersRBAC runs two backends on one pair of namespace-wide
// informers as the shared bmc-server's ServiceAccount: they list and watch
// the namespace and work their own VMs, and that identity may write no VM
// it does not serve.
func TestSharedInformersRBAC(t *testing.T) {
	ctx := t.Context()
	ns, cfg := sharedNamespace(t)
	informers := startInformers(t, cfg, ns, kubevirt.InformersOptions{})
	for _, name := range []string{"web1", "web2"} {
		m := mustMachine(t, kubevirttest.StartBackend(t, cfg, ns, name, kubevirt.Options{Informers: informers}), name)
		if _, err := m.Inventory(ctx); err != nil {
			t.Fatalf("%s Inventory: %v", name, err)
		}
		if err := m.Reset(ctx, machine.ResetOn); err != nil {
			t.Fatalf("%s Reset(On): %v", name, err)
		}
		waitPower(t, m, machine.PowerOn)
		serialPrompt(t, m)
		if err := m.Reset(ctx, machine.ResetForceOff); err != nil {
			t.Fatalf("%s Reset(ForceOff): %v", name, err)
		}
		waitPower(t, m, machine.PowerOff)
	}

	as, err := client.New(cfg, client.Options{Scheme: kubescheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	if err := as.List(ctx, &kubevirtv1.VirtualMachineInstanceList{}, client.InNamespace(ns)); err != nil {
		t.Fatalf("listing the namespace's VMIs: %v", err)
	}
	forcing := subresourceClient(t, cfg)
	other := client.ObjectKey{Namespace: ns, Name: "other"}
	runStrategyPatch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"runStrategy":"Always"}}`))
	forbidden := []struct {
		name string
		call func() error
	}{
		{"get a VM not served", func() error { return as.Get(ctx, other, &kubevirtv1.VirtualMachine{}) }},
		{"update a VM not served", func() error {
			vm := getVM(t, ns, "other")
			vm.Spec.RunStrategy = new(kubevirtv1.RunStrategyAlways)
			return as.Update(ctx, vm)
		}},
		{"patch a VM not served", func() error {
			return as.Patch(ctx, &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other"}}, runStrategyPatch)
		}},
		{"delete a served VM", func() error { return as.Delete(ctx, getVM(t, ns, "web1")) }},
		{"create a VM", func() error {
			return as.Create(ctx, &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "new"}})
		}},
		{"delete the VMI of a VM not served", func() error {
			return as.Delete(ctx, &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other"}})
		}},
		{"delete every VMI", func() error {
			return as.DeleteAllOf(ctx, &kubevirtv1.VirtualMachineInstance{}, client.InNamespace(ns))
		}},
		{"list VMs of another namespace", func() error {
			return as.List(ctx, &kubevirtv1.VirtualMachineList{}, client.InNamespace("default"))
		}},
	}
	for _, subresource := range []string{"start", "stop", "restart"} {
		forbidden = append(forbidden, struct {
			name string
			call func() error
		}{subresource + " a VM not served", func() error {
			return forcing.Put().Namespace(ns).Resource("virtualmachines").Name("other").SubResource(subresource).Body([]byte(`{}`)).Do(ctx).Error()
		}})
	}
	// The console of a VM it does not serve, which its informers see.
	powerOnBehindTheBMC(t, ns, "other")
	notServed := mustMachine(t, kubevirttest.StartBackend(t, cfg, ns, "other", kubevirt.Options{Informers: informers}), "other")
	waitPower(t, notServed, machine.PowerOn)
	for _, k := range machine.AllConsoleKinds {
		forbidden = append(forbidden, struct {
			name string
			call func() error
		}{"open the " + string(k) + " console of a VM not served", func() error {
			stream, err := notServed.OpenConsole(ctx, k)
			if err == nil {
				stream.Close()
			}
			return err
		}})
	}
	for _, tc := range forbidden {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !apierrors.IsForbidden(err) {
				t.Fatalf("error = %v, want Forbidden", err)
			}
		})
	}
}

// serialPrompt opens the machine's serial console and reads up to the
// guest's login prompt.
func serialPrompt(t *testing.T, m machine.Machine) {
	t.Helper()
	stream, err := m.OpenConsole(t.Context(), machine.ConsoleSerial)
	if err != nil {
		t.Fatalf("%s OpenConsole(Serial): %v", m.ID(), err)
	}
	defer stream.Close()
	read := make(chan error, 1)
	go func() {
		var seen []byte
		buf := make([]byte, 4<<10)
		for !bytes.Contains(seen, []byte(console.Prompt(m.ID()))) {
			n, err := stream.Read(buf)
			if err != nil {
				read <- fmt.Errorf("%w after %q", err, seen)
				return
			}
			seen = append(seen, buf[:n]...)
		}
		read <- nil
	}()
	select {
	case err := <-read:
		if err != nil {
			t.Fatalf("%s serial console: %v", m.ID(), err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s serial console: no login prompt in 30 s", m.ID())
	}
}

// TestSharedInformersKeepBackendsApart: with the namespace's informers
// shared, each backend serves, reads and resets its own VM only, and is
// told only of its own VM's changes: a change to a VM it does not serve
// wakes no backend.
func TestSharedInformersKeepBackendsApart(t *testing.T) {
	ctx := t.Context()
	ns := cluster.NewNamespace(t)
	for _, name := range []string{"web1", "web2", "other"} {
		newVM(t, ns, name, nil)
	}
	informers := startInformers(t, cluster.Config, ns, kubevirt.InformersOptions{})
	backends := map[string]*kubevirt.Backend{}
	for _, name := range []string{"web1", "web2"} {
		backends[name] = kubevirttest.StartBackend(t, cluster.Config, ns, name, kubevirt.Options{Informers: informers})
	}

	t.Run("each serves its own VM only", func(t *testing.T) {
		for name, b := range backends {
			if ids, err := b.Machines(ctx); err != nil || !slices.Equal(ids, []string{name}) {
				t.Errorf("%s Machines = %v, %v", name, ids, err)
			}
			for _, id := range []string{"web1", "web2", "other"} {
				if _, err := b.Machine(ctx, id); (id == name) != (err == nil) || err != nil && !errors.Is(err, machine.ErrNotFound) {
					t.Errorf("%s Machine(%s) = %v", name, id, err)
				}
			}
		}
	})

	t.Run("a reset changes its own VM only", func(t *testing.T) {
		// virt-controller writes status, finalizers and its own kubevirt.io/
		// annotations as it likes: what a backend writes is the spec
		// (generation) and the other annotations.
		written := func(vm *kubevirtv1.VirtualMachine) string {
			annotations := maps.Clone(vm.Annotations)
			maps.DeleteFunc(annotations, func(key, _ string) bool { return strings.HasPrefix(key, "kubevirt.io/") })
			return fmt.Sprintf("generation %d, annotations %v", vm.Generation, annotations)
		}
		before := map[string]string{}
		for _, name := range []string{"web2", "other"} {
			before[name] = written(getVM(t, ns, name))
		}
		m := mustMachine(t, backends["web1"], "web1")
		if err := m.Reset(ctx, machine.ResetOn); err != nil {
			t.Fatalf("Reset(On): %v", err)
		}
		waitPower(t, m, machine.PowerOn)
		for name, was := range before {
			if got := written(getVM(t, ns, name)); got != was {
				t.Errorf("VM %s changed (%s to %s)", name, was, got)
			}
		}
		if st, err := mustMachine(t, backends["web2"], "web2").PowerState(ctx); err != nil || st != machine.PowerOff {
			t.Errorf("web2 PowerState = %v, %v; want Off", st, err)
		}
		if err := m.Reset(ctx, machine.ResetForceOff); err != nil {
			t.Fatalf("Reset(ForceOff): %v", err)
		}
		waitPower(t, m, machine.PowerOff)
	})

	t.Run("a change wakes the backend of its VM only", func(t *testing.T) {
		// Let the writes above settle: web1's VMI going away still
		// changes web1.
		poll.True(t, "web1 settled", func() bool {
			v, _ := backends["web1"].StateVersion("web1")
			time.Sleep(300 * time.Millisecond)
			w, _ := backends["web1"].StateVersion("web1")
			return v == w
		})
		woken := map[string]<-chan struct{}{}
		versions := map[string]uint64{}
		for name, b := range backends {
			woken[name] = b.Changed()
			versions[name], _ = b.StateVersion(name)
		}
		// The unserved VM changes, and starts (a VMI of its name).
		annotate(t, ns, "other")
		vm := getVM(t, ns, "other")
		vm.Spec.RunStrategy = new(kubevirtv1.RunStrategyAlways)
		if err := cluster.Client.Update(ctx, vm); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, "the unserved VM's VMI", func() error {
			return cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "other"}, &kubevirtv1.VirtualMachineInstance{})
		})
		// A change to web2 after those: once its backend is told, the
		// informers have dispatched the unserved VM's events too.
		annotate(t, ns, "web2")
		select {
		case <-woken["web2"]:
		case <-time.After(10 * time.Second):
			t.Fatal("web2's backend was not told of web2's change")
		}
		select {
		case <-woken["web1"]:
			t.Error("web1's backend was woken by another VM's change")
		case <-time.After(500 * time.Millisecond):
		}
		if v, _ := backends["web1"].StateVersion("web1"); v != versions["web1"] {
			t.Errorf("web1's StateVersion went from %d to %d", versions["web1"], v)
		}
	})
}

// annotate changes the VM by an annotation, as an admin.
func annotate(t *testing.T, namespace, name string) {
	t.Helper()
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"test/touched":"`+time.Now().Format(time.RFC3339Nano)+`"}}}`))
	if err := cluster.Client.Patch(t.Context(), &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}, patch); err != nil {
		t.Fatalf("annotating VM %s: %v", name, err)
	}
}

// TestSharedInformersReachability: when the API server cannot be reached,
// every backend on the shared informers stops being ready, each by itself
// (idle backends send no request of their own), and is ready again once
// it can.
func TestSharedInformersReachability(t *testing.T) {
	ns := cluster.NewNamespace(t)
	for _, name := range []string{"web1", "web2"} {
		newVM(t, ns, name, nil)
	}
	apiHost, err := url(cluster.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	const timeout, probe = 500 * time.Millisecond, 200 * time.Millisecond
	tests := []struct {
		name  string
		fail  func(p *proxy)
		after func(t *testing.T, p *proxy)
	}{
		{"refused", (*proxy).cut, func(t *testing.T, p *proxy) { p.restore(t) }},
		{"blackholed", (*proxy).blackhole, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newProxy(t, apiHost)
			cfg := rest.CopyConfig(cluster.Config)
			cfg.Host = "https://" + p.addr
			informers := startInformers(t, cfg, ns, kubevirt.InformersOptions{RequestTimeout: timeout, ProbeInterval: probe})
			var backends []*kubevirt.Backend
			for _, name := range []string{"web1", "web2"} {
				b := kubevirttest.StartBackend(t, cfg, ns, name, kubevirt.Options{Informers: informers, RequestTimeout: timeout})
				poll.True(t, name+" ready", func() bool { return b.Ready() == nil })
				backends = append(backends, b)
			}
			tc.fail(p)
			for _, b := range backends {
				poll.True(t, "not ready", func() bool { return errors.Is(b.Ready(), machine.ErrUnavailable) })
			}
			if tc.after == nil {
				return
			}
			tc.after(t, p)
			for _, b := range backends {
				poll.True(t, "ready again", func() bool { return b.Ready() == nil })
			}
		})
	}
}
