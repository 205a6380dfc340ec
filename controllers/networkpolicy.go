package controllers

import (
	"fmt"
	"net/netip"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/virtmetal/virtmetal/internal/egress"
)

// NetworkPolicyConfig is the NetworkPolicy the controller renders next to
// each bmc-server (a VM's, or a namespace's shared one), which lets its
// pod be reached only from the Ingress controller (and on the IPMI port
// when IPMI is on), and reach only the API server, DNS and the event
// destinations an operator opts in. A cluster without a NetworkPolicy
// implementation stores it and enforces nothing.
type NetworkPolicyConfig struct {
	// Enabled renders the NetworkPolicy; off, the controller deletes the
	// ones it made.
	Enabled bool
	// IngressNamespaces selects the namespaces whose pods may reach the
	// Redfish port: the Ingress controller's (default
	// DefaultIngressNamespaces).
	IngressNamespaces labels.Selector
	// APIServer are the networks the API server is reached at, on TCP 443
	// and 6443. Empty means every address outside the denied networks and
	// those the BMC always refuses: what works without knowing the
	// control plane's addresses, and lets in no pod or service.
	APIServer []netip.Prefix
	// EventDestinations are networks event subscriptions may deliver to
	// (any port); empty means none is reachable.
	EventDestinations []netip.Prefix
}

// Keys of the ConfigMap that set NetworkPolicyConfig.
const (
	configKeyNetworkPolicy                  = "networkPolicy"
	configKeyNetworkPolicyIngressNamespaces = "networkPolicyIngressNamespaces"
	configKeyNetworkPolicyAPIServer         = "networkPolicyAPIServer"
	configKeyNetworkPolicyEventDestinations = "networkPolicyEventDestinations"
)

// DefaultIngressNamespaces is where ingress-nginx installs by default.
const DefaultIngressNamespaces = "kubernetes.io/metadata.name=ingress-nginx"

// apiServerPorts: 6443 is kube-apiserver's own port, which NetworkPolicy
// implementations see after the kubernetes Service's DNAT; 443 is the
// Service's, for those that match before it, and managed control planes.
var apiServerPorts = []int32{443, 6443}

// dnsPods are the cluster DNS's pods, in any namespace: CoreDNS's and
// kube-dns's label.
var dnsPods = map[string]string{"k8s-app": "kube-dns"}

// bmcNetworkPolicy is the NetworkPolicy of the pods with meta's labels;
// ipmi opens the IPMI port to every source, as the IPMI Service does.
func bmcNetworkPolicy(meta metav1.ObjectMeta, ipmi bool, cfg Config) (*networkingv1.NetworkPolicy, error) {
	selector := DefaultIngressNamespaces
	if cfg.NetworkPolicy.IngressNamespaces != nil {
		selector = cfg.NetworkPolicy.IngressNamespaces.String()
	}
	ingressNamespaces, err := metav1.ParseToLabelSelector(selector)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", configKeyNetworkPolicyIngressNamespaces, err)
	}
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	port := func(protocol corev1.Protocol, p intstr.IntOrString) networkingv1.NetworkPolicyPort {
		return networkingv1.NetworkPolicyPort{Protocol: &protocol, Port: &p}
	}
	ingress := []networkingv1.NetworkPolicyIngressRule{{
		From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: ingressNamespaces}},
		Ports: []networkingv1.NetworkPolicyPort{port(tcp, intstr.FromString("redfish"))},
	}}
	if ipmi {
		ingress = append(ingress, networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{port(udp, intstr.FromString("ipmi"))}})
	}
	apiServer := networkingv1.NetworkPolicyEgressRule{To: ipBlocks(cfg.NetworkPolicy.APIServer)}
	if len(cfg.NetworkPolicy.APIServer) == 0 {
		apiServer.To = outside(egress.RefusedNetworks(egress.Options{Denied: cfg.EventDestinationsDenied}))
	}
	for _, p := range apiServerPorts {
		apiServer.Ports = append(apiServer.Ports, port(tcp, intstr.FromInt32(p)))
	}
	egressRules := []networkingv1.NetworkPolicyEgressRule{
		apiServer,
		{
			To:    []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: dnsPods}}},
			Ports: []networkingv1.NetworkPolicyPort{port(udp, intstr.FromInt32(53)), port(tcp, intstr.FromInt32(53))},
		},
	}
	if len(cfg.NetworkPolicy.EventDestinations) > 0 {
		egressRules = append(egressRules, networkingv1.NetworkPolicyEgressRule{To: ipBlocks(cfg.NetworkPolicy.EventDestinations)})
	}
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: meta,
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: meta.Labels},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress:     ingress,
			Egress:      egressRules,
		},
	}, nil
}

func ipBlocks(networks []netip.Prefix) []networkingv1.NetworkPolicyPeer {
	peers := make([]networkingv1.NetworkPolicyPeer, len(networks))
	for i, n := range networks {
		peers[i] = networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: n.Masked().String()}}
	}
	return peers
}

// outside is every IPv4 and IPv6 address except those of excluded.
func outside(excluded []netip.Prefix) []networkingv1.NetworkPolicyPeer {
	v4 := &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}
	v6 := &networkingv1.IPBlock{CIDR: "::/0"}
	for _, n := range excluded {
		n = n.Masked()
		switch {
		case n.Bits() == 0: // a whole family is no exception a block can have
		case n.Addr().Is4():
			v4.Except = append(v4.Except, n.String())
		default:
			v6.Except = append(v6.Except, n.String())
		}
	}
	return []networkingv1.NetworkPolicyPeer{{IPBlock: v4}, {IPBlock: v6}}
}

// overlay sets the NetworkPolicyConfig key of the ConfigMap;
// handled is false for a key that is none of its.
func (c *NetworkPolicyConfig) overlay(key, value string) (handled bool, err error) {
	switch key {
	case configKeyNetworkPolicy:
		return true, parseInto(value, strconv.ParseBool, &c.Enabled)
	case configKeyNetworkPolicyIngressNamespaces:
		return true, parseInto(value, func(s string) (labels.Selector, error) { return labels.Parse(s) }, &c.IngressNamespaces)
	case configKeyNetworkPolicyAPIServer:
		return true, parseInto(value, ParseNetworks, &c.APIServer)
	case configKeyNetworkPolicyEventDestinations:
		return true, parseInto(value, ParseNetworks, &c.EventDestinations)
	}
	return false, nil
}
