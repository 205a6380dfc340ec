package bmcspec

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
)

// A machine proof is the secret that binds a MaaS machine to a VM. MaaS
// enlistment is anonymous and everything a machine reports of itself by
// default is public or derived from names: the power address and SMBIOS
// serial name the VM, the SMBIOS UUID and MACs are derived from its name and
// sent in DHCP broadcasts. So the controller gives each enrolled VM 128
// random bits that only its guest can read, as the SMBIOS chassis asset tag
// (KubeVirt's spec.domain.chassis.asset, stamped by the identity webhook);
// the commissioning script prints them as a ProofReportKey line, MaaS
// stores that output, and the MaaS reconciler binds a machine claiming the
// VM only when what MaaS stored for it is the VM's proof. Another tenant can
// read neither the VM's spec nor its guest's SMBIOS.

// machineProofPrefix marks a value as a virtmetal machine proof, and its
// format's version.
const machineProofPrefix = "vmp1-"

// NewMachineProof returns a fresh machine proof: 128 bits from crypto/rand.
func NewMachineProof() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24 and later)
	return machineProofPrefix + hex.EncodeToString(b[:])
}

// IsMachineProof says whether s has a machine proof's form.
func IsMachineProof(s string) bool {
	hexPart, ok := strings.CutPrefix(s, machineProofPrefix)
	if !ok || len(hexPart) != 32 {
		return false
	}
	for i := range len(hexPart) {
		if c := hexPart[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// ProofReportKey starts the line in which the commissioning script reports
// the proof it read from SMBIOS: "virtmetal-machine-proof: <proof>".
const ProofReportKey = "virtmetal-machine-proof"

// ProofFromReport finds the machine proof in a commissioning script's
// output: the value of its last well-formed ProofReportKey line, "" when
// there is none.
func ProofFromReport(output string) string {
	proof := ""
	for line := range strings.Lines(output) {
		value, found := strings.CutPrefix(strings.TrimSpace(line), ProofReportKey+":")
		if value = strings.TrimSpace(value); found && IsMachineProof(value) {
			proof = value
		}
	}
	return proof
}
