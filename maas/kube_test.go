package maas_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/internal/kubetest"
	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

// env is the package's one API server.
var env *kubetest.Env

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	ctrllog.SetLogger(logr.Discard()) // controller-runtime's client logs through the global logger
	// A fuzzing run (and each of its worker processes) runs only the fuzz
	// target, which needs no API server: starting one per worker would
	// leave the fuzzer waiting on them.
	flag.Parse()
	if fuzz := flag.Lookup("test.fuzz"); fuzz != nil && fuzz.Value.String() != "" {
		return m.Run()
	}
	var err error
	env, err = kubetest.Start(kubetest.Options{WithoutCDI: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "envtest:", err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	return m.Run()
}

var namespaces atomic.Int64

// newNamespace creates a fresh namespace (envtest cannot delete them).
func newNamespace(t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("maas-%d", namespaces.Add(1))}}
	if err := env.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}

// requestCounter counts the requests a rest.Config's clients send.
type requestCounter struct {
	mu       sync.Mutex
	requests []string
}

func (c *requestCounter) config(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 1000, 1000
	cfg.Wrap(func(next http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			c.mu.Lock()
			c.requests = append(c.requests, req.Method+" "+req.URL.Path)
			c.mu.Unlock()
			return next.RoundTrip(req)
		})
	})
	return cfg
}

func (c *requestCounter) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.requests
	c.requests = nil
	return out
}

// kubeCluster is a KubeCluster as cmd/reconciler builds it, on cfg.
func kubeCluster(t testing.TB, cfg *rest.Config) maas.KubeCluster {
	t.Helper()
	k, err := maas.NewKubeCluster(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// enrollment is what the controller creates for an enrolled VM.
type enrollment struct {
	vm              maas.VMRef
	password        string // "" for no Secret
	unlabelled      bool   // the Secret lacks the managed-by label
	noVM, noBMC     bool
	secretName      string // spec.credentialsSecret
	withoutSpecMACs bool
}

func (e enrollment) create(t testing.TB, c client.Client) {
	t.Helper()
	ctx := context.Background()
	if !e.noVM {
		vm := &kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: e.vm.Namespace, Name: e.vm.Name},
			Spec: kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				Spec: kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{
					Firmware: &kubevirtv1.Firmware{UUID: types.UID(strings.ToUpper(uuidOf(e.vm))), Serial: e.vm.Name + "." + e.vm.Namespace},
					Chassis:  &kubevirtv1.Chassis{Asset: proofOf(e.vm)},
					Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{{
						Name: "default", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}},
					}}},
				}},
			}},
		}
		if !e.withoutSpecMACs {
			vm.Spec.Template.Spec.Domain.Devices.Interfaces[0].MacAddress = strings.ToUpper(macOf(e.vm))
		}
		if err := c.Create(ctx, vm); err != nil {
			t.Fatalf("creating VM: %v", err)
		}
	}
	secretName := v1beta1.CredentialsSecretName(e.vm.Name)
	if e.secretName != "" {
		secretName = e.secretName
	}
	if e.password != "" {
		labels := map[string]string{v1beta1.LabelManagedBy: v1beta1.ManagedByValue, v1beta1.LabelVM: e.vm.Name}
		if e.unlabelled {
			labels = nil
		}
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: e.vm.Namespace, Name: secretName, Labels: labels},
			Data:       map[string][]byte{v1beta1.SecretUsernameKey: []byte("admin"), v1beta1.SecretPasswordKey: []byte(e.password)},
		}
		if err := c.Create(ctx, secret); err != nil {
			t.Fatalf("creating Secret: %v", err)
		}
	}
	if !e.noBMC {
		bmc := &v1beta1.VirtualMachineBMC{
			ObjectMeta: metav1.ObjectMeta{Namespace: e.vm.Namespace, Name: e.vm.Name},
			Spec:       v1beta1.VirtualMachineBMCSpec{VMName: e.vm.Name, CredentialsSecret: e.secretName},
		}
		if err := c.Create(ctx, bmc); err != nil {
			t.Fatalf("creating VirtualMachineBMC: %v", err)
		}
	}
}

func getBMC(t testing.TB, vm maas.VMRef) *v1beta1.VirtualMachineBMC {
	t.Helper()
	var bmc v1beta1.VirtualMachineBMC
	if err := env.Client.Get(context.Background(), types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name}, &bmc); err != nil {
		t.Fatal(err)
	}
	return &bmc
}

