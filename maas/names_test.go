package maas

import (
	"strings"
	"testing"
)

func TestParseBMCAddress(t *testing.T) {
	const domain = "bmc.example.org"
	tests := []struct {
		address string
		want    VMRef
		ok      bool
	}{
		{"https://vm-0.tenant-a.bmc.example.org", VMRef{Namespace: "tenant-a", Name: "vm-0"}, true},
		{"vm-0.tenant-a.bmc.example.org", VMRef{Namespace: "tenant-a", Name: "vm-0"}, true},
		{"https://vm-0.tenant-a.bmc.example.org:8443/redfish/v1", VMRef{Namespace: "tenant-a", Name: "vm-0"}, true},
		{"http://vm-0.tenant-a.bmc.example.org/", VMRef{Namespace: "tenant-a", Name: "vm-0"}, true},
		{"https://VM-0.Tenant-A.BMC.example.org.", VMRef{Namespace: "tenant-a", Name: "vm-0"}, true},
		{"https://web.prod.eu.tenant-a.bmc.example.org", VMRef{Namespace: "tenant-a", Name: "web.prod.eu"}, true},
		{" https://vm-0.ns.bmc.example.org ", VMRef{Namespace: "ns", Name: "vm-0"}, true},
		{"https://tenant-a.bmc.example.org", VMRef{}, false},     // no VM part
		{"https://vm-0.tenant-a.other.org", VMRef{}, false},      // another tool's BMC
		{"https://vm-0.tenant-abmc.example.org", VMRef{}, false}, // suffix without dot
		{"10.0.0.5", VMRef{}, false}, // physical server
		{"", VMRef{}, false},
		{"ftp://vm-0.tenant-a.bmc.example.org", VMRef{}, false},
		{"https://-vm.tenant-a.bmc.example.org", VMRef{}, false},
		{"https://vm..x.tenant-a.bmc.example.org", VMRef{}, false},
		{"https://vm_0.tenant-a.bmc.example.org", VMRef{}, false},
		{"https://vm-0." + strings.Repeat("n", 64) + ".bmc.example.org", VMRef{}, false},
		{"https://%zz", VMRef{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.address, func(t *testing.T) {
			got, ok := ParseBMCAddress(tt.address, domain)
			if ok != tt.ok || got != tt.want {
				t.Fatalf("ParseBMCAddress(%q) = %v, %v; want %v, %v", tt.address, got, ok, tt.want, tt.ok)
			}
			if ok {
				back, ok := ParseBMCAddress(BMCAddress(got, domain), domain)
				if !ok || back != got {
					t.Errorf("BMCAddress does not parse back: %v", back)
				}
			}
		})
	}
	if _, ok := ParseBMCAddress("https://vm-0.ns.bmc.example.org", ""); ok {
		t.Error("an empty domain must match nothing")
	}
}

func TestHostname(t *testing.T) {
	long := VMRef{Namespace: "tenant", Name: strings.Repeat("very-long-name.", 5) + "x"}
	tests := []struct {
		name string
		vm   VMRef
		want string
	}{
		{"plain", VMRef{Namespace: "tenant-a", Name: "vm-0"}, "vm-0-tenant-a"},
		{"dotted VM name", VMRef{Namespace: "ns", Name: "web.prod"}, "web-prod-ns"},
		{"exactly 63", VMRef{Namespace: "n", Name: strings.Repeat("a", 61)}, strings.Repeat("a", 61) + "-n"},
		{"too long gets the hash", long, HashedHostname(long)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Hostname(tt.vm)
			if got != tt.want {
				t.Fatalf("Hostname = %q, want %q", got, tt.want)
			}
			if len(got) > 63 || !IsDNSLabel(got) {
				t.Errorf("%q is not a DNS label", got)
			}
		})
	}
}

func TestHashedHostname(t *testing.T) {
	a := VMRef{Namespace: "b-c", Name: "a"}
	b := VMRef{Namespace: "c", Name: "a-b"}
	if Hostname(a) != Hostname(b) {
		t.Fatalf("test premise: %q and %q should collide", Hostname(a), Hostname(b))
	}
	if HashedHostname(a) == HashedHostname(b) {
		t.Errorf("hashed names of different VMs collide: %q", HashedHostname(a))
	}
	if HashedHostname(a) != HashedHostname(a) {
		t.Error("hashed name is not stable")
	}
	cut := VMRef{Namespace: "ns", Name: strings.Repeat("abcd-", 20) + "z"}
	got := HashedHostname(cut)
	if len(got) > 63 || !IsDNSLabel(got) || !strings.HasPrefix(got, "abcd-abcd") {
		t.Errorf("HashedHostname = %q (%d chars), want a DNS label ≤ 63 keeping the name's start", got, len(got))
	}
}

// FuzzParseBMCAddress: whatever the address, a recognised VM has valid
// names, its BMC address parses back to it, and its hostnames are DNS labels.
func FuzzParseBMCAddress(f *testing.F) {
	for _, seed := range []string{
		"https://vm-0.tenant-a.bmc.example.org",
		"web.prod.ns.bmc.example.org:443/redfish",
		"http://a.b.bmc.example.org.",
		"10.0.0.1",
		"https://" + strings.Repeat("x", 70) + ".ns.bmc.example.org",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, address string) {
		vm, ok := ParseBMCAddress(address, "bmc.example.org")
		if !ok {
			return
		}
		if !IsDNSSubdomain(vm.Name) || !IsDNSLabel(vm.Namespace) {
			t.Fatalf("%q gave invalid %+v", address, vm)
		}
		if back, ok := ParseBMCAddress(BMCAddress(vm, "bmc.example.org"), "bmc.example.org"); !ok || back != vm {
			t.Fatalf("%q: BMC address of %+v parses to %+v, %v", address, vm, back, ok)
		}
		for _, name := range []string{Hostname(vm), HashedHostname(vm)} {
			if !IsDNSLabel(name) {
				t.Fatalf("%q: hostname %q of %+v is not a DNS label", address, name, vm)
			}
		}
	})
}
