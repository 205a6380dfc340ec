package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"time"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/deploy/bmc"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/internal/kubetest"
	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
)

func workloadKey(vm types.NamespacedName) types.NamespacedName {
	return types.NamespacedName{Namespace: vm.Namespace, Name: "bmc-" + vm.Name}
}

// workloadExists is nil once every namespaced object of vm's BMC exists.
func workloadExists(vm types.NamespacedName) error {
	key := workloadKey(vm)
	for _, obj := range []client.Object{&appsv1.Deployment{}, &corev1.Service{}, &networkingv1.Ingress{},
		&corev1.ServiceAccount{}, &rbacv1.Role{}, &rbacv1.RoleBinding{}} {
		if err := get(key, obj); err != nil {
			return fmt.Errorf("%T: %w", obj, err)
		}
	}
	return nil
}

// enrolledVM creates an opted-in namespace with one VM and waits for its BMC.
func enrolledVM(t *testing.T, namespaceName, vmName string) types.NamespacedName {
	t.Helper()
	sharedManager(t)
	ns := namespace(t, namespaceName, true)
	vm := createVM(t, newVM(ns, vmName))
	key := client.ObjectKeyFromObject(vm)
	poll.Until(t, "workload", func() error { return workloadExists(key) })
	return key
}

func TestWorkload(t *testing.T) {
	vm := enrolledVM(t, "workload", "web1")
	key := workloadKey(vm)

	t.Run("Deployment", func(t *testing.T) {
		d := &appsv1.Deployment{}
		if err := get(key, d); err != nil {
			t.Fatal(err)
		}
		c := d.Spec.Template.Spec.Containers[0]
		checkBMCDeployment(t, d, "bmc-web1", []deploymentCheck{
			{"bmc-server on this VM", strings.Join(c.Args, " ") == "--backend kubevirt --namespace workload --vm web1 --listen :8443 --credentials-dir /etc/virtmetal/credentials --fqdn web1.workload."+testDomain+" --metrics-listen :9100"},
			{"credentials mounted from the Secret", d.Spec.Template.Spec.Volumes[0].Secret != nil && d.Spec.Template.Spec.Volumes[0].Secret.SecretName == "web1-bmc" && c.VolumeMounts[0].ReadOnly},
		})
	})

	t.Run("Service: Redfish only", func(t *testing.T) {
		s := &corev1.Service{}
		if err := get(key, s); err != nil {
			t.Fatal(err)
		}
		if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Port != 443 || s.Spec.Ports[0].Protocol != corev1.ProtocolTCP {
			t.Errorf("ports %+v, want 443/TCP alone", s.Spec.Ports)
		}
	})

	t.Run("Ingress", func(t *testing.T) {
		in := &networkingv1.Ingress{}
		if err := get(key, in); err != nil {
			t.Fatal(err)
		}
		host := "web1.workload." + testDomain
		if in.Spec.Rules[0].Host != host || in.Spec.TLS[0].Hosts[0] != host || in.Spec.TLS[0].SecretName == "" {
			t.Errorf("rules %+v tls %+v, want host %s with TLS", in.Spec.Rules, in.Spec.TLS, host)
		}
		if ptr.Deref(in.Spec.IngressClassName, "") != "nginx" {
			t.Errorf("class %v, want nginx", in.Spec.IngressClassName)
		}
	})

	t.Run("status", func(t *testing.T) {
		poll.Until(t, "status", func() error {
			b := &v1beta1.VirtualMachineBMC{}
			if err := get(vm, b); err != nil {
				return err
			}
			if b.Status.RedfishURL != "https://web1.workload."+testDomain+"/redfish/v1/" {
				return fmt.Errorf("redfishURL %q", b.Status.RedfishURL)
			}
			for _, c := range []string{v1beta1.ConditionVMFound, v1beta1.ConditionCredentialsReady, v1beta1.ConditionServiceReady, v1beta1.ConditionIngressReady} {
				if !meta.IsStatusConditionTrue(b.Status.Conditions, c) {
					return fmt.Errorf("condition %s not true: %+v", c, b.Status.Conditions)
				}
			}
			// envtest runs no pods: the Deployment is never available.
			if meta.IsStatusConditionTrue(b.Status.Conditions, v1beta1.ConditionReady) {
				return errors.New("Ready although no bmc-server runs")
			}
			if b.Status.ObservedGeneration != b.Generation {
				return fmt.Errorf("observedGeneration %d of %d", b.Status.ObservedGeneration, b.Generation)
			}
			return nil
		})
	})

	t.Run("Ready once the Deployment is available", func(t *testing.T) {
		readyOnceAvailable(t, key, vm)
	})

	t.Run("owner references: deleting the VM takes everything", func(t *testing.T) {
		// envtest runs no garbage collector: prove the chain it follows.
		vmObj := &kubevirtv1.VirtualMachine{}
		b := &v1beta1.VirtualMachineBMC{}
		secret := &corev1.Secret{}
		for k, obj := range map[types.NamespacedName]client.Object{vm: vmObj, {Namespace: vm.Namespace, Name: "web1-bmc"}: secret} {
			if err := get(k, obj); err != nil {
				t.Fatal(err)
			}
		}
		if err := get(vm, b); err != nil {
			t.Fatal(err)
		}
		if !metav1.IsControlledBy(b, vmObj) {
			t.Errorf("VirtualMachineBMC owners %+v, want the VM", b.OwnerReferences)
		}
		if !slices.ContainsFunc(secret.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == vmObj.UID }) {
			t.Errorf("Secret owners %+v, want the VM", secret.OwnerReferences)
		}
		for _, obj := range []client.Object{&appsv1.Deployment{}, &corev1.Service{}, &networkingv1.Ingress{},
			&corev1.ServiceAccount{}, &rbacv1.Role{}, &rbacv1.RoleBinding{}} {
			if err := get(key, obj); err != nil {
				t.Fatal(err)
			}
			if !metav1.IsControlledBy(obj, b) {
				t.Errorf("%T owners %+v, want the VirtualMachineBMC", obj, obj.GetOwnerReferences())
			}
			if obj.GetLabels()[v1beta1.LabelManagedBy] != "virtmetal" || obj.GetLabels()[v1beta1.LabelVM] != "web1" {
				t.Errorf("%T labels %v", obj, obj.GetLabels())
			}
		}
	})
}

