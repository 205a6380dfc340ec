package vmidentity

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/virtmetal/virtmetal/internal/bmcspec"
)

var errInjected = errors.New("injected failure")

// enrolledNamespaces are what the fake EnrolledFunc selects.
var enrolledNamespaces = map[string]bool{"team-a": true, "team-b": true}

func fakeEnrolled(_ context.Context, vm *kubevirtv1.VirtualMachine) (bool, error) {
	return enrolledNamespaces[vm.Namespace] && vm.Annotations["virtmetal.io/bmc"] != "disabled", nil
}

type vmOption func(*kubevirtv1.VirtualMachine)

func withSerial(s string) vmOption {
	return func(vm *kubevirtv1.VirtualMachine) { firmware(vm).Serial = s }
}

func withUUID(u string) vmOption {
	return func(vm *kubevirtv1.VirtualMachine) { firmware(vm).UUID = types.UID(u) }
}

// withInterface adds an interface; mac may be empty.
func withInterface(name, mac string) vmOption {
	return func(vm *kubevirtv1.VirtualMachine) {
		d := &vm.Spec.Template.Spec.Domain.Devices
		d.Interfaces = append(d.Interfaces, kubevirtv1.Interface{Name: name, MacAddress: mac})
	}
}

func optedOut(vm *kubevirtv1.VirtualMachine) {
	vm.Annotations = map[string]string{"virtmetal.io/bmc": "disabled"}
}

func firmware(vm *kubevirtv1.VirtualMachine) *kubevirtv1.Firmware {
	d := &vm.Spec.Template.Spec.Domain
	if d.Firmware == nil {
		d.Firmware = &kubevirtv1.Firmware{}
	}
	return d.Firmware
}

func newVM(namespace, name string, opts ...vmOption) *kubevirtv1.VirtualMachine {
	vm := &kubevirtv1.VirtualMachine{}
	vm.Namespace, vm.Name = namespace, name
	vm.Spec.Template = &kubevirtv1.VirtualMachineInstanceTemplateSpec{}
	for _, o := range opts {
		o(vm)
	}
	return vm
}

