// Package vmidentity gives every enrolled KubeVirt VirtualMachine an
// identity its guest (and MaaS, which reads it from SMBIOS and PXE) can
// trust: the SMBIOS serial "<vm>.<namespace>", an SMBIOS UUID unique in the
// cluster, stable MAC addresses from a configured range, and a machine
// proof (bmcspec.NewMachineProof) as the SMBIOS chassis asset tag: the
// secret its MaaS machine is bound by. It refuses, in
// every namespace, a VM that claims an enrolled VM's identity, so a tenant
// cannot pose as another tenant's machine.
//
// The same Stamper serves the admission webhooks (the first boot already
// carries the identity) and the reconciler (repair of existing VMs).
package vmidentity

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/bmcspec"
)

// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachines,verbs=get;list;watch

var (
	// ErrIdentityClaimed: the VM's serial or UUID is another enrolled VM's.
	ErrIdentityClaimed = errors.New("identity of another enrolled VM claimed")
	// ErrDuplicateMAC: one of the VM's MACs is an enrolled VM's.
	ErrDuplicateMAC = errors.New("MAC address of another enrolled VM")
	// ErrInvalidVM: the VM has no spec.template to stamp.
	ErrInvalidVM = errors.New("invalid VirtualMachine")
	// ErrMACRangeExhausted: every address of the range is taken.
	ErrMACRangeExhausted = errors.New("MAC range exhausted")
)

// Field indexes on VirtualMachines (SetupIndexes), by normalised value.
const (
	MACIndex  = "vmidentity.mac"
	UUIDIndex = "vmidentity.uuid"
)

// uuidNamespace is virtmetal's UUIDv5 namespace for SMBIOS UUIDs. Fixed
// forever: changing it would change no stamped VM (their UUIDs are in their
// specs) but would make new VMs' UUIDs differ from what older releases gave.
var uuidNamespace = uuid.MustParse("5b0c5f2e-8d4e-4c57-9a0e-6f1d2b7c9e31")

// EnrolledFunc says whether a VM is enrolled (its namespace is selected and
// it has not opted out). It is also asked about VMs that do not exist, with
// only Name and Namespace set, to learn whether such a VM would be enrolled;
// for a namespace that does not exist it answers false (a NotFound error is
// taken as false too).
type EnrolledFunc func(ctx context.Context, vm *kubevirtv1.VirtualMachine) (bool, error)

// Stamper sets and checks VM identities. Reader should be the manager's
// cache with the indexes of SetupIndexes.
type Stamper struct {
	Reader client.Reader
	// MACs is where missing MACs come from; the zero MACRange assigns none
	// (for clusters where KubeMacPool or the like does it).
	MACs     MACRange
	Enrolled EnrolledFunc

	// reserved holds the MACs this process handed out lately, which the
	// cache may not show yet. A Stamper must not be copied after first use.
	reserved macReservations
}

// macReservationTTL is how long a MAC handed out stays reserved for its VM
// without the cache showing it: long enough for the VM's create to reach
// the cache, short enough that MACs of refused creates come back.
const macReservationTTL = time.Minute

// macReservations keep two admissions in flight from picking the same MAC
// before either VM is in the cache. Per process: webhook replicas do not
// share them.
type macReservations struct {
	mu    sync.Mutex
	byMAC map[string]macReservation
}

type macReservation struct {
	vm    types.NamespacedName
	until time.Time
}

// SetupIndexes adds the MAC and UUID indexes Stamper queries, on
// VirtualMachines and VirtualMachineInstances.
func SetupIndexes(ctx context.Context, indexer client.FieldIndexer) error {
	for _, obj := range []client.Object{&kubevirtv1.VirtualMachine{}, &kubevirtv1.VirtualMachineInstance{}} {
		if err := indexer.IndexField(ctx, obj, MACIndex, IndexMACs); err != nil {
			return fmt.Errorf("indexing %T by MAC: %w", obj, err)
		}
		if err := indexer.IndexField(ctx, obj, UUIDIndex, IndexUUID); err != nil {
			return fmt.Errorf("indexing %T by UUID: %w", obj, err)
		}
	}
	return nil
}

// IndexMACs extracts the MACs of a VM's template or a VMI, normalised,
// for MACIndex.
func IndexMACs(obj client.Object) []string {
	domain := indexedDomain(obj)
	if domain == nil {
		return nil
	}
	var out []string
	for _, iface := range domain.Devices.Interfaces {
		if iface.MacAddress != "" {
			out = append(out, normalMAC(iface.MacAddress))
		}
	}
	return out
}

// IndexUUID extracts the firmware UUID of a VM's template or a VMI,
// normalised, for UUIDIndex.
func IndexUUID(obj client.Object) []string {
	if domain := indexedDomain(obj); domain != nil && domain.Firmware != nil && domain.Firmware.UUID != "" {
		return []string{normalUUID(string(domain.Firmware.UUID))}
	}
	return nil
}

