// Package bmcspec holds the contracts between virtmetal's parts that none
// of them owns: how a BMC's host name is formed, and what the shared
// bmc-server reads for each VM it serves. It imports nothing, so the
// bmc-server side (which never links Kubernetes) and the Kubernetes side
// (the controller, the MaaS reconciler) agree without importing each other.
package bmcspec

import (
	"encoding/json"
	"regexp"
	"sync"
)

// Host is the DNS name of a VM's BMC, "<vm>.<namespace>.<domain>": the
// controller's Ingress serves it, the shared bmc-server routes by it, MaaS
// stores it as the power address, and the commissioning script builds it
// from the VM's SMBIOS serial "<vm>.<namespace>".
func Host(namespace, vm, domain string) string { return vm + "." + Zone(namespace, domain) }

// Zone is a namespace's subdomain of domain: every BMC host of the
// namespace is inside it, and a host a tenant asks for outside it is
// refused.
func Zone(namespace, domain string) string { return namespace + "." + domain }

// SharedSecret is the controller's Secret of a namespace's shared
// bmc-server: a key per VM served, named after the VM, holding its SharedVM.
// Where a VM has no credentials Secret of its own, its entry here is where
// its credentials are, for the MaaS reconciler and the tenant too.
const SharedSecret = "virtmetal-bmcs"

// SharedStateSecret is the Secret a namespace's shared bmc-server keeps its
// VMs' protocol state in (Redfish's event subscriptions): a key per VM,
// named after the VM, holding a JSON object of the VM's state keys. One
// Secret a namespace, not one a VM, so that enrolling a VM writes none.
const SharedStateSecret = "virtmetal-bmcs-state"

// StateSecretName is the Secret a VM's own bmc-server (not the shared
// one: SharedStateSecret) keeps its protocols' state in (Redfish's event
// subscriptions, whose headers may carry a destination's credentials,
// hence a Secret). The controller creates it; the bmc-server may only get
// and patch it, since Kubernetes cannot limit create by name.
func StateSecretName(vm string) string { return vm + "-bmc-state" }

// SharedVM is one VM's file in the shared bmc-server's --vms-dir, a key
// named after the VM in the controller's Secret SharedSecret. The
// bmc-server serves the VM at Hosts (the request's Host header picks the
// VM) to the one account given.
type SharedVM struct {
	Username string   `json:"username"`
	Password string   `json:"password"`
	Hosts    []string `json:"hosts"`
	// StateSecret is the Secret whose key named after the VM holds its
	// state (SharedStateSecret); empty, the VM's own Secret
	// "<vm>-bmc-state", as controllers before SharedStateSecret made.
	StateSecret string `json:"stateSecret,omitempty"`
	// RotatedFor is the controller's bookkeeping, which the bmc-server
	// ignores: the rotate-credentials request that Password answers, when
	// the credentials are this entry's own (the VM has no credentials
	// Secret).
	RotatedFor string `json:"rotatedFor,omitempty"`
}

// ParseCredentials reads a VM's entry of SharedSecret as the parts that
// hand out its credentials do: ok only when it is a SharedVM with both a
// user name and a password.
func ParseCredentials(data []byte) (entry SharedVM, ok bool) {
	if err := json.Unmarshal(data, &entry); err != nil {
		return SharedVM{}, false
	}
	return entry, entry.Username != "" && entry.Password != ""
}

// EncodeStateEntry is a VM's kept state, the data of a state Secret of its
// own key by key, as its entry of SharedStateSecret.
func EncodeStateEntry(state map[string][]byte) ([]byte, error) { return json.Marshal(state) }

// DecodeStateEntry reads a VM's entry of SharedStateSecret back into its
// kept state, key by key.
func DecodeStateEntry(raw []byte) (map[string][]byte, error) {
	var state map[string][]byte
	if err := json.Unmarshal(raw, &state); err != nil {
		return nil, err
	}
	return state, nil
}

// dns1123Subdomain is a Kubernetes object name, as VM names and host names
// are; the pattern is Kubernetes', restated so this package imports none of
// its modules. Compiled at first use: a BMC's heap keeps it only when
// needed.
var dns1123Subdomain = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
})

// IsDNSName says whether s is a lower-case DNS name (a DNS-1123 subdomain):
// a VM's name, or a host its BMC is reached at.
func IsDNSName(s string) bool {
	return len(s) <= 253 && dns1123Subdomain().MatchString(s)
}