func testScheme(t testing.TB) *runtime.Scheme {
	s := runtime.NewScheme()
	if err := kubevirtv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

func mustRange(t testing.TB, s string) MACRange {
	r, err := ParseMACRange(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

const testRange = "02:00:00:00:00:00-02:00:00:ff:ff:ff"

// newStamper has a fake client holding existing, with the indexes of
// SetupIndexes, failing as funcs says; macRange "none" is the zero range.
func newStamper(t testing.TB, macRange string, funcs interceptor.Funcs, existing ...*kubevirtv1.VirtualMachine) *Stamper {
	objs := make([]client.Object, len(existing))
	for i, vm := range existing {
		objs[i] = vm
	}
	return newStamperWith(t, macRange, funcs, objs...)
}

// newStamperWith is newStamper with any objects, VMIs included.
func newStamperWith(t testing.TB, macRange string, funcs interceptor.Funcs, objs ...client.Object) *Stamper {
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).
		WithIndex(&kubevirtv1.VirtualMachine{}, MACIndex, IndexMACs).
		WithIndex(&kubevirtv1.VirtualMachine{}, UUIDIndex, IndexUUID).
		WithIndex(&kubevirtv1.VirtualMachineInstance{}, MACIndex, IndexMACs).
		WithIndex(&kubevirtv1.VirtualMachineInstance{}, UUIDIndex, IndexUUID).
		WithInterceptorFuncs(funcs).Build()
	s := &Stamper{Reader: c, Enrolled: fakeEnrolled}
	if macRange != "none" {
		s.MACs = mustRange(t, macRange)
	}
	return s
}

func macs(vm *kubevirtv1.VirtualMachine) []string {
	var out []string
	for _, iface := range vm.Spec.Template.Spec.Domain.Devices.Interfaces {
		out = append(out, iface.MacAddress)
	}
	return out
}

func TestDerivation(t *testing.T) {
	t.Run("serial splits back at the last dot", func(t *testing.T) {
		for _, tc := range []struct{ namespace, name string }{{"team-a", "web1"}, {"team-a", "web1.example.com"}} {
			got, ok := claimedVM(Serial(tc.namespace, tc.name))
			if !ok || got != (types.NamespacedName{Namespace: tc.namespace, Name: tc.name}) {
				t.Errorf("claimedVM(Serial(%q, %q)) = %v, %v", tc.namespace, tc.name, got, ok)
			}
		}
	})
	t.Run("serials that name no VM", func(t *testing.T) {
		for _, serial := range []string{"", "SN12345", ".team-a", "web1.", "web1.team_a", "web1.Team A", "Dell.R740.x/y"} {
			if got, ok := claimedVM(serial); ok {
				t.Errorf("claimedVM(%q) = %v, want no VM", serial, got)
			}
		}
	})
	t.Run("uuid is stable, per namespace and per attempt", func(t *testing.T) {
		a, b := DerivedUUID("team-a", "web1", 0), DerivedUUID("team-b", "web1", 0)
		if a != DerivedUUID("team-a", "web1", 0) {
			t.Error("DerivedUUID is not stable")
		}
		if a == b || a == DerivedUUID("team-a", "web1", 1) {
			t.Errorf("DerivedUUID collides: %s %s", a, b)
		}
		if u, err := uuid.Parse(a); err != nil || u.Version() != 5 || u.Variant() != uuid.RFC4122 {
			t.Errorf("DerivedUUID(team-a, web1) = %s, not an RFC 4122 version 5 UUID: %v", a, err)
		}
	})
}

func TestStamp(t *testing.T) {
	ctx := context.Background()
	derivedA := DerivedUUID("team-a", "web1", 0)
	userUUID := "6a1f0b8e-2d6c-4f1e-9a53-0c2b7e4d9f10"
	tests := []struct {
		name         string
		macRange     string
		existing     []*kubevirtv1.VirtualMachine
		vm           *kubevirtv1.VirtualMachine
		wantUUID     string
		wantMACs     []string // "" means "any address of the range", "-" none
		wantWarnings []string
		wantError    error
	}{
		{
			name:     "fresh VM",
			vm:       newVM("team-a", "web1", withInterface("default", "")),
			wantUUID: derivedA, wantMACs: []string{""},
		},
		{
			name:         "user serial replaced with a warning",
			vm:           newVM("team-a", "web1", withSerial("web1.team-b")),
			wantUUID:     derivedA,
			wantWarnings: []string{`firmware.serial "web1.team-b" replaced by "web1.team-a"`},
		},
		{
			name:     "user UUID kept",
			vm:       newVM("team-a", "web1", withUUID(userUUID)),
			wantUUID: userUUID,
		},
		{
			name:     "user UUID an unenrolled VM has is kept",
			existing: []*kubevirtv1.VirtualMachine{newVM("other", "db", withUUID(userUUID))},
			vm:       newVM("team-a", "web1", withUUID(userUUID)),
			wantUUID: userUUID,
		},
		{
			name:         "user UUID an enrolled VM has is replaced with a warning",
			existing:     []*kubevirtv1.VirtualMachine{newVM("team-b", "db", withUUID(strings.ToUpper(userUUID)))},
			vm:           newVM("team-a", "web1", withUUID(userUUID)),
			wantUUID:     derivedA,
			wantWarnings: []string{`firmware.uuid "` + userUUID + `" replaced by "` + derivedA + `": enrolled VM team-b/db has it`},
		},
		{
			name:     "user UUID on the VM itself (update) is kept",
			existing: []*kubevirtv1.VirtualMachine{newVM("team-a", "web1", withUUID(userUUID))},
			vm:       newVM("team-a", "web1", withUUID(userUUID)),
			wantUUID: userUUID,
		},
		{
			name:     "derived UUID another VM took is skipped",
			existing: []*kubevirtv1.VirtualMachine{newVM("other", "copycat", withUUID(derivedA))},
			vm:       newVM("team-a", "web1"),
			wantUUID: DerivedUUID("team-a", "web1", 1),
		},
		{
			name:     "MACs set are kept, missing ones added",
			vm:       newVM("team-a", "web1", withInterface("default", "52:54:00:12:34:56"), withInterface("storage", "")),
			wantUUID: derivedA, wantMACs: []string{"52:54:00:12:34:56", ""},
		},
		{
			name:     "taken MACs are probed past",
			macRange: "02:00:00:00:00:00-02:00:00:00:00:02",
			existing: []*kubevirtv1.VirtualMachine{
				newVM("other", "x", withInterface("default", "02:00:00:00:00:00")),
				newVM("other", "y", withInterface("default", "02-00-00-00-00-02")),
			},
			vm:       newVM("team-a", "web1", withInterface("default", "")),
			wantUUID: derivedA, wantMACs: []string{"02:00:00:00:00:01"},
		},
		{
			name:     "interfaces of one VM get distinct MACs",
			macRange: "02:00:00:00:00:00-02:00:00:00:00:01",
			vm:       newVM("team-a", "web1", withInterface("a", ""), withInterface("b", "")),
			wantUUID: derivedA, wantMACs: []string{"", ""},
		},
		{
			name:     "a MAC the VM set itself is not handed out again",
			macRange: "02:00:00:00:00:00-02:00:00:00:00:01",
			vm:       newVM("team-a", "web1", withInterface("a", ""), withInterface("b", "02:00:00:00:00:00")),
			wantUUID: derivedA, wantMACs: []string{"02:00:00:00:00:01", "02:00:00:00:00:00"},
		},
		{
			name:      "range exhausted",
			macRange:  "02:00:00:00:00:00-02:00:00:00:00:00",
			existing:  []*kubevirtv1.VirtualMachine{newVM("other", "x", withInterface("default", "02:00:00:00:00:00"))},
			vm:        newVM("team-a", "web1", withInterface("default", "")),
			wantError: ErrMACRangeExhausted,
		},
		{
			name:     "no MAC range: MACs left to others",
			macRange: "none",
			vm:       newVM("team-a", "web1", withInterface("default", "")),
			wantUUID: derivedA, wantMACs: []string{"-"},
		},
		{
			name:      "no template",
			vm:        &kubevirtv1.VirtualMachine{},
			wantError: ErrInvalidVM,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			macRange := tc.macRange
			if macRange == "" {
				macRange = testRange
			}
			s := newStamper(t, macRange, interceptor.Funcs{}, tc.existing...)
			vm := tc.vm.DeepCopy()
			warnings, err := s.Stamp(ctx, vm)
			if tc.wantError != nil {
				if !errors.Is(err, tc.wantError) {
					t.Fatalf("Stamp error = %v, want %v", err, tc.wantError)
				}
				return
			}
			if err != nil {
				t.Fatalf("Stamp: %v", err)
			}
			fw := vm.Spec.Template.Spec.Domain.Firmware
			if fw.Serial != Serial(vm.Namespace, vm.Name) {
				t.Errorf("serial = %q", fw.Serial)
			}
			if string(fw.UUID) != tc.wantUUID {
				t.Errorf("uuid = %q, want %q", fw.UUID, tc.wantUUID)
			}
			got := macs(vm)
			if len(got) != len(tc.wantMACs) {
				t.Fatalf("MACs = %v, want %v", got, tc.wantMACs)
			}
			seen := map[string]bool{}
			for i, mac := range got {
				if seen[mac] {
					t.Errorf("MAC %s given twice: %v", mac, got)
				}
				seen[mac] = true
				if want := tc.wantMACs[i]; want == "-" && mac != "" {
					t.Errorf("MAC[%d] = %s, want none", i, mac)
				} else if want != "" && want != "-" && mac != want {
					t.Errorf("MAC[%d] = %s, want %s", i, mac, want)
				}
				if tc.wantMACs[i] == "" && !strings.HasPrefix(mac, "02:00:00:") {
					t.Errorf("MAC[%d] = %q, not from %s", i, mac, macRange)
				}
			}
			if len(warnings) != len(tc.wantWarnings) {
				t.Fatalf("warnings = %q, want %q", warnings, tc.wantWarnings)
			}
			for i, w := range tc.wantWarnings {
				if !strings.Contains(warnings[i], w) {
					t.Errorf("warning %q does not contain %q", warnings[i], w)
				}
			}

			// Idempotent: a second call changes nothing and warns nothing.
			again := vm.DeepCopy()
			warnings, err = s.Stamp(ctx, again)
			if err != nil || len(warnings) != 0 || !reflect.DeepEqual(again, vm) {
				t.Errorf("second Stamp changed %v to %v, warnings %q, err %v", vm.Spec.Template.Spec.Domain, again.Spec.Template.Spec.Domain, warnings, err)
			}
		})
	}
}

func TestStampSameNameInTwoNamespaces(t *testing.T) {
	ctx := context.Background()
	s := newStamper(t, testRange, interceptor.Funcs{})
	a := newVM("team-a", "web1", withInterface("default", ""))
	b := newVM("team-b", "web1", withInterface("default", ""))
	for _, vm := range []*kubevirtv1.VirtualMachine{a, b} {
		if _, err := s.Stamp(ctx, vm); err != nil {
			t.Fatal(err)
		}
	}
	fa, fb := a.Spec.Template.Spec.Domain.Firmware, b.Spec.Template.Spec.Domain.Firmware
	if fa.UUID == fb.UUID || fa.Serial == fb.Serial || macs(a)[0] == macs(b)[0] {
		t.Errorf("team-a/web1 and team-b/web1 share identity: %+v %v, %+v %v", fa, macs(a), fb, macs(b))
	}
}

// Admissions in flight: the cache shows neither VM yet, the MACs handed
// out must still differ.
func TestStampReservesMACsNotYetCached(t *testing.T) {
	ctx := context.Background()
	t.Run("one after the other", func(t *testing.T) {
		s := newStamper(t, "02:00:00:00:00:00-02:00:00:00:00:00", interceptor.Funcs{})
		first := newVM("team-a", "web1", withInterface("default", ""))
		if _, err := s.Stamp(ctx, first); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Stamp(ctx, newVM("team-b", "web1", withInterface("default", ""))); !errors.Is(err, ErrMACRangeExhausted) {
			t.Fatalf("second VM: Stamp error = %v, want %v (the only MAC is reserved)", err, ErrMACRangeExhausted)
		}
		retry := newVM("team-a", "web1", withInterface("default", ""))
		if _, err := s.Stamp(ctx, retry); err != nil || macs(retry)[0] != macs(first)[0] {
			t.Fatalf("the same VM again: MAC %v, %v; want its reserved %s", macs(retry), err, macs(first)[0])
		}
	})
	t.Run("in parallel", func(t *testing.T) {
		s := newStamper(t, "02:00:00:00:00:00-02:00:00:00:00:07", interceptor.Funcs{})
		vms := make([]*kubevirtv1.VirtualMachine, 8)
		errs := make([]error, len(vms))
		var wg sync.WaitGroup
		for i := range vms {
			vms[i] = newVM("team-a", fmt.Sprintf("vm%d", i), withInterface("default", ""))
			wg.Go(func() { _, errs[i] = s.Stamp(ctx, vms[i]) })
		}
		wg.Wait()
		seen := map[string]string{}
		for i, vm := range vms {
			if errs[i] != nil {
				t.Fatalf("%s: %v", vm.Name, errs[i])
			}
			mac := macs(vm)[0]
			if other, ok := seen[mac]; ok {
				t.Errorf("%s and %s both got %s", other, vm.Name, mac)
			}
			seen[mac] = vm.Name
		}
	})
}

func TestStampReaderFailures(t *testing.T) {
	ctx := context.Background()
	failList := interceptor.Funcs{List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
		return errInjected
	}}
	tests := []struct {
		name     string
		vm       *kubevirtv1.VirtualMachine
		funcs    interceptor.Funcs
		enrolled EnrolledFunc
	}{
		{"listing for the UUID fails", newVM("team-a", "web1"), failList, fakeEnrolled},
		{"listing for a user UUID fails", newVM("team-a", "web1", withUUID("6a1f0b8e-2d6c-4f1e-9a53-0c2b7e4d9f10")), failList, fakeEnrolled},
		{"asking whether the UUID holder is enrolled fails", newVM("team-a", "web1", withUUID("6a1f0b8e-2d6c-4f1e-9a53-0c2b7e4d9f10")), interceptor.Funcs{},
			func(context.Context, *kubevirtv1.VirtualMachine) (bool, error) { return false, errInjected }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			holder := newVM("team-b", "db", withUUID("6a1f0b8e-2d6c-4f1e-9a53-0c2b7e4d9f10"))
			s := newStamper(t, testRange, tc.funcs, holder)
			s.Enrolled = tc.enrolled
			if _, err := s.Stamp(ctx, tc.vm); !errors.Is(err, errInjected) {
				t.Fatalf("Stamp error = %v, want the injected failure", err)
			}
		})
	}
	t.Run("listing for a MAC fails", func(t *testing.T) {
		s := newStamper(t, testRange, interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			lo := (&client.ListOptions{}).ApplyOptions(opts)
			if lo.FieldSelector != nil && strings.Contains(lo.FieldSelector.String(), MACIndex) {
				return errInjected
			}
			return c.List(ctx, list, opts...)
		}})
		if _, err := s.Stamp(ctx, newVM("team-a", "web1", withInterface("default", ""))); !errors.Is(err, errInjected) {
			t.Fatalf("Stamp error = %v, want the injected failure", err)
		}
	})
}

