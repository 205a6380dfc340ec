package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/controllers"
)

func build(t *testing.T, components ...string) []*unstructured.Unstructured {
	t.Helper()
	objects, err := Build(components...)
	if err != nil {
		t.Fatal(err)
	}
	return objects
}

// find decodes the one object of kind and name into out.
func find(t *testing.T, objects []*unstructured.Unstructured, kind, name string, out any) {
	t.Helper()
	for _, o := range objects {
		if o.GetKind() == kind && o.GetName() == name {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, out, true); err != nil {
				t.Fatalf("%s %s: %v", kind, name, err)
			}
			return
		}
	}
	t.Fatalf("no %s %s", kind, name)
}

func kinds(objects []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objects {
		out = append(out, o.GetKind()+"/"+o.GetName())
	}
	return out
}

// TestConfigIsWhatTheControllerReads: the installed ConfigMap parses as the
// controller parses it (no unknown key, a valid Config) and says what the
// manifests around it assume.
func TestConfigIsWhatTheControllerReads(t *testing.T) {
	objects := build(t)
	var cm corev1.ConfigMap
	find(t, objects, "ConfigMap", "virtmetal-config", &cm)
	source := &controllers.ConfigSource{
		Defaults:  controllers.Config{},
		ConfigMap: types.NamespacedName{Namespace: cm.Namespace, Name: cm.Name},
		Reader:    fake.NewClientBuilder().WithObjects(&cm).Build(),
	}
	cfg, err := source.Get(context.Background())
	if err != nil {
		t.Fatalf("the controller refuses the installed config: %v", err)
	}
	if cfg.NamespaceSelector.String() != "virtmetal.io/enabled=true" || cfg.IPMIDefault || cfg.Workload != controllers.WorkloadPodPerVM {
		t.Errorf("config = %+v", cfg)
	}
	// The pod and service networks are denied, and BMC pods fenced, out
	// of the box.
	if got := fmt.Sprint(cfg.EventDestinationsDenied); got != "[10.244.0.0/16 10.96.0.0/12]" {
		t.Errorf("denied destinations %s, want kubeadm's pod and service networks", got)
	}
	if np := cfg.NetworkPolicy; !np.Enabled || np.IngressNamespaces.String() != controllers.DefaultIngressNamespaces || len(np.APIServer) != 0 || len(np.EventDestinations) != 0 {
		t.Errorf("NetworkPolicy config %+v", np)
	}
	var d appsv1.Deployment
	find(t, objects, "Deployment", "virtmetal-controller", &d)
	if want := "--config=" + cm.Namespace + "/" + cm.Name; !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, want) {
		t.Errorf("controller args %q lack %s", d.Spec.Template.Spec.Containers[0].Args, want)
	}
}

// TestControllerDeployment: leader election in its own namespace, probes,
// metrics and webhook ports where its flags put them, restricted pod.
func TestControllerDeployment(t *testing.T) {
	var d appsv1.Deployment
	find(t, build(t), "Deployment", "virtmetal-controller", &d)
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	for _, want := range []string{"--leader-elect", "--leader-election-namespace=" + d.Namespace, "--metrics-bind-address=:8080", "--health-probe-bind-address=:8081", "--webhook-port=9443"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args %q lack %s", c.Args, want)
		}
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["metrics"] != 8080 || ports["health"] != 8081 || ports["webhook"] != 9443 {
		t.Errorf("ports = %v", ports)
	}
	for name, probe := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != name || probe.HTTPGet.Port.String() != "health" {
			t.Errorf("probe %s = %+v", name, probe)
		}
	}
	if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources = %+v", c.Resources)
	}
	sc := c.SecurityContext
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot ||
		sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("pod %+v, container %+v security contexts", pod.SecurityContext, sc)
	}
}

