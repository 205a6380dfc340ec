package vmidentity

import (
	"context"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	poolv1beta1 "kubevirt.io/api/pool/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// instanceDomain is a domain spec the API server's schemas accept, with
// the identity given ("" leaves a field unset) on one pod network
// interface.
func instanceDomain(serial, uuid, mac string) (kubevirtv1.DomainSpec, []kubevirtv1.Network) {
	domain := kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{{
		Name: "default", MacAddress: mac,
		InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}},
	}}}}
	if serial != "" || uuid != "" {
		domain.Firmware = &kubevirtv1.Firmware{Serial: serial, UUID: types.UID(uuid)}
	}
	return domain, []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}}
}

func clusterVMI(namespace, name, serial, uuid, mac string) *kubevirtv1.VirtualMachineInstance {
	vmi := &kubevirtv1.VirtualMachineInstance{}
	vmi.Namespace, vmi.Name = namespace, name
	vmi.Spec.Domain, vmi.Spec.Networks = instanceDomain(serial, uuid, mac)
	return vmi
}

func clusterReplicaSet(namespace, name, serial, uuid, mac string) *kubevirtv1.VirtualMachineInstanceReplicaSet {
	rs := &kubevirtv1.VirtualMachineInstanceReplicaSet{}
	rs.Namespace, rs.Name = namespace, name
	replicas := int32(0)
	rs.Spec.Replicas = &replicas
	rs.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}}
	rs.Spec.Template = &kubevirtv1.VirtualMachineInstanceTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}}}
	rs.Spec.Template.Spec.Domain, rs.Spec.Template.Spec.Networks = instanceDomain(serial, uuid, mac)
	return rs
}

func clusterPool(namespace, name, serial, uuid, mac string) *poolv1beta1.VirtualMachinePool {
	pool := &poolv1beta1.VirtualMachinePool{}
	pool.Namespace, pool.Name = namespace, name
	replicas := int32(0)
	pool.Spec.Replicas = &replicas
	pool.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}}
	halted := kubevirtv1.RunStrategyHalted
	pool.Spec.VirtualMachineTemplate = &poolv1beta1.VirtualMachineTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &halted,
			Template:    &kubevirtv1.VirtualMachineInstanceTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}}},
		},
	}
	template := pool.Spec.VirtualMachineTemplate.Spec.Template
	template.Spec.Domain, template.Spec.Networks = instanceDomain(serial, uuid, mac)
	return pool
}

// instanceKinds make, for each kind a VMI is made from, an object
// declaring the identity given.
var instanceKinds = []struct {
	kind string
	make func(namespace, name, serial, uuid, mac string) client.Object
}{
	{"VirtualMachineInstance", func(ns, n, s, u, m string) client.Object { return clusterVMI(ns, n, s, u, m) }},
	{"VirtualMachineInstanceReplicaSet", func(ns, n, s, u, m string) client.Object { return clusterReplicaSet(ns, n, s, u, m) }},
	{"VirtualMachinePool", func(ns, n, s, u, m string) client.Object { return clusterPool(ns, n, s, u, m) }},
}

// tenantAdmin is a client for a user who is admin of namespace and of
// nothing else: the built-in admin ClusterRole, and KubeVirt's own admin
// rules on its kinds (KubeVirt aggregates them into admin; envtest runs no
// aggregation controller, so they are bound here directly).
func (s *webhookSuite) tenantAdmin(t *testing.T, namespace string) client.Client {
	t.Helper()
	ctx := context.Background()
	kubevirtAdmin := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "test-kubevirt-admin"},
		Rules: []rbacv1.PolicyRule{
			{
				APIGroups: []string{"kubevirt.io"},
				Resources: []string{"virtualmachines", "virtualmachineinstances", "virtualmachineinstancepresets", "virtualmachineinstancereplicasets"},
				Verbs:     []string{"get", "delete", "create", "update", "patch", "list", "watch", "deletecollection"},
			},
			{
				APIGroups: []string{"pool.kubevirt.io"},
				Resources: []string{"virtualmachinepools"},
				Verbs:     []string{"get", "delete", "create", "update", "patch", "list", "watch", "deletecollection"},
			},
		},
	}
	if err := s.env.Client.Create(ctx, kubevirtAdmin); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	user := namespace + "-admin"
	for _, role := range []string{"admin", kubevirtAdmin.Name} {
		binding := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: user + "-" + role},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
		}
		if err := s.env.Client.Create(ctx, binding); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	cfg, err := s.env.ConfigFor(user)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: s.env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestEveryDoorToAVMI: tenant B, admin of its own namespace only, tries to
