package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/virtmetal/virtmetal/deploy/bmc"
	"github.com/virtmetal/virtmetal/internal/poll"
)

// TestEventsSayWhatHappened: enrolment that replaced a value of the VM
// tells its owner in one Event, with what it created; enrolment that
// replaced nothing posts none (its objects say it all); a Secret created
// again later is told on the VirtualMachineBMC.
func TestEventsSayWhatHappened(t *testing.T) {
	sharedManager(t)
	ns := namespace(t, "events", true)
	taken := newVM(ns, "web2")
	taken.Spec.Template.Spec.Domain.Firmware = &kubevirtv1.Firmware{Serial: "someone-else"}
	createVM(t, taken)
	vm := client.ObjectKeyFromObject(createVM(t, newVM(ns, "web1")))
	poll.Until(t, "workload", func() error { return workloadExists(vm) })
	poll.Until(t, "the Enrolled Event of the VM whose serial was replaced", func() error {
		return eventWith(ns, "Enrolled", `created VirtualMachineBMC web2 and credentials Secret web2-bmc; set SMBIOS serial, UUID, MACs and machine proof: spec.template.spec.domain.firmware.serial "someone-else" replaced`)
	})
	deleteObj(t, types.NamespacedName{Namespace: vm.Namespace, Name: "web1-bmc"}, &corev1.Secret{})
	poll.Until(t, "the CredentialsCreated Event", func() error {
		return eventWith(vm.Namespace, "CredentialsCreated", "created credentials Secret web1-bmc")
	})
	// Posted before the CredentialsCreated Event, had it been.
	if err := eventWith(ns, "Enrolled", "created VirtualMachineBMC web1"); err == nil {
		t.Error("an Enrolled Event for web1, whose enrolment replaced nothing")
	}
}

// eventWith finds an Event of namespace with that reason whose note begins
// with note.
func eventWith(namespace, reason, note string) error {
	var list eventsv1.EventList
	if err := admin.List(context.Background(), &list, client.InNamespace(namespace)); err != nil {
		return err
	}
	var seen []string
	for _, e := range list.Items {
		if e.Reason == reason && strings.HasPrefix(e.Note, note) {
			return nil
		}
		seen = append(seen, e.Reason+": "+e.Note)
	}
	return fmt.Errorf("events %q lack %s: %s", seen, reason, note)
}

func TestEnrolledVMsMetric(t *testing.T) {
	enrolledVM(t, "metrics", "web1")
	poll.Until(t, "virtmetal_enrolled_vms", func() error {
		families, err := metrics.Registry.Gather()
		if err != nil {
			return err
		}
		for _, f := range families {
			if f.GetName() == "virtmetal_enrolled_vms" {
				if v := f.GetMetric()[0].GetGauge().GetValue(); v < 1 {
					return fmt.Errorf("value %v", v)
				}
				return nil
			}
		}
		return fmt.Errorf("not exported")
	})
}

// TestRoleFollowsTheInstancetype changes a VM from a cluster instancetype to
// a namespaced one: the BMC's Role gains read access to that instancetype
// alone and the cluster RBAC goes.
func TestRoleFollowsTheInstancetype(t *testing.T) {
	sharedManager(t)
	ns := namespace(t, "instancetype-change", true)
	vm := newVM(ns, "web1")
	vm.Spec.Instancetype = &kubevirtv1.InstancetypeMatcher{Name: "u1.small"}
	createVM(t, vm)
	key := client.ObjectKeyFromObject(vm)
	clusterName := types.NamespacedName{Name: bmc.ClusterRBACName(ns, "web1")}
	poll.Until(t, "cluster RBAC", func() error { return get(clusterName, &rbacv1.ClusterRole{}) })
	update(t, key, &kubevirtv1.VirtualMachine{}, func(obj client.Object) {
		obj.(*kubevirtv1.VirtualMachine).Spec.Instancetype = &kubevirtv1.InstancetypeMatcher{Kind: "VirtualMachineInstancetype", Name: "team-small"}
	})
	poll.Until(t, "the Role in step", func() error {
		role := &rbacv1.Role{}
		if err := get(workloadKey(key), role); err != nil {
			return err
		}
		if !slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool {
			return slices.Equal(r.Resources, []string{"virtualmachineinstancetypes"}) && slices.Equal(r.ResourceNames, []string{"team-small"})
		}) {
			return fmt.Errorf("rules %+v", role.Rules)
		}
		return gone(clusterName, &rbacv1.ClusterRole{})
	})
}

