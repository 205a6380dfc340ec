package controllers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/deploy/bmc"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/internal/poll"
)

const sharedName = "virtmetal-bmcs"

func sharedKey(namespace string) types.NamespacedName {
	return types.NamespacedName{Namespace: namespace, Name: sharedName}
}

// setWorkload sets the run-time ConfigMap's workload key ("" removes the
// ConfigMap: the flags' pod-per-vm) for the rest of the test.
func setWorkload(t *testing.T, mode string) {
	t.Helper()
	if mode == "" {
		setConfig(t, nil)
		return
	}
	setConfig(t, map[string]string{"workload": mode})
}

// setConfig makes the controller's ConfigMap hold data, or removes it.
func setConfig(t *testing.T, data map[string]string) {
	t.Helper()
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: configNamespace, Name: configName}}
	if data == nil {
		if err := admin.Delete(ctx, cm); client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
		return
	}
	cm.Data = data
	err := admin.Create(ctx, cm)
	if apierrors.IsAlreadyExists(err) {
		err = admin.Update(ctx, cm)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Delete(ctx, cm) })
}

// aggregate reads the namespace's shared Secret.
func aggregate(namespace string) (map[string]bmcspec.SharedVM, error) {
	s := &corev1.Secret{}
	if err := get(sharedKey(namespace), s); err != nil {
		return nil, err
	}
	entries := map[string]bmcspec.SharedVM{}
	for vm, data := range s.Data {
		var e bmcspec.SharedVM
		if err := json.Unmarshal(data, &e); err != nil {
			return nil, fmt.Errorf("entry %s: %w", vm, err)
		}
		entries[vm] = e
	}
	return entries, nil
}

// serves is nil once the namespace's shared Secret and Role name exactly vms.
func serves(namespace string, vms ...string) error {
	entries, err := aggregate(namespace)
	if err != nil {
		return err
	}
	slices.Sort(vms)
	if got := slices.Sorted(maps.Keys(entries)); !slices.Equal(got, vms) {
		return fmt.Errorf("shared Secret serves %v, want %v", got, vms)
	}
	role := &rbacv1.Role{}
	if err := get(sharedKey(namespace), role); err != nil {
		return err
	}
	if got := role.Rules[0].ResourceNames; !slices.Equal(got, vms) {
		return fmt.Errorf("shared Role names %v, want %v", got, vms)
	}
	// The tests' VMs have no Ingress class or certificate of their own:
	// each served VM's host is a rule of the shared Ingress.
	var hosts []string
	for _, vm := range vms {
		hosts = append(hosts, entries[vm].Hosts...)
	}
	return sharedIngressRoutes(namespace, hosts...)
}

// sharedIngressRoutes is nil once the namespace's shared Ingress leads
// exactly hosts, in VM order, to the shared Service, each with its
// certificate entry.
func sharedIngressRoutes(namespace string, hosts ...string) error {
	in := &networkingv1.Ingress{}
	if err := get(sharedKey(namespace), in); err != nil {
		return err
	}
	var got, certs []string
	for _, rule := range in.Spec.Rules {
		got = append(got, rule.Host)
		if backend := rule.HTTP.Paths[0].Backend.Service; backend.Name != sharedName || backend.Port.Name != "redfish" {
			return fmt.Errorf("Ingress rule %s: backend %+v", rule.Host, backend)
		}
	}
	for _, tls := range in.Spec.TLS {
		certs = append(certs, tls.Hosts...)
	}
	if !slices.Equal(got, hosts) || !slices.Equal(certs, hosts) {
		return fmt.Errorf("shared Ingress routes %v with certificates for %v, want %v", got, certs, hosts)
	}
	return nil
}

// sharedExist is nil once all of the namespace's shared objects exist.
func sharedExist(namespace string) error {
	for _, obj := range []client.Object{&corev1.Secret{}, &appsv1.Deployment{}, &corev1.Service{},
		&corev1.ServiceAccount{}, &rbacv1.Role{}, &rbacv1.RoleBinding{}, &networkingv1.Ingress{}} {
		if err := get(sharedKey(namespace), obj); err != nil {
			return fmt.Errorf("%T: %w", obj, err)
		}
	}
	return get(stateKey(namespace), &corev1.Secret{})
}

// stateEntriesAre is nil once the namespace's state Secret keeps the
// state of vms and no other.
func stateEntriesAre(namespace string, vms ...string) func() error {
	return func() error {
		state := &corev1.Secret{}
		if err := get(stateKey(namespace), state); err != nil {
			return err
		}
		if got := slices.Sorted(maps.Keys(state.Data)); !slices.Equal(got, vms) {
			return fmt.Errorf("state Secret keeps %v, want %v", got, vms)
		}
		return nil
	}
}

// stateKey is the namespace's state Secret of the shared bmc-server.
func stateKey(namespace string) types.NamespacedName {
	return types.NamespacedName{Namespace: namespace, Name: bmcspec.SharedStateSecret}
}

