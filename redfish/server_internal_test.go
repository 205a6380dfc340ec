package redfish

import "testing"

func TestIsUUID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{"5b0c7f2e-8a43-4b0e-9d51-000000000001", true},
		{"5B0C7F2E-8A43-4B0E-9D51-00000000000A", true},
		{"", false},
		{"5b0c7f2e8a434b0e9d51000000000001", false},       // no hyphens
		{"{5b0c7f2e-8a43-4b0e-9d51-000000000001}", false}, // braces
		{"urn:uuid:5b0c7f2e-8a43-4b0e-9d51-000000000001", false},
		{"5b0c7f2e-8a43-4b0e-9d51-00000000000g", false},  // not hex
		{"5b0c7f2e-8a43-4b0e-9d5100-0000000001", false},  // hyphen moved
		{"5b0c7f2e-8a43-4b0e-9d51-0000000000011", false}, // too long
		{"5b0c7f2e-8a43-4b0e-9d51-00000000001", false},   // too short
	} {
		t.Run(tc.in, func(t *testing.T) {
			if got := isUUID(tc.in); got != tc.want {
				t.Errorf("isUUID(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}