func TestKubeClusterEnrolled(t *testing.T) {
	ns := newNamespace(t)
	ref := func(name string) maas.VMRef { return maas.VMRef{Namespace: ns, Name: name} }
	for _, e := range []enrollment{
		{vm: ref("full"), password: "pw"},
		{vm: ref("web.prod"), password: "pw"},
		{vm: ref("unlabelled"), password: "pw", unlabelled: true},
		{vm: ref("custom"), password: "pw", secretName: "my-credentials"},
		{vm: ref("no-secret")},
		{vm: ref("no-vm"), password: "pw", noVM: true},
		{vm: ref("no-mac"), password: "pw", withoutSpecMACs: true},
		{vm: ref("not-enrolled"), password: "pw", noBMC: true},
	} {
		e.create(t, env.Client)
	}
	var counter requestCounter
	k := kubeCluster(t, counter.config(env.Config))
	enrolled, err := k.Enrolled(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := counter.take(); len(got) != 3 {
		t.Errorf("Enrolled sent %d requests, want 3 lists: %q", len(got), got)
	}
	tests := []struct {
		name         string
		wantPassword string
		wantErr      error
		wantVM       bool
		wantMACs     []string
	}{
		{"full", "pw", nil, true, []string{macOf(ref("full"))}},
		{"web.prod", "pw", nil, true, []string{macOf(ref("web.prod"))}},
		{"unlabelled", "", maas.ErrNotFound, true, []string{macOf(ref("unlabelled"))}},
		{"custom", "pw", nil, true, []string{macOf(ref("custom"))}},
		{"no-secret", "", maas.ErrNotFound, true, []string{macOf(ref("no-secret"))}},
		{"no-vm", "pw", nil, false, nil},
		{"no-mac", "pw", nil, true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, ok := enrolled[ref(tt.name)]
			if !ok {
				t.Fatal("not listed")
			}
			if e.Credentials.Password != tt.wantPassword || !errors.Is(e.CredentialsErr, tt.wantErr) || (tt.wantErr == nil) != (e.CredentialsErr == nil) {
				t.Errorf("credentials %+v, %v", e.Credentials, e.CredentialsErr)
			}
			if e.VMFound != tt.wantVM || !slices.Equal(e.MACs, tt.wantMACs) {
				t.Errorf("found %v, MACs %v; want %v, %v", e.VMFound, e.MACs, tt.wantVM, tt.wantMACs)
			}
			if tt.wantVM && e.FirmwareUUID != uuidOf(ref(tt.name)) {
				t.Errorf("firmware UUID %q, want %q", e.FirmwareUUID, uuidOf(ref(tt.name)))
			}
			if e.BMCUID == "" {
				t.Error("no VirtualMachineBMC UID")
			}
		})
	}
	if _, ok := enrolled[ref("not-enrolled")]; ok {
		t.Error("a VM without VirtualMachineBMC is listed as enrolled")
	}
}

// sharedSecret creates namespace's shared Secret as the controller's shared
// workload mode writes it: an entry a VM, named after the VM.
func sharedSecret(t testing.TB, namespace string, entries map[string]string) {
	t.Helper()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: bmcspec.SharedSecret, Labels: map[string]string{
			v1beta1.LabelManagedBy: v1beta1.ManagedByValue, v1beta1.LabelShared: "true",
		}},
		Data: map[string][]byte{},
	}
	for vm, entry := range entries {
		secret.Data[vm] = []byte(entry)
	}
	if err := env.Client.Create(context.Background(), secret); err != nil {
		t.Fatalf("creating the shared Secret: %v", err)
	}
}

// entryOf is vm's entry of the shared Secret, user "bmc-<vm>".
func entryOf(t testing.TB, vm maas.VMRef, password string) string {
	t.Helper()
	entry, err := json.Marshal(bmcspec.SharedVM{Username: "bmc-" + vm.Name, Password: password,
		Hosts: []string{maas.BMCHost(vm, testDomain)}, StateSecret: bmcspec.SharedStateSecret})
	if err != nil {
		t.Fatal(err)
	}
	return string(entry)
}