func TestDriftIsRepaired(t *testing.T) {
	vm := enrolledVM(t, "drift", "web1")
	key := workloadKey(vm)
	ctx := context.Background()
	tests := []struct {
		name  string
		edit  func(t *testing.T)
		check func() error
	}{
		{
			name: "Deployment image and args edited",
			edit: func(t *testing.T) {
				update(t, key, &appsv1.Deployment{}, func(obj client.Object) {
					c := &obj.(*appsv1.Deployment).Spec.Template.Spec.Containers[0]
					c.Image, c.Args = "attacker/image", []string{"--backend", "kubevirt", "--namespace", "other", "--vm", "victim"}
				})
			},
			check: func() error {
				d := &appsv1.Deployment{}
				if err := get(key, d); err != nil {
					return err
				}
				if c := d.Spec.Template.Spec.Containers[0]; c.Image != testImage || c.Args[3] != "drift" {
					return fmt.Errorf("image %s args %v", c.Image, c.Args)
				}
				return nil
			},
		},
		{
			name: "Role widened",
			edit: func(t *testing.T) {
				update(t, key, &rbacv1.Role{}, func(obj client.Object) {
					r := obj.(*rbacv1.Role)
					r.Rules[0].ResourceNames = nil
				})
			},
			check: func() error {
				r := &rbacv1.Role{}
				if err := get(key, r); err != nil {
					return err
				}
				if !slices.Equal(r.Rules[0].ResourceNames, []string{"web1"}) {
					return fmt.Errorf("rules %+v", r.Rules)
				}
				return nil
			},
		},
		{
			name:  "Service deleted",
			edit:  func(t *testing.T) { deleteObj(t, key, &corev1.Service{}) },
			check: func() error { return get(key, &corev1.Service{}) },
		},
		{
			name:  "Ingress deleted",
			edit:  func(t *testing.T) { deleteObj(t, key, &networkingv1.Ingress{}) },
			check: func() error { return get(key, &networkingv1.Ingress{}) },
		},
		{
			name:  "RoleBinding deleted",
			edit:  func(t *testing.T) { deleteObj(t, key, &rbacv1.RoleBinding{}) },
			check: func() error { return get(key, &rbacv1.RoleBinding{}) },
		},
		{
			name: "credentials Secret deleted",
			edit: func(t *testing.T) {
				deleteObj(t, types.NamespacedName{Namespace: vm.Namespace, Name: "web1-bmc"}, &corev1.Secret{})
			},
			check: func() error { return enrolledSet(vm) },
		},
		{
			name: "Ingress host edited",
			edit: func(t *testing.T) {
				update(t, key, &networkingv1.Ingress{}, func(obj client.Object) {
					obj.(*networkingv1.Ingress).Spec.Rules[0].Host = "victim.other." + testDomain
				})
			},
			check: func() error {
				in := &networkingv1.Ingress{}
				if err := get(key, in); err != nil {
					return err
				}
				if h := in.Spec.Rules[0].Host; h != "web1.drift."+testDomain {
					return fmt.Errorf("host %s", h)
				}
				return nil
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.edit(t)
			poll.Until(t, "repair", tc.check)
		})
	}
	_ = ctx
}

func TestIPMIAndProtocolSwitches(t *testing.T) {
	vm := enrolledVM(t, "ipmi", "web1")
	key := workloadKey(vm)
	update(t, vm, &v1beta1.VirtualMachineBMC{}, func(obj client.Object) {
		obj.(*v1beta1.VirtualMachineBMC).Spec.IPMI.Enabled = ptr.To(true)
	})
	poll.Until(t, "IPMI port", func() error {
		s := &corev1.Service{}
		if err := get(key, s); err != nil {
			return err
		}
		if !slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == 623 && p.Protocol == corev1.ProtocolUDP }) {
			return fmt.Errorf("ports %+v", s.Spec.Ports)
		}
		d := &appsv1.Deployment{}
		if err := get(key, d); err != nil {
			return err
		}
		if !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--ipmi-listen") {
			return fmt.Errorf("args %v", d.Spec.Template.Spec.Containers[0].Args)
		}
		b := &v1beta1.VirtualMachineBMC{}
		if err := get(vm, b); err != nil {
			return err
		}
		if b.Status.IPMIAddress != "bmc-web1.ipmi.svc:623" {
			return fmt.Errorf("ipmiAddress %q", b.Status.IPMIAddress)
		}
		return nil
	})
	update(t, vm, &v1beta1.VirtualMachineBMC{}, func(obj client.Object) {
		obj.(*v1beta1.VirtualMachineBMC).Spec.Redfish.Enabled = ptr.To(false)
	})
	poll.Until(t, "no Ingress without Redfish", func() error { return gone(key, &networkingv1.Ingress{}) })
	update(t, vm, &v1beta1.VirtualMachineBMC{}, func(obj client.Object) {
		obj.(*v1beta1.VirtualMachineBMC).Spec.IPMI.Enabled = ptr.To(false)
	})
	poll.Until(t, "no Service without either", func() error { return gone(key, &corev1.Service{}) })
}

