package deploy

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/virtmetal/virtmetal/internal/kubetest"
	"github.com/virtmetal/virtmetal/internal/poll"
)

const hostPolicy = "virtmetal-bmc-hosts"

// TestHostPolicyReadsTheControllersDomain: the host policy learns the BMC
// domain from the very ConfigMap the controller reads, so that one value
// sets both.
func TestHostPolicyReadsTheControllersDomain(t *testing.T) {
	objects := build(t)
	var policy unstructured.Unstructured
	var binding unstructured.Unstructured
	for _, o := range objects {
		switch o.GetKind() {
		case "ValidatingAdmissionPolicy":
			policy = *o
		case "ValidatingAdmissionPolicyBinding":
			binding = *o
		}
	}
	if policy.GetName() != hostPolicy || binding.GetName() != hostPolicy {
		t.Fatalf("no policy and binding %s in %v", hostPolicy, kinds(objects))
	}
	for _, o := range []unstructured.Unstructured{policy, binding} {
		if o.GetNamespace() != "" {
			t.Errorf("%s %s is cluster-scoped, yet built with namespace %q", o.GetKind(), o.GetName(), o.GetNamespace())
		}
	}
	paramKind, _, _ := unstructured.NestedStringMap(policy.Object, "spec", "paramKind")
	if paramKind["apiVersion"] != "v1" || paramKind["kind"] != "ConfigMap" {
		t.Errorf("paramKind %v, want the v1 ConfigMap", paramKind)
	}
	paramRef, _, _ := unstructured.NestedStringMap(binding.Object, "spec", "paramRef")
	// The ConfigMap whose name the controller's --config gives
	// (TestConfigIsWhatTheControllerReads).
	var cm corev1.ConfigMap
	find(t, objects, "ConfigMap", "virtmetal-config", &cm)
	if paramRef["name"] != cm.Name || paramRef["namespace"] != cm.Namespace || cm.Data["domain"] == "" {
		t.Errorf("paramRef %v, want the controller's ConfigMap %s/%s, whose domain is %q", paramRef, cm.Namespace, cm.Name, cm.Data["domain"])
	}
	if paramRef["parameterNotFoundAction"] != "Deny" {
		t.Errorf("paramRef %v: without its ConfigMap the policy must refuse, not let every host through", paramRef)
	}
}