// TestWebhooksReachTheController: both webhook configurations call the
// webhook Service in the controller's namespace, whose port leads to the
// webhook port; cert-manager issues the Service's certificate into the
// Secret the controller mounts where --webhook-cert-dir says, and injects
// its CA into both. The mutating one sees only opted-in namespaces, the
// same ones the ConfigMap selects; both fail closed.
func TestWebhooksReachTheController(t *testing.T) {
	objects := build(t)
	var d appsv1.Deployment
	find(t, objects, "Deployment", "virtmetal-controller", &d)
	var svc corev1.Service
	find(t, objects, "Service", "virtmetal-webhook", &svc)
	var cm corev1.ConfigMap
	find(t, objects, "ConfigMap", "virtmetal-config", &cm)
	// cert-manager's types are not a dependency: the fields used here.
	var cert struct {
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata"`
		Spec              struct {
			SecretName string   `json:"secretName"`
			DNSNames   []string `json:"dnsNames"`
			IssuerRef  struct {
				Kind string `json:"kind"`
				Name string `json:"name"`
			} `json:"issuerRef"`
		} `json:"spec"`
	}
	find(t, objects, "Certificate", "virtmetal-webhook-cert", &cert)
	var issuer struct {
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata"`
		Spec              struct {
			SelfSigned *struct{} `json:"selfSigned"`
		} `json:"spec"`
	}
	find(t, objects, "Issuer", cert.Spec.IssuerRef.Name, &issuer)
	if issuer.Namespace != cert.Namespace || issuer.Spec.SelfSigned == nil {
		t.Errorf("Issuer %s/%s spec %+v", issuer.Namespace, issuer.Name, issuer.Spec)
	}

	if svc.Namespace != d.Namespace || svc.Spec.Ports[0].Port != 443 || svc.Spec.Ports[0].TargetPort.String() != "webhook" {
		t.Errorf("Service %s/%s ports %+v", svc.Namespace, svc.Name, svc.Spec.Ports)
	}
	for k, v := range svc.Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("Service selects %s=%s, not on the controller's pods", k, v)
		}
	}
	if !slices.Contains(cert.Spec.DNSNames, svc.Name+"."+svc.Namespace+".svc") || cert.Spec.IssuerRef.Kind != "Issuer" {
		t.Errorf("Certificate spec = %+v", cert.Spec)
	}
	pod := d.Spec.Template.Spec
	var certDir string
	for _, v := range pod.Volumes {
		if v.Secret != nil && v.Secret.SecretName == cert.Spec.SecretName {
			for _, m := range pod.Containers[0].VolumeMounts {
				if m.Name == v.Name {
					certDir = m.MountPath
				}
			}
		}
	}
	if certDir == "" || !slices.Contains(pod.Containers[0].Args, "--webhook-cert-dir="+certDir) {
		t.Errorf("Secret %s mounted at %q, args %q", cert.Spec.SecretName, certDir, pod.Containers[0].Args)
	}

	type webhook struct {
		Name         string
		ClientConfig struct {
			Service struct{ Name, Namespace string }
		}
		FailurePolicy     string
		NamespaceSelector *struct{ MatchLabels map[string]string }
		MatchConditions   []struct{ Name, Expression string }
	}
	type webhookConfiguration struct {
		Kind     string
		Metadata struct {
			Name        string
			Annotations map[string]string
		}
		Webhooks []webhook
	}
	var configs []webhookConfiguration
	for _, o := range objects {
		if strings.HasSuffix(o.GetKind(), "WebhookConfiguration") {
			data, err := o.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			var c webhookConfiguration
			if err := yaml.Unmarshal(data, &c); err != nil {
				t.Fatal(err)
			}
			configs = append(configs, c)
		}
	}
	if len(configs) != 2 {
		t.Fatalf("webhook configurations: %d", len(configs))
	}
	// Every kind a VMI is made from, and where its domain spec is.
	identityDomain := map[string]string{
		"vvirtualmachine.bmc.virtmetal.io":                   "object.spec.template.spec.domain",
		"vvirtualmachineinstance.bmc.virtmetal.io":           "object.spec.domain",
		"vvirtualmachineinstancereplicaset.bmc.virtmetal.io": "object.spec.template.spec.domain",
		"vvirtualmachinepool.bmc.virtmetal.io":               "object.spec.virtualMachineTemplate.spec.template.spec.domain",
	}
	validating := 0
	for _, c := range configs {
		if c.Kind == "ValidatingWebhookConfiguration" {
			validating = len(c.Webhooks)
		}
	}
	if validating != len(identityDomain) {
		t.Errorf("%d validating webhooks, want one per kind of %v", validating, identityDomain)
	}
	selector := strings.Split(cm.Data["namespaceSelector"], "=")
	for _, c := range configs {
		if got := c.Metadata.Annotations["cert-manager.io/inject-ca-from"]; got != cert.Namespace+"/"+cert.Name {
			t.Errorf("%s: inject-ca-from %q", c.Kind, got)
		}
		for _, w := range c.Webhooks {
			if w.ClientConfig.Service.Name != svc.Name || w.ClientConfig.Service.Namespace != svc.Namespace {
				t.Errorf("%s: calls %+v", w.Name, w.ClientConfig.Service)
			}
			if w.FailurePolicy != "Fail" {
				t.Errorf("%s: failurePolicy %s", w.Name, w.FailurePolicy)
			}
			switch c.Kind {
			case "MutatingWebhookConfiguration":
				if w.NamespaceSelector == nil || len(selector) != 2 || len(w.NamespaceSelector.MatchLabels) != 1 ||
					w.NamespaceSelector.MatchLabels[selector[0]] != selector[1] {
					t.Errorf("%s: namespaceSelector %+v, the ConfigMap selects %q", w.Name, w.NamespaceSelector, cm.Data["namespaceSelector"])
				}
			case "ValidatingWebhookConfiguration":
				if w.NamespaceSelector != nil || len(w.MatchConditions) == 0 || w.MatchConditions[0].Name != "declares-an-identity" {
					t.Errorf("%s: namespaceSelector %+v, matchConditions %+v: claims come from any namespace", w.Name, w.NamespaceSelector, w.MatchConditions)
				}
				// Each kind declares its identity at its own path.
				if domain := identityDomain[w.Name]; domain == "" || !strings.Contains(w.MatchConditions[0].Expression, "has("+domain+".firmware)") {
					t.Errorf("%s: matchCondition %q does not look at %q", w.Name, w.MatchConditions[0].Expression, domain)
				}
			}
		}
	}
}

