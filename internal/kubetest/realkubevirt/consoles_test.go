package realkubevirt_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/gorilla/websocket"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/deploy/bmc"
	"github.com/virtmetal/virtmetal/internal/kubetest/realkubevirt"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
	"github.com/virtmetal/virtmetal/machine/machinetest"
	"github.com/virtmetal/virtmetal/sim/console"
)

// createRBAC creates the per-VM RBAC deploy/bmc renders, after edit.
func createRBAC(t testing.TB, namespace, vm string, edit func(role *unstructured.Unstructured)) {
	t.Helper()
	objs, err := bmc.RBACObjects(bmc.RBACParams{Namespace: namespace, VMName: vm})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "Role" && edit != nil {
			edit(o)
		}
		if err := cluster.Client.Create(context.Background(), o); err != nil {
			t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

// tokenConfig authenticates as the BMC's ServiceAccount with a token of
// it, as a bmc-server pod does.
func tokenConfig(t testing.TB, namespace, account string) *rest.Config {
	t.Helper()
	tr, err := cluster.Kube.CoreV1().ServiceAccounts(namespace).CreateToken(context.Background(), account, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s: %v", account, err)
	}
	admin := rest.CopyConfig(cluster.Config)
	return &rest.Config{Host: admin.Host, TLSClientConfig: rest.TLSClientConfig{CAData: admin.CAData}, BearerToken: tr.Status.Token, QPS: 100, Burst: 200}
}

// bmcConsoleMachine runs the backend for vm as its BMC's ServiceAccount,
// with a token, holding the per-VM Role.
func bmcConsoleMachine(t testing.TB, namespace, vm string) (machine.Machine, *rest.Config) {
	t.Helper()
	createRBAC(t, namespace, vm, nil)
	cfg := tokenConfig(t, namespace, "bmc-"+vm)
	b := kubevirttest.StartBackend(t, cfg, namespace, vm, kubevirt.Options{Logger: logr.Discard()})
	m, err := b.Machine(context.Background(), vm)
	if err != nil {
		t.Fatalf("Machine: %v", err)
	}
	return m, cfg
}

// openSerial opens the serial console and reads up to the login prompt;
// the stream is closed when owner (t or a test above it) ends.
func openSerial(t, owner testing.TB, m machine.Machine) (io.ReadWriteCloser, *machinetest.ConsoleOutput) {
	t.Helper()
	stream, err := m.OpenConsole(context.Background(), machine.ConsoleSerial)
	if err != nil {
		t.Fatalf("OpenConsole(Serial): %v", err)
	}
	owner.Cleanup(func() { stream.Close() })
	out := machinetest.ReadConsole(stream)
	out.Until(t, console.Prompt(m.ID()))
	return stream, out
}

// The BMC's consoles on KubeVirt's real virt-api, as its ServiceAccount
// with a token and the per-VM Role: the serial console prints the boot and
// echoes; the screen speaks RFB; a newer stream ends the older one; a
// reboot, a guest power-off and a stop end the streams, and the next boot
// has a console again; another VM's console is refused.
func TestConsolesOnRealKubeVirt(t *testing.T) {
	ctx := context.Background()
	ns, key := newHaltedVM(t)
	m, cfg := bmcConsoleMachine(t, ns, "vm")
	if err := cluster.Client.Create(ctx, newVM(ns, "other", kubevirtv1.RunStrategyAlways)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.OpenConsole(ctx, machine.ConsoleSerial); !errors.Is(err, machine.ErrConflict) {
		t.Fatalf("OpenConsole of a stopped VM = %v, want ErrConflict", err)
	}
	if err := m.Reset(ctx, machine.ResetOn); err != nil {
		t.Fatal(err)
	}
	waitPower(t, m, key, machine.PowerOn)

	serial, out := openSerial(t, t, m)
	if _, err := io.WriteString(serial, "root\r"); err != nil {
		t.Fatalf("typing: %v", err)
	}
	out.Until(t, "root\r\n"+console.Prompt("vm"))

	screen, err := m.OpenConsole(ctx, machine.ConsoleGraphical)
	if err != nil {
		t.Fatalf("OpenConsole(Graphical): %v", err)
	}
	t.Cleanup(func() { screen.Close() })
	rfb, err := console.Handshake(screen)
	if err != nil || rfb.Name != "vm" {
		t.Fatalf("RFB handshake over vnc: %+v, %v", rfb, err)
	}

	parent := t
	t.Run("another VM's console is refused", func(t *testing.T) {
		eventually(t, "the other VM running", func() (bool, error) {
			vmi := &kubevirtv1.VirtualMachineInstance{}
			err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "other"}, vmi)
			return err == nil && vmi.Status.Phase == kubevirtv1.Running, err
		})
		for _, sub := range []string{"console", "vnc"} {
			conn, resp, err := realkubevirt.DialSubresource(cfg, ns, "other", sub)
			if err == nil {
				conn.Close()
				t.Fatalf("the BMC of vm opened the %s of another VM", sub)
			}
			if resp == nil || resp.StatusCode != http.StatusForbidden {
				t.Errorf("%s of another VM: %v (response %v), want 403", sub, err, resp)
			}
		}
	})

	t.Run("a newer stream ends the older", func(t *testing.T) {
		_, newer := openSerial(t, parent, m)
		out.End(t, "the older serial stream")
		out = newer
	})

	t.Run("a reboot ends the streams", func(t *testing.T) {
		screenOut := machinetest.ReadConsole(screen)
		if err := node.RebootGuest(ctx, ns, "vm"); err != nil {
			t.Fatal(err)
		}
		out.End(t, "serial across a reboot")
		screenOut.End(t, "vnc across a reboot")
		_, out = openSerial(t, parent, m)
	})

	t.Run("a stop ends the stream; a new start has a console", func(t *testing.T) {
		if err := m.Reset(ctx, machine.ResetForceOff); err != nil {
			t.Fatal(err)
		}
		out.End(t, "serial across a stop")
		waitPower(t, m, key, machine.PowerOff)
		for _, k := range machine.AllConsoleKinds {
			if _, err := m.OpenConsole(ctx, k); !errors.Is(err, machine.ErrConflict) {
				t.Errorf("OpenConsole(%s) once stopped = %v, want ErrConflict", k, err)
			}
		}
		if err := m.Reset(ctx, machine.ResetOn); err != nil {
			t.Fatal(err)
		}
		waitPower(t, m, key, machine.PowerOn)
		_, out = openSerial(t, parent, m)
	})

	t.Run("the guest powering off ends the stream", func(t *testing.T) {
		node.ShutdownGuest(ns, "vm")
		out.End(t, "serial across a guest power-off")
	})
}

// A VM whose devices leave a console out offers only the other; a Role
// without the console rule gets a Forbidden error that says so, no
// sentinel.
func TestConsoleRefusalsOnRealKubeVirt(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	vm := newVM(ns, "headless", kubevirtv1.RunStrategyAlways)
	vm.Spec.Template.Spec.Domain.Devices.AutoattachGraphicsDevice = ptr.To(false)
	if err := cluster.Client.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	m, _ := bmcConsoleMachine(t, ns, "headless")
	if got := m.Capabilities().Consoles; len(got) != 1 || got[0] != machine.ConsoleSerial {
		t.Errorf("consoles of a VM without a graphics device: %v, want [Serial]", got)
	}
	if _, err := m.OpenConsole(ctx, machine.ConsoleGraphical); !errors.Is(err, machine.ErrNotSupported) {
		t.Errorf("OpenConsole(Graphical) = %v, want ErrNotSupported", err)
	}

	if err := cluster.Client.Create(ctx, newVM(ns, "locked", kubevirtv1.RunStrategyAlways)); err != nil {
		t.Fatal(err)
	}
	createRBAC(t, ns, "locked", func(role *unstructured.Unstructured) {
		rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
		var kept []any
		for _, r := range rules {
			resources, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
			if !strings.Contains(strings.Join(resources, ","), "/console") {
				kept = append(kept, r)
			}
		}
		_ = unstructured.SetNestedSlice(role.Object, kept, "rules")
	})
	b := kubevirttest.StartBackend(t, tokenConfig(t, ns, "bmc-locked"), ns, "locked", kubevirt.Options{Logger: logr.Discard()})
	eventually(t, "the locked VM running", func() (bool, error) {
		st, err := mustMachine(t, b, "locked").PowerState(ctx)
		return st == machine.PowerOn, err
	})
	_, err := mustMachine(t, b, "locked").OpenConsole(ctx, machine.ConsoleSerial)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "virtualmachineinstances/console") {
		t.Errorf("OpenConsole without the console rule = %v, want a Forbidden error naming the subresource", err)
	}
	for _, sentinel := range []error{machine.ErrConflict, machine.ErrUnavailable, machine.ErrNotSupported, machine.ErrNotFound} {
		if errors.Is(err, sentinel) {
			t.Errorf("OpenConsole without the console rule = %v, which reads as %v", err, sentinel)
		}
	}
}

