package machine

import (
	"context"
	"io"
)

// Operation names a Machine method a decorator sees.
type Operation string

// The Machine methods an Interceptor runs; ID and Capabilities are plain
// reads and are not intercepted.
const (
	OpInventory       Operation = "Inventory"
	OpPowerState      Operation = "PowerState"
	OpReset           Operation = "Reset"
	OpBootOverride    Operation = "BootOverride"
	OpSetBootOverride Operation = "SetBootOverride"
	OpVirtualMedia    Operation = "VirtualMedia"
	OpInsertMedia     Operation = "InsertMedia"
	OpEjectMedia      Operation = "EjectMedia"
	OpFirmware        Operation = "Firmware"
	OpSetFirmware     Operation = "SetFirmware"
	OpResetFirmware   Operation = "ResetFirmware"
	OpLocatorActive   Operation = "LocatorActive"
	OpSetLocator      Operation = "SetLocatorActive"
	OpOpenConsole     Operation = "OpenConsole"
)

// Call is one call of a machine method as an Interceptor sees it.
type Call struct {
	Machine string // the machine's ID
	Op      Operation
	// Arg is the write's argument in words ("ForceOff", "Pxe Once UEFI",
	// the media URL, "UEFI SecureBoot", "On"), the console's kind for
	// OpenConsole; "" for reads, EjectMedia and ResetFirmware.
	Arg string
}

// IsWrite tells whether the call changes the machine.
func (c Call) IsWrite() bool {
	switch c.Op {
	case OpReset, OpSetBootOverride, OpInsertMedia, OpEjectMedia, OpSetFirmware, OpResetFirmware, OpSetLocator:
		return true
	}
	return false
}

// Interceptor runs one call of a machine method: it calls call at most once
// (with ctx or a context derived from it) and returns call's error, or its
// own instead of calling.
type Interceptor func(ctx context.Context, c Call, call func(context.Context) error) error

// Chain is an Interceptor running each of its own in turn, the first
// outermost.
func Chain(interceptors ...Interceptor) Interceptor {
	return func(ctx context.Context, c Call, call func(context.Context) error) error {
		next := call
		for i := len(interceptors) - 1; i >= 0; i-- {
			inner, around := next, interceptors[i]
			next = func(ctx context.Context) error { return around(ctx, c, inner) }
		}
		return next(ctx)
	}
}

// Intercept returns m with every call but ID and Capabilities run through
// around. It is Readiness-aware: the result's Ready is m's, or nil when m
// has none.
func Intercept(m Machine, around Interceptor) Machine {
	return &intercepted{
		Forwarder: Forwarder{MachineID: m.ID(), Target: func(context.Context) (Machine, error) { return m, nil }, Around: around},
		m:         m,
	}
}

type intercepted struct {
	Forwarder
	m Machine
}

var _ Readiness = (*intercepted)(nil)

func (i *intercepted) ID() string                 { return i.m.ID() }
func (i *intercepted) Capabilities() Capabilities { return i.m.Capabilities() }

func (i *intercepted) Ready() error {
	if r, ok := i.m.(Readiness); ok {
		return r.Ready()
	}
	return nil
}

// Forwarder is what every decorator of a Machine would otherwise write
// again, method by method: each call but ID and Capabilities is made on
// the machine Target finds for it, run through Around. A decorator embeds
// it and adds ID and Capabilities (and Ready) of its own.
type Forwarder struct {
	// MachineID names the machine in the Call that Around is given.
	MachineID string
	// Target finds the machine of each call, inside Around, so that a
	// decorator may look its machine up per call rather than hold it.
	Target func(ctx context.Context) (Machine, error)
	// Around runs each call; nil runs it as it is.
	Around Interceptor
}

func (f Forwarder) forward(ctx context.Context, op Operation, arg string, call func(context.Context, Machine) error) error {
	onTarget := func(ctx context.Context) error {
		m, err := f.Target(ctx)
		if err != nil {
			return err
		}
		return call(ctx, m)
	}
	if f.Around == nil {
		return onTarget(ctx)
	}
	return f.Around(ctx, Call{Machine: f.MachineID, Op: op, Arg: arg}, onTarget)
}

// forwardRead is forward for the methods that return a value.
func forwardRead[T any](ctx context.Context, f Forwarder, op Operation, read func(context.Context, Machine) (T, error)) (T, error) {
	var out T
	err := f.forward(ctx, op, "", func(ctx context.Context, m Machine) error {
		var err error
		out, err = read(ctx, m)
		return err
	})
	return out, err
}

func (f Forwarder) Inventory(ctx context.Context) (Inventory, error) {
	return forwardRead(ctx, f, OpInventory, func(ctx context.Context, m Machine) (Inventory, error) { return m.Inventory(ctx) })
}

func (f Forwarder) PowerState(ctx context.Context) (PowerState, error) {
	return forwardRead(ctx, f, OpPowerState, func(ctx context.Context, m Machine) (PowerState, error) { return m.PowerState(ctx) })
}

func (f Forwarder) Reset(ctx context.Context, r ResetType) error {
	return f.forward(ctx, OpReset, string(r), func(ctx context.Context, m Machine) error { return m.Reset(ctx, r) })
}

func (f Forwarder) BootOverride(ctx context.Context) (BootOverride, error) {
	return forwardRead(ctx, f, OpBootOverride, func(ctx context.Context, m Machine) (BootOverride, error) { return m.BootOverride(ctx) })
}