// TestKubeClusterSharedCredentials: a VM without a credentials Secret of its
// own has its entry of its namespace's shared Secret as its credentials, and
// only that namespace's.
func TestKubeClusterSharedCredentials(t *testing.T) {
	nsA, nsB := newNamespace(t), newNamespace(t)
	a := func(name string) maas.VMRef { return maas.VMRef{Namespace: nsA, Name: name} }
	b := func(name string) maas.VMRef { return maas.VMRef{Namespace: nsB, Name: name} }
	for _, e := range []enrollment{
		{vm: a("entry-only")},
		{vm: a("own-secret"), password: "own-pw"},
		{vm: a("user-named"), secretName: "my-credentials"}, // which does not exist
		{vm: a("not-json")},
		{vm: a("wrong-shape")},
		{vm: a("no-password")},
		{vm: a("no-entry")},
		{vm: a("other-tenant")},
		{vm: a("twin")},
		{vm: b("twin")},
	} {
		e.create(t, env.Client)
	}
	sharedSecret(t, nsA, map[string]string{
		"entry-only":  entryOf(t, a("entry-only"), "entry-pw"),
		"own-secret":  entryOf(t, a("own-secret"), "entry-pw"),
		"user-named":  entryOf(t, a("user-named"), "entry-pw"),
		"not-json":    `{"username":"bmc-not-json","password":"s3cret"`,
		"wrong-shape": `{"username":"bmc-wrong-shape","password":"s3cret","hosts":"not a list"}`,
		"no-password": `{"username":"bmc-no-password"}`,
		"twin":        entryOf(t, a("twin"), "pw-a"),
	})
	sharedSecret(t, nsB, map[string]string{
		"other-tenant": entryOf(t, b("other-tenant"), "pw-b"),
		"twin":         entryOf(t, b("twin"), "pw-b"),
	})
	var counter requestCounter
	enrolled, err := kubeCluster(t, counter.config(env.Config)).Enrolled(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := counter.take(); len(got) != 3 {
		t.Errorf("Enrolled sent %d requests, want 3 lists: %q", len(got), got)
	}
	sharedA := nsA + "/" + bmcspec.SharedSecret
	tests := []struct {
		name         string
		vm           maas.VMRef
		wantUser     string
		wantPassword string
		wantErr      error
		wantInErr    []string // where the error says it looked
	}{
		{"entry used when no own Secret", a("entry-only"), "bmc-entry-only", "entry-pw", nil, nil},
		{"own Secret wins", a("own-secret"), "admin", "own-pw", nil, nil},
		{"user-named Secret never falls back", a("user-named"), "", "", maas.ErrNotFound, []string{nsA + "/my-credentials"}},
		{"entry not JSON", a("not-json"), "", "", maas.ErrInvalidArgument, []string{`"not-json"`, sharedA}},
		{"entry of the wrong shape", a("wrong-shape"), "", "", maas.ErrInvalidArgument, []string{`"wrong-shape"`, sharedA}},
		{"entry without password", a("no-password"), "", "", maas.ErrInvalidArgument, []string{`"no-password"`, sharedA}},
		{"no entry", a("no-entry"), "", "", maas.ErrNotFound, []string{nsA + "/no-entry-bmc", `"no-entry"`, sharedA}},
		{"another namespace's entry not used", a("other-tenant"), "", "", maas.ErrNotFound, []string{`"other-tenant"`, sharedA}},
		{"same name in A", a("twin"), "bmc-twin", "pw-a", nil, nil},
		{"same name in B", b("twin"), "bmc-twin", "pw-b", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, ok := enrolled[tt.vm]
			if !ok {
				t.Fatal("not listed")
			}
			if e.Credentials != (maas.Credentials{Username: tt.wantUser, Password: tt.wantPassword}) {
				t.Errorf("credentials %+v, want %s/%s", e.Credentials, tt.wantUser, tt.wantPassword)
			}
			if !errors.Is(e.CredentialsErr, tt.wantErr) || (tt.wantErr == nil) != (e.CredentialsErr == nil) {
				t.Fatalf("error %v, want %v", e.CredentialsErr, tt.wantErr)
			}
			for _, want := range tt.wantInErr {
				if !strings.Contains(e.CredentialsErr.Error(), want) {
					t.Errorf("error %q does not name %s", e.CredentialsErr, want)
				}
			}
			if e.CredentialsErr != nil && strings.Contains(e.CredentialsErr.Error(), "s3cret") {
				t.Errorf("error %q quotes a password", e.CredentialsErr)
			}
		})
	}
}

