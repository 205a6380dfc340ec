// Package controllers holds bmc-controller's reconcilers: enrolment (every VM
// of an opted-in namespace gets a VirtualMachineBMC and an identity) and the
// BMC reconciler (each VirtualMachineBMC gets its bmc-server workload).
// Nothing here speaks Redfish or IPMI: the workload runs bmc-server.
package controllers

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Config is what the controller's behaviour depends on besides the objects
// it reconciles.
type Config struct {
	// Domain makes BMC host names: <vm>.<namespace>.<Domain>.
	Domain string
	// NamespaceSelector picks the namespaces whose VMs are enrolled.
	NamespaceSelector labels.Selector
	// IngressClass is the default ingressClassName of BMC Ingresses.
	IngressClass string
	// Issuer and ClusterIssuer name the default cert-manager issuer of BMC
	// Ingress certificates; both empty means a TLS Secret is expected.
	Issuer        string
	ClusterIssuer string
	// IPMIDefault is whether a VirtualMachineBMC that does not say serves IPMI.
	IPMIDefault bool
	// BMCImage is the container image that runs bmc-server.
	BMCImage string
	// Workload is how BMCs run: WorkloadPodPerVM (also when empty) or
	// WorkloadShared.
	Workload WorkloadMode
	// EventDestinationsDenied are networks no bmc-server sends events to
	// nor has images fetched from (its --destinations-denied): the
	// cluster's pod and service networks, so that a tenant's event
	// subscription or virtual media cannot reach into another tenant's
	// pods or the cluster's services.
	EventDestinationsDenied []netip.Prefix
	// TrustedProxies are the Ingress controller's addresses (its pods',
	// or its nodes' with hostNetwork): every bmc-server's
	// --trusted-proxies, so that it throttles failed logins per client
	// behind the Ingress rather than per Ingress. See
	// validateTrustedProxies for the networks refused.
	TrustedProxies []netip.Prefix
	// NetworkPolicy is the BMC pods' NetworkPolicy.
	NetworkPolicy NetworkPolicyConfig
}

// WorkloadMode is how BMCs run.
type WorkloadMode string

// Workload modes.
const (
	// WorkloadPodPerVM runs one bmc-server Deployment per VM.
	WorkloadPodPerVM WorkloadMode = "pod-per-vm"
	// WorkloadShared runs one bmc-server per namespace for the VMs it can
	// serve (Redfish without IPMI), which costs the API server a few writes
	// per VM instead of a dozen.
	WorkloadShared WorkloadMode = "shared"
)

// shared says whether the shared workload mode is on.
func (c Config) shared() bool { return c.Workload == WorkloadShared }

// Keys of the optional ConfigMap that overrides the flags at run time.
const (
	configKeyNamespaceSelector = "namespaceSelector"
	configKeyDomain            = "domain"
	configKeyIngressClass      = "ingressClass"
	configKeyIssuer            = "tlsIssuer"
	configKeyClusterIssuer     = "tlsClusterIssuer"
	configKeyIPMIDefault       = "ipmiDefault"
	configKeyBMCImage          = "bmcImage"
	configKeyWorkload          = "workload"
	// Comma-separated CIDRs; the second is the key's former name.
	configKeyDestinationsDenied      = "destinationsDenied"
	configKeyEventDestinationsDenied = "eventDestinationsDenied"
	configKeyTrustedProxies          = "trustedProxies"
)

// ParseNetworks reads comma-separated CIDRs; "" is none.
func ParseNetworks(value string) ([]netip.Prefix, error) {
	var networks []netip.Prefix
	for _, cidr := range strings.Split(value, ",") {
		if cidr = strings.TrimSpace(cidr); cidr == "" {
			continue
		}
		p, err := netip.ParsePrefix(cidr)
		if err != nil {
			return nil, err
		}
		networks = append(networks, p.Masked())
	}
	return networks, nil
}

// networksArg is a list of networks as bmc-server's flags take it.
func networksArg(networks []netip.Prefix) string {
	cidrs := make([]string, len(networks))
	for i, p := range networks {
		cidrs[i] = p.String()
	}
	return strings.Join(cidrs, ",")
}

// Validate reports a Config that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Domain == "":
		return fmt.Errorf("the BMC domain is required")
	case len(validation.IsDNS1123Subdomain(c.Domain)) > 0:
		return fmt.Errorf("domain %q is not a DNS name: %s", c.Domain, strings.Join(validation.IsDNS1123Subdomain(c.Domain), "; "))
	case c.NamespaceSelector == nil:
		return fmt.Errorf("a namespace selector is required")
	case c.BMCImage == "":
		return fmt.Errorf("the bmc-server image is required")
	case c.Issuer != "" && c.ClusterIssuer != "":
		return fmt.Errorf("a TLS issuer and a cluster issuer exclude each other")
	case c.Workload != "" && c.Workload != WorkloadPodPerVM && c.Workload != WorkloadShared:
		return fmt.Errorf("workload %q is neither %s nor %s", c.Workload, WorkloadPodPerVM, WorkloadShared)
	}
	return validateTrustedProxies(c.TrustedProxies, c.EventDestinationsDenied)
}

