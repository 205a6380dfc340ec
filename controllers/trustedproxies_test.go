package controllers_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/virtmetal/virtmetal/controllers"
	"github.com/virtmetal/virtmetal/internal/poll"
)

// TestTrustedProxiesReachEveryBMC: the config's trusted proxies (the
// Ingress controller's addresses) are on the command line of every
// bmc-server, one VM's and a namespace's shared one, so that behind the
// Ingress each client's failed logins are its own (issue 35 item 5).
func TestTrustedProxiesReachEveryBMC(t *testing.T) {
	vm := enrolledVM(t, "trusted-proxies", "web1")
	const trusted = "10.244.3.0/24,fd00:10:244:3::/120"
	args := func(key types.NamespacedName) func() error { return argsContain(key, "--trusted-proxies "+trusted) }
	setConfig(t, map[string]string{"trustedProxies": "10.244.3.0/24, fd00:10:244:3::/120", "eventDestinationsDenied": "10.244.0.0/16"})
	poll.Until(t, "the trusted proxies on the VM's bmc-server", args(workloadKey(vm)))
	setConfig(t, map[string]string{"trustedProxies": trusted, "workload": "shared"})
	poll.Until(t, "the trusted proxies on the shared bmc-server", args(sharedKey(vm.Namespace)))
	setConfig(t, nil)
}

// argsContain is nil once the bmc-server of Deployment key has want among
// its arguments.
func argsContain(key types.NamespacedName, want string) func() error {
	return func() error {
		d := &appsv1.Deployment{}
		if err := get(key, d); err != nil {
			return err
		}
		got := strings.Join(d.Spec.Template.Spec.Containers[0].Args, " ")
		if !strings.Contains(got, want) {
			return fmt.Errorf("args %s", got)
		}
		return nil
	}
}

// TestTrustedProxiesRefused: a trusted-proxy network that would trust
// more than an Ingress controller (a pod or service network, anything
// wider than /24 or /120) is a config error that says why, from the
// ConfigMap as from the flags.
func TestTrustedProxiesRefused(t *testing.T) {
	denied := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("10.244.7.0/24")}
	for _, tt := range []struct {
		name, trusted, wantErr string
	}{
		{"one address", "10.244.3.17/32", ""},
		{"a node's pod range", "10.244.3.0/24", ""},
		{"IPv6 addresses", "fd00:10:244:3::/120", ""},
		{"the pod network", "10.244.0.0/16", "wider than /24 (IPv4) or /120 (IPv6)"},
		{"everything", "0.0.0.0/0", "wider than /24"},
		{"all of IPv6", "::/0", "wider than /24 (IPv4) or /120 (IPv6)"},
		{"an IPv6 pod range", "fd00:10:244:3::/64", "wider than"},
		{"a listed pod network", "10.244.7.0/24", "covers 10.244.7.0/24, a pod or service network"},
		{"IPv4-mapped", "::ffff:10.244.3.0/120", "IPv4 form"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			trusted, err := controllers.ParseNetworks(tt.trusted)
			if err != nil {
				t.Fatal(err)
			}
			cfg := controllers.Config{Domain: "bmc.example.org", NamespaceSelector: labels.Everything(), BMCImage: "img",
				EventDestinationsDenied: denied, TrustedProxies: trusted}
			err = cfg.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Validate = %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Validate = %v, want an error with %q", err, tt.wantErr)
			}
		})
	}
	setConfig(t, map[string]string{"trustedProxies": "10.244.0.0/16"})
	source := &controllers.ConfigSource{
		Defaults:  controllers.Config{Domain: "bmc.example.org", NamespaceSelector: labels.Everything(), BMCImage: "img"},
		ConfigMap: types.NamespacedName{Namespace: configNamespace, Name: configName},
		Reader:    admin,
	}
	if _, err := source.Get(t.Context()); err == nil || !strings.Contains(err.Error(), "never a whole pod network") {
		t.Errorf("a ConfigMap trusting the pod network: %v, want a refusal", err)
	}
}