// give a VMI, a VMI replica set's template or a VM pool's template the
// serial, SMBIOS UUID or MAC of tenant A's enrolled VM web1; the real API
// server, calling the generated webhook configurations, refuses each.
func TestEveryDoorToAVMI(t *testing.T) {
	s := sharedSuite(t)
	ctx := context.Background()
	s.namespace(t, "tenant-a", true)
	s.namespace(t, "tenant-b", false)
	tenantB := s.tenantAdmin(t, "tenant-b")

	web1 := clusterVM("tenant-a", "web1", "", "")
	if err := s.env.Client.Create(ctx, web1); err != nil {
		t.Fatal(err)
	}
	s.waitCached(t, web1)
	serial, uuid, mac := Serial("tenant-a", "web1"), string(web1.Spec.Template.Spec.Domain.Firmware.UUID), macs(web1)[0]

	t.Run("the tenant is admin of its namespace only", func(t *testing.T) {
		err := tenantB.Create(ctx, clusterVMI("tenant-a", "intruder", "", "", ""))
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `User "tenant-b-admin" cannot create resource`) {
			t.Fatalf("Create in tenant-a = %v, want RBAC's Forbidden", err)
		}
	})

	claims := []struct {
		name                       string
		serial, uuid, mac, message string
	}{
		{"serial", serial, "", "", `firmware.serial "web1.tenant-a" names VM tenant-a/web1`},
		{"UUID", "", uuid, "", `firmware.uuid "` + uuid + `" is the SMBIOS UUID of VM tenant-a/web1`},
		{"MAC", "", "", mac, "macAddress " + mac + " is used by VM tenant-a/web1"},
	}
	for _, kind := range instanceKinds {
		for _, claim := range claims {
			t.Run("refused: "+kind.kind+" in tenant-b with web1's "+claim.name, func(t *testing.T) {
				obj := kind.make("tenant-b", "copy-"+strings.ToLower(claim.name), claim.serial, claim.uuid, claim.mac)
				err := tenantB.Create(ctx, obj)
				if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), claim.message) {
					t.Fatalf("Create = %v, want Forbidden with %q", err, claim.message)
				}
			})
		}
		t.Run("admitted: "+kind.kind+" in tenant-b with its own identity", func(t *testing.T) {
			obj := kind.make("tenant-b", "own", "own.tenant-b", "8d3c6a0e-5b1f-4c2e-9f7a-1e2d3c4b5a69", "02:00:00:ee:00:01")
			if err := tenantB.Create(ctx, obj); err != nil {
				t.Fatalf("Create = %v", err)
			}
			if err := tenantB.Delete(ctx, obj); err != nil {
				t.Fatalf("Delete = %v", err)
			}
		})
	}

	// virt-controller makes a VM's VMI from its template, under the VM's
	// name and controlled by it: web1's own VMI carries web1's identity.
	controlledBy := func(vmi *kubevirtv1.VirtualMachineInstance, vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachineInstance {
		vmi.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(vm, kubevirtv1.VirtualMachineGroupVersionKind)}
		return vmi
	}
	t.Run("admitted: the VMI web1 controls, with web1's identity", func(t *testing.T) {
		vmi := controlledBy(clusterVMI("tenant-a", "web1", serial, uuid, mac), web1)
		if err := s.env.Client.Create(ctx, vmi); err != nil {
			t.Fatalf("Create = %v", err)
		}
		got := &kubevirtv1.VirtualMachineInstance{}
		if err := s.env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), got); err != nil {
			t.Fatal(err)
		}
		if fw := got.Spec.Domain.Firmware; fw.Serial != serial || string(fw.UUID) != uuid || got.Spec.Domain.Devices.Interfaces[0].MacAddress != mac {
			t.Fatalf("web1's VMI changed at admission: %+v %+v", fw, got.Spec.Domain.Devices.Interfaces)
		}
		if err := s.env.Client.Delete(ctx, vmi); err != nil {
			t.Fatalf("Delete = %v", err)
		}
	})
	ownNamespace := []struct {
		name string
		obj  client.Object
	}{
		{"a VMI of web1's name it does not control", clusterVMI("tenant-a", "web1", serial, uuid, mac)},
		{"a VMI web1 controls under another name", controlledBy(clusterVMI("tenant-a", "web1-copy", serial, uuid, mac), web1)},
		{"a pool template of web1's namespace, opted out", func() client.Object {
			pool := clusterPool("tenant-a", "web", serial, "", "")
			pool.Spec.VirtualMachineTemplate.ObjectMeta.Annotations = map[string]string{"virtmetal.io/bmc": "disabled"}
			return pool
		}()},
		{"a replica set template of web1's namespace, opted out", func() client.Object {
			rs := clusterReplicaSet("tenant-a", "web", "", uuid, "")
			rs.Spec.Template.ObjectMeta.Annotations = map[string]string{"virtmetal.io/bmc": "disabled"}
			return rs
		}()},
	}
	for _, tc := range ownNamespace {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			err := s.env.Client.Create(ctx, tc.obj)
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "VM tenant-a/web1") {
				t.Fatalf("Create = %v, want Forbidden naming tenant-a/web1", err)
			}
		})
	}

	t.Run("refused: an update of a VMI that takes web1's MAC", func(t *testing.T) {
		vmi := clusterVMI("tenant-b", "later", "", "", "02:00:00:ee:00:02")
		if err := tenantB.Create(ctx, vmi); err != nil {
			t.Fatal(err)
		}
		vmi.Spec.Domain.Devices.Interfaces[0].MacAddress = mac
		err := tenantB.Update(ctx, vmi)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "is used by VM tenant-a/web1") {
			t.Fatalf("Update = %v, want Forbidden", err)
		}
	})
}

