// Package maas connects virtmetal VMs to Canonical MaaS. A VM enlists in MaaS
// by PXE boot and the commissioning script in deploy/maas gives MaaS the VM's
// Redfish address; this package finishes the job from outside: a MaaS REST
// client (Client), a reconciler that supplies the BMC credentials, names the
// machine, files it into its namespace's resource pool and commissions it
// (Reconciler), and the Kubernetes side it reads from and reports to (Cluster).
package maas

import (
	"crypto/sha256"
	"encoding/hex"
	"net/url"
	"regexp"
	"strings"

	"github.com/virtmetal/virtmetal/internal/bmcspec"
)

// VMRef names a KubeVirt VirtualMachine.
type VMRef struct {
	Namespace string
	Name      string
}

func (v VMRef) String() string { return v.Namespace + "/" + v.Name }

// BMCHost is the DNS name of the VM's BMC: "<vm>.<namespace>.<domain>". The
// commissioning script builds the same name from the VM's SMBIOS serial.
func BMCHost(vm VMRef, domain string) string {
	return bmcspec.Host(vm.Namespace, vm.Name, domain)
}

// BMCAddress is the Redfish power address MaaS should store for the VM: the
// bare host name. MaaS's redfish driver adds https:// itself, and MaaS 3.4's
// region answers HTTP 500 to an address with a scheme.
func BMCAddress(vm VMRef, domain string) string {
	return BMCHost(vm, domain)
}

var (
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// IsDNSLabel reports whether s is an RFC 1123 label, as Kubernetes requires
// of namespace names.
func IsDNSLabel(s string) bool { return dnsLabel.MatchString(s) }

// IsDNSSubdomain reports whether s is an RFC 1123 subdomain, as Kubernetes
// requires of VirtualMachine names (they may contain dots).
func IsDNSSubdomain(s string) bool {
	return len(s) <= 253 && dnsSubdomain.MatchString(s)
}

// ParseBMCAddress recognises a power address that points at a virtmetal BMC
// under domain and returns the VM it serves. The address may carry a scheme,
// a port and a path; anything else (another tool's BMC, a physical server's
// IP, a malformed URL) gives ok == false. The namespace is a DNS label, so it
// is the last dot-separated part before the domain; everything left of it is
// the VM name, dots included.
func ParseBMCAddress(address, domain string) (vm VMRef, ok bool) {
	address = strings.TrimSpace(address)
	if address == "" || domain == "" {
		return VMRef{}, false
	}
	if !strings.Contains(address, "://") {
		address = "https://" + address
	}
	u, err := url.Parse(address)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") {
		return VMRef{}, false
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	left, found := strings.CutSuffix(host, "."+strings.ToLower(domain))
	if !found {
		return VMRef{}, false
	}
	dot := strings.LastIndexByte(left, '.')
	if dot < 0 {
		return VMRef{}, false
	}
	vm = VMRef{Name: left[:dot], Namespace: left[dot+1:]}
	if !IsDNSSubdomain(vm.Name) || !IsDNSLabel(vm.Namespace) {
		return VMRef{}, false
	}
	return vm, true
}

// maxHostnameLength is the longest MaaS host label: MaaS hostnames are DNS
// names and a dot would make MaaS read the rest as a DNS domain.
const maxHostnameLength = 63

// hashSuffixLength is how many hex digits of the VM's identity hash tell
// apart names that had to be shortened or that collide.
const hashSuffixLength = 8

// Hostname is the MaaS hostname the reconciler prefers for the VM:
// "<vm>-<namespace>", dots turned into dashes so it stays one DNS label, and
// shortened with a stable hash of the VM's identity when longer than 63.
func Hostname(vm VMRef) string {
	base := strings.ToLower(strings.ReplaceAll(vm.Name, ".", "-") + "-" + vm.Namespace)
	if len(base) <= maxHostnameLength {
		return base
	}
	return HashedHostname(vm)
}

// HashedHostname is the VM's fallback MaaS hostname, used when Hostname is
// too long or already held by another machine: "<vm>-<namespace>" cut short
// and suffixed with a hash of "<vm>.<namespace>", which no other VM shares.
func HashedHostname(vm VMRef) string {
	base := strings.ToLower(strings.ReplaceAll(vm.Name, ".", "-") + "-" + vm.Namespace)
	sum := sha256.Sum256([]byte(vm.Name + "." + vm.Namespace))
	suffix := hex.EncodeToString(sum[:])[:hashSuffixLength]
	keep := maxHostnameLength - len(suffix) - 1
	if len(base) > keep {
		base = strings.TrimRight(base[:keep], "-")
	}
	return base + "-" + suffix
}

// SystemHostname is the VM's last-resort MaaS hostname, for when both
// Hostname and HashedHostname are held by other machines: anyone can
// predict those and enlist a machine holding them first, but not the system
// ID MaaS gives the VM's machine when it enlists. "<vm>-<namespace>" cut
// short, and the system ID.
func SystemHostname(vm VMRef, systemID string) string {
	id := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, strings.ToLower(systemID))
	base := strings.ToLower(strings.ReplaceAll(vm.Name, ".", "-") + "-" + vm.Namespace)
	if keep := maxHostnameLength - len(id) - 1; len(base) > keep {
		base = strings.TrimRight(base[:max(keep, 0)], "-")
	}
	return base + "-" + id
}