func (f Forwarder) SetBootOverride(ctx context.Context, o BootOverride) error {
	arg := string(o.Target) + " " + string(o.Enabled) + " " + string(o.Mode)
	return f.forward(ctx, OpSetBootOverride, arg, func(ctx context.Context, m Machine) error { return m.SetBootOverride(ctx, o) })
}

func (f Forwarder) VirtualMedia(ctx context.Context) (VirtualMedia, error) {
	return forwardRead(ctx, f, OpVirtualMedia, func(ctx context.Context, m Machine) (VirtualMedia, error) { return m.VirtualMedia(ctx) })
}

func (f Forwarder) InsertMedia(ctx context.Context, url string) error {
	return f.forward(ctx, OpInsertMedia, url, func(ctx context.Context, m Machine) error { return m.InsertMedia(ctx, url) })
}

func (f Forwarder) EjectMedia(ctx context.Context) error {
	return f.forward(ctx, OpEjectMedia, "", func(ctx context.Context, m Machine) error { return m.EjectMedia(ctx) })
}

func (f Forwarder) Firmware(ctx context.Context) (FirmwareState, error) {
	return forwardRead(ctx, f, OpFirmware, func(ctx context.Context, m Machine) (FirmwareState, error) { return m.Firmware(ctx) })
}

func (f Forwarder) SetFirmware(ctx context.Context, fw Firmware) error {
	arg := string(fw.Mode)
	if fw.SecureBoot {
		arg += " SecureBoot"
	}
	return f.forward(ctx, OpSetFirmware, arg, func(ctx context.Context, m Machine) error { return m.SetFirmware(ctx, fw) })
}

func (f Forwarder) ResetFirmware(ctx context.Context) error {
	return f.forward(ctx, OpResetFirmware, "", func(ctx context.Context, m Machine) error { return m.ResetFirmware(ctx) })
}

func (f Forwarder) LocatorActive(ctx context.Context) (bool, error) {
	return forwardRead(ctx, f, OpLocatorActive, func(ctx context.Context, m Machine) (bool, error) { return m.LocatorActive(ctx) })
}

func (f Forwarder) SetLocatorActive(ctx context.Context, on bool) error {
	arg := "Off"
	if on {
		arg = "On"
	}
	return f.forward(ctx, OpSetLocator, arg, func(ctx context.Context, m Machine) error { return m.SetLocatorActive(ctx, on) })
}

// OpenConsole is intercepted as the connecting only: what passes over the
// stream afterwards is the protocol's to account for.
func (f Forwarder) OpenConsole(ctx context.Context, k ConsoleKind) (io.ReadWriteCloser, error) {
	var stream io.ReadWriteCloser
	err := f.forward(ctx, OpOpenConsole, string(k), func(ctx context.Context, m Machine) error {
		var err error
		stream, err = m.OpenConsole(ctx, k)
		return err
	})
	return stream, err
}

// InterceptBackend returns b whose machines are intercepted by around. It
// keeps b's Readiness, Versioned, ChangeNotifier and StateStore: without
// them, Ready is nil, StateVersion says it cannot tell, Changed never
// closes and the state store is not supported, as the contracts allow.
func InterceptBackend(b Backend, around Interceptor) Backend {
	return &interceptedBackend{b: b, around: around}
}

type interceptedBackend struct {
	b      Backend
	around Interceptor
}

var (
	_ Readiness      = (*interceptedBackend)(nil)
	_ Versioned      = (*interceptedBackend)(nil)
	_ ChangeNotifier = (*interceptedBackend)(nil)
	_ StateStore     = (*interceptedBackend)(nil)
)

// Changed is b's, or a channel that never closes when b cannot tell.
func (ib *interceptedBackend) Changed() <-chan struct{} {
	if n, ok := ib.b.(ChangeNotifier); ok {
		return n.Changed()
	}
	return nil
}

func (ib *interceptedBackend) Machines(ctx context.Context) ([]string, error) {
	return ib.b.Machines(ctx)
}

func (ib *interceptedBackend) Machine(ctx context.Context, id string) (Machine, error) {
	m, err := ib.b.Machine(ctx, id)
	if err != nil {
		return nil, err
	}
	return Intercept(m, ib.around), nil
}

func (ib *interceptedBackend) Ready() error {
	if r, ok := ib.b.(Readiness); ok {
		return r.Ready()
	}
	return nil
}

func (ib *interceptedBackend) StateVersion(id string) (uint64, bool) {
	if v, ok := ib.b.(Versioned); ok {
		return v.StateVersion(id)
	}
	return 0, false
}

// LoadState is b's, or ErrNotSupported when b keeps no state.
func (ib *interceptedBackend) LoadState(ctx context.Context, key string) ([]byte, error) {
	if st, ok := ib.b.(StateStore); ok {
		return st.LoadState(ctx, key)
	}
	return nil, Errorf(ErrNotSupported, "the backend keeps no state")
}

// SaveState is b's, or ErrNotSupported when b keeps no state.
func (ib *interceptedBackend) SaveState(ctx context.Context, key string, data []byte) error {
	if st, ok := ib.b.(StateStore); ok {
		return st.SaveState(ctx, key, data)
	}
	return Errorf(ErrNotSupported, "the backend keeps no state")
}