func TestValidate(t *testing.T) {
	ctx := context.Background()
	webA := newVM("team-a", "web1", withSerial("web1.team-a"), withUUID(DerivedUUID("team-a", "web1", 0)), withInterface("default", "02:00:00:00:00:01"))
	dotted := newVM("team-a", "web1.example.com", withSerial("web1.example.com.team-a"))
	outsider := newVM("free", "db", withSerial("db.free"), withUUID("6a1f0b8e-2d6c-4f1e-9a53-0c2b7e4d9f10"), withInterface("default", "02:00:00:00:00:09"))
	quiet := newVM("team-a", "quiet", optedOut, withUUID("11111111-2222-4333-8444-555555555555"), withInterface("default", "02:00:00:00:00:07"))
	existing := []*kubevirtv1.VirtualMachine{webA, dotted, outsider, quiet}
	tests := []struct {
		name      string
		vm        *kubevirtv1.VirtualMachine
		funcs     interceptor.Funcs
		enrolled  EnrolledFunc
		wantError error
	}{
		{name: "nothing set", vm: newVM("free", "x")},
		{name: "no template", vm: &kubevirtv1.VirtualMachine{}},
		{name: "its own serial", vm: newVM("team-b", "web1", withSerial("web1.team-b"))},
		{name: "the enrolled VM itself (update)", vm: webA.DeepCopy()},
		{name: "serial of an enrolled VM in another namespace", vm: newVM("free", "web1", withSerial("web1.team-a")), wantError: ErrIdentityClaimed},
		{name: "serial of an enrolled VM from an enrolled namespace", vm: newVM("team-b", "web1", withSerial("web1.team-a")), wantError: ErrIdentityClaimed},
		{name: "serial of an enrolled VM, another VM of its namespace", vm: newVM("team-a", "web2", optedOut, withSerial("web1.team-a")), wantError: ErrIdentityClaimed},
		{name: "serial of an enrolled VM in capitals and blanks", vm: newVM("free", "web1", withSerial(" WEB1.Team-A ")), wantError: ErrIdentityClaimed},
		{name: "serial of an enrolled VM with dots in its name", vm: newVM("free", "x", withSerial("web1.example.com.team-a")), wantError: ErrIdentityClaimed},
		{name: "serial of a VM not yet created in an enrolled namespace", vm: newVM("free", "x", withSerial("future.team-b")), wantError: ErrIdentityClaimed},
		{name: "serial of a VM in a namespace not enrolled", vm: newVM("team-b", "x", withSerial("db.free"))},
		{name: "serial of an opted-out VM", vm: newVM("free", "x", withSerial("quiet.team-a"))},
		{name: "serial naming no VM", vm: newVM("free", "x", withSerial("Dell R740 SN 1234"))},
		{name: "UUID of an enrolled VM", vm: newVM("free", "x", withUUID(strings.ToUpper(DerivedUUID("team-a", "web1", 0)))), wantError: ErrIdentityClaimed},
		{name: "UUID of an unenrolled VM", vm: newVM("team-b", "x", withUUID("6a1f0b8e-2d6c-4f1e-9a53-0c2b7e4d9f10"))},
		{name: "UUID of an opted-out VM", vm: newVM("free", "x", withUUID("11111111-2222-4333-8444-555555555555"))},
		{name: "MAC of an enrolled VM", vm: newVM("free", "x", withInterface("default", "02:00:00:00:00:01")), wantError: ErrDuplicateMAC},
		{name: "MAC of an enrolled VM written otherwise", vm: newVM("free", "x", withInterface("a", "02:00:00:00:00:99"), withInterface("b", "02-00-00-00-00-01")), wantError: ErrDuplicateMAC},
		{name: "MAC of an unenrolled VM", vm: newVM("team-a", "x", withInterface("default", "02:00:00:00:00:09"))},
		{name: "MAC of an opted-out VM", vm: newVM("free", "x", withInterface("default", "02:00:00:00:00:07"))},
		{name: "reading the claimed VM fails", vm: newVM("free", "x", withSerial("web1.team-a")), wantError: errInjected,
			funcs: interceptor.Funcs{Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
				return errInjected
			}}},
		{name: "listing by MAC fails", vm: newVM("free", "x", withInterface("default", "02:00:00:00:00:01")), wantError: errInjected,
			funcs: interceptor.Funcs{List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
				return errInjected
			}}},
		{name: "asking whether the claimed VM is enrolled fails", vm: newVM("free", "x", withSerial("web1.team-a")), wantError: errInjected,
			enrolled: func(context.Context, *kubevirtv1.VirtualMachine) (bool, error) { return false, errInjected }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStamper(t, testRange, tc.funcs, existing...)
			if tc.enrolled != nil {
				s.Enrolled = tc.enrolled
			}
			err := s.Validate(ctx, tc.vm)
			if tc.wantError == nil && err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if !errors.Is(err, tc.wantError) {
				t.Fatalf("Validate error = %v, want %v", err, tc.wantError)
			}
		})
	}
}