func indexedDomain(obj client.Object) *kubevirtv1.DomainSpec {
	switch o := obj.(type) {
	case *kubevirtv1.VirtualMachine:
		if o.Spec.Template != nil {
			return &o.Spec.Template.Spec.Domain
		}
	case *kubevirtv1.VirtualMachineInstance:
		return &o.Spec.Domain
	}
	return nil
}

// normalMAC lets "02-00-00-00-00-0A" and "02:00:00:00:00:0a" match.
func normalMAC(s string) string {
	if hw, err := net.ParseMAC(strings.TrimSpace(s)); err == nil {
		return hw.String()
	}
	return strings.ToLower(strings.TrimSpace(s))
}

func normalUUID(s string) string {
	if u, err := uuid.Parse(strings.TrimSpace(s)); err == nil {
		return u.String()
	}
	return strings.ToLower(strings.TrimSpace(s))
}

// Serial is the SMBIOS serial of an enrolled VM: "<vm>.<namespace>". A VM
// name may hold dots, a namespace never does: split at the last dot.
func Serial(namespace, name string) string { return name + "." + namespace }

// DerivedUUID is the SMBIOS UUID an enrolled VM gets unless taken: UUIDv5 of
// "<namespace>/<name>", unique where KubeVirt's default (from the name
// alone) makes web1 in two namespaces collide.
func DerivedUUID(namespace, name string, attempt int) string {
	key := namespace + "/" + name
	if attempt > 0 {
		key = fmt.Sprintf("%s#%d", key, attempt)
	}
	return uuid.NewSHA1(uuidNamespace, []byte(key)).String()
}

// claimedVM parses a serial as "<name>.<namespace>"; ok is false when it
// cannot name a VM (the MaaS script would not read it as one either).
// Compared case-insensitively and without surrounding blanks: stricter
// than what the guest reads.
func claimedVM(serial string) (types.NamespacedName, bool) {
	s := strings.ToLower(strings.TrimSpace(serial))
	i := strings.LastIndexByte(s, '.')
	if i <= 0 {
		return types.NamespacedName{}, false
	}
	name, namespace := s[:i], s[i+1:]
	if len(validation.IsDNS1123Label(namespace)) != 0 {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: namespace, Name: name}, true
}

// Stamp makes vm's identity right in place: the serial, the UUID (a user's
// kept unless another enrolled VM has it), a MAC for each interface
// without one, and a machine proof unless it has a value of a proof's form
// (so a VM keeps its proof). It returns admission warnings for user values
// it replaced.
// Idempotent: a second call changes nothing and warns nothing. The caller
// decides that vm is enrolled; Stamp does not ask.
func (s *Stamper) Stamp(ctx context.Context, vm *kubevirtv1.VirtualMachine) ([]string, error) {
	if vm.Spec.Template == nil {
		return nil, fmt.Errorf("%w: VirtualMachine %s/%s has no spec.template", ErrInvalidVM, vm.Namespace, vm.Name)
	}
	domain := &vm.Spec.Template.Spec.Domain
	if domain.Firmware == nil {
		domain.Firmware = &kubevirtv1.Firmware{}
	}
	fw := domain.Firmware
	var warnings []string

	if want := Serial(vm.Namespace, vm.Name); fw.Serial != want {
		if fw.Serial != "" {
			warnings = append(warnings, fmt.Sprintf("spec.template.spec.domain.firmware.serial %q replaced by %q: virtmetal names enrolled VMs <vm>.<namespace>", fw.Serial, want))
		}
		fw.Serial = want
	}

	if warning := stampProof(domain); warning != "" {
		warnings = append(warnings, warning)
	}

	uuidWarning, err := s.stampUUID(ctx, vm, fw)
	if err != nil {
		return nil, err
	}
	if uuidWarning != "" {
		warnings = append(warnings, uuidWarning)
	}

	if s.MACs.size() > 0 {
		if err := s.stampMACs(ctx, vm, domain.Devices.Interfaces); err != nil {
			return nil, err
		}
	}
	return warnings, nil
}

// proofPath is where a VM keeps its machine proof.
const proofPath = "spec.template.spec.domain.chassis.asset"

// stampProof gives the domain a fresh machine proof at chassis.asset unless
// it holds a value of a proof's form, and returns the warning for a value
// it replaced. Neither value is ever in a warning: the proof is a secret,
// and what held its place may be one of the user's.
func stampProof(domain *kubevirtv1.DomainSpec) string {
	if domain.Chassis == nil {
		domain.Chassis = &kubevirtv1.Chassis{}
	}
	if bmcspec.IsMachineProof(domain.Chassis.Asset) {
		return ""
	}
	warning := ""
	if domain.Chassis.Asset != "" {
		warning = proofPath + " replaced by a machine proof: virtmetal keeps there the secret that binds the VM's MaaS machine"
	}
	domain.Chassis.Asset = bmcspec.NewMachineProof()
	return warning
}

