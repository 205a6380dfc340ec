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
		return eventWith(ns, "Enrolled", `created VirtualMachineBMC web2 and credentials Secret web2-bmc; set SMBIOS serial, UUID and MACs: spec.template.spec.domain.firmware.serial "someone-else" replaced`)
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
