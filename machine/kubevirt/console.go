package kubevirt

import (
	"context"
	"io"

	"github.com/virtmetal/virtmetal/machine"
)

// OpenConsole: not yet wired to virt-api's console and vnc subresources.
func (m *Machine) OpenConsole(context.Context, machine.ConsoleKind) (io.ReadWriteCloser, error) {
	return nil, machine.Errorf(machine.ErrNotSupported, "consoles")
}
