// Package machine is the backend contract: "a machine behind a BMC", in
// domain types. Protocol packages (redfish, ipmi) translate their wire
// formats to and from these types; backends (memory, kubevirt) implement
// them. Nothing here knows about HTTP, IPMI or Kubernetes.
//
// The contract is split into small capability interfaces in the manner of
// bmclib, so a protocol handler can say exactly what it needs.
package machine

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"time"
)

// Sentinel errors. Backends wrap them with %w and add detail; each protocol
// maps them to its own error codes in exactly one place.
var (
	// ErrNotFound: the machine (or the object behind it) does not exist.
	ErrNotFound = errors.New("machine not found")
	// ErrNotSupported: the backend cannot do this at all (e.g. NMI on a VM).
	ErrNotSupported = errors.New("operation not supported")
	// ErrInvalidArgument: a value outside what the contract allows.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrConflict: the request is valid but the machine's current state
	// forbids it (e.g. inserting media into an occupied drive).
	ErrConflict = errors.New("conflicts with machine state")
	// ErrUnavailable: the backend cannot be reached right now; retrying
	// later may succeed.
	ErrUnavailable = errors.New("backend unavailable")
)

// PowerState is the machine's power state as a BMC reports it.
type PowerState string

const (
	PowerOn     PowerState = "On"
	PowerOff    PowerState = "Off"
	PoweringOn  PowerState = "PoweringOn"
	PoweringOff PowerState = "PoweringOff"
	// Paused: the machine is suspended; it counts as powered for the purpose
	// of On (nothing to do) and can be forced off.
	Paused PowerState = "Paused"
)

// ResetType is a power action. The names match Redfish's ResetType because
// they are the industry's vocabulary, not because this package knows Redfish.
type ResetType string

const (
	ResetOn               ResetType = "On"
	ResetForceOn          ResetType = "ForceOn"
	ResetForceOff         ResetType = "ForceOff"
	ResetGracefulShutdown ResetType = "GracefulShutdown"
	ResetGracefulRestart  ResetType = "GracefulRestart"
	ResetForceRestart     ResetType = "ForceRestart"
	ResetPowerCycle       ResetType = "PowerCycle"
	ResetNmi              ResetType = "Nmi"
)

// AllResetTypes lists every ResetType in a stable order.
var AllResetTypes = []ResetType{
	ResetOn, ResetForceOn, ResetForceOff, ResetGracefulShutdown,
	ResetGracefulRestart, ResetForceRestart, ResetPowerCycle, ResetNmi,
}

// BootTarget is the device a boot override points at.
type BootTarget string

const (
	BootNone     BootTarget = "None"
	BootPxe      BootTarget = "Pxe"
	BootHdd      BootTarget = "Hdd"
	BootCd       BootTarget = "Cd"
	BootUefiHttp BootTarget = "UefiHttp"
)

// BootEnabled says how long a boot override lasts.
type BootEnabled string

const (
	BootDisabled   BootEnabled = "Disabled"
	BootOnce       BootEnabled = "Once"
	BootContinuous BootEnabled = "Continuous"
)

// BootMode is the firmware interface the machine boots with.
type BootMode string

const (
	BootModeUEFI   BootMode = "UEFI"
	BootModeLegacy BootMode = "Legacy"
)

// BootOverride is the boot source override of a machine.
type BootOverride struct {
	Target  BootTarget
	Enabled BootEnabled
	Mode    BootMode
}

// Capabilities lists what a machine accepts. Protocols advertise exactly
// these (Redfish AllowableValues) and refuse the rest before calling the
// backend.
type Capabilities struct {
	ResetTypes  []ResetType
	BootTargets []BootTarget
	BootModes   []BootMode
	// VirtualMedia is false where the backend cannot attach media at all.
	VirtualMedia bool
	// Consoles lists the consoles OpenConsole connects to.
	Consoles []ConsoleKind
}

// SupportsReset reports whether r is among c.ResetTypes.
func (c Capabilities) SupportsReset(r ResetType) bool { return slices.Contains(c.ResetTypes, r) }

// SupportsBootTarget reports whether t is among c.BootTargets.
func (c Capabilities) SupportsBootTarget(t BootTarget) bool {
	return slices.Contains(c.BootTargets, t)
}

// SupportsBootMode reports whether m is among c.BootModes.
func (c Capabilities) SupportsBootMode(m BootMode) bool { return slices.Contains(c.BootModes, m) }

// Inventory is the hardware description of a machine.
type Inventory struct {
	Name         string // human name (the VM name for KubeVirt)
	UUID         string // SMBIOS system UUID, lower case, with dashes
	SerialNumber string // SMBIOS system serial
	Manufacturer string
	Model        string
	CPU          CPU
	MemoryMiB    int64 // guest memory
	NICs         []NIC
	Disks        []Disk
}