func TestIngressHostStaysInItsNamespace(t *testing.T) {
	vm := enrolledVM(t, "hosts", "web1")
	update(t, vm, &v1beta1.VirtualMachineBMC{}, func(obj client.Object) {
		obj.(*v1beta1.VirtualMachineBMC).Spec.Ingress.Host = "web1.team-a." + testDomain
	})
	poll.Until(t, "refusal", func() error {
		b := &v1beta1.VirtualMachineBMC{}
		if err := get(vm, b); err != nil {
			return err
		}
		c := meta.FindStatusCondition(b.Status.Conditions, v1beta1.ConditionIngressReady)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "HostNotAllowed" {
			return fmt.Errorf("IngressReady %+v", c)
		}
		return gone(workloadKey(vm), &networkingv1.Ingress{})
	})
	update(t, vm, &v1beta1.VirtualMachineBMC{}, func(obj client.Object) {
		obj.(*v1beta1.VirtualMachineBMC).Spec.Ingress.Host = "redfish.hosts." + testDomain
	})
	poll.Until(t, "a host in the namespace's zone", func() error {
		in := &networkingv1.Ingress{}
		if err := get(workloadKey(vm), in); err != nil {
			return err
		}
		if in.Spec.Rules[0].Host != "redfish.hosts."+testDomain {
			return fmt.Errorf("host %s", in.Spec.Rules[0].Host)
		}
		return nil
	})
}

// fqdnIs checks the --fqdn a BMC's bmc-server Deployment is given: the
// host its Manager says it is reached at; "" wants none.
func fqdnIs(key types.NamespacedName, want string) func() error {
	return func() error {
		d := &appsv1.Deployment{}
		if err := get(key, d); err != nil {
			return err
		}
		args := d.Spec.Template.Spec.Containers[0].Args
		var got, wanted []string
		for i, arg := range args[:len(args)-1] {
			if arg == "--fqdn" {
				got = append(got, args[i+1])
			}
		}
		if want != "" {
			wanted = []string{want}
		}
		if !slices.Equal(got, wanted) {
			return fmt.Errorf("args %q, want --fqdn %q", args, want)
		}
		return nil
	}
}

// hostTaken is nil once the BMC says its host is another's and has no URL.
func hostTaken(key types.NamespacedName) error {
	b := &v1beta1.VirtualMachineBMC{}
	if err := get(key, b); err != nil {
		return err
	}
	c := meta.FindStatusCondition(b.Status.Conditions, v1beta1.ConditionIngressReady)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "HostTaken" || b.Status.RedfishURL != "" {
		return fmt.Errorf("IngressReady %+v, URL %q", c, b.Status.RedfishURL)
	}
	return nil
}

// TestOneHostOneBMC: a BMC asking for a host another BMC of the namespace
// has gets no Ingress and says why; the older keeps it, and the younger
// gets its own host back once it asks for that. Each bmc-server names the
// host its Ingress routes to it, and the one whose claim lost names none.
func TestOneHostOneBMC(t *testing.T) {
	first := enrolledVM(t, "host-claims", "web1")
	second := client.ObjectKeyFromObject(createVM(t, newVM(first.Namespace, "web2")))
	poll.Until(t, "web2's Ingress", func() error { return get(workloadKey(second), &networkingv1.Ingress{}) })
	taken := "web1.host-claims." + testDomain
	update(t, second, &v1beta1.VirtualMachineBMC{}, func(obj client.Object) {
		obj.(*v1beta1.VirtualMachineBMC).Spec.Ingress.Host = taken
	})
	poll.Until(t, "web2 refused", func() error {
		if err := hostTaken(second); err != nil {
			return err
		}
		return gone(workloadKey(second), &networkingv1.Ingress{})
	})
	poll.Until(t, "web1's Ingress kept", func() error {
		in := &networkingv1.Ingress{}
		if err := get(workloadKey(first), in); err != nil {
			return err
		}
		if in.Spec.Rules[0].Host != taken {
			return fmt.Errorf("host %s", in.Spec.Rules[0].Host)
		}
		return nil
	})
	poll.Until(t, "web1 named at its host", fqdnIs(workloadKey(first), taken))
	poll.Until(t, "web2, whose claim lost, named at none", fqdnIs(workloadKey(second), ""))
	update(t, second, &v1beta1.VirtualMachineBMC{}, func(obj client.Object) {
		obj.(*v1beta1.VirtualMachineBMC).Spec.Ingress.Host = ""
	})
	poll.Until(t, "web2 at its own host", func() error {
		in := &networkingv1.Ingress{}
		if err := get(workloadKey(second), in); err != nil {
			return err
		}
		if in.Spec.Rules[0].Host != "web2.host-claims."+testDomain {
			return fmt.Errorf("host %s", in.Spec.Rules[0].Host)
		}
		return nil
	})
	poll.Until(t, "web2 named at its own host", fqdnIs(workloadKey(second), "web2.host-claims."+testDomain))
}