// TestComponents: each component changes what it says and nothing else.
func TestComponents(t *testing.T) {
	base := kinds(build(t))
	tests := []struct {
		component     string
		removed, adds []string
	}{
		{"reconciler-loop", []string{"CronJob/maas-reconciler"}, []string{"Deployment/maas-reconciler"}},
		{"without-webhooks", []string{
			"MutatingWebhookConfiguration/virtmetal-vm-identity-mutating", "ValidatingWebhookConfiguration/virtmetal-vm-identity-validating",
			"Service/virtmetal-webhook", "Issuer/virtmetal-selfsigned", "Certificate/virtmetal-webhook-cert",
		}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.component, func(t *testing.T) {
			objects := build(t, tc.component)
			got := kinds(objects)
			want := slices.DeleteFunc(slices.Clone(base), func(k string) bool { return slices.Contains(tc.removed, k) })
			want = append(want, tc.adds...)
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("objects = %q, want %q", got, want)
			}
			if tc.component != "without-webhooks" {
				return
			}
			var d appsv1.Deployment
			find(t, objects, "Deployment", "virtmetal-controller", &d)
			args := d.Spec.Template.Spec.Containers[0].Args
			var port string
			for _, a := range args {
				if v, ok := strings.CutPrefix(a, "--webhook-port="); ok {
					port = v // the last one wins
				}
			}
			if port != "0" || len(d.Spec.Template.Spec.Volumes) != 0 || len(d.Spec.Template.Spec.Containers[0].VolumeMounts) != 0 {
				t.Errorf("args %q, volumes %+v", args, d.Spec.Template.Spec.Volumes)
			}
		})
	}
}