// CPU is the processor topology the guest sees: Sockets × Cores × Threads
// logical processors.
type CPU struct {
	Sockets      int    // at least 1
	Cores        int    // per socket, at least 1
	Threads      int    // per core, at least 1
	Model        string // may be empty
	Architecture Architecture
}

// LogicalProcessors is the number of hardware threads.
func (c CPU) LogicalProcessors() int { return c.Sockets * c.Cores * c.Threads }

// Architecture is the guest's instruction set, in Go's GOARCH names; empty
// when unknown.
type Architecture string

const (
	ArchAMD64   Architecture = "amd64"
	ArchARM64   Architecture = "arm64"
	ArchPPC64LE Architecture = "ppc64le"
	ArchS390X   Architecture = "s390x"
)

// NIC is a network interface.
type NIC struct {
	Name string
	MAC  string // lower case, colon separated
	IPs  []string
	Link LinkState
}

// LinkState is whether a NIC has a link; empty when unknown.
type LinkState string

const (
	LinkUp   LinkState = "Up"
	LinkDown LinkState = "Down"
)

// DiskKind tells a hard disk from an optical drive.
type DiskKind string

const (
	DiskKindDisk  DiskKind = "Disk"
	DiskKindCdrom DiskKind = "Cdrom"
)

// DiskBus is the bus a disk is attached to the guest by.
type DiskBus string

const (
	DiskBusVirtio DiskBus = "virtio"
	DiskBusSATA   DiskBus = "sata"
	DiskBusSCSI   DiskBus = "scsi"
	DiskBusUSB    DiskBus = "usb"
)

// Disk is a block device of the machine.
type Disk struct {
	Name          string
	Kind          DiskKind
	Bus           DiskBus // empty when unknown
	CapacityBytes int64   // 0 when unknown
}

// VirtualMedia is the state of the machine's virtual CD drive.
type VirtualMedia struct {
	Inserted       bool
	Image          string // URL of the inserted image; empty when ejected
	WriteProtected bool
	// State says whether the inserted image can be read yet; empty when
	// nothing is inserted.
	State MediaState
	// Percent is how much of the image the backend has fetched, 0 to 100,
	// as far as it can tell: 100 once Ready.
	Percent int
	// Problem says why a Failed import failed.
	Problem string
}

// MediaState is how far the backend has got with an inserted image. A
// backend that reads the image where it is (the in-memory machine) is Ready
// at once; one that copies it first (KubeVirt's CDI import) is Importing
// until the copy is whole.
type MediaState string

const (
	// MediaReady: the drive reads the image.
	MediaReady MediaState = "Ready"
	// MediaPending: the fetch has not started and waits for the machine
	// (a volume bound only when the machine first starts).
	MediaPending MediaState = "Pending"
	// MediaImporting: the backend is fetching the image.
	MediaImporting MediaState = "Importing"
	// MediaFailed: the fetch failed (Problem says why); the media stays
	// inserted until ejected, and the drive reads nothing.
	MediaFailed MediaState = "Failed"
)

// InventoryReader describes the machine. Reads never change state.
type InventoryReader interface {
	Inventory(ctx context.Context) (Inventory, error)
}

// PowerController reads and changes power.
type PowerController interface {
	PowerState(ctx context.Context) (PowerState, error)
	// Reset performs a power action. It is idempotent where the action names
	// a state: On/ForceOn when already on (or powering on), and
	// ForceOff/GracefulShutdown when already off (or powering off), return
	// nil and change nothing. Restart actions (ForceRestart, GracefulRestart,
	// PowerCycle) power an Off machine on. Actions issued during a transition
	// are accepted and converge on the last one requested; they are never
	// refused because the machine is "busy". Every power-on (including the
	// one inside a restart) is a boot, and consumes a Once boot override.
	// An action not in Capabilities returns ErrNotSupported. Nmi on a
	// machine that is not running returns ErrConflict.
	Reset(ctx context.Context, r ResetType) error
}

// BootController reads and changes the boot override.
type BootController interface {
	BootOverride(ctx context.Context) (BootOverride, error)
	// SetBootOverride replaces the override. Enabled Disabled (or Target
	// None) clears it; the stored value is then {None, Disabled, mode}. A
	// Mode other than the firmware's configures that mode for the next
	// boot, as SetFirmware does (keeping Secure Boot, so a Legacy mode with
	// Secure Boot on returns ErrConflict). A
	// Once override lasts for exactly one boot, after which BootOverride
	// reports {None, Disabled, mode}. Setting the current value again is a
	// no-op. Targets or modes outside Capabilities return ErrNotSupported;
	// unknown enum values return ErrInvalidArgument.
	SetBootOverride(ctx context.Context, o BootOverride) error
}