func (s *Stamper) stampUUID(ctx context.Context, vm *kubevirtv1.VirtualMachine, fw *kubevirtv1.Firmware) (string, error) {
	if fw.UUID != "" {
		holder, err := s.enrolledHolder(ctx, client.ObjectKeyFromObject(vm), UUIDIndex, normalUUID(string(fw.UUID)))
		if err != nil || holder == nil {
			return "", err
		}
		old := fw.UUID
		if err := s.setDerivedUUID(ctx, vm, fw); err != nil {
			return "", err
		}
		return fmt.Sprintf("spec.template.spec.domain.firmware.uuid %q replaced by %q: enrolled VM %s/%s has it", old, fw.UUID, holder.Namespace, holder.Name), nil
	}
	return "", s.setDerivedUUID(ctx, vm, fw)
}

// maxUUIDAttempts bounds the search past derived UUIDs other VMs took
// (someone may have copied one by hand; the derivation is public).
const maxUUIDAttempts = 16

func (s *Stamper) setDerivedUUID(ctx context.Context, vm *kubevirtv1.VirtualMachine, fw *kubevirtv1.Firmware) error {
	for attempt := range maxUUIDAttempts {
		candidate := DerivedUUID(vm.Namespace, vm.Name, attempt)
		used, err := s.inUse(ctx, client.ObjectKeyFromObject(vm), UUIDIndex, candidate)
		if err != nil {
			return err
		}
		if !used {
			fw.UUID = types.UID(candidate)
			return nil
		}
	}
	return fmt.Errorf("no free SMBIOS UUID for VM %s/%s after %d attempts", vm.Namespace, vm.Name, maxUUIDAttempts)
}

// maxMACProbes bounds the linear probe from a hashed start: past that many
// taken addresses in a row, the range is (nearly) full.
const maxMACProbes = 4096

func (s *Stamper) stampMACs(ctx context.Context, vm *kubevirtv1.VirtualMachine, ifaces []kubevirtv1.Interface) error {
	// One VM at a time from the probe to the reservation.
	s.reserved.mu.Lock()
	defer s.reserved.mu.Unlock()
	now := time.Now()
	if s.reserved.byMAC == nil {
		s.reserved.byMAC = map[string]macReservation{}
	}
	for mac, r := range s.reserved.byMAC {
		if now.After(r.until) {
			delete(s.reserved.byMAC, mac)
		}
	}
	self := types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name}
	ownMACs := map[string]bool{}
	for _, iface := range ifaces {
		if iface.MacAddress != "" {
			ownMACs[normalMAC(iface.MacAddress)] = true
		}
	}
	for i := range ifaces {
		if ifaces[i].MacAddress != "" {
			continue
		}
		mac, err := s.freeMAC(ctx, vm, ifaces[i].Name, ownMACs)
		if err != nil {
			return err
		}
		ifaces[i].MacAddress = mac
		ownMACs[mac] = true
		s.reserved.byMAC[mac] = macReservation{vm: self, until: now.Add(macReservationTTL)}
	}
	return nil
}

// freeMAC is called with s.reserved.mu held.
func (s *Stamper) freeMAC(ctx context.Context, vm *kubevirtv1.VirtualMachine, iface string, taken map[string]bool) (string, error) {
	size := s.MACs.size()
	sum := sha256.Sum256([]byte(vm.Namespace + "/" + vm.Name + "/" + iface))
	start := binary.BigEndian.Uint64(sum[:8]) % size
	for probe := range min(size, maxMACProbes) {
		candidate := s.MACs.at(start + probe)
		if r, ok := s.reserved.byMAC[candidate]; taken[candidate] || ok && (r.vm.Namespace != vm.Namespace || r.vm.Name != vm.Name) {
			continue
		}
		used, err := s.inUse(ctx, client.ObjectKeyFromObject(vm), MACIndex, candidate)
		if err != nil {
			return "", err
		}
		if !used {
			return candidate, nil
		}
	}
	return "", fmt.Errorf("%w: no free address in %s for interface %q of VM %s/%s after %d probes", ErrMACRangeExhausted, s.MACs, iface, vm.Namespace, vm.Name, min(size, maxMACProbes))
}

