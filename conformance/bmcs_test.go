package conformance_test

import (
	"context"
	"io"
	stdlog "log"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/egress"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

// bmc is a Redfish BMC over TLS on one backend, with the one machine the
// tests and benchmarks drive, and a way to change that machine's state
// behind the BMC's back (as KubeVirt or another client would).
type bmc struct {
	ts        *httptest.Server
	namespace string // the VM's, on the KubeVirt backend
	system    string // the ComputerSystem's path
	machine   string // the machine's ID
	nic       string // the name of its network interface
	// changeOutside changes something a GET of the system shows without
	// going through Redfish.
	changeOutside func(t testing.TB)
}

// backends names the backends every side-by-side figure covers.
var backends = []string{"memory", "kubevirt"}

func startBMC(t testing.TB, backend string) bmc {
	t.Helper()
	switch backend {
	case "memory":
		return startMemoryBMC(t)
	default:
		return startKubeVirtBMC(t, cluster.Config)
	}
}

func startMemoryBMC(t testing.TB) bmc {
	t.Helper()
	backend := memory.New(memory.Options{})
	ts := serveBMC(t, backend)
	return bmc{ts: ts, system: "/redfish/v1/Systems/vm-0", machine: "vm-0", nic: "default", changeOutside: func(t testing.TB) {
		t.Helper()
		m := backend.Get("vm-0")
		reset := machine.ResetOn
		if state, _ := m.PowerState(context.Background()); state == machine.PowerOn {
			reset = machine.ResetForceOff
		}
		if err := m.Reset(context.Background(), reset); err != nil {
			t.Fatal(err)
		}
	}}
}

// startKubeVirtBMC serves a new VM through a backend that reaches the API
// server with cfg.
func startKubeVirtBMC(t testing.TB, cfg *rest.Config) bmc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ns, name := cluster.NewNamespace(t), "bmc"
	halted := kubevirtv1.RunStrategyHalted
	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &halted,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{
					Memory:   &kubevirtv1.Memory{Guest: ptr.To(resource.MustParse("1Gi"))},
					Firmware: &kubevirtv1.Firmware{UUID: "8d1f3c52-4a6b-4e0f-9b7a-2c5d8e1f0a34", Serial: name + "." + ns, Bootloader: &kubevirtv1.Bootloader{EFI: &kubevirtv1.EFI{SecureBoot: ptr.To(false)}}},
					Devices: kubevirtv1.Devices{
						Disks: []kubevirtv1.Disk{{Name: "root", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}}},
						Interfaces: []kubevirtv1.Interface{{
							Name: "pxe", MacAddress: "02:00:00:00:02:01",
							InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}},
						}},
					},
				},
				Networks: []kubevirtv1.Network{{Name: "pxe", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
				Volumes:  []kubevirtv1.Volume{{Name: "root", VolumeSource: kubevirtv1.VolumeSource{ContainerDisk: &kubevirtv1.ContainerDiskSource{Image: "registry.test/disk:1"}}}},
			}},
		},
	}
	if err := cluster.Client.Create(ctx, vm); err != nil {
		t.Fatalf("creating VM: %v", err)
	}
	backend := kubevirttest.StartBackend(t, cfg, ns, name, kubevirt.Options{})
	ts := serveBMC(t, backend)
	return bmc{ts: ts, namespace: ns, system: "/redfish/v1/Systems/" + name, machine: name, nic: "pxe", changeOutside: func(t testing.TB) {
		t.Helper()
		// Another writer renames the VM's serial number.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, vm); err != nil {
				return err
			}
			vm.Spec.Template.Spec.Domain.Firmware.Serial += "x"
			return cluster.Client.Update(ctx, vm)
		})
		if err != nil {
			t.Fatal(err)
		}
	}}
}

func serveBMC(t testing.TB, backend machine.Backend) *httptest.Server {
	t.Helper()
	return serveBMCWith(t, backend, nil)
}

// testImageHosts resolves the tests' image host names to a documentation
// address, asking no DNS server.
var testImageHosts = egress.FixedResolver{netip.MustParseAddr("192.0.2.80")}

// serveBMCWith is serveBMC with edit applied to the configuration.
func serveBMCWith(t testing.TB, backend machine.Backend, edit func(*redfish.Config)) *httptest.Server {
	t.Helper()
	return serveBMCThrough(t, backend, edit, nil)
}

// serveBMCThrough is serveBMCWith with the server's handler wrapped by
// wrap, when not nil (a recorder of the requests, say).
func serveBMCThrough(t testing.TB, backend machine.Backend, edit func(*redfish.Config), wrap func(http.Handler) http.Handler) *httptest.Server {
	t.Helper()
	cfg := redfish.Config{
		Backend:  backend,
		Accounts: []redfish.Account{{Username: maasUser, Password: maasPass, Role: redfish.RoleAdministrator}},
		Logger:   logr.Discard(),
		// The flows' images are on loopback or named images.test, which
		// resolves here without asking DNS; nothing fetches them.
		EventDestinationsAllowLoopback: true,
		DestinationResolver:            testImageHosts,
	}
	if edit != nil {
		edit(&cfg)
	}
	server, err := redfish.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = server.Run(ctx) }()
	var handler http.Handler = server
	if wrap != nil {
		handler = wrap(server)
	}
	ts := quietTLSServer(t, handler)
	t.Cleanup(server.StopEventStreams) // before ts.Close, which waits for them
	return ts
}

// quietTLSServer serves h over TLS without logging failed handshakes: the
// benchmarks' clients drop connections at the end of each run, and a line
// per dropped handshake would print over their figures.
func quietTLSServer(t testing.TB, h http.Handler) *httptest.Server {
	ts := httptest.NewUnstartedServer(h)
	ts.Config.ErrorLog = stdlog.New(io.Discard, "", 0)
	ts.StartTLS()
	t.Cleanup(ts.Close)
	return ts
}

// rawGet is a GET as a poller sends it; it returns the bytes as served.
func rawGet(t testing.TB, ts *httptest.Server, path, ifNoneMatch string) (status int, etag string, body []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, ts.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth(maasUser, maasPass)
	if ifNoneMatch != "" {
		req.Header.Set("If-None-Match", ifNoneMatch)
	}
	res, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err = io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, res.Header.Get("ETag"), body
}
