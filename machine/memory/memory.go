// Package memory is an in-memory machine backend: the built-in backend of
// bmc-server (no cluster needed) and the reference implementation of the
// machine contract. It can delay power transitions like real hardware and
// can be told to fail, so protocol tests use it as their fake.
package memory

import (
	"context"
	"crypto/sha1"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/sim/console"
)

// Options configures a Backend.
type Options struct {
	// Machines is how many machines to create (vm-0, vm-1, ...). Zero means one.
	Machines int
	// TransitionDelay keeps PoweringOn/PoweringOff visible for this long
	// after a power action. Zero makes transitions instant.
	TransitionDelay time.Duration
	// Now is the clock; nil means time.Now. Tests inject a fake one.
	Now func() time.Time
	// CPU is every machine's processor topology; the zero value means
	// DefaultCPU.
	CPU machine.CPU
	// MemoryMiB is every machine's memory; zero means DefaultMemoryMiB.
	MemoryMiB int64
	// MediaImportTime is how long an inserted image stays Importing, its
	// Percent growing with the time, as a backend that copies images
	// first shows it. Zero makes inserted media Ready at once.
	MediaImportTime time.Duration
}

// The hardware of a machine whose Options do not say: a small amd64
// server, as the demo server shows it.
var DefaultCPU = machine.CPU{Sockets: 1, Cores: 2, Threads: 1, Model: "virtual", Architecture: machine.ArchAMD64}

const DefaultMemoryMiB = 4096

// Backend is a fixed set of in-memory machines. It is safe for concurrent use.
type Backend struct {
	machines []*Machine
	changes  *machine.Broadcast

	stateMu    sync.Mutex
	state      map[string][]byte
	stateFault error
}

var (
	_ machine.Backend        = (*Backend)(nil)
	_ machine.Versioned      = (*Backend)(nil)
	_ machine.ChangeNotifier = (*Backend)(nil)
	_ machine.StateStore     = (*Backend)(nil)
)

// New creates a backend with opts.Machines machines, all powered off.
func New(opts Options) *Backend {
	n := max(opts.Machines, 1)
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	if opts.CPU == (machine.CPU{}) {
		opts.CPU = DefaultCPU
	}
	if opts.MemoryMiB == 0 {
		opts.MemoryMiB = DefaultMemoryMiB
	}
	b := &Backend{changes: &machine.Broadcast{}}
	for i := range n {
		m := newMachine(i, opts.TransitionDelay, now, b.changes)
		m.inv.CPU = opts.CPU
		m.inv.MemoryMiB = opts.MemoryMiB
		m.mediaTime = opts.MediaImportTime
		b.machines = append(b.machines, m)
	}
	return b
}

// Changed is closed at the next change of a machine's generation. A
// transition that ends with time is seen, and told, at the next read.
func (b *Backend) Changed() <-chan struct{} { return b.changes.Changed() }

// Machines lists the machine IDs in creation order.
func (b *Backend) Machines(context.Context) ([]string, error) {
	ids := make([]string, len(b.machines))
	for i, m := range b.machines {
		ids[i] = m.id
	}
	return ids, nil
}

// Machine returns the machine with that ID.
func (b *Backend) Machine(_ context.Context, id string) (machine.Machine, error) {
	m := b.Get(id)
	if m == nil {
		return nil, machine.Errorf(machine.ErrNotFound, "%q", id)
	}
	return m, nil
}