// TestTemplatesInEnrolledNamespaces: a replica set's or pool's template in
// an enrolled namespace loses the serial, UUID and MACs it sets (each
// instance would carry them all), with a warning per field; elsewhere the
// template is kept.
func TestTemplatesInEnrolledNamespaces(t *testing.T) {
	s := sharedSuite(t)
	ctx := context.Background()
	s.namespace(t, "tenant-c", true)
	s.namespace(t, "tenant-d", false)
	c, warnings := s.clientWithWarnings(t)
	const uuid, mac = "3f0e8a52-7c1d-4b6e-8a9f-2d4c6b8e0a13", "02:00:00:ee:00:03"
	domainOf := map[string]func(client.Object) kubevirtv1.DomainSpec{
		"VirtualMachineInstanceReplicaSet": func(o client.Object) kubevirtv1.DomainSpec {
			return o.(*kubevirtv1.VirtualMachineInstanceReplicaSet).Spec.Template.Spec.Domain
		},
		"VirtualMachinePool": func(o client.Object) kubevirtv1.DomainSpec {
			return o.(*poolv1beta1.VirtualMachinePool).Spec.VirtualMachineTemplate.Spec.Template.Spec.Domain
		},
	}
	for _, kind := range instanceKinds[1:] {
		t.Run(kind.kind+" in an enrolled namespace", func(t *testing.T) {
			before := len(warnings.all())
			obj := kind.make("tenant-c", "fleet", "fleet.tenant-c", uuid, mac)
			if err := c.Create(ctx, obj); err != nil {
				t.Fatalf("Create = %v", err)
			}
			domain := domainOf[kind.kind](obj)
			if fw := domain.Firmware; fw != nil && (fw.Serial != "" || fw.UUID != "") || domain.Devices.Interfaces[0].MacAddress != "" {
				t.Errorf("template keeps an identity: %+v %+v", fw, domain.Devices.Interfaces)
			}
			if got := warnings.all()[before:]; len(got) != 3 || !strings.Contains(strings.Join(got, "\n"), `firmware.uuid "`+uuid+`" removed`) {
				t.Errorf("warnings = %q", got)
			}
		})
		t.Run(kind.kind+" in a namespace not enrolled", func(t *testing.T) {
			obj := kind.make("tenant-d", "fleet", "fleet.tenant-d", uuid, mac)
			if err := c.Create(ctx, obj); err != nil {
				t.Fatalf("Create = %v", err)
			}
			domain := domainOf[kind.kind](obj)
			if domain.Firmware == nil || string(domain.Firmware.UUID) != uuid || domain.Devices.Interfaces[0].MacAddress != mac {
				t.Errorf("template changed: %+v %+v", domain.Firmware, domain.Devices.Interfaces)
			}
		})
	}
}

// TestEarlyVMIKeepsItsIdentity: tenant B runs a VMI with the MAC and UUID
// the name tenant-a/web9 derives, before that VM exists (the derivations
// are public, and no enrolled VM has them yet, so it is admitted); web9,
// created next, gets other ones rather than share them with B's VMI.
func TestEarlyVMIKeepsItsIdentity(t *testing.T) {
	s := sharedSuite(t)
	ctx := context.Background()
	s.namespace(t, "tenant-a", true)
	s.namespace(t, "tenant-b", false)
	tenantB := s.tenantAdmin(t, "tenant-b")

	derived := newVM("tenant-a", "web9", withInterface("default", ""))
	if _, err := newStamper(t, testRange, interceptor.Funcs{}).Stamp(ctx, derived); err != nil {
		t.Fatal(err)
	}
	uuid, mac := string(derived.Spec.Template.Spec.Domain.Firmware.UUID), macs(derived)[0]
	early := clusterVMI("tenant-b", "early", "", uuid, mac)
	if err := tenantB.Create(ctx, early); err != nil {
		t.Fatalf("creating the early VMI: %v", err)
	}
	s.waitCached(t, early)

	web9 := clusterVM("tenant-a", "web9", "", "")
	if err := s.env.Client.Create(ctx, web9); err != nil {
		t.Fatal(err)
	}
	if got := web9.Spec.Template.Spec.Domain.Firmware.UUID; string(got) == uuid {
		t.Errorf("web9 got UUID %s, which tenant-b/early has", got)
	}
	if got := macs(web9)[0]; got == mac {
		t.Errorf("web9 got MAC %s, which tenant-b/early has", got)
	}
}
