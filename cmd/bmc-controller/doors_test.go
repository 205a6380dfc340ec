package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// doorObject is a VirtualMachineInstance, VirtualMachineInstanceReplicaSet
// or VirtualMachinePool with one bridge interface, setting serial unless
// it is empty.
func doorObject(t *testing.T, kind, namespace, name, serial string) *unstructured.Unstructured {
	t.Helper()
	domain := `{"devices":{"interfaces":[{"name":"pxe","bridge":{}}]}}`
	if serial != "" {
		domain = `{"firmware":{"serial":"` + serial + `"},"devices":{"interfaces":[{"name":"pxe","bridge":{}}]}}`
	}
	networks := `[{"name":"pxe","multus":{"networkName":"pxe"}}]`
	vmiSpec := `{"domain":` + domain + `,"networks":` + networks + `}`
	selector := `{"matchLabels":{"app":"` + name + `"}}`
	labels := `{"labels":{"app":"` + name + `"}}`
	var body string
	switch kind {
	case "VirtualMachineInstance":
		body = `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance","spec":` + vmiSpec + `}`
	case "VirtualMachineInstanceReplicaSet":
		body = `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstanceReplicaSet","spec":{"replicas":0,"selector":` + selector +
			`,"template":{"metadata":` + labels + `,"spec":` + vmiSpec + `}}}`
	case "VirtualMachinePool":
		body = `{"apiVersion":"pool.kubevirt.io/v1beta1","kind":"VirtualMachinePool","spec":{"replicas":0,"selector":` + selector +
			`,"virtualMachineTemplate":{"metadata":` + labels + `,"spec":{"runStrategy":"Halted","template":{"metadata":` + labels + `,"spec":` + vmiSpec + `}}}}}`
	default:
		t.Fatalf("no door %s", kind)
	}
	o := &unstructured.Unstructured{}
	if err := json.Unmarshal([]byte(body), &o.Object); err != nil {
		t.Fatal(err)
	}
	o.SetNamespace(namespace)
	o.SetName(name)
	return o
}

// earlyVMI is a VMI that claims a serial, made in a namespace of its own
// before the webhooks are installed, as one admitted while nothing refused
// it: its status writes must not wait for the webhooks.
func earlyVMI(ctx context.Context, t *testing.T, c client.Client) *unstructured.Unstructured {
	t.Helper()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "install-early"}}); err != nil {
		t.Fatal(err)
	}
	vmi := doorObject(t, "VirtualMachineInstance", "install-early", "early", "early.install-early")
	if err := c.Create(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	return vmi
}

// doorsFailClosed: with no webhook server answering, as when the
// controller is down, the webhooks of VMIs, VMI replica sets and VM pools
// refuse what they would have to look at (the installed matchConditions
// and namespaceSelectors, evaluated by the real API server) and nothing
// else.
func doorsFailClosed(ctx context.Context, t *testing.T, c client.Client, early *unstructured.Unstructured) {
	tests := []struct {
		name, kind, namespace, serial string
		refusedBy                     string
	}{
		{"VMI claiming no identity in an opted-in namespace", "VirtualMachineInstance", "install-a", "", ""},
		{"VMI claiming a serial", "VirtualMachineInstance", "install-plain", "web1.install-a", "vvirtualmachineinstance.bmc.virtmetal.io"},
		{"replica set in another namespace, claims no identity", "VirtualMachineInstanceReplicaSet", "install-plain", "", ""},
		{"replica set claiming a serial", "VirtualMachineInstanceReplicaSet", "install-plain", "web1.install-a", "vvirtualmachineinstancereplicaset.bmc.virtmetal.io"},
		{"replica set in an opted-in namespace, claims no identity", "VirtualMachineInstanceReplicaSet", "install-a", "", ""},
		{"replica set in an opted-in namespace, sets a serial", "VirtualMachineInstanceReplicaSet", "install-a", "fleet", "mvirtualmachineinstancereplicaset.bmc.virtmetal.io"},
		{"pool in another namespace, claims no identity", "VirtualMachinePool", "install-plain", "", ""},
		{"pool claiming a serial", "VirtualMachinePool", "install-plain", "web1.install-a", "vvirtualmachinepool.bmc.virtmetal.io"},
		{"pool in an opted-in namespace, claims no identity", "VirtualMachinePool", "install-a", "", ""},
		{"pool in an opted-in namespace, sets a serial", "VirtualMachinePool", "install-a", "fleet", "mvirtualmachinepool.bmc.virtmetal.io"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			createdOrRefusedBy(ctx, t, c, doorObject(t, tc.kind, tc.namespace, "door", tc.serial), tc.refusedBy)
		})
	}
	t.Run("a VMI's write that keeps its spec is not sent", func(t *testing.T) {
		o := early.DeepCopy()
		if err := c.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
			t.Fatal(err)
		}
		o.SetLabels(map[string]string{"seen": "true"})
		if err := unstructured.SetNestedField(o.Object, "Running", "status", "phase"); err != nil {
			t.Fatal(err)
		}
		if err := c.Update(ctx, o); err != nil {
			t.Fatalf("update = %v, want it accepted without calling a webhook", err)
		}
		if err := unstructured.SetNestedField(o.Object, "web1.install-a", "spec", "domain", "firmware", "serial"); err != nil {
			t.Fatal(err)
		}
		if err := c.Update(ctx, o); err == nil || !strings.Contains(err.Error(), "vvirtualmachineinstance.bmc.virtmetal.io") {
			t.Fatalf("update of the spec = %v, want it refused by webhook vvirtualmachineinstance.bmc.virtmetal.io", err)
		}
	})
}