// TestStampMachineProof: Stamp gives a VM without one a fresh machine
// proof, keeps one of the proof's form (Stamp is idempotent, and the repair
// path must not rotate it), replaces anything else with a warning that
// names neither value, and gives two VMs two proofs.
func TestStampMachineProof(t *testing.T) {
	ctx := context.Background()
	s := newStamper(t, testRange, interceptor.Funcs{})
	kept := bmcspec.NewMachineProof()
	tests := []struct {
		name        string
		asset       string
		want        string // "" for a fresh proof
		wantWarning bool
	}{
		{name: "none"},
		{name: "a proof is kept", asset: kept, want: kept},
		{name: "a user's asset tag is replaced", asset: "ACME-0001", wantWarning: true},
		{name: "an upper-case look-alike is replaced", asset: strings.ToUpper(kept), wantWarning: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vm := newVM("team-a", "web1")
			if tc.asset != "" {
				vm.Spec.Template.Spec.Domain.Chassis = &kubevirtv1.Chassis{Asset: tc.asset}
			}
			warnings, err := s.Stamp(ctx, vm)
			if err != nil {
				t.Fatal(err)
			}
			got := vm.Spec.Template.Spec.Domain.Chassis.Asset
			if !bmcspec.IsMachineProof(got) || (tc.want != "" && got != tc.want) || (tc.want == "" && got == kept) {
				t.Errorf("asset = %q, want %q (fresh when empty)", got, tc.want)
			}
			if (len(warnings) == 1) != tc.wantWarning {
				t.Errorf("warnings %q", warnings)
			}
			for _, w := range warnings {
				if strings.Contains(w, got) || (tc.asset != "" && strings.Contains(w, tc.asset)) {
					t.Errorf("a value in the warning %q", w)
				}
			}
			again, err := s.Stamp(ctx, vm)
			if err != nil || len(again) != 0 || vm.Spec.Template.Spec.Domain.Chassis.Asset != got {
				t.Errorf("second Stamp changed the proof or warned: %q, %v", again, err)
			}
		})
	}
	a, b := newVM("team-a", "web1"), newVM("team-b", "web1")
	if _, err := s.Stamp(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stamp(ctx, b); err != nil {
		t.Fatal(err)
	}
	if a.Spec.Template.Spec.Domain.Chassis.Asset == b.Spec.Template.Spec.Domain.Chassis.Asset {
		t.Error("web1 in two namespaces got one proof: it must not derive from names")
	}
}