// sharedGone is nil once none of the namespace's shared objects exist.
func sharedGone(namespace string) error {
	for _, obj := range []client.Object{&corev1.Secret{}, &appsv1.Deployment{}, &corev1.Service{},
		&corev1.ServiceAccount{}, &rbacv1.Role{}, &rbacv1.RoleBinding{}, &networkingv1.Ingress{}} {
		if err := gone(sharedKey(namespace), obj); err != nil {
			return err
		}
	}
	return gone(stateKey(namespace), &corev1.Secret{})
}

// servedShared is nil once vm has an entry of the shared Secret and no
// bmc-server objects, no state Secret (its state is the namespace's) and no
// Ingress of its own (its host is a rule of the shared Ingress).
func servedShared(vm types.NamespacedName) error {
	key := workloadKey(vm)
	for _, obj := range []client.Object{&appsv1.Deployment{}, &corev1.Service{}, &corev1.ServiceAccount{}, &rbacv1.Role{}, &rbacv1.RoleBinding{}, &networkingv1.Ingress{}} {
		if err := gone(key, obj); err != nil {
			return err
		}
	}
	if err := gone(types.NamespacedName{Namespace: vm.Namespace, Name: bmcspec.StateSecretName(vm.Name)}, &corev1.Secret{}); err != nil {
		return err
	}
	entries, err := aggregate(vm.Namespace)
	if err != nil {
		return err
	}
	if e, ok := entries[vm.Name]; !ok || e.StateSecret != bmcspec.SharedStateSecret {
		return fmt.Errorf("%s: entry %+v, want one whose state is in %s", vm, e, bmcspec.SharedStateSecret)
	}
	return nil
}

// sharedVMs creates VMs in a new opted-in namespace and waits until the
// shared bmc-server serves them.
func sharedVMs(t *testing.T, namespaceName string, vms ...string) []types.NamespacedName {
	t.Helper()
	sharedManager(t)
	ns := namespace(t, namespaceName, true)
	var keys []types.NamespacedName
	for _, name := range vms {
		keys = append(keys, client.ObjectKeyFromObject(createVM(t, newVM(ns, name))))
	}
	poll.Until(t, "shared bmc-server", func() error { return serves(ns, vms...) })
	poll.Until(t, "shared objects", func() error { return sharedExist(ns) })
	for _, key := range keys {
		poll.Until(t, "per-VM objects", func() error { return servedShared(key) })
		// Enrolled for the shared server, it has no Secret of its own:
		// its credentials are its entry.
		if err := gone(types.NamespacedName{Namespace: key.Namespace, Name: key.Name + "-bmc"}, &corev1.Secret{}); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

func TestSharedWorkload(t *testing.T) {
	sharedManager(t)
	setWorkload(t, "shared")
	vmsA := sharedVMs(t, "shared-a", "web1", "web2")
	vmsB := sharedVMs(t, "shared-b", "web1")
	all := slices.Concat(vmsA, vmsB)

	t.Run("Secret: each VM's own generated credentials and host, its namespace's only", func(t *testing.T) {
		hosts, users := map[string]bool{}, map[string]bool{}
		for _, vm := range all {
			entries, err := aggregate(vm.Namespace)
			if err != nil {
				t.Fatal(err)
			}
			e := entries[vm.Name]
			if !strings.HasPrefix(e.Username, "bmc-") || len(e.Username) != 14 || len(e.Password) != 20 || users[e.Username] {
				t.Errorf("%s: entry %+v, want a random user and password of its own", vm, e)
			}
			users[e.Username] = true
			if want := vm.Name + "." + vm.Namespace + "." + testDomain; !slices.Equal(e.Hosts, []string{want}) {
				t.Errorf("%s: hosts %v, want [%s]", vm, e.Hosts, want)
			}
			for _, h := range e.Hosts {
				if hosts[h] {
					t.Errorf("host %s given twice", h)
				}
				hosts[h] = true
			}
		}
		if len(hosts) != 3 {
			t.Errorf("hosts %v, want three", hosts)
		}
	})

	t.Run("Deployment", func(t *testing.T) {
		d := &appsv1.Deployment{}
		if err := get(sharedKey("shared-a"), d); err != nil {
			t.Fatal(err)
		}
		pod := d.Spec.Template.Spec
		c := pod.Containers[0]
		checkBMCDeployment(t, d, sharedName, []deploymentCheck{
			{"bmc-server on the namespace's VMs", strings.Join(c.Args, " ") == "--backend kubevirt --namespace shared-a --vms-dir /etc/virtmetal/vms --listen :8443 --metrics-listen :9100"},
			{"the shared Secret mounted read-only", pod.Volumes[0].Secret != nil && pod.Volumes[0].Secret.SecretName == sharedName &&
				c.VolumeMounts[0].MountPath == "/etc/virtmetal/vms" && c.VolumeMounts[0].ReadOnly},
		})
	})

	t.Run("Service", func(t *testing.T) {
		s := &corev1.Service{}
		if err := get(sharedKey("shared-a"), s); err != nil {
			t.Fatal(err)
		}
		if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Port != 443 || s.Spec.Ports[0].Name != "redfish" || s.Spec.Ports[0].TargetPort.String() != "redfish" {
			t.Errorf("ports %+v, want redfish 443", s.Spec.Ports)
		}
		if s.Spec.Selector["virtmetal.io/shared"] != "true" || s.Spec.Selector["virtmetal.io/vm"] != "" {
			t.Errorf("selector %v", s.Spec.Selector)
		}
	})

	t.Run("labels", func(t *testing.T) {
		state := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: bmcspec.SharedStateSecret}}
		for _, obj := range []client.Object{&corev1.Secret{}, &appsv1.Deployment{}, &corev1.Service{},
			&corev1.ServiceAccount{}, &rbacv1.Role{}, &rbacv1.RoleBinding{}, &networkingv1.Ingress{}, state} {
			key := sharedKey("shared-b")
			if obj.GetName() != "" {
				key.Name = obj.GetName()
			}
			if err := get(key, obj); err != nil {
				t.Fatal(err)
			}
			l := obj.GetLabels()
			if l[v1beta1.LabelManagedBy] != "virtmetal" || l["virtmetal.io/shared"] != "true" || l[v1beta1.LabelVM] != "" {
				t.Errorf("%T labels %v", obj, l)
			}
		}
	})

	t.Run("status", func(t *testing.T) {
		for _, vm := range all {
			poll.Until(t, "status", func() error {
				b := &v1beta1.VirtualMachineBMC{}
				if err := get(vm, b); err != nil {
					return err
				}
				if want := "https://" + vm.Name + "." + vm.Namespace + "." + testDomain + "/redfish/v1/"; b.Status.RedfishURL != want {
					return fmt.Errorf("redfishURL %q, want %q", b.Status.RedfishURL, want)
				}
				for _, c := range []string{v1beta1.ConditionCredentialsReady, v1beta1.ConditionServiceReady, v1beta1.ConditionIngressReady} {
					if !meta.IsStatusConditionTrue(b.Status.Conditions, c) {
						return fmt.Errorf("condition %s not true: %+v", c, b.Status.Conditions)
					}
				}
				return nil
			})
		}
	})

	t.Run("Ready once the shared Deployment is available", func(t *testing.T) {
		readyOnceAvailable(t, sharedKey("shared-b"), vmsB[0])
	})
}