// TestBMCHostsBelongToTheirNamespace installs deploy/'s host policy, as
// built, on a real API server (which evaluates it: no webhook server) and
// attacks as a tenant that is admin of its own namespace only: tenant-b
// claims tenant-a's BMC hosts with Ingresses, first while the Gateway API
// is not installed, then with Gateway API routes once it is.
func TestBMCHostsBelongToTheirNamespace(t *testing.T) {
	log.SetLogger(logr.Discard())
	env, err := kubetest.Start(kubetest.Options{WithoutCDI: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	admin := env.Client

	objects := build(t)
	var domain string
	for _, o := range objects {
		switch {
		case o.GetKind() == "ConfigMap" && o.GetName() == "virtmetal-config":
			domain, _, _ = unstructured.NestedString(o.Object, "data", "domain")
		case o.GetKind() != "Namespace" && !strings.HasPrefix(o.GetKind(), "ValidatingAdmissionPolicy"):
			continue
		}
		// As kubectl apply: namespaced or not is the server's to say.
		if err := admin.Apply(ctx, client.ApplyConfigurationFromUnstructured(o.DeepCopy()), client.FieldOwner("kubectl"), client.ForceOwnership); err != nil {
			t.Fatalf("apply %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	if domain == "" {
		t.Fatal("the built ConfigMap virtmetal-config has no domain")
	}

	const tenant = "tenant-b-admin"
	for _, ns := range []string{"tenant-a", "tenant-b"} {
		if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	// The built-in admin role, as kube-controller-manager would fill it.
	if err := env.AggregateClusterRoles(ctx); err != nil {
		t.Fatal(err)
	}
	bindInTenantB(ctx, t, admin, tenant, "admin")
	tenantConfig, err := env.ConfigFor(tenant)
	if err != nil {
		t.Fatal(err)
	}
	tenantB, err := client.New(tenantConfig, client.Options{Scheme: admin.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := tenantB.Create(ctx, bmcIngress("tenant-a", "reach", []string{"www.example.org"}, nil), client.DryRunAll); !apierrors.IsForbidden(err) {
		t.Fatalf("tenant-b writes an Ingress in tenant-a (%v): not admin of its own namespace only", err)
	}

	victim := "web1.tenant-a." + domain
	// The API server starts enforcing once it has seen the policy, its
	// binding and the ConfigMap.
	poll.Until(t, "the policy enforced", func() error {
		return refusal(tenantB.Create(ctx, bmcIngress("tenant-b", "probe", []string{victim}, nil), client.DryRunAll), victim)
	})

	t.Run("Ingress", func(t *testing.T) {
		many := make([]string, 500)
		for i := range many {
			many[i] = fmt.Sprintf("x%d.tenant-b.%s", i, domain)
		}
		tests := []struct {
			name       string
			hosts, tls []string
			refused    []string // hosts the refusal names; none: admitted
		}{
			{"another namespace's VM", []string{victim}, nil, []string{victim}},
			{"a VM not yet created", []string{"web9.tenant-a." + domain}, nil, []string{"web9.tenant-a." + domain}},
			{"the bare domain", []string{domain}, nil, []string{domain}},
			{"the whole domain by wildcard", []string{"*." + domain}, nil, []string{"*." + domain}},
			{"another namespace's zone by wildcard", []string{"*.tenant-a." + domain}, nil, []string{"*.tenant-a." + domain}},
			{"a wildcard above the domain", []string{"*." + parent(domain)}, nil, []string{"*." + parent(domain)}},
			{"its own bare zone", []string{"tenant-b." + domain}, nil, []string{"tenant-b." + domain}},
			{"another namespace's VM in TLS only", []string{"www.example.org"}, []string{"www.example.org", victim}, []string{victim}},
			{"its own host next to another's", []string{"x.tenant-b." + domain, victim}, nil, []string{victim}},
			{"its own zone", []string{"x.tenant-b." + domain}, []string{"x.tenant-b." + domain}, nil},
			{"its own zone by wildcard", []string{"*.tenant-b." + domain}, nil, nil},
			{"a dotted VM of its own named like another namespace", []string{"web1.tenant-a.tenant-b." + domain}, nil, nil},
			{"many hosts of its own", many, many, nil},
			{"outside the domain", []string{"www.example.org"}, []string{"www.example.org"}, nil},
			{"a name ending like the domain", []string{"evil" + domain}, nil, nil},
			{"the domain inside another", []string{victim + ".example.net"}, nil, nil},
			{"no host", []string{""}, nil, nil},
		}
		for i, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				in := bmcIngress("tenant-b", fmt.Sprintf("claim%d", i), tc.hosts, tc.tls)
				err := tenantB.Create(ctx, in)
				if tc.refused == nil {
					if err != nil {
						t.Fatalf("tenant-b's Ingress for %v refused: %v", tc.hosts, err)
					}
					if err := tenantB.Delete(ctx, in); err != nil {
						t.Fatal(err)
					}
					return
				}
				if err := refusal(err, tc.refused...); err != nil {
					t.Fatalf("tenant-b's Ingress for %v: %v", tc.hosts, err)
				}
			})
		}
		t.Run("an update to another namespace's VM", func(t *testing.T) {
			in := bmcIngress("tenant-b", "later", []string{"x.tenant-b." + domain}, nil)
			if err := tenantB.Create(ctx, in); err != nil {
				t.Fatal(err)
			}
			in.Spec.Rules[0].Host = victim
			if err := refusal(tenantB.Update(ctx, in), victim); err != nil {
				t.Fatalf("tenant-b's update to %s: %v", victim, err)
			}
		})
	})

	t.Run("the domain follows the controller's ConfigMap", func(t *testing.T) {
		config := &corev1.ConfigMap{}
		key := client.ObjectKey{Namespace: "virtmetal-system", Name: "virtmetal-config"}
		if err := admin.Get(ctx, key, config); err != nil {
			t.Fatal(err)
		}
		original := config.DeepCopy()
		t.Cleanup(func() {
			restored := original.DeepCopy()
			restored.ResourceVersion = ""
			if err := admin.Delete(ctx, config); client.IgnoreNotFound(err) != nil {
				t.Error(err)
			}
			if err := admin.Create(ctx, restored); err != nil {
				t.Error(err)
			}
			poll.Until(t, "the policy enforced again", func() error {
				return refusal(tenantB.Create(ctx, bmcIngress("tenant-b", "probe", []string{victim}, nil), client.DryRunAll), victim)
			})
		})
		moved := "web1.tenant-a.bmc.example.net"
		config.Data["domain"] = "bmc.example.net"
		if err := admin.Update(ctx, config); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, "the new domain's hosts refused", func() error {
			return refusal(tenantB.Create(ctx, bmcIngress("tenant-b", "probe", []string{moved}, nil), client.DryRunAll), moved)
		})
		if err := tenantB.Create(ctx, bmcIngress("tenant-b", "probe", []string{victim}, nil), client.DryRunAll); err != nil {
			t.Errorf("a host of the former domain, now no BMC's, refused: %v", err)
		}
		// Without a domain it cannot tell a BMC's host from another: it
		// refuses every host rather than let a claim through.
		config.Data["domain"] = ""
		if err := admin.Update(ctx, config); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, "every host refused without a domain", func() error {
			err := tenantB.Create(ctx, bmcIngress("tenant-b", "probe", []string{"www.example.org"}, nil), client.DryRunAll)
			if err := refusal(err); err != nil {
				return err
			}
			if !strings.Contains(err.Error(), "has no domain") {
				return fmt.Errorf("refusal %q does not say the domain is missing", err)
			}
			return nil
		})
		// Nor without the ConfigMap.
		if err := admin.Delete(ctx, config); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, "every host refused without the ConfigMap", func() error {
			err := tenantB.Create(ctx, bmcIngress("tenant-b", "probe", []string{"www.example.org"}, nil), client.DryRunAll)
			if err == nil || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+hostPolicy+"'") || !strings.Contains(err.Error(), "no params found") {
				return fmt.Errorf("%v, want refused by %s for want of its ConfigMap", err, hostPolicy)
			}
			return nil
		})
	})

	// The policy was installed, and the Ingresses checked, while the
	// Gateway API was not.
	route := &unstructured.Unstructured{}
	route.SetGroupVersionKind(schema.GroupVersionKind{Group: gatewayGroup, Version: "v1", Kind: "HTTPRoute"})
	route.SetNamespace("tenant-b")
	route.SetName("before")
	if err := admin.Create(ctx, route); !meta.IsNoMatchError(err) {
		t.Fatalf("creating an HTTPRoute before the Gateway API is installed = %v, want no such kind", err)
	}
	routeKinds := map[string]string{"HTTPRoute": "httproutes", "GRPCRoute": "grpcroutes", "TLSRoute": "tlsroutes"}
	var crds []*apiextensionsv1.CustomResourceDefinition
	for kind, plural := range routeKinds {
		crds = append(crds, routeCRD(kind, plural))
	}
	if _, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{CRDs: crds}); err != nil {
		t.Fatal(err)
	}
	// Namespace admins write routes, as a cluster with the Gateway API
	// would let them.
	routeWriter := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "gateway-route-writer", Labels: map[string]string{"rbac.authorization.k8s.io/aggregate-to-admin": "true"}},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{gatewayGroup}, Resources: slices.Sorted(maps.Values(routeKinds)), Verbs: []string{"create", "update", "delete", "get"}}},
	}
	if err := admin.Create(ctx, routeWriter); err != nil {
		t.Fatal(err)
	}
	if err := env.AggregateClusterRoles(ctx); err != nil {
		t.Fatal(err)
	}

	t.Run("Gateway API routes", func(t *testing.T) {
		tests := []struct {
			name      string
			hostnames []string
			refused   []string
		}{
			{"another namespace's VM", []string{victim}, []string{victim}},
			{"another namespace's VM in upper case", []string{strings.ToUpper(victim)}, []string{victim}},
			{"the whole domain by wildcard", []string{"*." + domain}, []string{"*." + domain}},
			{"another namespace's zone by wildcard", []string{"*.tenant-a." + domain}, []string{"*.tenant-a." + domain}},
			{"a wildcard above the domain", []string{"*." + parent(domain)}, []string{"*." + parent(domain)}},
			{"its own host next to another's", []string{"x.tenant-b." + domain, victim}, []string{victim}},
			{"its own zone", []string{"x.tenant-b." + domain, "*.tenant-b." + domain}, nil},
			{"outside the domain", []string{"www.example.org"}, nil},
			{"no hostnames", nil, nil},
		}
		for _, kind := range slices.Sorted(maps.Keys(routeKinds)) {
			t.Run(kind, func(t *testing.T) {
				for i, tc := range tests {
					t.Run(tc.name, func(t *testing.T) {
						r := &unstructured.Unstructured{}
						r.SetGroupVersionKind(schema.GroupVersionKind{Group: gatewayGroup, Version: "v1", Kind: kind})
						r.SetNamespace("tenant-b")
						r.SetName(fmt.Sprintf("claim%d", i))
						if tc.hostnames != nil {
							if err := unstructured.SetNestedStringSlice(r.Object, tc.hostnames, "spec", "hostnames"); err != nil {
								t.Fatal(err)
							}
						}
						err := tenantB.Create(ctx, r)
						if tc.refused == nil {
							if err != nil {
								t.Fatalf("tenant-b's %s for %v refused: %v", kind, tc.hostnames, err)
							}
							if err := tenantB.Delete(ctx, r); err != nil {
								t.Fatal(err)
							}
							return
						}
						if err := refusal(err, tc.refused...); err != nil {
							t.Fatalf("tenant-b's %s for %v: %v", kind, tc.hostnames, err)
						}
					})
				}
			})
		}
	})
}

