package kubevirt_test

import (
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/machinetest"
)

func TestContract(t *testing.T) {
	machinetest.Run(t, func(t *testing.T) machinetest.Subject {
		ns := newNamespace(t)
		newVM(t, ns, "vm", nil)
		b := startBackend(t, env.Config, ns, "vm", kubevirt.Options{})
		m, err := b.Machine(t.Context(), "vm")
		if err != nil {
			t.Fatalf("Machine: %v", err)
		}
		return machinetest.Subject{
			Machine: m,
			Boots:   func() []machine.BootTarget { return sim.Boots(ns, "vm") },
			Settle:  20 * time.Second,
		}
	})
}