// TestSharedEntryCredentialsReachMaaS: a VM whose credentials are only its
// shared entry gets them into MaaS as a VM with its own Secret does, with
// the deployed ClusterRole.
func TestSharedEntryCredentialsReachMaaS(t *testing.T) {
	ns := newNamespace(t)
	own, shared := maas.VMRef{Namespace: ns, Name: "own"}, maas.VMRef{Namespace: ns, Name: "shared"}
	enrollment{vm: own, password: "own-pw"}.create(t, env.Client)
	enrollment{vm: shared}.create(t, env.Client)
	sharedSecret(t, ns, map[string]string{shared.Name: entryOf(t, shared, "entry-pw")})
	cfg := userWith(t, "maas-reconciler-shared-entry", reconcilerRole(t).Rules, nil)
	s := maassim.New(t).WithMachine(ours("m-own", own, maassim.StatusNew)).WithMachine(ours("m-shared", shared, maassim.StatusNew))
	r := newReconciler(t, s, kubeCluster(t, cfg))
	if result := reconcile(t, r); len(failuresIn(result, ns)) != 0 || result.Bound != 2 {
		t.Fatalf("cycle: %+v", result)
	}
	for _, tt := range []struct {
		systemID, user, password string
	}{
		{"m-own", "admin", "own-pw"},
		{"m-shared", "bmc-shared", "entry-pw"},
	} {
		t.Run(tt.systemID, func(t *testing.T) {
			m, _ := s.Machine(tt.systemID)
			if m.PowerType != maas.PowerTypeRedfish || m.PowerParameters[maas.PowerUser] != tt.user || m.PowerParameters[maas.PowerPass] != tt.password {
				t.Errorf("power %s %v, want redfish with %s/%s", m.PowerType, m.PowerParameters, tt.user, tt.password)
			}
			if m.Status != maassim.StatusCommissioning {
				t.Errorf("status %d, want commissioning", m.Status)
			}
		})
	}
}