// onClaims gives vm a disk on each volume: a persistentVolumeClaim volume
// per claim, and a dataVolume volume per DataVolume.
func onClaims(vm *kubevirtv1.VirtualMachine, claims, dataVolumes []string) {
	spec := &vm.Spec.Template.Spec
	spec.Domain.Devices.Disks, spec.Volumes = nil, nil
	add := func(source kubevirtv1.VolumeSource) {
		name := fmt.Sprintf("disk%d", len(spec.Volumes))
		spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, kubevirtv1.Disk{Name: name})
		spec.Volumes = append(spec.Volumes, kubevirtv1.Volume{Name: name, VolumeSource: source})
	}
	for _, c := range claims {
		add(kubevirtv1.VolumeSource{PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: c}}})
	}
	for _, dv := range dataVolumes {
		add(kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: dv}})
	}
}

// claimsGranted checks the claims a Role lets its bmc-server get: want,
// by name, get only; none, no rule at all (an empty resourceNames would
// grant every claim).
func claimsGranted(key types.NamespacedName, want ...string) func() error {
	return func() error {
		role := &rbacv1.Role{}
		if err := get(key, role); err != nil {
			return err
		}
		var got []string
		for _, r := range role.Rules {
			if slices.Contains(r.Resources, "persistentvolumeclaims") {
				if !slices.Equal(r.Verbs, []string{"get"}) || len(r.ResourceNames) == 0 {
					return fmt.Errorf("claim rule %+v, want get by name", r)
				}
				got = append(got, r.ResourceNames...)
			}
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("claims granted %v, want %v", got, want)
		}
		return nil
	}
}

// TestRoleFollowsTheClaims: the BMC's Role grants get on the claims its
// VM's disks name and do not make, by name, in step with the VM's volumes,
// in both workloads (the shared Role grants those of the VMs it serves).
func TestRoleFollowsTheClaims(t *testing.T) {
	sharedManager(t)
	for _, workload := range []string{"pod-per-vm", "shared"} {
		t.Run(workload, func(t *testing.T) {
			if workload == "shared" {
				setWorkload(t, workload)
			}
			ns := namespace(t, "claims-"+workload, true)
			vm := newVM(ns, "web1")
			onClaims(vm, []string{"data-1"}, []string{"golden"})
			createVM(t, vm)
			other := newVM(ns, "web2")
			onClaims(other, []string{"web2-data"}, nil)
			createVM(t, other)
			key := client.ObjectKeyFromObject(vm)
			role := workloadKey(key)
			want := func(web1 ...string) []string { return web1 }
			if workload == "shared" {
				role = sharedKey(ns)
				want = func(web1 ...string) []string { return slices.Sorted(slices.Values(append(web1, "web2-data"))) }
			}
			poll.Until(t, "the VM's claims granted", claimsGranted(role, want("data-1", "golden")...))
			update(t, key, &kubevirtv1.VirtualMachine{}, func(obj client.Object) {
				onClaims(obj.(*kubevirtv1.VirtualMachine), []string{"data-2"}, []string{"golden"})
			})
			poll.Until(t, "the changed claim granted, the removed one no longer", claimsGranted(role, want("data-2", "golden")...))
			update(t, key, &kubevirtv1.VirtualMachine{}, func(obj client.Object) { onClaims(obj.(*kubevirtv1.VirtualMachine), nil, nil) })
			poll.Until(t, "no claim left", claimsGranted(role, want()...))
		})
	}
}
