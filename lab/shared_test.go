package lab_test

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/lab"
	"github.com/virtmetal/virtmetal/maas"
)

// TestWholeFlowShared: a lab of its own whose controller runs in shared
// mode, with two VMs in one namespace and one in another, all Redfish. The
// end state is TestWholeFlow's, and each namespace's VMs were served by one
// bmc-server, the namespace's only one.
func TestWholeFlowShared(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+flowDeadline)
	defer cancel()
	started := time.Now()
	l, err := lab.Start(ctx, lab.Options{Workload: "shared", Binaries: binaries})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.StartController(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("shared-mode lab up in %v", time.Since(started).Round(time.Millisecond))
	vms := []maas.VMRef{
		{Namespace: "shared-a", Name: "web1"},
		{Namespace: "shared-a", Name: "web2"},
		{Namespace: "shared-b", Name: "web1"},
	}
	for _, vm := range vms {
		if err := l.CreateNamespace(ctx, vm.Namespace); err != nil {
			t.Fatal(err)
		}
		if err := l.CreateVM(ctx, vm, lab.VMOptions{}); err != nil {
			t.Fatalf("creating %s: %v", vm, err)
		}
	}
	checkFlow(t, ctx, l, vms...)

	servers := map[string]string{} // namespace → the Deployment serving its BMCs
	for _, b := range l.BMCs() {
		if first, ok := servers[b.VM.Namespace]; ok && first != b.Server {
			t.Errorf("%s served by %s, another VM of its namespace by %s; want one bmc-server", b.VM, b.Server, first)
		}
		servers[b.VM.Namespace] = b.Server
	}
	for _, ns := range []string{"shared-a", "shared-b"} {
		var deployments appsv1.DeploymentList
		if err := l.Client.List(ctx, &deployments, client.InNamespace(ns),
			client.MatchingLabels{v1beta1.LabelManagedBy: v1beta1.ManagedByValue}); err != nil {
			t.Fatal(err)
		}
		if len(deployments.Items) != 1 || deployments.Items[0].Labels[v1beta1.LabelShared] != "true" ||
			servers[ns] != ns+"/"+deployments.Items[0].Name {
			var names []string
			for _, d := range deployments.Items {
				names = append(names, d.Name)
			}
			t.Errorf("namespace %s: bmc-server Deployments %v, BMCs served by %q; want one, shared, serving them all", ns, names, servers[ns])
		}
	}
}
