package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/internal/poll"
)

// enrolledSet is nil once vm has its VirtualMachineBMC and credentials.
func enrolledSet(vm types.NamespacedName) error {
	b := &v1beta1.VirtualMachineBMC{}
	if err := get(vm, b); err != nil {
		return err
	}
	if b.Spec.VMName != vm.Name || b.Labels[v1beta1.LabelEnrolled] != "true" {
		return fmt.Errorf("VirtualMachineBMC %s is %+v", vm, b)
	}
	secret := &corev1.Secret{}
	if err := get(types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name + "-bmc"}, secret); err != nil {
		return err
	}
	user, pass := string(secret.Data["username"]), string(secret.Data["password"])
	if user == "" || user == "admin" || len(pass) < 16 || len(pass) > 20 {
		return fmt.Errorf("credentials %q/%d characters", user, len(pass))
	}
	return nil
}

func unenrolled(vm types.NamespacedName) error {
	if err := gone(vm, &v1beta1.VirtualMachineBMC{}); err != nil {
		return err
	}
	return gone(types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name + "-bmc"}, &corev1.Secret{})
}

func TestEnrolment(t *testing.T) {
	sharedManager(t)
	ctx := context.Background()

	t.Run("a VM created before the controller started", func(t *testing.T) {
		key := types.NamespacedName{Namespace: preexistingNS, Name: "old"}
		poll.Until(t, "enrolment", func() error { return enrolledSet(key) })
		poll.Until(t, "serial", func() error { return serialIs(key, "old."+preexistingNS) })
	})

	t.Run("a VM enrolled before machine proofs gets one, and keeps it", func(t *testing.T) {
		key := types.NamespacedName{Namespace: preexistingNS, Name: "old"}
		var proof string
		poll.Until(t, "a machine proof", func() error {
			var err error
			proof, err = proofOf(key)
			return err
		})
		// Another repair (an edited serial) keeps it.
		update(t, key, &kubevirtv1.VirtualMachine{}, func(obj client.Object) {
			obj.(*kubevirtv1.VirtualMachine).Spec.Template.Spec.Domain.Firmware.Serial = "victim.team-b"
		})
		poll.Until(t, "serial repaired", func() error { return serialIs(key, "old."+preexistingNS) })
		if got, err := proofOf(key); err != nil || got != proof {
			t.Fatalf("proof changed by a repair (%v)", err)
		}
		var list eventsv1.EventList
		if err := admin.List(ctx, &list, client.InNamespace(preexistingNS)); err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Items {
			if strings.Contains(e.Note, proof) {
				t.Errorf("the proof in Event %s: %s", e.Reason, e.Note)
			}
		}
	})

	t.Run("a new VM in an opted-in namespace", func(t *testing.T) {
		ns := namespace(t, "enrol-new", true)
		vm := createVM(t, newVM(ns, "web1"))
		poll.Until(t, "enrolment", func() error { return enrolledSet(client.ObjectKeyFromObject(vm)) })
	})

	t.Run("a VM in a namespace without the label", func(t *testing.T) {
		ns := namespace(t, "enrol-off", false)
		since := reconciles(t, "enrolment")
		vm := createVM(t, newVM(ns, "web1"))
		requireNever(t, "enrolment of a VM in an unlabelled namespace", "enrolment", since, func() error {
			return enrolledSet(client.ObjectKeyFromObject(vm))
		})
	})

	t.Run("a VM that opts out, and back in", func(t *testing.T) {
		ns := namespace(t, "enrol-optout", true)
		vm := createVM(t, newVM(ns, "web1"))
		key := client.ObjectKeyFromObject(vm)
		poll.Until(t, "enrolment", func() error { return enrolledSet(key) })
		annotate(t, key, map[string]string{v1beta1.AnnotationBMC: v1beta1.BMCDisabled})
		poll.Until(t, "removal", func() error { return unenrolled(key) })
		annotate(t, key, map[string]string{v1beta1.AnnotationBMC: "enabled"})
		poll.Until(t, "enrolment again", func() error { return enrolledSet(key) })
	})

	t.Run("a namespace that loses its label, and gets it back", func(t *testing.T) {
		ns := namespace(t, "enrol-label", true)
		vm := createVM(t, newVM(ns, "web1"))
		key := client.ObjectKeyFromObject(vm)
		poll.Until(t, "enrolment", func() error { return enrolledSet(key) })
		setNamespaceLabel(t, ns, enabledLabelKey, "")
		poll.Until(t, "removal", func() error { return unenrolled(key) })
		setNamespaceLabel(t, ns, enabledLabelKey, "true")
		poll.Until(t, "enrolment again", func() error { return enrolledSet(key) })
	})

	t.Run("a changed selector, at run time", func(t *testing.T) {
		ns := namespace(t, "enrol-selector", false)
		setNamespaceLabel(t, ns, "team", "metal")
		vm := createVM(t, newVM(ns, "web1"))
		key := client.ObjectKeyFromObject(vm)
		cm := &corev1.ConfigMap{}
		cm.Namespace, cm.Name = configNamespace, configName
		cm.Data = map[string]string{"namespaceSelector": "team=metal"}
		if err := admin.Create(ctx, cm); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.Delete(ctx, cm) })
		poll.Until(t, "enrolment under the new selector", func() error { return enrolledSet(key) })
		// The old selector no longer holds: a namespace it matched loses its VMs.
		poll.Until(t, "removal under the new selector", func() error {
			return unenrolled(types.NamespacedName{Namespace: preexistingNS, Name: "old"})
		})
		if err := admin.Delete(ctx, cm); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, "back to the flag's selector", func() error {
			return enrolledSet(types.NamespacedName{Namespace: preexistingNS, Name: "old"})
		})
		poll.Until(t, "removal under the flag's selector", func() error { return unenrolled(key) })
	})

	t.Run("an edited serial is put back", func(t *testing.T) {
		ns := namespace(t, "enrol-serial", true)
		vm := createVM(t, newVM(ns, "web1"))
		key := client.ObjectKeyFromObject(vm)
		poll.Until(t, "serial", func() error { return serialIs(key, "web1."+ns) })
		// Without the webhook in this suite, only the loop can repair it.
		update(t, key, &kubevirtv1.VirtualMachine{}, func(obj client.Object) {
			obj.(*kubevirtv1.VirtualMachine).Spec.Template.Spec.Domain.Firmware.Serial = "victim.team-b"
		})
		poll.Until(t, "serial repaired", func() error { return serialIs(key, "web1."+ns) })
		poll.Until(t, "an Event saying so", func() error { return eventWith(ns, "IdentityRepaired", "") })
	})

	t.Run("a deleted VirtualMachineBMC comes back", func(t *testing.T) {
		ns := namespace(t, "enrol-comeback", true)
		vm := createVM(t, newVM(ns, "web1"))
		key := client.ObjectKeyFromObject(vm)
		poll.Until(t, "enrolment", func() error { return enrolledSet(key) })
		before := &v1beta1.VirtualMachineBMC{}
		if err := get(key, before); err != nil {
			t.Fatal(err)
		}
		secret := &corev1.Secret{}
		if err := get(types.NamespacedName{Namespace: ns, Name: "web1-bmc"}, secret); err != nil {
			t.Fatal(err)
		}
		if err := admin.Delete(ctx, before); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, "a new VirtualMachineBMC", func() error {
			after := &v1beta1.VirtualMachineBMC{}
			if err := get(key, after); err != nil {
				return err
			}
			if after.UID == before.UID {
				return fmt.Errorf("still the old one")
			}
			return nil
		})
		kept := &corev1.Secret{}
		if err := get(client.ObjectKeyFromObject(secret), kept); err != nil {
			t.Fatal(err)
		}
		if kept.UID != secret.UID || string(kept.Data["password"]) != string(secret.Data["password"]) {
			t.Error("the credentials changed with the VirtualMachineBMC: MaaS would lose power control")
		}
	})

	t.Run("a user's own VirtualMachineBMC is left alone on opt-out", func(t *testing.T) {
		ns := namespace(t, "enrol-manual", false)
		vm := createVM(t, newVM(ns, "web1"))
		key := client.ObjectKeyFromObject(vm)
		manual := &v1beta1.VirtualMachineBMC{}
		manual.Namespace, manual.Name, manual.Spec.VMName = ns, "web1", "web1"
		since := reconciles(t, "enrolment")
		if err := admin.Create(ctx, manual); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, "its workload", func() error { return workloadExists(key) })
		requireNever(t, "removal of a user's VirtualMachineBMC", "enrolment", since, func() error { return gone(key, &v1beta1.VirtualMachineBMC{}) })
	})
}