// StateVersion is the machine's generation: every change of its state
// (and every fault set) counts one. Unknown IDs have version 0, which no
// machine has.
func (b *Backend) StateVersion(id string) (uint64, bool) {
	m := b.Get(id)
	if m == nil {
		return 0, true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.settle()
	return m.generation, true
}

// LoadState returns what SaveState kept under key. The state lasts as long
// as the backend: a protocol server made again on the same backend finds
// it, as a restarted bmc-server finds a KubeVirt backend's.
func (b *Backend) LoadState(_ context.Context, key string) ([]byte, error) {
	b.stateMu.Lock()
	defer b.stateMu.Unlock()
	if b.stateFault != nil {
		return nil, b.stateFault
	}
	return slices.Clone(b.state[key]), nil
}

// SaveState keeps data under key.
func (b *Backend) SaveState(_ context.Context, key string, data []byte) error {
	b.stateMu.Lock()
	defer b.stateMu.Unlock()
	if b.stateFault != nil {
		return b.stateFault
	}
	if b.state == nil {
		b.state = map[string][]byte{}
	}
	b.state[key] = slices.Clone(data)
	return nil
}

// SetStateFault makes LoadState and SaveState return err until called
// with nil, as a store that cannot be reached would.
func (b *Backend) SetStateFault(err error) {
	b.stateMu.Lock()
	defer b.stateMu.Unlock()
	b.stateFault = err
}

// Get returns the concrete machine with that ID, or nil. Tests use it to
// reach the fault and boot-history hooks.
func (b *Backend) Get(id string) *Machine {
	for _, m := range b.machines {
		if m.id == id {
			return m
		}
	}
	return nil
}

// Machine is one in-memory machine.
type Machine struct {
	id    string
	inv   machine.Inventory
	delay time.Duration
	now   func() time.Time

	mu            sync.Mutex
	power         machine.PowerState
	transitionEnd time.Time            // when PoweringOn/PoweringOff settles
	boot          machine.BootOverride // its Mode is firmware.Next.Mode
	firmware      machine.FirmwareState
	locator       bool
	media         machine.VirtualMedia
	mediaTime     time.Duration // Options.MediaImportTime
	mediaStart    time.Time     // when the inserted image's import began
	boots         []machine.BootTarget
	consoles      []io.Closer // the machine's side of the streams open to this boot
	fault         error
	// generation counts changes of the fields above, from 1; each is told
	// to changes.
	generation uint64
	changes    *machine.Broadcast
}

// changed counts a change of state. Callers hold mu.
func (m *Machine) changed() {
	m.generation++
	m.changes.Notify()
}

var _ machine.Machine = (*Machine)(nil)

// defaultBootTarget is what a machine boots from without an override.
const defaultBootTarget = machine.BootHdd

// defaultFirmware is a new machine's, and what ResetFirmware restores.
var defaultFirmware = machine.Firmware{Mode: machine.BootModeUEFI}

// emptyCD is the virtual CD drive with no media: a CD drive is
// write-protected whatever it holds, as the KubeVirt backend reports too.
var emptyCD = machine.VirtualMedia{WriteProtected: true}

func newMachine(i int, delay time.Duration, now func() time.Time, changes *machine.Broadcast) *Machine {
	name := fmt.Sprintf("vm-%d", i)
	// Identity is derived from the index so it survives a restart of the
	// process: MaaS keys machines by MAC and UUID.
	sum := sha1.Sum([]byte("virtmetal/memory/" + name))
	sum[6] = sum[6]&0x0f | 0x50 // RFC 4122 version 5 (name-based, SHA-1)
	sum[8] = sum[8]&0x3f | 0x80 // RFC 4122 variant
	uuid := fmt.Sprintf("%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
	return &Machine{
		id:         name,
		delay:      delay,
		now:        now,
		power:      machine.PowerOff,
		generation: 1,
		changes:    changes,
		boot:       machine.BootOverride{Target: machine.BootNone, Enabled: machine.BootDisabled, Mode: defaultFirmware.Mode},
		media:      emptyCD,
		firmware:   machine.FirmwareState{Next: defaultFirmware, Current: defaultFirmware},
		inv: machine.Inventory{
			Name:         name,
			UUID:         uuid,
			SerialNumber: name + ".memory",
			Manufacturer: "virtmetal",
			Model:        "in-memory machine",
			NICs: []machine.NIC{{
				Name: "default",
				MAC:  fmt.Sprintf("52:54:00:%02x:%02x:%02x", sum[16], sum[17], sum[18]),
			}},
			Disks: []machine.Disk{
				{Name: "rootdisk", Kind: machine.DiskKindDisk, Bus: machine.DiskBusVirtio, CapacityBytes: 20 << 30},
				{Name: "cdrom", Kind: machine.DiskKindCdrom, Bus: machine.DiskBusSATA},
			},
		},
	}
}

// ID returns the machine's ID (vm-N).
func (m *Machine) ID() string { return m.id }

// Capabilities: the in-memory machine supports everything in the contract.
func (m *Machine) Capabilities() machine.Capabilities {
	return machine.Capabilities{
		ResetTypes:   slices.Clone(machine.AllResetTypes),
		BootTargets:  []machine.BootTarget{machine.BootPxe, machine.BootHdd, machine.BootCd, machine.BootUefiHttp},
		BootModes:    []machine.BootMode{machine.BootModeUEFI, machine.BootModeLegacy},
		VirtualMedia: true,
		Consoles:     slices.Clone(machine.AllConsoleKinds),
	}
}

// SetFault makes every later call fail with err, until SetFault(nil).
func (m *Machine) SetFault(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fault = err
	m.changed()
}

// Boots returns the device of every boot so far, oldest first.
func (m *Machine) Boots() []machine.BootTarget {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.boots)
}

// Inventory returns a copy of the machine's hardware description.
func (m *Machine) Inventory(context.Context) (machine.Inventory, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fault != nil {
		return machine.Inventory{}, m.fault
	}
	m.settle()
	inv := m.inv
	inv.NICs = slices.Clone(inv.NICs)
	for i := range inv.NICs {
		// A machine's NIC has a link while it runs.
		inv.NICs[i].Link = machine.LinkDown
		if m.power == machine.PowerOn || m.power == machine.Paused {
			inv.NICs[i].Link = machine.LinkUp
		}
	}
	inv.Disks = slices.Clone(inv.Disks)
	return inv, nil
}

// PowerState returns the current state, settling a finished transition.
func (m *Machine) PowerState(context.Context) (machine.PowerState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fault != nil {
		return "", m.fault
	}
	m.settle()
	return m.power, nil
}

// settle ends a transition whose time is up. Callers hold mu.
func (m *Machine) settle() {
	if m.now().Before(m.transitionEnd) {
		return
	}
	switch m.power {
	case machine.PoweringOn:
		m.power = machine.PowerOn
		m.changed()
	case machine.PoweringOff:
		m.power = machine.PowerOff
		m.changed()
	}
}

// startTransition moves towards on (true) or off. Either way the running
// boot ends, and its consoles with it. Callers hold mu.
func (m *Machine) startTransition(on bool) {
	for _, c := range m.consoles {
		c.Close()
	}
	m.consoles = nil
	switch {
	case on && m.delay > 0:
		m.power = machine.PoweringOn
	case on:
		m.power = machine.PowerOn
	case m.delay > 0:
		m.power = machine.PoweringOff
	default:
		m.power = machine.PowerOff
	}
	m.transitionEnd = m.now().Add(m.delay)
	m.changed()
}

// powerOn boots the machine, consuming a Once override. Callers hold mu.
func (m *Machine) powerOn() {
	target := defaultBootTarget
	if m.boot.Enabled != machine.BootDisabled {
		target = m.boot.Target
	}
	if m.boot.Enabled == machine.BootOnce {
		m.boot = machine.BootOverride{Target: machine.BootNone, Enabled: machine.BootDisabled, Mode: m.boot.Mode}
	}
	m.boots = append(m.boots, target)
	m.firmware.Current = m.firmware.Next
	m.firmware.Booted = m.now()
	m.startTransition(true)
}

// Reset performs a power action; see machine.PowerController.
func (m *Machine) Reset(_ context.Context, r machine.ResetType) error {
	if err := m.Capabilities().CheckReset(r); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fault != nil {
		return m.fault
	}
	m.settle()
	running := m.power == machine.PowerOn || m.power == machine.PoweringOn || m.power == machine.Paused
	switch r {
	case machine.ResetOn, machine.ResetForceOn:
		if !running {
			m.powerOn()
		}
	case machine.ResetForceOff, machine.ResetGracefulShutdown:
		if running {
			m.startTransition(false)
		}
	case machine.ResetForceRestart, machine.ResetGracefulRestart, machine.ResetPowerCycle:
		m.powerOn()
	case machine.ResetNmi:
		if m.power != machine.PowerOn {
			return machine.Errorf(machine.ErrConflict, "NMI needs a running machine, it is %s", m.power)
		}
	}
	return nil
}

// BootOverride returns the current boot override.
func (m *Machine) BootOverride(context.Context) (machine.BootOverride, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fault != nil {
		return machine.BootOverride{}, m.fault
	}
	return m.boot, nil
}

// SetBootOverride replaces the boot override; see machine.BootController.
func (m *Machine) SetBootOverride(_ context.Context, o machine.BootOverride) error {
	if err := m.Capabilities().CheckBootOverride(o); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fault != nil {
		return m.fault
	}
	next := m.firmware.Next
	next.Mode = o.Mode
	if err := next.Check(m.Capabilities()); err != nil {
		return err
	}
	m.boot = o.Normalize()
	m.configure(next)
	m.changed()
	return nil
}

// Firmware returns the configured and the running firmware.
func (m *Machine) Firmware(context.Context) (machine.FirmwareState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fault != nil {
		return machine.FirmwareState{}, m.fault
	}
	m.settle()
	return m.firmwareState(), nil
}

// firmwareState is the firmware as a reader sees it: Current is Next
// while the machine is off. Callers hold mu.
func (m *Machine) firmwareState() machine.FirmwareState {
	state := m.firmware
	if m.power == machine.PowerOff {
		state.Current, state.Booted = state.Next, time.Time{}
	}
	state.Product = "in-memory " + string(state.Current.Mode) + " firmware"
	return state
}

// SetFirmware configures the next boot's firmware; see
// machine.FirmwareController.
func (m *Machine) SetFirmware(_ context.Context, f machine.Firmware) error {
	if err := f.Check(m.Capabilities()); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fault != nil {
		return m.fault
	}
	m.configure(f)
	return nil
}

// ResetFirmware configures the factory firmware for the next boot.
func (m *Machine) ResetFirmware(ctx context.Context) error {
	return m.SetFirmware(ctx, defaultFirmware)
}

// configure makes f the next boot's firmware. Callers hold mu.
func (m *Machine) configure(f machine.Firmware) {
	if m.firmware.Next == f {
		return
	}
	m.firmware.Next = f
	m.boot.Mode = f.Mode
	m.changed()
}

// LocatorActive reports the locator light.
func (m *Machine) LocatorActive(context.Context) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fault != nil {
		return false, m.fault
	}
	return m.locator, nil
}

