package controllers_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/controllers"
	"github.com/virtmetal/virtmetal/internal/poll"
)

// TestNetworkPolicyRendered: the NetworkPolicy of a VM's bmc-server
// selects its pod; lets in the Ingress controller's namespaces on the
// Redfish port and, with IPMI on, anyone on the IPMI port, nothing else;
// lets out the API server's ports outside the denied and always refused
// networks, DNS, and the opted-in event destinations, nothing else.
func TestNetworkPolicyRendered(t *testing.T) {
	cfg := defaultConfig()
	cfg.EventDestinationsDenied = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("::ffff:10.96.0.0/108")}
	cfg.NetworkPolicy = controllers.NetworkPolicyConfig{Enabled: true, IngressNamespaces: labels.SelectorFromSet(labels.Set{"kubernetes.io/metadata.name": "ingress"}),
		EventDestinations: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}
	for _, ipmi := range []bool{false, true} {
		t.Run(fmt.Sprintf("IPMI %v", ipmi), func(t *testing.T) {
			b := &v1beta1.VirtualMachineBMC{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "web1", UID: "uid"}, Spec: v1beta1.VirtualMachineBMCSpec{VMName: "web1"}}
			b.Spec.IPMI.Enabled = ptr.To(ipmi)
			w, err := controllers.PodPerVM(controllers.WorkloadInput{BMC: b, VM: newVM("tenant-a", "web1"), Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			policy := only[*networkingv1.NetworkPolicy](t, w.Objects)
			pod := only[*appsv1.Deployment](t, w.Objects).Spec.Template
			if !equality.Semantic.DeepEqual(policy.Spec.PodSelector.MatchLabels, pod.Labels) || policy.Name != "bmc-web1" {
				t.Errorf("policy %s selects %v, the pod is %v", policy.Name, policy.Spec.PodSelector.MatchLabels, pod.Labels)
			}
			if !slices.Equal(policy.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
				t.Errorf("policy types %v, want both", policy.Spec.PolicyTypes)
			}
			wantIngress := []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "ingress"}}}},
				Ports: []networkingv1.NetworkPolicyPort{npPort(corev1.ProtocolTCP, "redfish")},
			}}
			if ipmi {
				wantIngress = append(wantIngress, networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{npPort(corev1.ProtocolUDP, "ipmi")}})
			}
			if !equality.Semantic.DeepEqual(policy.Spec.Ingress, wantIngress) {
				t.Errorf("ingress %+v\nwant %+v", policy.Spec.Ingress, wantIngress)
			}
			for _, port := range pod.Spec.Containers[0].Ports {
				if port.Name == "ipmi" && !ipmi || port.Name != "redfish" && port.Name != "ipmi" && port.Name != "metrics" {
					t.Errorf("pod port %s", port.Name)
				}
			}
			egress := policy.Spec.Egress
			if len(egress) != 3 {
				t.Fatalf("egress rules %+v, want API server, DNS, event destinations", egress)
			}
			api := egress[0]
			if len(api.To) != 2 || api.To[0].IPBlock == nil || api.To[0].IPBlock.CIDR != "0.0.0.0/0" || api.To[1].IPBlock == nil || api.To[1].IPBlock.CIDR != "::/0" {
				t.Fatalf("API server peers %+v", api.To)
			}
			for _, refused := range []string{"10.244.0.0/16", "10.96.0.0/12", "169.254.0.0/16", "127.0.0.0/8", "100.100.100.200/32"} {
				if !slices.Contains(api.To[0].IPBlock.Except, refused) {
					t.Errorf("API server's IPv4 block lets in %s: except %v", refused, api.To[0].IPBlock.Except)
				}
			}
			for _, refused := range []string{"fe80::/10", "::1/128", "fd00:ec2::254/128"} {
				if !slices.Contains(api.To[1].IPBlock.Except, refused) {
					t.Errorf("API server's IPv6 block lets in %s: except %v", refused, api.To[1].IPBlock.Except)
				}
			}
			if want := []networkingv1.NetworkPolicyPort{npPortNumber(corev1.ProtocolTCP, 443), npPortNumber(corev1.ProtocolTCP, 6443)}; !equality.Semantic.DeepEqual(api.Ports, want) {
				t.Errorf("API server ports %+v", api.Ports)
			}
			dns := egress[1]
			if len(dns.To) != 1 || dns.To[0].PodSelector == nil || dns.To[0].PodSelector.MatchLabels["k8s-app"] != "kube-dns" || len(dns.Ports) != 2 {
				t.Errorf("DNS rule %+v", dns)
			}
			if events := egress[2]; len(events.To) != 1 || events.To[0].IPBlock.CIDR != "203.0.113.0/24" || len(events.Ports) != 0 {
				t.Errorf("event destinations rule %+v", events)
			}
		})
	}
	t.Run("API server networks given", func(t *testing.T) {
		cfg := cfg
		cfg.NetworkPolicy.APIServer = []netip.Prefix{netip.MustParsePrefix("192.0.2.10/32")}
		cfg.NetworkPolicy.EventDestinations = nil
		b := &v1beta1.VirtualMachineBMC{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "web1", UID: "uid"}, Spec: v1beta1.VirtualMachineBMCSpec{VMName: "web1"}}
		w, err := controllers.PodPerVM(controllers.WorkloadInput{BMC: b, VM: newVM("tenant-a", "web1"), Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		egress := only[*networkingv1.NetworkPolicy](t, w.Objects).Spec.Egress
		if len(egress) != 2 || len(egress[0].To) != 1 || egress[0].To[0].IPBlock.CIDR != "192.0.2.10/32" {
			t.Errorf("egress %+v, want the API server's network and DNS only", egress)
		}
	})
}