// Trusted proxies are at most 256 addresses: room for an Ingress
// controller's replicas, or the few nodes it runs on with hostNetwork,
// many times over, and never a pod network (a /16 by default) or a service
// network. Whoever sends from a trusted address names the client in
// X-Forwarded-For, so it could throttle any client address it names: only
// the Ingress controller may.
const (
	maxTrustedProxyBitsIPv4 = 32 - 8
	maxTrustedProxyBitsIPv6 = 128 - 8
)

// validateTrustedProxies refuses a trusted-proxy network wider than the
// bound above, one that covers a network listed in denied (the pod and
// service networks), and an IPv4-mapped IPv6 one (clients' addresses are
// compared unmapped, so it would match nobody).
func validateTrustedProxies(trusted, denied []netip.Prefix) error {
	for _, p := range trusted {
		switch {
		case p.Addr().Is4In6():
			return fmt.Errorf("%s %s: write an IPv4 network in IPv4 form", configKeyTrustedProxies, p)
		case p.Addr().Is4() && p.Bits() < maxTrustedProxyBitsIPv4, p.Addr().Is6() && p.Bits() < maxTrustedProxyBitsIPv6:
			return fmt.Errorf("%s %s is wider than /%d (IPv4) or /%d (IPv6): list the Ingress controller's addresses, never a whole pod network",
				configKeyTrustedProxies, p, maxTrustedProxyBitsIPv4, maxTrustedProxyBitsIPv6)
		}
		for _, d := range denied {
			if d = unmapped(d); p.Bits() <= d.Bits() && p.Contains(d.Addr()) {
				return fmt.Errorf("%s %s covers %s, a pod or service network (%s): list the Ingress controller's addresses only",
					configKeyTrustedProxies, p, d, configKeyDestinationsDenied)
			}
		}
	}
	return nil
}

// unmapped is p with an IPv4-mapped IPv6 network written as IPv4.
func unmapped(p netip.Prefix) netip.Prefix {
	if !p.Addr().Is4In6() || p.Bits() < 96 {
		return p
	}
	return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
}

// ConfigSource gives the Config in force: the flags' Config, overridden key
// by key by a ConfigMap when one is named, so that an admin can change the
// opt-in selector (or any other key) without restarting or recreating
// anything. The ConfigMap is read through the manager's cache.
type ConfigSource struct {
	Defaults Config
	// ConfigMap names the overriding ConfigMap; empty Name means none.
	ConfigMap types.NamespacedName
	Reader    client.Reader
}

// Get returns the Config in force. A missing ConfigMap means the defaults;
// a ConfigMap that does not parse is an error, so that a typo stops the
// controller's work instead of enrolling the wrong namespaces.
func (s *ConfigSource) Get(ctx context.Context) (Config, error) {
	cfg := s.Defaults
	if s.ConfigMap.Name == "" {
		return cfg, nil
	}
	var cm corev1.ConfigMap
	if err := s.Reader.Get(ctx, s.ConfigMap, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return cfg, nil
		}
		return cfg, fmt.Errorf("read config %s: %w", s.ConfigMap, err)
	}
	cfg, err := cfg.overlay(cm.Data)
	if err != nil {
		return cfg, fmt.Errorf("config %s: %w", s.ConfigMap, err)
	}
	return cfg, cfg.Validate()
}

func (c Config) overlay(data map[string]string) (Config, error) {
	for key, value := range data {
		var err error
		switch key {
		case configKeyNamespaceSelector:
			err = parseInto(value, func(s string) (labels.Selector, error) { return labels.Parse(s) }, &c.NamespaceSelector)
		case configKeyDomain:
			c.Domain = value
		case configKeyIngressClass:
			c.IngressClass = value
		case configKeyIssuer:
			c.Issuer = value
		case configKeyClusterIssuer:
			c.ClusterIssuer = value
		case configKeyIPMIDefault:
			err = parseInto(value, strconv.ParseBool, &c.IPMIDefault)
		case configKeyBMCImage:
			c.BMCImage = value
		case configKeyWorkload:
			c.Workload = WorkloadMode(value)
		case configKeyDestinationsDenied, configKeyEventDestinationsDenied:
			err = parseInto(value, ParseNetworks, &c.EventDestinationsDenied)
		case configKeyTrustedProxies:
			err = parseInto(value, ParseNetworks, &c.TrustedProxies)
		default:
			var handled bool
			if handled, err = c.NetworkPolicy.overlay(key, value); !handled {
				return c, fmt.Errorf("unknown key %q", key)
			}
		}
		if err != nil {
			return c, fmt.Errorf("%s: %w", key, err)
		}
	}
	return c, nil
}

// parseInto sets *into to value parsed, leaving it as it was on an error.
func parseInto[T any](value string, parse func(string) (T, error), into *T) error {
	parsed, err := parse(value)
	if err == nil {
		*into = parsed
	}
	return err
}