// MediaController drives the virtual CD drive.
type MediaController interface {
	// VirtualMedia reports the drive, with how far the backend has got
	// with the inserted image.
	VirtualMedia(ctx context.Context) (VirtualMedia, error)
	// InsertMedia attaches the image at url and starts fetching it; it
	// returns before the image is Ready (VirtualMedia tells when it is).
	// Inserting the URL that is already inserted returns nil and changes
	// nothing (clients retry inserts, or eject best-effort and insert
	// again), whatever its State; a different URL while media is inserted
	// returns ErrConflict. An empty or non-absolute URL returns
	// ErrInvalidArgument. The machine's own drives and volumes are never
	// touched: the media has a drive of its own.
	InsertMedia(ctx context.Context, url string) error
	// EjectMedia detaches the media, stopping a fetch under way; it
	// returns nil when the drive is empty.
	EjectMedia(ctx context.Context) error
}

// Firmware is the firmware a machine boots with.
type Firmware struct {
	Mode BootMode
	// SecureBoot is UEFI Secure Boot; a Legacy firmware has none.
	SecureBoot bool
}

// FirmwareState is the firmware configured for the next boot and the one
// the running boot started with.
type FirmwareState struct {
	// Next is what the next power-on (or restart) boots with.
	Next Firmware
	// Current is what the machine booted with, while it runs; Next while
	// it does not (nothing runs that could differ).
	Current Firmware
	// Product names the firmware Current is ("SeaBIOS"), without a
	// version the backend cannot know; empty when unknown.
	Product string
	// Booted is when the running boot started with Current, which is when
	// those settings were applied; zero while the machine is off.
	Booted time.Time
}

// Pending reports whether a restart would change the firmware.
func (s FirmwareState) Pending() bool { return s.Next != s.Current }

// Check validates f's enum values and that Secure Boot has UEFI under it.
func (f Firmware) Check(c Capabilities) error {
	switch f.Mode {
	case BootModeUEFI, BootModeLegacy:
	default:
		return Errorf(ErrInvalidArgument, "unknown boot mode %q", f.Mode)
	}
	if !c.SupportsBootMode(f.Mode) {
		return Errorf(ErrNotSupported, "boot mode %q", f.Mode)
	}
	if f.SecureBoot && f.Mode != BootModeUEFI {
		return Errorf(ErrConflict, "Secure Boot needs UEFI firmware, the mode asked for is %s", f.Mode)
	}
	return nil
}

// FirmwareController reads and configures the firmware. Changes take
// effect at the next power-on or restart, as a BIOS setup's do; the boot
// mode is also the Mode of BootOverride, and SetBootOverride with another
// mode changes it the same way.
type FirmwareController interface {
	Firmware(ctx context.Context) (FirmwareState, error)
	// SetFirmware configures the firmware of the next boot. Setting the
	// configured value again returns nil and changes nothing. Secure Boot
	// with Legacy returns ErrConflict, a mode outside Capabilities
	// ErrNotSupported, an unknown mode ErrInvalidArgument.
	SetFirmware(ctx context.Context, f Firmware) error
	// ResetFirmware configures, for the next boot, the firmware the
	// machine had before the BMC first changed it; it returns nil when
	// nothing was changed.
	ResetFirmware(ctx context.Context) error
}

// IndicatorController reads and sets the machine's locator light: a
// machine without one keeps its state, so a client's "find me" reads back.
type IndicatorController interface {
	LocatorActive(ctx context.Context) (bool, error)
	// SetLocatorActive switches the light; setting the current state
	// again returns nil and changes nothing.
	SetLocatorActive(ctx context.Context, on bool) error
}

// Machine is everything a BMC can do to one machine.
type Machine interface {
	// ID is stable for the machine's life and safe in a URL path segment.
	ID() string
	Capabilities() Capabilities
	InventoryReader
	PowerController
	BootController
	MediaController
	FirmwareController
	IndicatorController
	ConsoleController
}

// Backend is a set of machines served by one BMC process.
type Backend interface {
	// Machines lists the machine IDs in a stable order.
	Machines(ctx context.Context) ([]string, error)
	// Machine returns the machine with that ID, or ErrNotFound.
	Machine(ctx context.Context, id string) (Machine, error)
}