// TestImagesAgree: every image the install runs (containers, and the
// bmc-server image in the ConfigMap) is a target of the Dockerfile, named
// and tagged as `make images` builds it, and as kustomization.yaml's images
// list says.
func TestImagesAgree(t *testing.T) {
	makefile := readFile(t, "../Makefile")
	prefix := makeVariable(t, makefile, "IMAGE_PREFIX")
	tag := makeVariable(t, makefile, "IMAGE_TAG")
	imagesList := strings.Fields(makeVariable(t, makefile, "IMAGES"))
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^FROM \S+ AS (\S+)$`).FindAllStringSubmatch(readFile(t, "../Dockerfile"), -1) {
		targets[m[1]] = true
	}
	want := map[string]bool{}
	for _, image := range imagesList {
		if !targets[image] {
			t.Errorf("make images builds %s, not a Dockerfile target", image)
		}
		want[prefix+"/"+image+":"+tag] = true
	}
	var k struct {
		Images []struct{ Name, NewName, NewTag string }
	}
	if err := yaml.Unmarshal([]byte(readFile(t, "kustomization.yaml")), &k); err != nil {
		t.Fatal(err)
	}
	for _, image := range k.Images {
		if !want[image.Name+":"+image.NewTag] || image.NewName != "" {
			t.Errorf("kustomization.yaml image %+v is not one make images builds (%v)", image, want)
		}
	}
	used := map[string]bool{}
	for _, components := range [][]string{nil, {"reconciler-loop"}} {
		objects := build(t, components...)
		var cm corev1.ConfigMap
		find(t, objects, "ConfigMap", "virtmetal-config", &cm)
		used[cm.Data["bmcImage"]] = true
		for _, o := range objects {
			spec, ok, _ := unstructured.NestedMap(o.Object, "spec", "template", "spec")
			if o.GetKind() == "CronJob" {
				spec, ok, _ = unstructured.NestedMap(o.Object, "spec", "jobTemplate", "spec", "template", "spec")
			}
			if !ok {
				continue
			}
			containers, _, _ := unstructured.NestedSlice(spec, "containers")
			for _, c := range containers {
				used[c.(map[string]any)["image"].(string)] = true
			}
		}
	}
	for image := range used {
		if !want[image] {
			t.Errorf("the install runs %s, not one make images builds (%v)", image, want)
		}
	}
	if len(used) != len(want) {
		t.Errorf("images used %v, built %v", used, want)
	}
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func makeVariable(t *testing.T, makefile, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + name + ` \??:?= (.*)$`).FindStringSubmatch(makefile)
	if m == nil {
		t.Fatalf("Makefile sets no %s", name)
	}
	return strings.TrimSpace(m[1])
}

// TestExamples: the examples decode strictly into their API types and are
// what the README says: a PXE VM the controller completes, an opted-in
// namespace, a manual VirtualMachineBMC.
func TestExamples(t *testing.T) {
	var ns corev1.Namespace
	decodeStrict(t, "examples/namespace.yaml", &ns)
	if ns.Labels["virtmetal.io/enabled"] != "true" {
		t.Errorf("namespace labels %v", ns.Labels)
	}
	var vm kubevirtv1.VirtualMachine
	decodeStrict(t, "examples/vm-pxe.yaml", &vm)
	spec := vm.Spec.Template.Spec
	devices := spec.Domain.Devices
	if vm.Namespace != ns.Name || vm.Spec.RunStrategy == nil || *vm.Spec.RunStrategy != kubevirtv1.RunStrategyHalted {
		t.Errorf("VM %s/%s runStrategy %v", vm.Namespace, vm.Name, vm.Spec.RunStrategy)
	}
	if spec.Domain.Firmware != nil {
		t.Errorf("firmware %+v: the controller sets serial and UUID", spec.Domain.Firmware)
	}
	if len(devices.Interfaces) != 1 || devices.Interfaces[0].Bridge == nil || devices.Interfaces[0].MacAddress != "" ||
		devices.Interfaces[0].BootOrder == nil || *devices.Interfaces[0].BootOrder != 1 {
		t.Errorf("interfaces %+v", devices.Interfaces)
	}
	if len(spec.Networks) != 1 || spec.Networks[0].Multus == nil || spec.Networks[0].Name != devices.Interfaces[0].Name {
		t.Errorf("networks %+v", spec.Networks)
	}
	if len(devices.Disks) != 1 || devices.Disks[0].BootOrder == nil || *devices.Disks[0].BootOrder != 2 {
		t.Errorf("disks %+v", devices.Disks)
	}
	if len(vm.Spec.DataVolumeTemplates) != 1 || vm.Spec.DataVolumeTemplates[0].Spec.Source == nil || vm.Spec.DataVolumeTemplates[0].Spec.Source.Blank == nil {
		t.Errorf("dataVolumeTemplates %+v: want one blank disk", vm.Spec.DataVolumeTemplates)
	}
	var nad struct {
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata"`
		Spec              struct {
			Config string `json:"config"`
		} `json:"spec"`
	}
	decodeStrict(t, "examples/network.yaml", &nad)
	// The bridge plugin's config: a guest must not send frames with another
	// VM's MAC on the provisioning network.
	var bridge struct {
		Type        string `json:"type"`
		MACSpoofChk bool   `json:"macspoofchk"`
	}
	if err := json.Unmarshal([]byte(nad.Spec.Config), &bridge); err != nil {
		t.Errorf("NetworkAttachmentDefinition config: %v", err)
	}
	if nad.Namespace+"/"+nad.Name != vm.Namespace+"/"+spec.Networks[0].Multus.NetworkName || bridge.Type != "bridge" || !bridge.MACSpoofChk {
		t.Errorf("NetworkAttachmentDefinition %+v (bridge config %+v: want MAC spoof checking), VM network %+v", nad, bridge, spec.Networks[0].Multus)
	}
	var bmc v1beta1.VirtualMachineBMC
	decodeStrict(t, "examples/vmbmc-manual.yaml", &bmc)
	if bmc.Spec.VMName == "" {
		t.Error("VirtualMachineBMC names no VM")
	}
}

func decodeStrict(t *testing.T, file string, out any) {
	t.Helper()
	if err := yaml.UnmarshalStrict([]byte(readFile(t, file)), out); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}
