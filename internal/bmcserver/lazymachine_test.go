package bmcserver

import (
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/machine/machinetest"
	"github.com/virtmetal/virtmetal/machine/memory"
)

// TestLazyMachineKeepsTheContract: looked up at each call, the machine IPMI
// serves still passes the backend contract suite.
func TestLazyMachineKeepsTheContract(t *testing.T) {
	machinetest.Run(t, func(t *testing.T) machinetest.Subject {
		b := memory.New(memory.Options{TransitionDelay: 10 * time.Millisecond})
		m := newLazyMachine(b, "vm-0")
		// As IPMI does before any call: Capabilities are the last lookup's.
		if err := m.Ready(); err != nil {
			t.Fatal(err)
		}
		return machinetest.Subject{Machine: m, Boots: b.Get("vm-0").Boots, Versioned: b}
	})
}
