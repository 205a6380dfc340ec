package kubevirt

import (
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/machine"
)

// PowerWishes is how many runStrategy writes have been asked for, so tests
// can order concurrent callers.
func (b *Backend) PowerWishes() uint64 {
	b.power.mu.Lock()
	defer b.power.mu.Unlock()
	return b.power.asked
}

// WriteOverride changes vm as SetBootOverride does, without anything else
// SetBootOverride does, so tests can build the VM another BMC left behind.
func WriteOverride(vm *kubevirtv1.VirtualMachine, o machine.BootOverride) error {
	_, err := applyOverride(vm, nil, o.Normalize())
	return err
}