// TestNetworkPolicyApplied: with networkPolicy on in the ConfigMap, every
// bmc-server, a VM's and a namespace's shared one, gets its NetworkPolicy
// on the API server; a rule added to it is taken back; off, they go.
func TestNetworkPolicyApplied(t *testing.T) {
	vm := enrolledVM(t, "netpol", "web1")
	on := map[string]string{"networkPolicy": "true", "networkPolicyIngressNamespaces": "kubernetes.io/metadata.name=ingress", "destinationsDenied": "10.244.0.0/16"}
	setConfig(t, on)
	defer setConfig(t, nil)
	key := workloadKey(vm)
	applied := func(key types.NamespacedName) func() error {
		return func() error {
			p := &networkingv1.NetworkPolicy{}
			if err := get(key, p); err != nil {
				return err
			}
			if len(p.Spec.Ingress) != 1 || len(p.Spec.Egress) != 2 || !slices.Contains(p.Spec.Egress[0].To[0].IPBlock.Except, "10.244.0.0/16") {
				return fmt.Errorf("NetworkPolicy %s: %+v", key, p.Spec)
			}
			return nil
		}
	}
	poll.Until(t, "the VM's NetworkPolicy", applied(key))

	p := &networkingv1.NetworkPolicy{}
	if err := get(key, p); err != nil {
		t.Fatal(err)
	}
	p.Spec.Ingress = append(p.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{}) // from anywhere, to any port
	if err := admin.Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the added rule taken back", applied(key))

	shared := map[string]string{"workload": "shared"}
	for k, v := range on {
		shared[k] = v
	}
	setConfig(t, shared)
	poll.Until(t, "the shared bmc-server's NetworkPolicy", applied(sharedKey(vm.Namespace)))

	setConfig(t, map[string]string{"networkPolicy": "false", "workload": "shared"})
	poll.Until(t, "the shared NetworkPolicy deleted", func() error { return gone(sharedKey(vm.Namespace), &networkingv1.NetworkPolicy{}) })
	setConfig(t, map[string]string{"networkPolicy": "false"})
	poll.Until(t, "the VM's bmc-server back", func() error { return workloadExists(vm) })
	poll.Until(t, "the VM's NetworkPolicy deleted", func() error { return gone(key, &networkingv1.NetworkPolicy{}) })
}

// only is the one object of type T among objects.
func only[T client.Object](t *testing.T, objects []client.Object) T {
	t.Helper()
	var found []T
	for _, o := range objects {
		if typed, ok := o.(T); ok {
			found = append(found, typed)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("%d objects of type %T, want one", len(found), zero)
	}
	return found[0]
}

func npPort(protocol corev1.Protocol, name string) networkingv1.NetworkPolicyPort {
	port := intstr.FromString(name)
	return networkingv1.NetworkPolicyPort{Protocol: &protocol, Port: &port}
}

func npPortNumber(protocol corev1.Protocol, number int32) networkingv1.NetworkPolicyPort {
	port := intstr.FromInt32(number)
	return networkingv1.NetworkPolicyPort{Protocol: &protocol, Port: &port}
}
