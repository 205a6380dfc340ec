package bmcspec

import "testing"

func TestMachineProof(t *testing.T) {
	a, b := NewMachineProof(), NewMachineProof()
	if !IsMachineProof(a) || !IsMachineProof(b) {
		t.Fatalf("NewMachineProof gave %q and %q, not of the proof's form", a, b)
	}
	if a == b {
		t.Fatalf("two proofs are both %q", a)
	}
	for _, bad := range []string{"", "vmp1-", "vmp1-0123", "VMP1-0123456789abcdef0123456789abcdef", "vmp1-0123456789ABCDEF0123456789abcdef", "vmp1-0123456789abcdef0123456789abcdeg", "vmp1_0123456789abcdef0123456789abcdef", " " + a, a + "0", a[:len(a)-1]} {
		if IsMachineProof(bad) {
			t.Errorf("IsMachineProof(%q) = true", bad)
		}
	}
}

func TestProofFromReport(t *testing.T) {
	proof := "vmp1-0123456789abcdef0123456789abcdef"
	other := "vmp1-ffffffffffffffffffffffffffffffff"
	for _, tc := range []struct{ name, output, want string }{
		{"none", "INFO: Redfish BMC of VM ns/vm is vm.ns.example\n", ""},
		{"reported", "INFO: x\n" + ProofReportKey + ": " + proof + "\n", proof},
		{"last line wins", ProofReportKey + ": " + other + "\n" + ProofReportKey + ": " + proof, proof},
		{"malformed ignored", ProofReportKey + ": " + proof + "\n" + ProofReportKey + ": not-a-proof\n", proof},
		{"not at line start", "echo " + ProofReportKey + ": " + proof + "\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ProofFromReport(tc.output); got != tc.want {
				t.Errorf("ProofFromReport = %q, want %q", got, tc.want)
			}
		})
	}
}