// SetLocatorActive switches the locator light.
func (m *Machine) SetLocatorActive(_ context.Context, on bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fault != nil {
		return m.fault
	}
	if m.locator != on {
		m.locator = on
		m.changed()
	}
	return nil
}

// VirtualMedia returns the state of the virtual CD drive, with the
// import's progress as of now.
func (m *Machine) VirtualMedia(context.Context) (machine.VirtualMedia, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fault != nil {
		return machine.VirtualMedia{}, m.fault
	}
	media := m.media
	if media.State == machine.MediaImporting {
		elapsed := m.now().Sub(m.mediaStart)
		if elapsed >= m.mediaTime {
			media.State, media.Percent = machine.MediaReady, 100
		} else {
			media.Percent = int(100 * elapsed / m.mediaTime)
		}
	}
	return media, nil
}

// FailMediaImport makes an import under way fail with problem, as a fetch
// of an unreachable URL does; it returns false when no import is under way.
func (m *Machine) FailMediaImport(problem string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.media.State != machine.MediaImporting || m.now().Sub(m.mediaStart) >= m.mediaTime {
		return false
	}
	m.media.State, m.media.Problem = machine.MediaFailed, problem
	return true
}

// InsertMedia attaches an image; see machine.MediaController.
func (m *Machine) InsertMedia(_ context.Context, image string) error {
	if err := machine.CheckImageURL(image); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fault != nil {
		return m.fault
	}
	switch {
	case m.media.Inserted && m.media.Image == image:
		return nil
	case m.media.Inserted:
		return machine.Errorf(machine.ErrConflict, "media %q is already inserted", m.media.Image)
	}
	m.media = machine.VirtualMedia{Inserted: true, Image: image, WriteProtected: true, State: machine.MediaReady, Percent: 100}
	if m.mediaTime > 0 {
		m.media.State, m.media.Percent = machine.MediaImporting, 0
		m.mediaStart = m.now()
	}
	m.changed()
	return nil
}