// holders are the VMs other than self whose index field has value. The
// zero self excludes none.
func (s *Stamper) holders(ctx context.Context, self types.NamespacedName, index, value string) ([]kubevirtv1.VirtualMachine, error) {
	var list kubevirtv1.VirtualMachineList
	if err := s.Reader.List(ctx, &list, client.MatchingFields{index: value}); err != nil {
		return nil, fmt.Errorf("listing VirtualMachines by %s %s: %w", index, value, err)
	}
	out := list.Items[:0]
	for _, other := range list.Items {
		if client.ObjectKeyFromObject(&other) != self {
			out = append(out, other)
		}
	}
	return out, nil
}

// enrolledHolder is an enrolled VM other than self whose index field has
// value, or nil.
func (s *Stamper) enrolledHolder(ctx context.Context, self types.NamespacedName, index, value string) (*kubevirtv1.VirtualMachine, error) {
	holders, err := s.holders(ctx, self, index, value)
	if err != nil {
		return nil, err
	}
	for i := range holders {
		enrolled, err := s.enrolled(ctx, &holders[i])
		if err != nil {
			return nil, err
		}
		if enrolled {
			return &holders[i], nil
		}
	}
	return nil, nil
}

func (s *Stamper) enrolled(ctx context.Context, vm *kubevirtv1.VirtualMachine) (bool, error) {
	enrolled, err := s.Enrolled(ctx, vm)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("is VM %s/%s enrolled: %w", vm.Namespace, vm.Name, err)
	}
	return enrolled, nil
}

// Validate refuses a VM, in any namespace, that claims an enrolled VM's
// identity: a serial naming another VM that is (or, not existing yet, would
// be) enrolled, an enrolled VM's UUID, or an enrolled VM's MAC. The VM
// itself is excluded, so an update of an enrolled VM passes.
func (s *Stamper) Validate(ctx context.Context, vm *kubevirtv1.VirtualMachine) error {
	if vm.Spec.Template == nil {
		return nil
	}
	return s.validateDomain(ctx, domainClaim{
		self: client.ObjectKeyFromObject(vm), path: "spec.template.spec.domain", domain: &vm.Spec.Template.Spec.Domain,
	})
}

// domainClaim is the identity one object declares in a domain spec: a VM's
// template, a VMI's spec, the template of a replica set or pool.
type domainClaim struct {
	// self is the VM whose identity the object may carry (the VM itself, or
	// the VM that controls a VMI); zero for objects that may carry none.
	self types.NamespacedName
	// path locates domain in the object, for messages.
	path   string
	domain *kubevirtv1.DomainSpec
}

// validateDomain refuses a claim of another enrolled VM's identity; the
// rules of Validate.
func (s *Stamper) validateDomain(ctx context.Context, c domainClaim) error {
	fw := c.domain.Firmware
	if fw != nil && fw.Serial != "" {
		if err := s.validateSerial(ctx, c, fw.Serial); err != nil {
			return err
		}
	}
	if fw != nil && fw.UUID != "" {
		holder, err := s.enrolledHolder(ctx, c.self, UUIDIndex, normalUUID(string(fw.UUID)))
		if err != nil {
			return err
		}
		if holder != nil {
			return fmt.Errorf("%w: %s.firmware.uuid %q is the SMBIOS UUID of VM %s/%s", ErrIdentityClaimed, c.path, fw.UUID, holder.Namespace, holder.Name)
		}
	}
	for _, iface := range c.domain.Devices.Interfaces {
		if iface.MacAddress == "" {
			continue
		}
		holder, err := s.enrolledHolder(ctx, c.self, MACIndex, normalMAC(iface.MacAddress))
		if err != nil {
			return err
		}
		if holder != nil {
			return fmt.Errorf("%w: %s: interface %q: macAddress %s is used by VM %s/%s", ErrDuplicateMAC, c.path, iface.Name, iface.MacAddress, holder.Namespace, holder.Name)
		}
	}
	return nil
}

func (s *Stamper) validateSerial(ctx context.Context, c domainClaim, serial string) error {
	claimed, ok := claimedVM(serial)
	if !ok || claimed == c.self {
		return nil
	}
	target := &kubevirtv1.VirtualMachine{}
	err := s.Reader.Get(ctx, claimed, target)
	switch {
	case apierrors.IsNotFound(err):
		// Not there yet: would it be enrolled once created? Then the serial
		// is reserved for it.
		target = &kubevirtv1.VirtualMachine{}
		target.Namespace, target.Name = claimed.Namespace, claimed.Name
	case err != nil:
		return fmt.Errorf("reading VM %s claimed by serial %q: %w", claimed, serial, err)
	}
	enrolled, err := s.enrolled(ctx, target)
	if err != nil {
		return err
	}
	if enrolled {
		return fmt.Errorf("%w: %s.firmware.serial %q names VM %s of an enrolled namespace; only that VM may carry it", ErrIdentityClaimed, c.path, serial, claimed)
	}
	return nil
}