// Readiness is implemented by backends, and machines, that cannot serve
// until something outside the process answers (a cache's first sync, an
// API server). Protocols ask it before calling, so a client is told "busy,
// retry" (Redfish 503, IPMI node busy) rather than shown a partial view.
type Readiness interface {
	// Ready returns nil when calls can be served, else an error wrapping
	// ErrUnavailable that says why. It never blocks.
	Ready() error
}

// ActionRecorder is implemented by backends that can keep the record of a
// BMC action where it outlives the BMC's process (KubeVirt: an Event on
// the VM). action names the operation ("Reset"), note says who did what.
type ActionRecorder interface {
	RecordAction(ctx context.Context, machineID, action string, failed bool, note string) error
}

// StateStore is implemented by backends that can keep a protocol's own
// state (Redfish's event subscriptions) where it outlives the BMC's
// process and where the BMC may write (KubeVirt: a Secret of the VM's
// BMC, since subscriptions carry their destinations' credentials). The
// protocol owns the bytes' format; a key names one protocol's record.
type StateStore interface {
	// LoadState returns what SaveState last saved under key, or nil and
	// no error when nothing was. It returns an error wrapping
	// ErrNotSupported when this backend has nowhere to keep state (the
	// protocol then runs without), or ErrUnavailable when the store
	// cannot be read now (the protocol tries again).
	LoadState(ctx context.Context, key string) ([]byte, error)
	// SaveState replaces what is kept under key; saving the bytes already
	// kept changes nothing.
	SaveState(ctx context.Context, key string, data []byte) error
}

// Versioned is implemented by backends that can tell, cheaply and without
// a remote call, when a machine's state may have changed, so a protocol can
// render its answers once per change rather than once per request.
type Versioned interface {
	// StateVersion returns a number that changes whenever anything the
	// machine with that ID reports could read differently: Inventory,
	// PowerState, BootOverride, VirtualMedia, Firmware, LocatorActive,
	// Capabilities, and whether Backend.Machine finds it; VirtualMedia's
	// State, Percent and Problem excepted, which an import moves without
	// any write (read VirtualMedia afresh to follow them). It may also
	// change when nothing did. Once a write (Reset, SetBootOverride,
	// InsertMedia, EjectMedia, SetFirmware, ResetFirmware,
	// SetLocatorActive) has returned,
	// StateVersion no longer returns the number from before it. ok is false
	// when the backend cannot tell (e.g. it is reading through to a remote
	// API); callers must then read afresh. A Versioned backend's Machines
	// list never changes. StateVersion never blocks.
	StateVersion(id string) (version uint64, ok bool)
}

// Validate checks that o uses known enum values only, independent of any
// machine's capabilities.
func (o BootOverride) Validate() error {
	switch o.Target {
	case BootNone, BootPxe, BootHdd, BootCd, BootUefiHttp:
	default:
		return Errorf(ErrInvalidArgument, "unknown boot target %q", o.Target)
	}
	switch o.Enabled {
	case BootDisabled, BootOnce, BootContinuous:
	default:
		return Errorf(ErrInvalidArgument, "unknown boot override duration %q", o.Enabled)
	}
	switch o.Mode {
	case BootModeUEFI, BootModeLegacy:
	default:
		return Errorf(ErrInvalidArgument, "unknown boot mode %q", o.Mode)
	}
	return nil
}

// Normalize folds the two spellings of "no override" into one:
// {None, Disabled, mode}.
func (o BootOverride) Normalize() BootOverride {
	if o.Target == BootNone || o.Enabled == BootDisabled {
		return BootOverride{Target: BootNone, Enabled: BootDisabled, Mode: o.Mode}
	}
	return o
}

// CheckBootOverride validates o against the enum values and against c.
func (c Capabilities) CheckBootOverride(o BootOverride) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if o.Target != BootNone && !c.SupportsBootTarget(o.Target) {
		return Errorf(ErrNotSupported, "boot target %q", o.Target)
	}
	if !c.SupportsBootMode(o.Mode) {
		return Errorf(ErrNotSupported, "boot mode %q", o.Mode)
	}
	return nil
}

// CheckReset validates r against the known reset types and against c.
func (c Capabilities) CheckReset(r ResetType) error {
	if !slices.Contains(AllResetTypes, r) {
		return Errorf(ErrInvalidArgument, "unknown reset type %q", r)
	}
	if !c.SupportsReset(r) {
		return Errorf(ErrNotSupported, "reset type %q", r)
	}
	return nil
}

// CheckImageURL accepts absolute http(s) URLs only: every backend can fetch
// those (CDI's http import among them).
func CheckImageURL(image string) error {
	u, err := url.Parse(image)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Errorf(ErrInvalidArgument, "image %q is not an absolute http(s) URL", image)
	}
	return nil
}