func mustMachine(t testing.TB, b *kubevirt.Backend, vm string) machine.Machine {
	t.Helper()
	m, err := b.Machine(context.Background(), vm)
	if err != nil {
		t.Fatalf("Machine: %v", err)
	}
	return m
}

// Without virt-api's aggregated API nothing can carry a console: the
// backend says ErrUnavailable.
func TestConsoleWithoutVirtAPI(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	if err := cluster.Client.Create(ctx, newVM(ns, "vm", kubevirtv1.RunStrategyAlways)); err != nil {
		t.Fatal(err)
	}
	m, _ := bmcConsoleMachine(t, ns, "vm")
	eventually(t, "the VM running", func() (bool, error) {
		st, err := m.PowerState(ctx)
		return st == machine.PowerOn, err
	})
	if err := cluster.UnregisterVirtAPI(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.RegisterVirtAPI(ctx); err != nil {
			t.Errorf("registering virt-api again: %v", err)
		}
	})
	if _, err := m.OpenConsole(ctx, machine.ConsoleSerial); !errors.Is(err, machine.ErrUnavailable) {
		t.Errorf("OpenConsole without virt-api = %v, want ErrUnavailable", err)
	}
}

// BenchmarkSerialConsole compares the serial console through the backend
// with a WebSocket of virt-api's subresource opened directly (as virtctl
// does), in one run: the latency of a typed byte's echo, and the
// throughput of 16 KiB lines typed and echoed back.
func BenchmarkSerialConsole(b *testing.B) {
	ctx := context.Background()
	ns, key := newHaltedVM(b)
	m, cfg := bmcConsoleMachine(b, ns, "vm")
	if err := m.Reset(ctx, machine.ResetOn); err != nil {
		b.Fatal(err)
	}
	eventually(b, "the VM running", func() (bool, error) {
		vmi := &kubevirtv1.VirtualMachineInstance{}
		err := cluster.Client.Get(ctx, key, vmi)
		return err == nil && vmi.Status.Phase == kubevirtv1.Running, err
	})
	streams := []struct {
		name string
		open func(b *testing.B) (io.ReadWriteCloser, error)
	}{
		{"backend", func(*testing.B) (io.ReadWriteCloser, error) {
			return m.OpenConsole(ctx, machine.ConsoleSerial)
		}},
		{"direct WebSocket", func(*testing.B) (io.ReadWriteCloser, error) {
			conn, _, err := realkubevirt.DialSubresource(cfg, ns, "vm", "console")
			if err != nil {
				return nil, err
			}
			return &rawSocket{conn: conn}, nil
		}},
	}
	for _, s := range streams {
		for _, size := range []int{1, 16 << 10} {
			b.Run(fmt.Sprintf("%s/%dB", s.name, size), func(b *testing.B) {
				stream, err := s.open(b)
				if err != nil {
					b.Fatal(err)
				}
				defer stream.Close()
				machinetest.BenchEcho(b, stream, "vm", size)
			})
		}
	}
}