func TestKubeClusterInstanceMACs(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	// The VMI CRD has no status subresource: the status is created with it.
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm-0"}}
	vmi.Status.Interfaces = []kubevirtv1.VirtualMachineInstanceNetworkInterface{{Name: "default", MAC: "02:AA:BB:CC:DD:EE"}, {Name: "bad", MAC: "nonsense"}}
	if err := env.Client.Create(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	macs, err := kubeCluster(t, env.Config).InstanceMACs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := macs[maas.VMRef{Namespace: ns, Name: "vm-0"}]; !slices.Equal(got, []string{"02:aa:bb:cc:dd:ee"}) {
		t.Errorf("MACs = %v", got)
	}
}

// TestStatusIsAppliedBesideTheController: the reconciler's status write
// keeps the controller's conditions and fields, owns only status.maas and
// the MaaSMachine condition, and puts back a value someone removed.
func TestStatusIsAppliedBesideTheController(t *testing.T) {
	ns := newNamespace(t)
	vm := maas.VMRef{Namespace: ns, Name: "vm-0"}
	enrollment{vm: vm, password: "pw"}.create(t, env.Client)
	ctx := context.Background()
	controllerStatus := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1beta1.GroupVersion.String(), "kind": "VirtualMachineBMC",
		"metadata": map[string]any{"namespace": ns, "name": vm.Name},
		"status": map[string]any{
			"redfishURL": "https://vm-0.example/redfish/v1",
			"conditions": []any{map[string]any{"type": "Ready", "status": "True", "reason": "Available", "message": "ok", "lastTransitionTime": "2026-01-01T00:00:00Z"}},
		},
	}}
	if err := env.Client.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(controllerStatus), client.FieldOwner("virtmetal-controller")); err != nil {
		t.Fatal(err)
	}

	s := maassim.New(t).WithMachine(ours("m1", vm, maassim.StatusReady))
	var counter requestCounter
	r := newReconciler(t, s, kubeCluster(t, counter.config(env.Config)))
	reconcile(t, r)

	bmc := getBMC(t, vm)
	if bmc.Status.RedfishURL == "" || meta.FindStatusCondition(bmc.Status.Conditions, "Ready") == nil {
		t.Fatalf("the controller's status was lost: %+v", bmc.Status)
	}
	got := bmc.Status.MaaS
	if got == nil || got.SystemID != "m1" || got.StatusName != "Ready" || got.Hostname != maas.Hostname(vm) || got.Pool != ns || got.LastUpdateTime == nil {
		t.Fatalf("status.maas = %+v", got)
	}
	c := meta.FindStatusCondition(bmc.Status.Conditions, v1beta1.ConditionMaaSMachine)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != maas.ReasonBound {
		t.Fatalf("MaaSMachine condition = %+v", c)
	}
	for _, f := range bmc.ManagedFields {
		if f.Manager != maas.FieldManager {
			continue
		}
		owned := string(f.FieldsV1.Raw)
		if f.Subresource != "status" || strings.Contains(owned, "Ready") || strings.Contains(owned, "redfishURL") || !strings.Contains(owned, `"f:maas"`) {
			t.Errorf("reconciler owns %s of %s", owned, f.Subresource)
		}
	}
	var events corev1.EventList
	if err := env.Client.List(ctx, &events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(events.Items) != 1 || events.Items[0].Reason != "MaaSMachineBound" || events.Items[0].InvolvedObject.UID != bmc.UID {
		t.Errorf("events = %+v", events.Items)
	}

	// Converged: a cycle reads three lists and writes nothing.
	counter.take()
	reconcile(t, r)
	if got := counter.take(); len(got) != 3 {
		t.Errorf("idle cycle sent %d Kubernetes requests, want 3: %q", len(got), got)
	}

	// Someone removes the hostname: the next cycle puts it back.
	patch := []byte(`{"status":{"maas":{"hostname":null}}}`)
	if err := env.Client.Status().Patch(ctx, getBMC(t, vm), client.RawPatch(types.MergePatchType, patch), client.FieldOwner("kubectl-edit")); err != nil {
		t.Fatal(err)
	}
	if getBMC(t, vm).Status.MaaS.Hostname != "" {
		t.Fatal("hostname not removed")
	}
	reconcile(t, r)
	if got := getBMC(t, vm).Status.MaaS; got.Hostname != maas.Hostname(vm) {
		t.Errorf("removed hostname not put back: %+v", got)
	}
	if c := meta.FindStatusCondition(getBMC(t, vm).Status.Conditions, "Ready"); c == nil {
		t.Error("the controller's Ready condition was lost")
	}

	// The machine leaves MaaS: the maas block goes, the condition says so.
	s2 := maassim.New(t)
	r.MaaS = s2.Client(t)
	reconcile(t, r)
	bmc = getBMC(t, vm)
	if bmc.Status.MaaS != nil && bmc.Status.MaaS.SystemID != "" {
		t.Errorf("status.maas kept a machine MaaS no longer has: %+v", bmc.Status.MaaS)
	}
	if c := meta.FindStatusCondition(bmc.Status.Conditions, v1beta1.ConditionMaaSMachine); c == nil || c.Reason != maas.ReasonNoMachine {
		t.Errorf("MaaSMachine condition = %+v", c)
	}
}

// failuresIn are a cycle's failures in one namespace: the API server is
// shared, so a cycle sees the other tests' VirtualMachineBMCs too.
func failuresIn(result maas.CycleResult, namespace string) []maas.MachineFailure {
	var out []maas.MachineFailure
	for _, f := range result.Failures {
		if f.VM.Namespace == namespace {
			out = append(out, f)
		}
	}
	return out
}

// reconcilerRole is the ClusterRole of deploy/reconciler.
func reconcilerRole(t testing.TB) rbacv1.ClusterRole {
	t.Helper()
	data, err := os.ReadFile("../deploy/reconciler/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for doc := range strings.SplitSeq(string(data), "\n---\n") {
		var role rbacv1.ClusterRole
		if err := yaml.Unmarshal([]byte(doc), &role); err == nil && role.Kind == "ClusterRole" {
			return role
		}
	}
	t.Fatal("no ClusterRole in deploy/reconciler/rbac.yaml")
	return rbacv1.ClusterRole{}
}