// proofOf is the VM's machine proof, or why it has none.
func proofOf(key types.NamespacedName) (string, error) {
	vm := &kubevirtv1.VirtualMachine{}
	if err := get(key, vm); err != nil {
		return "", err
	}
	chassis := vm.Spec.Template.Spec.Domain.Chassis
	if chassis == nil || !bmcspec.IsMachineProof(chassis.Asset) {
		return "", errors.New("no machine proof at chassis.asset")
	}
	return chassis.Asset, nil
}

func serialIs(key types.NamespacedName, want string) error {
	vm := &kubevirtv1.VirtualMachine{}
	if err := get(key, vm); err != nil {
		return err
	}
	fw := vm.Spec.Template.Spec.Domain.Firmware
	if fw == nil || fw.Serial != want {
		return fmt.Errorf("firmware is %+v, want serial %q", fw, want)
	}
	return nil
}

func annotate(t *testing.T, key types.NamespacedName, annotations map[string]string) {
	t.Helper()
	vm := &kubevirtv1.VirtualMachine{}
	if err := get(key, vm); err != nil {
		t.Fatal(err)
	}
	patched := vm.DeepCopy()
	if patched.Annotations == nil {
		patched.Annotations = map[string]string{}
	}
	for k, v := range annotations {
		patched.Annotations[k] = v
	}
	if err := admin.Patch(context.Background(), patched, client.MergeFrom(vm)); err != nil {
		t.Fatal(err)
	}
}

// setNamespaceLabel sets a label, or removes it when value is empty.
func setNamespaceLabel(t *testing.T, name, key, value string) {
	t.Helper()
	ns := &corev1.Namespace{}
	if err := get(types.NamespacedName{Name: name}, ns); err != nil {
		t.Fatal(err)
	}
	patched := ns.DeepCopy()
	if patched.Labels == nil {
		patched.Labels = map[string]string{}
	}
	if value == "" {
		delete(patched.Labels, key)
	} else {
		patched.Labels[key] = value
	}
	if err := admin.Patch(context.Background(), patched, client.MergeFrom(ns)); err != nil {
		t.Fatal(err)
	}
}