// TestDottedVMKeepsItsHost: a VM whose name has a dot holds its default
// host as any other VM does: a newer VirtualMachineBMC asking for it is
// refused, and the host stays the dotted VM's alone. In the shared mode,
// which serves dotted names (no Service of their own).
func TestDottedVMKeepsItsHost(t *testing.T) {
	sharedManager(t)
	setWorkload(t, "shared")
	dotted := sharedVMs(t, "dotted-host", "web1.rack")[0]
	ns := dotted.Namespace
	newer := client.ObjectKeyFromObject(createVM(t, newVM(ns, "web2")))
	poll.Until(t, "web2 served", func() error { return serves(ns, "web1.rack", "web2") })
	taken := "web1.rack." + ns + "." + testDomain
	editSpec(t, newer, func(b *v1beta1.VirtualMachineBMC) { b.Spec.Ingress.Host = taken })
	poll.Until(t, "web2 refused", func() error { return hostTaken(newer) })
	poll.Until(t, "the host web1.rack's alone", func() error {
		if err := serves(ns, "web1.rack"); err != nil {
			return err
		}
		return sharedIngressRoutes(ns, taken)
	})
}

func TestVirtualMachineBMCIsNamedAfterItsVM(t *testing.T) {
	sharedManager(t)
	ns := namespace(t, "naming", false)
	b := &v1beta1.VirtualMachineBMC{}
	b.Namespace, b.Name, b.Spec.VMName = ns, "mine", "someone-elses"
	err := admin.Create(context.Background(), b)
	if !apierrors.IsInvalid(err) {
		t.Fatalf("create = %v, want Invalid", err)
	}
}

func TestCredentialRotation(t *testing.T) {
	vm := enrolledVM(t, "rotation", "web1")
	secretKey := types.NamespacedName{Namespace: vm.Namespace, Name: "web1-bmc"}
	before := &corev1.Secret{}
	if err := get(secretKey, before); err != nil {
		t.Fatal(err)
	}
	sinceRotation := reconciles(t, "virtualmachinebmc")
	update(t, vm, &v1beta1.VirtualMachineBMC{}, func(obj client.Object) {
		obj.SetAnnotations(map[string]string{v1beta1.AnnotationRotateCredentials: "2026-12-01"})
	})
	poll.Until(t, "rotation", func() error {
		after := &corev1.Secret{}
		if err := get(secretKey, after); err != nil {
			return err
		}
		if string(after.Data["password"]) == string(before.Data["password"]) {
			return errors.New("password unchanged")
		}
		if string(after.Data["username"]) != string(before.Data["username"]) {
			return errors.New("user name changed")
		}
		b := &v1beta1.VirtualMachineBMC{}
		if err := get(vm, b); err != nil {
			return err
		}
		if b.Status.CredentialsRotation != "2026-12-01" {
			return fmt.Errorf("credentialsRotation %q", b.Status.CredentialsRotation)
		}
		return nil
	})
	// Once per value: nothing rotates again while the annotation stays.
	rotated := &corev1.Secret{}
	if err := get(secretKey, rotated); err != nil {
		t.Fatal(err)
	}
	requireNever(t, "a second rotation", "virtualmachinebmc", sinceRotation, func() error {
		now := &corev1.Secret{}
		if err := get(secretKey, now); err != nil {
			return err
		}
		if now.ResourceVersion != rotated.ResourceVersion {
			return nil
		}
		return errors.New("unchanged")
	})
	if got := rotated.Annotations[v1beta1.AnnotationRotatedFor]; got != "2026-12-01" {
		t.Fatalf("Secret's %s = %q", v1beta1.AnnotationRotatedFor, got)
	}
	// A reconcile that reads the status from before the rotation (a lost
	// status write, a lagging cache) finds the answer on the Secret.
	b := &v1beta1.VirtualMachineBMC{}
	if err := get(vm, b); err != nil {
		t.Fatal(err)
	}
	b.Status.CredentialsRotation = ""
	if err := admin.Status().Update(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the status told again", func() error {
		if err := get(vm, b); err != nil {
			return err
		}
		if b.Status.CredentialsRotation != "2026-12-01" {
			return fmt.Errorf("credentialsRotation %q", b.Status.CredentialsRotation)
		}
		return nil
	})
	if err := get(secretKey, before); err != nil {
		t.Fatal(err)
	}
	if before.ResourceVersion != rotated.ResourceVersion {
		t.Fatal("the Secret was rotated again")
	}
}