// TestSharedRoleReachesOnlyItsVMs runs as the shared ServiceAccount: it may
// patch the VMs it serves and no other.
func TestSharedRoleReachesOnlyItsVMs(t *testing.T) {
	sharedManager(t)
	setWorkload(t, "shared")
	vms := sharedVMs(t, "shared-rbac", "web1", "web2")
	ns := vms[0].Namespace
	// Not enrolled, so not served.
	other := newVM(ns, "other")
	other.Annotations = map[string]string{v1beta1.AnnotationBMC: v1beta1.BMCDisabled}
	createVM(t, other)
	bmcClient := serviceAccountClient(t, ns, sharedName)
	ctx := context.Background()
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"runStrategy":"Always"}}`))
	for _, vm := range vms {
		poll.Until(t, "a served VM", func() error {
			return bmcClient.Patch(ctx, &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: vm.Name}}, patch)
		})
	}
	// The namespace's state Secret, which the shared bmc-server may write.
	state := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: bmcspec.SharedStateSecret}}
	poll.Until(t, "the state Secret", func() error {
		return bmcClient.Patch(ctx, state, client.RawPatch(types.MergePatchType, []byte(`{"data":{"web1":"e30="}}`)))
	})
	for _, tc := range []struct {
		subresource, vm string
		allowed         bool
	}{
		{"console", "web1", true},
		{"vnc", "web2", true},
		{"console", "other", false},
		{"vnc", "other", false},
	} {
		if got := mayUseSubresource(t, ns, sharedName, "get", tc.subresource, tc.vm); got != tc.allowed {
			t.Errorf("get virtualmachineinstances/%s of %s allowed = %v, want %v", tc.subresource, tc.vm, got, tc.allowed)
		}
	}
	tests := []struct {
		name string
		call func() error
	}{
		{"patch a VM not served", func() error { return bmcClient.Patch(ctx, other, patch) }},
		{"read a VM not served", func() error {
			return bmcClient.Get(ctx, client.ObjectKeyFromObject(other), &kubevirtv1.VirtualMachine{})
		}},
		{"read the shared Secret through the API", func() error { return bmcClient.Get(ctx, sharedKey(ns), &corev1.Secret{}) }},
		{"read a VM's Secret", func() error {
			return bmcClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "web1-bmc"}, &corev1.Secret{})
		}},
		{"read a VM's own state Secret's name", func() error {
			return bmcClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: bmcspec.StateSecretName("web1")}, &corev1.Secret{})
		}},
		{"create a Secret", func() error {
			return bmcClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "minted"}})
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !apierrors.IsForbidden(err) {
				t.Errorf("= %v, want Forbidden", err)
			}
		})
	}
}

func TestSharedModeKeepsIPMIPodPerVM(t *testing.T) {
	sharedManager(t)
	setWorkload(t, "shared")
	vms := sharedVMs(t, "shared-ipmi", "web1", "web2")
	ns := vms[1].Namespace
	entries, err := aggregate(ns)
	if err != nil {
		t.Fatal(err)
	}
	// What the shared server kept for web2 goes with it to its own pod.
	kept := []byte(`{"version":1,"lastId":1,"subscriptions":[]}`)
	entry, _ := json.Marshal(map[string][]byte{"redfish-subscriptions": kept})
	patch, _ := json.Marshal(map[string]any{"data": map[string][]byte{"web1": []byte(`{}`), "web2": entry}})
	if err := admin.Patch(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: bmcspec.SharedStateSecret}},
		client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	update(t, vms[1], &v1beta1.VirtualMachineBMC{}, func(obj client.Object) {
		obj.(*v1beta1.VirtualMachineBMC).Spec.IPMI.Enabled = ptr.To(true)
	})
	poll.Until(t, "a pod of its own", func() error { return workloadExists(vms[1]) })
	// Its credentials Secret is new, its credentials are not: MaaS has them.
	creds := &corev1.Secret{}
	if err := get(types.NamespacedName{Namespace: vms[1].Namespace, Name: "web2-bmc"}, creds); err != nil {
		t.Fatal(err)
	}
	if e := entries["web2"]; string(creds.Data["username"]) != e.Username || string(creds.Data["password"]) != e.Password {
		t.Errorf("credentials Secret %s/%s, want the entry's %s/%s", creds.Data["username"], creds.Data["password"], e.Username, e.Password)
	}
	ownState := &corev1.Secret{}
	if err := get(types.NamespacedName{Namespace: ns, Name: bmcspec.StateSecretName("web2")}, ownState); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ownState.Data["redfish-subscriptions"], kept) {
		t.Errorf("its own state Secret holds %q, want what the shared server kept", ownState.Data)
	}
	poll.Until(t, "its entry dropped, web1's kept", stateEntriesAre(ns, "web1"))
	poll.Until(t, "not served by the shared server", func() error { return serves(vms[0].Namespace, "web1") })
	in := &networkingv1.Ingress{}
	if err := get(workloadKey(vms[1]), in); err != nil {
		t.Fatal(err)
	}
	if name := in.Spec.Rules[0].HTTP.Paths[0].Backend.Service.Name; name != "bmc-web2" {
		t.Errorf("Ingress backend %s, want bmc-web2", name)
	}
	if err := servedShared(vms[0]); err != nil {
		t.Error(err)
	}
}

// TestSharedIngressClassOfItsOwn: a served VM that asks for an Ingress
// class or certificate of its own has an Ingress of its own, to the shared
// Service, and is no rule of the shared Ingress; back to the defaults, it
// is again, and its own Ingress goes.
func TestSharedIngressClassOfItsOwn(t *testing.T) {
	sharedManager(t)
	setWorkload(t, "shared")
	vms := sharedVMs(t, "shared-class", "web1", "web2")
	ns := vms[0].Namespace
	host := func(vm string) string { return vm + "." + ns + "." + testDomain }
	tests := []struct {
		name string
		edit func(b *v1beta1.VirtualMachineBMC)
		want func(in *networkingv1.Ingress) error
	}{
		{"a class", func(b *v1beta1.VirtualMachineBMC) { b.Spec.Ingress.ClassName = "other" }, func(in *networkingv1.Ingress) error {
			if in.Spec.IngressClassName == nil || *in.Spec.IngressClassName != "other" {
				return fmt.Errorf("class %v, want other", in.Spec.IngressClassName)
			}
			return nil
		}},
		{"a certificate Secret", func(b *v1beta1.VirtualMachineBMC) { b.Spec.Ingress.TLS.SecretName = "mine" }, func(in *networkingv1.Ingress) error {
			if in.Spec.TLS[0].SecretName != "mine" {
				return fmt.Errorf("TLS %+v, want Secret mine", in.Spec.TLS)
			}
			return nil
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			restore := editSpec(t, vms[1], tc.edit)
			poll.Until(t, "an Ingress of its own", func() error {
				in := &networkingv1.Ingress{}
				if err := get(workloadKey(vms[1]), in); err != nil {
					return err
				}
				if rule := in.Spec.Rules[0]; rule.Host != host("web2") || rule.HTTP.Paths[0].Backend.Service.Name != sharedName {
					return fmt.Errorf("rule %+v", rule)
				}
				return tc.want(in)
			})
			poll.Until(t, "no rule of the shared Ingress", func() error { return sharedIngressRoutes(ns, host("web1")) })
			if entries, err := aggregate(ns); err != nil || len(entries) != 2 {
				t.Errorf("shared Secret %v (%v), want both VMs served", entries, err)
			}
			restore()
			poll.Until(t, "a rule of the shared Ingress again", func() error { return serves(ns, "web1", "web2") })
			poll.Until(t, "its own Ingress gone", func() error { return servedShared(vms[1]) })
		})
	}
}

// editSpec edits the VirtualMachineBMC's spec and returns what puts the
// spec back as it was.
func editSpec(t *testing.T, key types.NamespacedName, edit func(b *v1beta1.VirtualMachineBMC)) (restore func()) {
	t.Helper()
	var before v1beta1.VirtualMachineBMC
	update(t, key, &v1beta1.VirtualMachineBMC{}, func(obj client.Object) {
		b := obj.(*v1beta1.VirtualMachineBMC)
		b.Spec.DeepCopyInto(&before.Spec)
		edit(b)
	})
	return func() {
		update(t, key, &v1beta1.VirtualMachineBMC{}, func(obj client.Object) { before.Spec.DeepCopyInto(&obj.(*v1beta1.VirtualMachineBMC).Spec) })
	}
}

func TestSwitchWorkloadAtRunTime(t *testing.T) {
	vm := enrolledVM(t, "switch", "web1")
	// What its own bmc-server kept moves into the namespace's state Secret;
	// its credentials Secret stays its own.
	own := types.NamespacedName{Namespace: vm.Namespace, Name: bmcspec.StateSecretName(vm.Name)}
	kept := []byte(`{"version":1,"lastId":3,"subscriptions":[]}`)
	update(t, own, &corev1.Secret{}, func(obj client.Object) {
		obj.(*corev1.Secret).Data = map[string][]byte{"redfish-subscriptions": kept}
	})
	creds := &corev1.Secret{}
	if err := get(types.NamespacedName{Namespace: vm.Namespace, Name: "web1-bmc"}, creds); err != nil {
		t.Fatal(err)
	}
	movedIn := func() error {
		state := &corev1.Secret{}
		if err := get(stateKey(vm.Namespace), state); err != nil {
			return err
		}
		var entry map[string][]byte
		if err := json.Unmarshal(state.Data["web1"], &entry); err != nil || !bytes.Equal(entry["redfish-subscriptions"], kept) {
			return fmt.Errorf("state entry %q (%v), want what its own Secret kept", state.Data["web1"], err)
		}
		entries, err := aggregate(vm.Namespace)
		if e := entries["web1"]; err != nil || e.Username != string(creds.Data["username"]) || e.Password != string(creds.Data["password"]) {
			return fmt.Errorf("entry %+v (%v), want the credentials of its own Secret", e, err)
		}
		return nil
	}
	steps := []struct {
		mode  string
		check func() error
	}{
		{"shared", func() error {
			if err := serves(vm.Namespace, "web1"); err != nil {
				return err
			}
			if err := movedIn(); err != nil {
				return err
			}
			return servedShared(vm)
		}},
		{"", func() error {
			if err := workloadExists(vm); err != nil {
				return err
			}
			// What the shared server kept goes back to its own Secret.
			state := &corev1.Secret{}
			if err := get(own, state); err != nil {
				return err
			}
			if !bytes.Equal(state.Data["redfish-subscriptions"], kept) {
				return fmt.Errorf("its own state Secret holds %q, want what the shared server kept", state.Data)
			}
			in := &networkingv1.Ingress{}
			if err := get(workloadKey(vm), in); err != nil {
				return err
			}
			if name := in.Spec.Rules[0].HTTP.Paths[0].Backend.Service.Name; name != "bmc-web1" {
				return fmt.Errorf("Ingress backend %s", name)
			}
			return sharedGone(vm.Namespace)
		}},
		{"shared", func() error {
			if err := serves(vm.Namespace, "web1"); err != nil {
				return err
			}
			if err := movedIn(); err != nil {
				return err
			}
			return servedShared(vm)
		}},
	}
	for _, step := range steps {
		t.Run("workload "+cmpOr(step.mode, "pod-per-vm"), func(t *testing.T) {
			setWorkload(t, step.mode)
			poll.Until(t, "objects of the mode", step.check)
		})
	}
}

func cmpOr(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}

func TestSharedObjectsGoWithTheLastBMC(t *testing.T) {
	sharedManager(t)
	setWorkload(t, "shared")
	ns := namespace(t, "shared-last", true)
	plain := createVM(t, newVM(ns, "web1"))
	withIT := newVM(ns, "web2")
	withIT.Spec.Instancetype = &kubevirtv1.InstancetypeMatcher{Name: "u1.small"}
	createVM(t, withIT)
	clusterName := types.NamespacedName{Name: bmc.ClusterRBACName(ns, "")}
	poll.Until(t, "shared bmc-server", func() error { return serves(ns, "web1", "web2") })
	poll.Until(t, "cluster RBAC of the union", func() error {
		role := &rbacv1.ClusterRole{}
		if err := get(clusterName, role); err != nil {
			return err
		}
		if !slices.Equal(role.Rules[0].ResourceNames, []string{"u1.small"}) {
			return fmt.Errorf("rules %+v", role.Rules)
		}
		if owners := role.OwnerReferences; len(owners) != 1 || owners[0].Kind != "Namespace" || owners[0].Name != ns {
			return fmt.Errorf("owners %+v, want the Namespace", owners)
		}
		return get(clusterName, &rbacv1.ClusterRoleBinding{})
	})
	// The bmc-server kept state for both; the one that leaves takes its own.
	if err := admin.Patch(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: bmcspec.SharedStateSecret}},
		client.RawPatch(types.MergePatchType, []byte(`{"data":{"web1":"e30=","web2":"e30="}}`))); err != nil {
		t.Fatal(err)
	}
	annotate(t, client.ObjectKeyFromObject(withIT), map[string]string{v1beta1.AnnotationBMC: v1beta1.BMCDisabled})
	poll.Until(t, "one VM left", func() error { return serves(ns, "web1") })
	poll.Until(t, "the state of the VM left only", stateEntriesAre(ns, "web1"))
	poll.Until(t, "no cluster RBAC without a cluster instancetype", func() error {
		if err := gone(clusterName, &rbacv1.ClusterRole{}); err != nil {
			return err
		}
		return gone(clusterName, &rbacv1.ClusterRoleBinding{})
	})
	annotate(t, client.ObjectKeyFromObject(plain), map[string]string{v1beta1.AnnotationBMC: v1beta1.BMCDisabled})
	poll.Until(t, "shared objects gone with the last BMC", func() error { return sharedGone(ns) })
}

func TestSharedCredentialsRotation(t *testing.T) {
	sharedManager(t)
	setWorkload(t, "shared")
	vms := sharedVMs(t, "shared-rotation", "web1", "web2")
	ns := vms[0].Namespace
	ctx := context.Background()
	own := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "own-credentials"},
		Data:       map[string][]byte{"username": []byte("admin2"), "password": []byte("first")},
	}
	if err := admin.Create(ctx, own); err != nil {
		t.Fatal(err)
	}
	update(t, vms[1], &v1beta1.VirtualMachineBMC{}, func(obj client.Object) {
		obj.(*v1beta1.VirtualMachineBMC).Spec.CredentialsSecret = own.Name
	})
	passwordIs := func(vm, want string) func() error {
		return func() error {
			entries, err := aggregate(ns)
			if err != nil {
				return err
			}
			if got := entries[vm].Password; got != want {
				return fmt.Errorf("%s's password %q, want %q", vm, got, want)
			}
			return nil
		}
	}
	poll.Until(t, "the user's Secret served", passwordIs("web2", "first"))

	tests := []struct {
		name   string
		rotate func(t *testing.T) string // returns the new password
		vm     string
	}{
		{"the entry's own credentials, rotate annotation", func(t *testing.T) string {
			entries, err := aggregate(ns)
			if err != nil {
				t.Fatal(err)
			}
			before := entries["web1"]
			update(t, vms[0], &v1beta1.VirtualMachineBMC{}, func(obj client.Object) {
				obj.SetAnnotations(map[string]string{v1beta1.AnnotationRotateCredentials: "2026-12-01"})
			})
			var after bmcspec.SharedVM
			poll.Until(t, "rotation", func() error {
				b := &v1beta1.VirtualMachineBMC{}
				if err := get(vms[0], b); err != nil {
					return err
				}
				if b.Status.CredentialsRotation != "2026-12-01" {
					return errors.New("not reported rotated yet")
				}
				entries, err := aggregate(ns)
				after = entries["web1"]
				return err
			})
			if after.Password == before.Password || after.Username != before.Username || after.RotatedFor != "2026-12-01" {
				t.Fatalf("entry %+v after rotation, was %+v: want a new password for the same user", after, before)
			}
			// Once: the password stays through later batches.
			time.Sleep(2 * time.Second)
			if entries, err := aggregate(ns); err != nil || entries["web1"].Password != after.Password {
				t.Fatalf("entry %+v (%v), want the rotated password to stay", entries["web1"], err)
			}
			return after.Password
		}, "web1"},
		{"user-named Secret edited", func(t *testing.T) string {
			update(t, client.ObjectKeyFromObject(own), &corev1.Secret{}, func(obj client.Object) {
				obj.(*corev1.Secret).Data["password"] = []byte("second")
			})
			return "second"
		}, "web2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			poll.Until(t, "the aggregate follows", passwordIs(tc.vm, tc.rotate(t)))
		})
	}
}

func TestSharedRefusals(t *testing.T) {
	sharedManager(t)
	setWorkload(t, "shared")
	vms := sharedVMs(t, "shared-refusals", "web1", "web2")
	ns := vms[0].Namespace
	tests := []struct {
		name   string
		edit   func(b *v1beta1.VirtualMachineBMC)
		reason string // an Event's
		check  func(b *v1beta1.VirtualMachineBMC) error
	}{
		{"the shared Secret as credentials", func(b *v1beta1.VirtualMachineBMC) { b.Spec.CredentialsSecret = sharedName }, "SecretNotAllowed",
			func(b *v1beta1.VirtualMachineBMC) error {
				if c := meta.FindStatusCondition(b.Status.Conditions, v1beta1.ConditionCredentialsReady); c == nil || c.Reason != "SecretNotAllowed" {
					return fmt.Errorf("CredentialsReady %+v", c)
				}
				return nil
			}},
		{"another VM's host", func(b *v1beta1.VirtualMachineBMC) { b.Spec.Ingress.Host = "web1." + ns + "." + testDomain }, "HostTaken",
			func(b *v1beta1.VirtualMachineBMC) error {
				if c := meta.FindStatusCondition(b.Status.Conditions, v1beta1.ConditionIngressReady); c == nil || c.Reason != "HostTaken" {
					return fmt.Errorf("IngressReady %+v", c)
				}
				return gone(types.NamespacedName{Namespace: ns, Name: "bmc-web2"}, &networkingv1.Ingress{})
			}},
		{"a host of another namespace", func(b *v1beta1.VirtualMachineBMC) { b.Spec.Ingress.Host = "web1.shared-a." + testDomain }, "HostNotAllowed",
			func(b *v1beta1.VirtualMachineBMC) error {
				if c := meta.FindStatusCondition(b.Status.Conditions, v1beta1.ConditionIngressReady); c == nil || c.Reason != "HostNotAllowed" {
					return fmt.Errorf("IngressReady %+v", c)
				}
				return nil
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			restore := editSpec(t, vms[1], tc.edit)
			t.Cleanup(func() {
				restore()
				poll.Until(t, "served again", func() error { return serves(ns, "web1", "web2") })
			})
			poll.Until(t, "web2 not served", func() error { return serves(ns, "web1") })
			poll.Until(t, "an Event", func() error { return eventWith(ns, tc.reason, "") })
			if tc.check != nil {
				poll.Until(t, "status", func() error {
					b := &v1beta1.VirtualMachineBMC{}
					if err := get(vms[1], b); err != nil {
						return err
					}
					return tc.check(b)
				})
			}
			entries, err := aggregate(ns)
			if err != nil {
				t.Fatal(err)
			}
			// Its one host is also the FQDN the shared bmc-server names
			// web1's Manager by; web2, whose claim lost, has no entry.
			if hosts := entries["web1"].Hosts; !slices.Equal(hosts, []string{"web1." + ns + "." + testDomain}) {
				t.Errorf("web1's hosts %v", hosts)
			}
		})
	}
}

func TestSharedDriftIsRepaired(t *testing.T) {
	sharedManager(t)
	setWorkload(t, "shared")
	vms := sharedVMs(t, "shared-drift", "web1")
	ns := vms[0].Namespace
	key := sharedKey(ns)
	tests := []struct {
		name  string
		edit  func(t *testing.T)
		check func() error
	}{
		{
			name: "a VM added to the Secret",
			edit: func(t *testing.T) {
				update(t, key, &corev1.Secret{}, func(obj client.Object) {
					obj.(*corev1.Secret).Data["intruder"] = []byte(`{"username":"a","password":"b","hosts":["victim.other.` + testDomain + `"]}`)
				})
			},
			check: func() error { return serves(ns, "web1") },
		},
		{
			name: "Deployment args edited",
			edit: func(t *testing.T) {
				update(t, key, &appsv1.Deployment{}, func(obj client.Object) {
					obj.(*appsv1.Deployment).Spec.Template.Spec.Containers[0].Args = []string{"--backend", "kubevirt", "--namespace", "other"}
				})
			},
			check: func() error {
				d := &appsv1.Deployment{}
				if err := get(key, d); err != nil {
					return err
				}
				if args := d.Spec.Template.Spec.Containers[0].Args; args[3] != ns {
					return fmt.Errorf("args %v", args)
				}
				return nil
			},
		},
		{
			name: "Role widened",
			edit: func(t *testing.T) {
				update(t, key, &rbacv1.Role{}, func(obj client.Object) { obj.(*rbacv1.Role).Rules[0].ResourceNames = nil })
			},
			check: func() error { return serves(ns, "web1") },
		},
		{
			name: "a host added to the Ingress",
			edit: func(t *testing.T) {
				update(t, key, &networkingv1.Ingress{}, func(obj client.Object) {
					in := obj.(*networkingv1.Ingress)
					intruder := *in.Spec.Rules[0].DeepCopy()
					intruder.Host = "victim.other." + testDomain
					in.Spec.Rules = append(in.Spec.Rules, intruder)
				})
			},
			check: func() error { return serves(ns, "web1") },
		},
		{"Ingress deleted", func(t *testing.T) { deleteObj(t, key, &networkingv1.Ingress{}) }, func() error { return serves(ns, "web1") }},
		{"Secret deleted", func(t *testing.T) { deleteObj(t, key, &corev1.Secret{}) }, func() error { return serves(ns, "web1") }},
		{"Service deleted", func(t *testing.T) { deleteObj(t, key, &corev1.Service{}) }, func() error { return get(key, &corev1.Service{}) }},
		{"RoleBinding deleted", func(t *testing.T) { deleteObj(t, key, &rbacv1.RoleBinding{}) }, func() error { return get(key, &rbacv1.RoleBinding{}) }},
		{"Deployment deleted", func(t *testing.T) { deleteObj(t, key, &appsv1.Deployment{}) }, func() error { return get(key, &appsv1.Deployment{}) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.edit(t)
			poll.Until(t, "repair", tc.check)
		})
	}
}

// TestSharedWritesInBatches: a namespace's VMs arriving together cost a
// few writes of the shared Secret, not one each.
func TestSharedWritesInBatches(t *testing.T) {
	const n = 50
	sharedManager(t)
	setWorkload(t, "shared")
	ns := namespace(t, "shared-batch", true)
	watcher, err := client.NewWithWatch(env.Config, client.Options{Scheme: admin.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := watcher.Watch(context.Background(), &corev1.SecretList{}, client.InNamespace(ns),
		client.MatchingFields{"metadata.name": sharedName})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	names := make([]string, n)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		names[i] = fmt.Sprintf("vm-%02d", i)
		wg.Go(func() {
			if err := admin.Create(context.Background(), newVM(ns, names[i])); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	poll.Until(t, "all served", func() error { return serves(ns, names...) })
	// One write per batch (the reconciler's one-second delay) at most,
	// however long a loaded machine takes to enrol them; without batching
	// it writes several times a second.
	allowed := int(time.Since(start)/time.Second) + 1
	// The watch delivers late: count until it has been quiet a while.
	writes := 0
	for quiet := time.After(2 * time.Second); ; {
		select {
		case e := <-w.ResultChan():
			if e.Type == watch.Added || e.Type == watch.Modified {
				writes++
			}
			quiet = time.After(2 * time.Second)
			continue
		case <-quiet:
		}
		break
	}
	t.Logf("%d writes of the shared Secret for %d VMs (%d allowed)", writes, n, allowed)
	if writes == 0 || writes > allowed {
		t.Errorf("%d writes of the shared Secret for %d VMs, want %d at most", writes, n, allowed)
	}
}

// TestEventDestinationsDeniedReachEveryBMC: the ConfigMap's denied
// networks (destinationsDenied, or its former name eventDestinationsDenied)
// are on the command line of every bmc-server, one VM's and a namespace's
// shared one, so that no tenant's subscription or image can reach into
// the cluster's networks.
func TestEventDestinationsDeniedReachEveryBMC(t *testing.T) {
	vm := enrolledVM(t, "denied-nets", "web1")
	const denied = "10.244.0.0/16,10.96.0.0/12"
	args := func(key types.NamespacedName) func() error {
		return func() error {
			d := &appsv1.Deployment{}
			if err := get(key, d); err != nil {
				return err
			}
			got := strings.Join(d.Spec.Template.Spec.Containers[0].Args, " ")
			if !strings.Contains(got, "--destinations-denied "+denied) {
				return fmt.Errorf("args %s", got)
			}
			return nil
		}
	}
	setConfig(t, map[string]string{"destinationsDenied": "10.244.0.0/16, 10.96.0.0/12"})
	poll.Until(t, "the denied networks on the VM's bmc-server", args(workloadKey(vm)))
	setConfig(t, map[string]string{"eventDestinationsDenied": denied, "workload": "shared"})
	poll.Until(t, "the denied networks on the shared bmc-server", args(sharedKey(vm.Namespace)))
	setConfig(t, nil)
}

// TestSharedFailureIsReported: when the namespace's shared bmc-server
// cannot be kept (here its Deployment is refused), each VirtualMachineBMC
// it serves says so in DeploymentAvailable and gets a Warning Event, once;
// when the refusal goes, the condition says what the Deployment says.
func TestSharedFailureIsReported(t *testing.T) {
	sharedManager(t)
	setWorkload(t, "shared")
	vms := sharedVMs(t, "shared-failure", "web1")
	ns := vms[0].Namespace
	probe := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "probe"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "probe"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "probe", Image: "probe"}}},
			},
		},
	}
	lift := refuse(t, ns, "deployments", "no Deployment is admitted here", probe)
	// Its deletion is admitted; making it again is not.
	deleteObj(t, sharedKey(ns), &appsv1.Deployment{})
	available := func() (*metav1.Condition, error) {
		b := &v1beta1.VirtualMachineBMC{}
		if err := get(vms[0], b); err != nil {
			return nil, err
		}
		c := meta.FindStatusCondition(b.Status.Conditions, v1beta1.ConditionDeploymentAvailable)
		if c == nil {
			return nil, errors.New("no DeploymentAvailable")
		}
		return c, nil
	}
	poll.Until(t, "the failure on the BMC", func() error {
		c, err := available()
		if err != nil {
			return err
		}
		if c.Status != metav1.ConditionFalse || c.Reason != "SharedServerFailed" || !strings.Contains(c.Message, "no Deployment is admitted here") {
			return fmt.Errorf("DeploymentAvailable %+v", c)
		}
		return nil
	})
	poll.Until(t, "the Warning Event", func() error { return eventWith(ns, "SharedServerFailed", "shared bmc-server virtmetal-bmcs: ") })
	lift()
	poll.Until(t, "the Deployment's own state once it is admitted", func() error {
		if err := get(sharedKey(ns), &appsv1.Deployment{}); err != nil {
			return err
		}
		c, err := available()
		if err != nil {
			return err
		}
		if c.Reason == "SharedServerFailed" {
			return fmt.Errorf("DeploymentAvailable %+v", c)
		}
		return nil
	})
}
