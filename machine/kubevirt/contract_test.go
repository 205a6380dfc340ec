package kubevirt_test

import (
	"net/http"
	"testing"

	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
	"github.com/virtmetal/virtmetal/machine/machinetest"
)

// TestContract runs the contract suite on a cluster whose virt-api serves
// the stop and restart subresources, and on one without (the fallback).
func TestContract(t *testing.T) {
	modes := []struct {
		name   string
		answer int // the virt-api stand-in's; 0: acts as virt-api
	}{
		{"subresource API served", 0},
		{"subresource API not served", http.StatusNotFound},
	}
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			machinetest.Run(t, func(t *testing.T) machinetest.Subject {
				ns := cluster.NewNamespace(t)
				newVM(t, ns, "vm", nil)
				api := cluster.NewVirtAPI(t)
				api.Answer(mode.answer)
				b := kubevirttest.StartBackend(t, api.Config(), ns, "vm", kubevirt.Options{})
				if mode.answer == 0 {
					t.Cleanup(func() {
						if _, deleted := forcing(api.Requests(), ns, "vm"); deleted {
							t.Errorf("the backend fell back to deleting the VMI while virt-api served stop and restart")
						}
					})
				}
				m, err := b.Machine(t.Context(), "vm")
				if err != nil {
					t.Fatalf("Machine: %v", err)
				}
				return machinetest.Subject{
					Machine:   m,
					Boots:     func() []machine.BootTarget { return cluster.Boots(ns, "vm") },
					Versioned: b,
					FinishImport: func(t *testing.T) {
						setImportStatus(t, ns, "vm", cdiv1beta1.DataVolumeStatus{Phase: cdiv1beta1.Succeeded, Progress: "100.0%"})
					},
				}
			})
		})
	}
}