// TestBMCRoleReachesOnlyItsVM runs as the ServiceAccount the controller
// made: it may patch its own VM and nothing else in the namespace.
func TestBMCRoleReachesOnlyItsVM(t *testing.T) {
	vm := enrolledVM(t, "rbac", "web1")
	other := createVM(t, newVM(vm.Namespace, "web2"))
	bmcClient := serviceAccountClient(t, vm.Namespace, "bmc-web1")
	ctx := context.Background()
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"runStrategy":"Always"}}`))
	poll.Until(t, "its own VM", func() error {
		return bmcClient.Patch(ctx, &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: vm.Name}}, patch)
	})
	if err := bmcClient.Patch(ctx, other, patch); !apierrors.IsForbidden(err) {
		t.Errorf("patch of another VM = %v, want Forbidden", err)
	}
	if err := bmcClient.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: "web1-bmc"}, &corev1.Secret{}); !apierrors.IsForbidden(err) {
		t.Errorf("read of its Secret through the API = %v, want Forbidden (it is mounted)", err)
	}
	// Its VM's serial console and screen, no other VM's, nothing else of
	// KubeVirt's streams.
	for _, tc := range []struct {
		verb, subresource, vm string
		allowed               bool
	}{
		{"get", "console", "web1", true},
		{"get", "vnc", "web1", true},
		{"get", "console", "web2", false},
		{"get", "vnc", "web2", false},
		{"get", "portforward", "web1", false},
		{"get", "usbredir", "web1", false},
		{"update", "console", "web1", false},
	} {
		if got := mayUseSubresource(t, vm.Namespace, "bmc-web1", tc.verb, tc.subresource, tc.vm); got != tc.allowed {
			t.Errorf("%s virtualmachineinstances/%s of %s allowed = %v, want %v", tc.verb, tc.subresource, tc.vm, got, tc.allowed)
		}
	}
	// Its audit trail: Events in its own namespace, nowhere else.
	event := func(namespace string) *eventsv1.Event {
		return &eventsv1.Event{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "web1.audit"}, EventTime: metav1.NewMicroTime(time.Now()),
			ReportingController: "virtmetal.io/bmc-server", ReportingInstance: "bmc-web1", Action: "Reset", Reason: "BMCReset",
			Regarding: corev1.ObjectReference{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Namespace: namespace, Name: vm.Name}, Type: "Normal",
		}
	}
	if err := bmcClient.Create(ctx, event(vm.Namespace)); err != nil {
		t.Errorf("an Event on its VM = %v, want it recorded", err)
	}
	if err := bmcClient.Create(ctx, event("default")); !apierrors.IsForbidden(err) {
		t.Errorf("an Event in another namespace = %v, want Forbidden", err)
	}

	// Its state Secret, which the controller made, through the backend's
	// own code as the bmc-server runs it; no other Secret.
	cfg, err := env.ConfigFor(kubetest.ServiceAccountUser(vm.Namespace, "bmc-web1"), "system:serviceaccounts")
	if err != nil {
		t.Fatal(err)
	}
	store, err := kubevirt.New(cfg, vm.Namespace, "web1", kubevirt.Options{StateSecret: bmcspec.StateSecretName("web1")})
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "its state Secret", func() error { return store.SaveState(ctx, "redfish-subscriptions", []byte(`{"version":1}`)) })
	if data, err := store.LoadState(ctx, "redfish-subscriptions"); err != nil || string(data) != `{"version":1}` {
		t.Errorf("LoadState as the BMC = %q, %v", data, err)
	}
	poll.Until(t, "web2's state Secret", func() error {
		return get(types.NamespacedName{Namespace: vm.Namespace, Name: bmcspec.StateSecretName("web2")}, &corev1.Secret{})
	})
	if err := bmcClient.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: bmcspec.StateSecretName("web2")}, &corev1.Secret{}); !apierrors.IsForbidden(err) {
		t.Errorf("read of another VM's state Secret = %v, want Forbidden", err)
	}
	if err := bmcClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: "minted"}}); !apierrors.IsForbidden(err) {
		t.Errorf("creating a Secret = %v, want Forbidden", err)
	}
	// The controller puts back a drifted state Secret (its label taken
	// off) and leaves what the BMC wrote in it.
	stateKey := types.NamespacedName{Namespace: vm.Namespace, Name: bmcspec.StateSecretName("web1")}
	update(t, stateKey, &corev1.Secret{}, func(obj client.Object) { obj.SetLabels(nil) })
	poll.Until(t, "the state Secret's labels put back", func() error {
		secret := &corev1.Secret{}
		if err := get(stateKey, secret); err != nil {
			return err
		}
		if secret.Labels[v1beta1.LabelVM] != "web1" {
			return fmt.Errorf("labels %v", secret.Labels)
		}
		return nil
	})
	if data, err := store.LoadState(ctx, "redfish-subscriptions"); err != nil || string(data) != `{"version":1}` {
		t.Errorf("after the controller put the Secret back the BMC's state is %q, %v; want it kept", data, err)
	}
}

// TestClusterInstancetypeRBAC uses VirtualMachineBMCs made by hand in
// namespaces that are not opted in: in an opted-in one enrolment makes the
// BMC again at once, and its cluster RBAC with it. Namespace cluster-it with
// VM b-web1 and namespace cluster-it-b with VM web1 each get cluster RBAC of
// their own (a dash-joined name made them one object, which the second
// tenant's BMC took over). Cluster RBAC an earlier version made for a VM
// (cluster-it-c's web1) under the dash-joined name goes; an object under
// such a name made for another VM stays.
func TestClusterInstancetypeRBAC(t *testing.T) {
	sharedManager(t)
	ctx := context.Background()
	legacy := func(namespace, vm, madeFor string) *rbacv1.ClusterRole {
		return &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{
			Name:   bmc.LegacyClusterRBACName(namespace, vm),
			Labels: map[string]string{v1beta1.LabelManagedBy: v1beta1.ManagedByValue, v1beta1.LabelNamespace: namespace, v1beta1.LabelVM: madeFor},
		}}
	}
	earlier, foreign := legacy("cluster-it-c", "web1", "web1"), legacy("cluster-it", "b-web1", "someone-else")
	for _, obj := range []client.Object{earlier, foreign} {
		if err := admin.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	type tenant struct{ namespace, vm string }
	tenants := []tenant{{"cluster-it", "b-web1"}, {"cluster-it-b", "web1"}, {"cluster-it-c", "web1"}}
	var bmcs []*v1beta1.VirtualMachineBMC
	for _, tn := range tenants {
		namespace(t, tn.namespace, false)
		vm := newVM(tn.namespace, tn.vm)
		vm.Spec.Instancetype = &kubevirtv1.InstancetypeMatcher{Name: "u1.small"}
		createVM(t, vm)
		b := &v1beta1.VirtualMachineBMC{}
		b.Namespace, b.Name, b.Spec.VMName = tn.namespace, vm.Name, vm.Name
		if err := admin.Create(ctx, b); err != nil {
			t.Fatal(err)
		}
		bmcs = append(bmcs, b)
	}
	for _, tn := range tenants {
		name := types.NamespacedName{Name: bmc.ClusterRBACName(tn.namespace, tn.vm)}
		poll.Until(t, "cluster RBAC of "+tn.namespace+"/"+tn.vm, func() error {
			binding := &rbacv1.ClusterRoleBinding{}
			if err := get(name, &rbacv1.ClusterRole{}); err != nil {
				return err
			}
			if err := get(name, binding); err != nil {
				return err
			}
			if len(binding.Subjects) != 1 || binding.Subjects[0].Namespace != tn.namespace || binding.Subjects[0].Name != "bmc-"+tn.vm {
				return fmt.Errorf("subjects %+v, want only bmc-%s of %s", binding.Subjects, tn.vm, tn.namespace)
			}
			return nil
		})
	}
	poll.Until(t, "the earlier version's cluster RBAC of the VM deleted", func() error {
		return gone(types.NamespacedName{Name: earlier.Name}, &rbacv1.ClusterRole{})
	})
	if err := get(types.NamespacedName{Name: foreign.Name}, &rbacv1.ClusterRole{}); err != nil {
		t.Errorf("cluster RBAC of another VM under the old name: %v, want it left", err)
	}

	for i, b := range bmcs {
		if err := admin.Delete(ctx, b); err != nil {
			t.Fatal(err)
		}
		name := types.NamespacedName{Name: bmc.ClusterRBACName(tenants[i].namespace, tenants[i].vm)}
		poll.Until(t, "cluster RBAC removed with the BMC", func() error {
			if err := gone(name, &rbacv1.ClusterRole{}); err != nil {
				return err
			}
			if err := gone(name, &rbacv1.ClusterRoleBinding{}); err != nil {
				return err
			}
			return gone(client.ObjectKeyFromObject(b), &v1beta1.VirtualMachineBMC{})
		})
	}
}

func TestTwoNamespacesSameVMName(t *testing.T) {
	a := enrolledVM(t, "team-a", "web1")
	b := enrolledVM(t, "team-b", "web1")
	hosts, users, macs, uuids := map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, vm := range []types.NamespacedName{a, b} {
		poll.Until(t, "identity", func() error { return serialIs(vm, "web1."+vm.Namespace) })
		vmObj := &kubevirtv1.VirtualMachine{}
		if err := get(vm, vmObj); err != nil {
			t.Fatal(err)
		}
		macs[vmObj.Spec.Template.Spec.Domain.Devices.Interfaces[0].MacAddress] = true
		uuids[string(vmObj.Spec.Template.Spec.Domain.Firmware.UUID)] = true
		in := &networkingv1.Ingress{}
		if err := get(workloadKey(vm), in); err != nil {
			t.Fatal(err)
		}
		hosts[in.Spec.Rules[0].Host] = true
		s := &corev1.Secret{}
		if err := get(types.NamespacedName{Namespace: vm.Namespace, Name: "web1-bmc"}, s); err != nil {
			t.Fatal(err)
		}
		users[string(s.Data["username"])] = true
	}
	delete(macs, "")
	delete(uuids, "")
	if len(hosts) != 2 || len(users) != 2 || len(macs) != 2 || len(uuids) != 2 {
		t.Errorf("hosts %v users %v MACs %v UUIDs %v: want two of each", hosts, users, macs, uuids)
	}
}

// update reads key into obj, edits it and writes it back.
func update(t *testing.T, key types.NamespacedName, obj client.Object, edit func(client.Object)) {
	t.Helper()
	poll.Until(t, "update", func() error {
		if err := get(key, obj); err != nil {
			return err
		}
		edit(obj)
		return admin.Update(context.Background(), obj)
	})
}

func deleteObj(t *testing.T, key types.NamespacedName, obj client.Object) {
	t.Helper()
	if err := get(key, obj); err != nil {
		t.Fatal(err)
	}
	if err := admin.Delete(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
}

// requireNever fails if check succeeds before the named controller has
// settled since it had finished `since` reconciles (it finished more, and
// has none queued or running), or within a second after: what must not
// happen is given the time the controller would take to do it, not only
// a second in which it might not have run yet.
func requireNever(t *testing.T, what, controller string, since float64, check func() error) {
	t.Helper()
	poll.Until(t, controller+" settled", func() error {
		if check() == nil {
			t.Fatalf("%s happened", what)
		}
		return settled(controller, since)
	})
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if check() == nil {
			t.Fatalf("%s happened", what)
		}
		time.Sleep(poll.Interval)
	}
}

// reconciles is how many reconciles the named controller ("": every one)
// has finished, in every manager of the test process.
func reconciles(t testing.TB, controller string) float64 {
	t.Helper()
	n, err := controllerMetric("controller_runtime_reconcile_total", "controller", controller)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// settled is nil once the named controller has finished more than since
// reconciles and has nothing queued or running.
func settled(controller string, since float64) error {
	done, err := controllerMetric("controller_runtime_reconcile_total", "controller", controller)
	if err != nil {
		return err
	}
	queued, err := controllerMetric("workqueue_depth", "name", controller)
	if err != nil {
		return err
	}
	running, err := controllerMetric("controller_runtime_active_workers", "controller", controller)
	if err != nil {
		return err
	}
	if done <= since || queued > 0 || running > 0 {
		return fmt.Errorf("%v reconciles (since %v), %v queued, %v running", done, since, queued, running)
	}
	return nil
}

// controllerMetric sums the metric's series whose label is value ("": all).
func controllerMetric(name, label, value string) (float64, error) {
	families, err := metrics.Registry.Gather()
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if value != "" && !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == label && l.GetValue() == value }) {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				sum += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return sum, nil
}

type deploymentCheck struct {
	what string
	ok   bool
}

// checkBMCDeployment checks what every bmc-server Deployment must be, in
// either workload mode, and the mode's own checks.
func checkBMCDeployment(t *testing.T, d *appsv1.Deployment, serviceAccount string, own []deploymentCheck) {
	t.Helper()
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	checks := append([]deploymentCheck{
		{"one replica", *d.Spec.Replicas == 1},
		{"the configured image", c.Image == testImage},
		{"no credentials in env", len(c.Env) == 0 && len(c.EnvFrom) == 0},
		{"its own ServiceAccount", pod.ServiceAccountName == serviceAccount},
		{"non-root", *pod.SecurityContext.RunAsNonRoot && *pod.SecurityContext.RunAsUser != 0},
		{"read-only root", *c.SecurityContext.ReadOnlyRootFilesystem},
		{"no privilege escalation", !*c.SecurityContext.AllowPrivilegeEscalation},
		{"capabilities dropped", slices.Equal(c.SecurityContext.Capabilities.Drop, []corev1.Capability{"ALL"})},
		{"requests and limits", !c.Resources.Requests.Memory().IsZero() && !c.Resources.Limits.Memory().IsZero() && !c.Resources.Limits.Cpu().IsZero()},
		{"probes on the Redfish port", c.ReadinessProbe.HTTPGet.Path == "/readyz" && c.LivenessProbe.HTTPGet.Path == "/healthz" && c.LivenessProbe.HTTPGet.Port.String() == "redfish"},
		{"no IPMI port; metrics on the pod network only", len(c.Ports) == 2 && c.Ports[0].Name == "redfish" &&
			c.Ports[1].Name == "metrics" && c.Ports[1].ContainerPort == 9100 && slices.Contains(c.Args, "--metrics-listen")},
	}, own...)
	for _, check := range checks {
		if !check.ok {
			t.Errorf("Deployment: want %s; pod spec %+v", check.what, pod)
		}
	}
}

// readyOnceAvailable marks the Deployment deployment available, as
// kube-controller-manager would, and waits for the VirtualMachineBMC bmc to
// turn Ready.
func readyOnceAvailable(t *testing.T, deployment, bmc types.NamespacedName) {
	t.Helper()
	d := &appsv1.Deployment{}
	if err := get(deployment, d); err != nil {
		t.Fatal(err)
	}
	d.Status.Replicas, d.Status.AvailableReplicas, d.Status.ReadyReplicas = 1, 1, 1
	d.Status.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable"}}
	if err := admin.Status().Update(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "Ready", func() error {
		b := &v1beta1.VirtualMachineBMC{}
		if err := get(bmc, b); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(b.Status.Conditions, v1beta1.ConditionReady) {
			return fmt.Errorf("conditions %+v", b.Status.Conditions)
		}
		return nil
	})
}

// serviceAccountClient is a client that authenticates as the ServiceAccount
// namespace/name, as its pod would.
func serviceAccountClient(t *testing.T, namespace, name string) client.Client {
	t.Helper()
	cfg, err := env.ConfigFor(kubetest.ServiceAccountUser(namespace, name), "system:serviceaccounts")
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: admin.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestFailedApplyIsReported: a workload object the API server refuses
// (here a Service, by an admission policy of the namespace) shows in the
// status at once, as a False condition carrying the refusal, with Ready
// False and the conditions reached before it kept; once the refusal goes,
// a retry makes the condition True again.
func TestFailedApplyIsReported(t *testing.T) {
	sharedManager(t)
	ns := namespace(t, "refused", true)
	lift := refuse(t, ns, "services", "no Service is admitted here", &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	})
	key := client.ObjectKeyFromObject(createVM(t, newVM(ns, "web1")))
	condition := func(b *v1beta1.VirtualMachineBMC, conditionType string) metav1.Condition {
		if c := meta.FindStatusCondition(b.Status.Conditions, conditionType); c != nil {
			return *c
		}
		return metav1.Condition{}
	}
	poll.Until(t, "the refused Service in the status", func() error {
		b := &v1beta1.VirtualMachineBMC{}
		if err := get(key, b); err != nil {
			return err
		}
		service, ready, vm := condition(b, v1beta1.ConditionServiceReady), condition(b, v1beta1.ConditionReady), condition(b, v1beta1.ConditionVMFound)
		if service.Status != metav1.ConditionFalse || service.Reason != "WorkloadFailed" || !strings.Contains(service.Message, "no Service is admitted here") {
			return fmt.Errorf("ServiceReady %+v", service)
		}
		if ready.Status != metav1.ConditionFalse || !strings.Contains(ready.Message, v1beta1.ConditionServiceReady) {
			return fmt.Errorf("Ready %+v", ready)
		}
		if vm.Status != metav1.ConditionTrue {
			return fmt.Errorf("VMFound %+v, reached before the failure", vm)
		}
		return nil
	})
	lift()
	poll.Until(t, "the Service once the policy is gone", func() error {
		b := &v1beta1.VirtualMachineBMC{}
		if err := get(key, b); err != nil {
			return err
		}
		if c := condition(b, v1beta1.ConditionServiceReady); c.Status != metav1.ConditionTrue {
			return fmt.Errorf("ServiceReady %+v", c)
		}
		return get(workloadKey(key), &corev1.Service{})
	})
}

// refuse makes the API server refuse every create and update of resource
// (a core kind's plural) in namespace, with message, until the returned
// lift is called (or the test ends). probe, a valid object of that kind in
// namespace, tells when the refusal is in force (created as a dry run).
func refuse(t *testing.T, namespace, resource, message string, probe client.Object) (lift func()) {
	t.Helper()
	ctx := context.Background()
	name := "refuse-" + resource + "-in-" + namespace
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{"", "apps"}, APIVersions: []string{"v1"}, Resources: []string{resource}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: message}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{corev1.LabelMetadataName: namespace},
			}},
		},
	}
	for _, obj := range []client.Object{policy, binding} {
		if err := admin.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	lift = func() {
		for _, obj := range []client.Object{binding, policy} {
			if err := admin.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(lift)
	poll.Until(t, "the refusal in force", func() error {
		if err := admin.Create(ctx, probe.DeepCopyObject().(client.Object), client.DryRunAll); err == nil {
			return fmt.Errorf("%s still admitted", resource)
		}
		return nil
	})
	return lift
}

// TestClusterRBACIsOwnedByItsNamespace: a BMC's cluster RBAC is owned by
// its Namespace in pod-per-VM mode as in shared mode, and a
// VirtualMachineBMC left with the finalizer of earlier versions loses it
// (so its deletion is not held) while its cluster RBAC stays served.
func TestClusterRBACIsOwnedByItsNamespace(t *testing.T) {
	sharedManager(t)
	ctx := context.Background()
	ns := namespace(t, "cluster-owner", false)
	vm := newVM(ns, "web1")
	vm.Spec.Instancetype = &kubevirtv1.InstancetypeMatcher{Name: "u1.small"}
	createVM(t, vm)
	b := &v1beta1.VirtualMachineBMC{}
	b.Namespace, b.Name, b.Spec.VMName = ns, vm.Name, vm.Name
	b.Finalizers = []string{"bmc.virtmetal.io/cluster-rbac"}
	if err := admin.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	namespaceObj := &corev1.Namespace{}
	if err := admin.Get(ctx, types.NamespacedName{Name: ns}, namespaceObj); err != nil {
		t.Fatal(err)
	}
	name := types.NamespacedName{Name: bmc.ClusterRBACName(ns, "web1")}
	poll.Until(t, "cluster RBAC owned by the Namespace, no finalizer", func() error {
		for _, obj := range []client.Object{&rbacv1.ClusterRole{}, &rbacv1.ClusterRoleBinding{}} {
			if err := get(name, obj); err != nil {
				return err
			}
			if owners := obj.GetOwnerReferences(); len(owners) != 1 || owners[0].Kind != "Namespace" || owners[0].UID != namespaceObj.UID {
				return fmt.Errorf("%T owners %+v", obj, owners)
			}
		}
		got := &v1beta1.VirtualMachineBMC{}
		if err := get(client.ObjectKeyFromObject(b), got); err != nil {
			return err
		}
		if len(got.Finalizers) != 0 {
			return fmt.Errorf("finalizers %v", got.Finalizers)
		}
		return nil
	})
	// The VM leaves its cluster instancetype: the RBAC goes, the BMC stays.
	update(t, client.ObjectKeyFromObject(vm), &kubevirtv1.VirtualMachine{}, func(obj client.Object) {
		obj.(*kubevirtv1.VirtualMachine).Spec.Instancetype = nil
	})
	poll.Until(t, "cluster RBAC removed with the instancetype", func() error {
		if err := gone(name, &rbacv1.ClusterRole{}); err != nil {
			return err
		}
		return gone(name, &rbacv1.ClusterRoleBinding{})
	})
}

// mayUseSubresource asks the API server's authorizer whether the
// ServiceAccount may verb a VMI's subresource.kubevirt.io subresource (what
// virt-api's aggregated API is authorized as; envtest runs no virt-api).
func mayUseSubresource(t *testing.T, namespace, account, verb, subresource, vmi string) bool {
	t.Helper()
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   kubetest.ServiceAccountUser(namespace, account),
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: namespace, Verb: verb, Group: kubevirtv1.SubresourceGroupName,
			Resource: "virtualmachineinstances", Subresource: subresource, Name: vmi,
		},
	}}
	if err := admin.Create(context.Background(), review); err != nil {
		t.Fatalf("SubjectAccessReview: %v", err)
	}
	return review.Status.Allowed
}