// EjectMedia detaches the media, if any.
func (m *Machine) EjectMedia(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fault != nil {
		return m.fault
	}
	m.media = emptyCD
	m.changed()
	return nil
}

// OpenConsole connects to the simulated guest's serial console (boot lines,
// a login prompt, an echo) or screen (an RFB server); see
// machine.ConsoleController. Every stream of a boot ends when it does.
func (m *Machine) OpenConsole(_ context.Context, k machine.ConsoleKind) (io.ReadWriteCloser, error) {
	if err := m.Capabilities().CheckConsole(k); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fault != nil {
		return nil, m.fault
	}
	m.settle()
	if m.power != machine.PowerOn && m.power != machine.PoweringOn && m.power != machine.Paused {
		return nil, machine.Errorf(machine.ErrConflict, "the console needs a running machine, it is %s", m.power)
	}
	if k == machine.ConsoleSerial {
		serial := console.NewSerial(m.id)
		return m.track(serial, serial), nil
	}
	screen, client := net.Pipe()
	go func() {
		_ = console.ServeRFB(screen, m.id)
		screen.Close()
	}()
	return m.track(client, screen), nil
}

// track keeps the machine's side of a stream until the boot ends or the
// stream is closed, whichever is first. Callers hold mu.
func (m *Machine) track(stream io.ReadWriteCloser, machineSide io.Closer) io.ReadWriteCloser {
	m.consoles = append(m.consoles, machineSide)
	return machine.OnClose(stream, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.consoles = slices.DeleteFunc(m.consoles, func(c io.Closer) bool { return c == machineSide })
		machineSide.Close()
	})
}