// rawSocket is the least a client of the subresource does: a binary
// message per write, messages read as they come.
type rawSocket struct {
	conn *websocket.Conn
	r    io.Reader
}

func (s *rawSocket) Read(p []byte) (int, error) {
	for {
		if s.r == nil {
			_, r, err := s.conn.NextReader()
			if err != nil {
				return 0, err
			}
			s.r = r
		}
		n, err := s.r.Read(p)
		if err == io.EOF {
			s.r = nil
			if n == 0 {
				continue
			}
			err = nil
		}
		return n, err
	}
}

func (s *rawSocket) Write(p []byte) (int, error) {
	return len(p), s.conn.WriteMessage(websocket.BinaryMessage, p)
}

func (s *rawSocket) Close() error { return s.conn.Close() }

// A console nobody reads holds the typing back, all the way from
// sim/console's guest (its output held, MaxPending) through virt-api to the
// backend's Write, instead of anything in between buffering it; reading
// again lets the typing go on.
func TestUnreadConsoleHoldsTypingBack(t *testing.T) {
	ctx := context.Background()
	ns, key := newHaltedVM(t)
	m, _ := bmcConsoleMachine(t, ns, "vm")
	if err := m.Reset(ctx, machine.ResetOn); err != nil {
		t.Fatal(err)
	}
	waitPower(t, m, key, machine.PowerOn)
	stream, err := m.OpenConsole(ctx, machine.ConsoleSerial)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	const chunk, limit = 64 << 10, 256 << 20
	var typed atomic.Int64
	go func() {
		line := bytes.Repeat([]byte{'x'}, chunk)
		for typed.Load() < limit {
			if _, err := stream.Write(line); err != nil {
				return
			}
			typed.Add(chunk)
		}
	}()
	stalledAt := func() int64 {
		t.Helper()
		last, since := int64(-1), time.Now()
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if n := typed.Load(); n != last {
				last, since = n, time.Now()
			} else if time.Since(since) > 2*time.Second {
				return n
			}
		}
		t.Fatalf("the typing never stalled: %d bytes typed", typed.Load())
		return 0
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	held := stalledAt()
	runtime.GC()
	runtime.ReadMemStats(&after)
	// The guest holds 64 KiB, the sockets of the three hops each way (the
	// kernel's, up to some 10 MiB each) the rest: far less than limit.
	if held >= limit {
		t.Fatalf("%d bytes typed into a console nobody reads: nothing held them back", held)
	}
	// Of this process's memory, the backend's and the guest's side, a
	// few buffers.
	if grown := int64(after.HeapInuse) - int64(before.HeapInuse); grown > 8<<20 {
		t.Errorf("the heap grew by %d KiB while the typing was held back", grown>>10)
	}
	t.Logf("typing held back after %d KiB; heap in use %d KiB before, %d KiB after", held>>10, before.HeapInuse>>10, after.HeapInuse>>10)
	out := machinetest.ReadConsole(stream)
	poll := time.After(30 * time.Second)
	for typed.Load() < held+8*chunk {
		select {
		case <-out.Chunks:
		case err := <-out.Err:
			t.Fatalf("the console ended: %v", err)
		case <-poll:
			t.Fatalf("reading again did not let the typing go on (%d bytes typed, held at %d)", typed.Load(), held)
		}
	}
}