// userWith creates a user with the rules bound cluster-wide, and with
// namespaceRules bound in each of namespaces only.
func userWith(t testing.TB, name string, rules []rbacv1.PolicyRule, namespaceRules []rbacv1.PolicyRule, namespaces ...string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	subject := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}}
	create := func(obj client.Object) {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	create(&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules})
	create(&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, Subjects: subject,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}})
	if len(namespaceRules) > 0 {
		create(&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name + "-ns"}, Rules: namespaceRules})
		for _, ns := range namespaces {
			create(&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Subjects: subject,
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name + "-ns"}})
		}
	}
	cfg, err := env.ConfigFor(name)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestReconcilerWithItsOwnRole runs a cycle as a user with exactly the
// deployed ClusterRole: a VM with no MAC in its spec (so instances are
// listed too) converges, its status and Event are written.
func TestReconcilerWithItsOwnRole(t *testing.T) {
	ns := newNamespace(t)
	vm := maas.VMRef{Namespace: ns, Name: "vm-0"}
	enrollment{vm: vm, password: "pw", withoutSpecMACs: true}.create(t, env.Client)
	ctx := context.Background()
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: vm.Name}}
	vmi.Status.Interfaces = []kubevirtv1.VirtualMachineInstanceNetworkInterface{{Name: "default", MAC: macOf(vm)}}
	if err := env.Client.Create(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	cfg := userWith(t, "maas-reconciler-own-role", reconcilerRole(t).Rules, nil)
	s := maassim.New(t).WithMachine(ours("m1", vm, maassim.StatusNew))
	r := newReconciler(t, s, kubeCluster(t, cfg))
	if result := reconcile(t, r); len(failuresIn(result, ns)) != 0 || result.Bound != 1 {
		t.Fatalf("cycle: %+v", result)
	}
	if m, _ := s.Machine("m1"); m.Status != maassim.StatusCommissioning || m.PowerParameters[maas.PowerPass] != "pw" {
		t.Errorf("machine = %+v", m)
	}
	if got := getBMC(t, vm).Status.MaaS; got == nil || got.StatusName != "Commissioning" {
		t.Errorf("status.maas = %+v", got)
	}
	var events corev1.EventList
	if err := env.Client.List(ctx, &events, client.InNamespace(ns)); err != nil || len(events.Items) != 1 {
		t.Errorf("events = %+v, %v", events.Items, err)
	}
}

// TestForbiddenNamespaceStaysLocal: the reconciler may read everywhere but
// write status and Events only in namespace A; B's machine still converges
// in MaaS, B's failure is reported, and the cycle as a whole succeeds.
func TestForbiddenNamespaceStaysLocal(t *testing.T) {
	nsA, nsB := newNamespace(t), newNamespace(t)
	a, b := maas.VMRef{Namespace: nsA, Name: "vm-0"}, maas.VMRef{Namespace: nsB, Name: "vm-0"}
	enrollment{vm: a, password: "pa"}.create(t, env.Client)
	enrollment{vm: b, password: "pb"}.create(t, env.Client)
	var reads, writes []rbacv1.PolicyRule
	for _, rule := range reconcilerRole(t).Rules {
		if slices.Contains(rule.Verbs, "list") {
			reads = append(reads, rule)
		} else {
			writes = append(writes, rule)
		}
	}
	cfg := userWith(t, "maas-reconciler-only-a", reads, writes, nsA)
	s := maassim.New(t).WithMachine(ours("m-a", a, maassim.StatusNew)).WithMachine(ours("m-b", b, maassim.StatusNew))
	r := newReconciler(t, s, kubeCluster(t, cfg))

	result := reconcile(t, r)
	if got := failuresIn(result, nsA); len(got) != 0 {
		t.Errorf("A failed: %v", got)
	}
	// B's binding cannot be recorded, so B's machine is not commissioned
	// (that would replace the output that proves it).
	if got := failuresIn(result, nsB); len(got) != 2 || !errors.Is(got[0], maas.ErrForbidden) || !errors.Is(got[1], maas.ErrForbidden) {
		t.Fatalf("B's failures = %v, want its status writes, Forbidden", got)
	}
	if m, _ := s.Machine("m-a"); m.Status != maassim.StatusCommissioning {
		t.Errorf("m-a status = %d, want commissioned", m.Status)
	}
	if m, _ := s.Machine("m-b"); m.Status != maassim.StatusNew {
		t.Errorf("m-b status = %d, want New", m.Status)
	}
	if got := getBMC(t, a).Status.MaaS; got == nil || got.SystemID != "m-a" {
		t.Errorf("A's status.maas = %+v", got)
	}
}