const gatewayGroup = "gateway.networking.k8s.io"

// refusal is nil when err is the host policy's refusal naming hosts.
func refusal(err error, hosts ...string) error {
	if err == nil {
		return fmt.Errorf("admitted, want refused by %s", hostPolicy)
	}
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+hostPolicy+"'") {
		return fmt.Errorf("%w, want refused by %s", err, hostPolicy)
	}
	for _, h := range hosts {
		if !strings.Contains(err.Error(), h) {
			return fmt.Errorf("refusal %q does not name %s", err, h)
		}
	}
	return nil
}

// bindInTenantB gives user the ClusterRole role in namespace tenant-b only.
func bindInTenantB(ctx context.Context, t *testing.T, c client.Client, user, role string) {
	t.Helper()
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-b", Name: user + "-" + role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	if err := c.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
}

// bmcIngress is an Ingress as an attacker would write it: the BMC's
// Redfish path, longer than the BMC Ingress's "/", to a Service of its own.
func bmcIngress(namespace, name string, hosts, tlsHosts []string) *networkingv1.Ingress {
	in := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	backend := networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "mine", Port: networkingv1.ServiceBackendPort{Number: 443}}}
	for _, h := range hosts {
		in.Spec.Rules = append(in.Spec.Rules, networkingv1.IngressRule{Host: h, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
			Paths: []networkingv1.HTTPIngressPath{{Path: "/redfish/v1/Systems", PathType: ptr.To(networkingv1.PathTypePrefix), Backend: backend}},
		}}})
	}
	if tlsHosts != nil {
		in.Spec.TLS = []networkingv1.IngressTLS{{Hosts: tlsHosts, SecretName: "mine-tls"}}
	}
	return in
}

// routeCRD is a minimal structural stand-in for a Gateway API route kind:
// the policy reads spec.hostnames alone. Its hostnames have no pattern, so
// that names the real CRD would refuse (upper case) reach the policy.
func routeCRD(kind, plural string) *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{
			Name: plural + "." + gatewayGroup,
			// A *.k8s.io group wants this; a stand-in is not approved.
			Annotations: map[string]string{"api-approved.kubernetes.io": "unapproved, a test stand-in"},
		},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: gatewayGroup,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: kind, ListKind: kind + "List", Plural: plural, Singular: strings.ToLower(kind)},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {
							Type:                   "object",
							XPreserveUnknownFields: ptr.To(true),
							Properties: map[string]apiextensionsv1.JSONSchemaProps{
								"hostnames": {Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &apiextensionsv1.JSONSchemaProps{Type: "string"}}},
							},
						},
					},
				}},
			}},
		},
	}
}

// parent is domain without its first label: bmc.example.org's example.org.
func parent(domain string) string {
	_, rest, _ := strings.Cut(domain, ".")
	return rest
}
