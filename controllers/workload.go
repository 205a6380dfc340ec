package controllers

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/deploy/bmc"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/machine/kubevirt"
)

// Ports of bmc-server inside its pod: unprivileged, so the container needs
// no capability; the Service maps the standard ports onto them.
const (
	redfishContainerPort = 8443
	ipmiContainerPort    = 6230
	// metricsContainerPort serves bmc-server's Prometheus metrics, plain
	// HTTP without credentials, to scrapers on the pod network: no
	// Service or Ingress reaches it.
	metricsContainerPort = 9100
	redfishServicePort   = 443
	ipmiServicePort      = 623
	credentialsMountPath = "/etc/virtmetal/credentials"
	bmcUserID            = 65532 // distroless "nonroot"
)

// WorkloadFunc returns every object one VirtualMachineBMC needs, owned by
// it, with no status. The controller creates what is missing and puts back
// what drifted, and deletes the per-VM objects it no longer returns. It is
// a function of its inputs alone: PodPerVM and Shared are two of them.
type WorkloadFunc func(in WorkloadInput) (Workload, error)

// WorkloadInput is what a workload is a function of.
type WorkloadInput struct {
	BMC    *v1beta1.VirtualMachineBMC
	VM     *kubevirtv1.VirtualMachine
	Config Config
	// HostTakenBy names the older VirtualMachineBMC of the namespace that
	// keeps the host BMC asks for; "" when BMC holds it. A BMC whose claim
	// lost gets no Ingress, and its bmc-server names no host.
	HostTakenBy string
}

// Workload is a VirtualMachineBMC's objects.
type Workload struct {
	// Namespaced objects, each with the VirtualMachineBMC as controller.
	Objects []client.Object
	// ClusterObjects cannot be owned by a namespaced object; the controller
	// deletes them itself (behind a finalizer) when the BMC goes.
	ClusterObjects []client.Object
	// RedfishURL and IPMIAddress are where the workload serves, or empty.
	RedfishURL  string
	IPMIAddress string
	// IngressProblem says why the Ingress was left out although Redfish is
	// on (a host outside the namespace's zone).
	IngressProblem error
	// Shared says the namespace's shared bmc-server serves the VM: the
	// Deployment and Service are not among Objects.
	Shared bool
}

// workloadKinds are the namespaced kinds of a BMC's workload, each object
// named workloadName(vm), or sharedName for the shared bmc-server: what the
// controller caches, owns, and deletes when no longer wanted. Fresh
// objects, to read into.
func workloadKinds() []client.Object {
	return []client.Object{&appsv1.Deployment{}, &corev1.Service{}, &networkingv1.Ingress{},
		&corev1.ServiceAccount{}, &rbacv1.Role{}, &rbacv1.RoleBinding{}, &networkingv1.NetworkPolicy{}}
}

// clusterRBACKinds are the kinds of a BMC's cluster-scoped RBAC, named
// bmc.ClusterRBACName, in the order they are deleted: the binding first.
func clusterRBACKinds() []client.Object {
	return []client.Object{&rbacv1.ClusterRoleBinding{}, &rbacv1.ClusterRole{}}
}

// Names of a BMC's objects.
func workloadName(vm string) string         { return "bmc-" + vm }
func ingressTLSSecretName(vm string) string { return "bmc-" + vm + "-tls" }

// credentialsSecretName is the Secret a VirtualMachineBMC's credentials are in.
func credentialsSecretName(b *v1beta1.VirtualMachineBMC) string {
	if b.Spec.CredentialsSecret != "" {
		return b.Spec.CredentialsSecret
	}
	return v1beta1.CredentialsSecretName(b.Spec.VMName)
}

// ingressHost is the BMC's host name, refused when it would leave the
// namespace's own subdomain (another namespace's BMC host, or anything else).
func ingressHost(b *v1beta1.VirtualMachineBMC, domain string) (string, error) {
	zone := bmcspec.Zone(b.Namespace, domain)
	if b.Spec.Ingress.Host == "" {
		return bmcspec.Host(b.Namespace, b.Spec.VMName, domain), nil
	}
	host := strings.ToLower(b.Spec.Ingress.Host)
	if !strings.HasSuffix(host, "."+zone) || host == "."+zone {
		return "", fmt.Errorf("%w: host %q is outside this namespace's zone %q", errHostNotAllowed, b.Spec.Ingress.Host, zone)
	}
	return host, nil
}

func redfishEnabled(b *v1beta1.VirtualMachineBMC) bool {
	return b.Spec.Redfish.Enabled == nil || *b.Spec.Redfish.Enabled
}

func ipmiEnabled(b *v1beta1.VirtualMachineBMC, cfg Config) bool {
	if b.Spec.IPMI.Enabled == nil {
		return cfg.IPMIDefault
	}
	return *b.Spec.IPMI.Enabled
}

// PodPerVM is the WorkloadFunc of one bmc-server Deployment per VM.
func PodPerVM(in WorkloadInput) (Workload, error) {
	b, vm, cfg := in.BMC, in.VM, in.Config
	var w Workload
	labels := childLabels(b.Spec.VMName)
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: b.Namespace, Labels: labels}
	}

	var err error
	instancetype, clusterInstancetype := instancetypes(vm)
	w.Objects, w.ClusterObjects, err = rbacObjects(bmc.RBACParams{
		Namespace:           b.Namespace,
		VMName:              b.Spec.VMName,
		ServiceAccount:      workloadName(b.Spec.VMName),
		Instancetype:        instancetype,
		ClusterInstancetype: clusterInstancetype,
		Claims:              kubevirt.ReferencedClaims(vm),
	})
	if err != nil {
		return w, err
	}

	redfish, ipmi := redfishEnabled(b), ipmiEnabled(b, cfg)
	args := []string{"--credentials-dir", credentialsMountPath}
	var ingress *networkingv1.Ingress
	if redfish {
		if ingress, w.RedfishURL, w.IngressProblem = bmcIngress(in, meta(workloadName(b.Spec.VMName))); ingress != nil {
			// The Manager names the host the Ingress routes to this BMC:
			// only the BMC that holds it, so never a name that reaches
			// another VM.
			args = append(args, "--fqdn", ingress.Spec.Rules[0].Host)
		}
	}
	// The Redfish port also serves the probes, so it is always there;
	// only the Service and Ingress follow spec.redfish.enabled.
	containerPorts := []corev1.ContainerPort{redfishContainerPortSpec()}
	var servicePorts []corev1.ServicePort
	if redfish {
		servicePorts = append(servicePorts, redfishServicePortSpec())
	}
	if ipmi {
		args = append(args, "--ipmi-listen", fmt.Sprintf(":%d", ipmiContainerPort))
		containerPorts = append(containerPorts, corev1.ContainerPort{Name: "ipmi", ContainerPort: ipmiContainerPort, Protocol: corev1.ProtocolUDP})
		servicePorts = append(servicePorts, corev1.ServicePort{
			Name: "ipmi", Port: ipmiServicePort, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromString("ipmi"),
		})
		w.IPMIAddress = fmt.Sprintf("%s.%s.svc:%d", workloadName(b.Spec.VMName), b.Namespace, ipmiServicePort)
	}

	resources := defaultResources()
	if b.Spec.Resources != nil {
		resources = *b.Spec.Resources
	}
	w.Objects = append(w.Objects, bmcDeployment(meta(workloadName(b.Spec.VMName)), bmcPod{
		namespace:      b.Namespace,
		serves:         []string{"--vm", b.Spec.VMName},
		serviceAccount: workloadName(b.Spec.VMName),
		image:          cfg.BMCImage,
		args:           args,
		ports:          containerPorts,
		resources:      resources,
		secret:         credentialsSecretName(b),
		mountPath:      credentialsMountPath,

		eventDestinationsDenied: cfg.EventDestinationsDenied,
		trustedProxies:          cfg.TrustedProxies,
	}))

	if len(servicePorts) > 0 {
		w.Objects = append(w.Objects, bmcService(meta(workloadName(b.Spec.VMName)), servicePorts))
	}
	if cfg.NetworkPolicy.Enabled {
		policy, err := bmcNetworkPolicy(meta(workloadName(b.Spec.VMName)), ipmi, cfg)
		if err != nil {
			return w, err
		}
		w.Objects = append(w.Objects, policy)
	}

	w.Objects = append(w.Objects, stateSecret(meta(bmcspec.StateSecretName(b.Spec.VMName))))

	if ingress != nil {
		w.Objects = append(w.Objects, ingress)
	}

	for _, obj := range w.Objects {
		setOwner(obj, bmcKind, b, controlledBy)
	}
	return w, nil
}

// Shared is the WorkloadFunc of the shared mode: with Config.Workload
// "shared", a VM that needs only Redfish is served by its namespace's
// bmc-server virtmetal-bmcs (which SharedReconciler keeps) and has only an
// Ingress of its own, to that server's Service; any other VM (IPMI, which
// has no host name to tell VMs apart by, or neither protocol) gets PodPerVM.
func Shared(in WorkloadInput) (Workload, error) {
	if !servedShared(in.BMC, in.Config) {
		return PodPerVM(in)
	}
	b := in.BMC
	w := Workload{Shared: true}
	meta := metav1.ObjectMeta{Name: workloadName(b.Spec.VMName), Namespace: b.Namespace, Labels: childLabels(b.Spec.VMName)}
	ingress, url, err := bmcIngress(in, meta)
	if err != nil {
		w.IngressProblem = err
		return w, nil
	}
	// Its state is in the namespace's state Secret, which the shared
	// reconciler keeps: enrolling a VM writes no Secret.
	w.RedfishURL = url
	if !inSharedIngress(b) {
		// A class or certificate of its own: an Ingress of its own.
		ingress.Spec.Rules[0].HTTP.Paths[0].Backend.Service.Name = sharedName
		w.Objects = append(w.Objects, ingress)
	}
	for _, obj := range w.Objects {
		setOwner(obj, bmcKind, b, controlledBy)
	}
	return w, nil
}

// inSharedIngress says whether the host of b, served by the shared
// bmc-server, is a rule of the namespace's Ingress sharedName (which
// SharedReconciler writes in batches, as its Secret) rather than of an
// Ingress of its own: so it is unless its spec asks for an IngressClass or
// a certificate (Secret or issuer) other than the controller's, which are
// the Ingress's, not a rule's.
func inSharedIngress(b *v1beta1.VirtualMachineBMC) bool {
	return b.Spec.Ingress.ClassName == "" && b.Spec.Ingress.TLS == (v1beta1.IngressTLS{})
}

// stateSecret is where the VM's bmc-server keeps its event subscriptions.
// It sets no data: the bmc-server writes that, and applying the Secret
// again leaves what it wrote alone. Owned by the VirtualMachineBMC, the
// subscriptions go with the BMC.
func stateSecret(meta metav1.ObjectMeta) *corev1.Secret {
	return &corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"}, ObjectMeta: meta, Type: corev1.SecretTypeOpaque}
}

// servedShared says whether the namespace's shared bmc-server serves b.
func servedShared(b *v1beta1.VirtualMachineBMC, cfg Config) bool {
	return cfg.shared() && redfishEnabled(b) && !ipmiEnabled(b, cfg)
}

// bmcPod is what differs between the pods of PodPerVM and of the shared
// bmc-server.
type bmcPod struct {
	namespace, serviceAccount, image string
	// serves says which VMs of the namespace the pod serves, args what
	// else it needs; bmcArgs adds what every bmc-server gets.
	serves, args []string
	ports        []corev1.ContainerPort
	resources    corev1.ResourceRequirements
	// secret is mounted read-only at mountPath.
	secret, mountPath string
	// eventDestinationsDenied is Config.EventDestinationsDenied.
	eventDestinationsDenied []netip.Prefix
	// trustedProxies is Config.TrustedProxies.
	trustedProxies []netip.Prefix
}

func defaultResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("96Mi")},
	}
}

// bmcArgs are the arguments every bmc-server gets, then the pod's own.
func bmcArgs(p bmcPod) []string {
	args := slices.Concat(
		[]string{"--backend", "kubevirt", "--namespace", p.namespace},
		p.serves,
		[]string{"--listen", fmt.Sprintf(":%d", redfishContainerPort)},
		p.args,
		[]string{"--metrics-listen", fmt.Sprintf(":%d", metricsContainerPort)})
	if len(p.eventDestinationsDenied) > 0 {
		args = append(args, "--destinations-denied", networksArg(p.eventDestinationsDenied))
	}
	if len(p.trustedProxies) > 0 {
		args = append(args, "--trusted-proxies", networksArg(p.trustedProxies))
	}
	return args
}

func redfishContainerPortSpec() corev1.ContainerPort {
	return corev1.ContainerPort{Name: "redfish", ContainerPort: redfishContainerPort, Protocol: corev1.ProtocolTCP}
}

func redfishServicePortSpec() corev1.ServicePort {
	return corev1.ServicePort{Name: "redfish", Port: redfishServicePort, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("redfish")}
}

// bmcService serves the pods that carry meta's labels.
func bmcService(meta metav1.ObjectMeta, ports []corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: meta,
		Spec:       corev1.ServiceSpec{Selector: meta.Labels, Ports: ports},
	}
}

// bmcDeployment is a hardened one-replica bmc-server Deployment whose pods
// carry meta's labels.
func bmcDeployment(meta metav1.ObjectMeta, p bmcPod) *appsv1.Deployment {
	probe := func(path string) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: path, Port: intstr.FromString("redfish"), Scheme: corev1.URISchemeHTTPS,
			}},
			// All set, so the API server's defaults never read as drift.
			PeriodSeconds: 10, TimeoutSeconds: 2, SuccessThreshold: 1, FailureThreshold: 3,
		}
	}
	replicas := int32(1)
	maxUnavailable := intstr.FromInt32(0)
	yes, no := true, false
	uid := int64(bmcUserID)
	readOnly := int32(0o440)
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: meta,
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: meta.Labels},
			// Power control must not lapse during an update: the new
			// pod is ready before the old one goes.
			Strategy: appsv1.DeploymentStrategy{
				Type:          appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: &maxUnavailable},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: meta.Labels},
				Spec: corev1.PodSpec{
					ServiceAccountName:           p.serviceAccount,
					AutomountServiceAccountToken: &yes, // bmc-server talks to the API server as that account
					EnableServiceLinks:           &no,
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   &yes,
						RunAsUser:      &uid,
						RunAsGroup:     &uid,
						FSGroup:        &uid,
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name:  "bmc-server",
						Image: p.image,
						Args:  bmcArgs(p),
						Ports: append(slices.Clone(p.ports),
							corev1.ContainerPort{Name: "metrics", ContainerPort: metricsContainerPort, Protocol: corev1.ProtocolTCP}),
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: &no,
							ReadOnlyRootFilesystem:   &yes,
							Privileged:               &no,
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						Resources:      p.resources,
						ReadinessProbe: probe("/readyz"),
						LivenessProbe:  probe("/healthz"),
						VolumeMounts:   []corev1.VolumeMount{{Name: "credentials", MountPath: p.mountPath, ReadOnly: true}},
					}},
					Volumes: []corev1.Volume{{
						Name: "credentials",
						VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
							SecretName:  p.secret,
							DefaultMode: &readOnly,
						}},
					}},
				},
			},
		},
	}
}

// bmcIngress is the Ingress of in.BMC's host, and its Redfish URL; or an
// error saying why it has none: a host outside the namespace's zone, or one
// an older BMC holds.
func bmcIngress(in WorkloadInput, meta metav1.ObjectMeta) (*networkingv1.Ingress, string, error) {
	b, cfg := in.BMC, in.Config
	host, err := ingressHost(b, cfg.Domain)
	if err != nil {
		return nil, "", err
	}
	if in.HostTakenBy != "" {
		return nil, "", hostTaken(host, in.HostTakenBy)
	}
	meta.Annotations = map[string]string{
		// bmc-server speaks only HTTPS; ingress-nginx needs telling.
		"nginx.ingress.kubernetes.io/backend-protocol": "HTTPS",
	}
	tls := b.Spec.Ingress.TLS
	switch {
	case tls.Issuer != "":
		meta.Annotations["cert-manager.io/issuer"] = tls.Issuer
	case tls.ClusterIssuer != "":
		meta.Annotations["cert-manager.io/cluster-issuer"] = tls.ClusterIssuer
	case tls.SecretName == "" && cfg.Issuer != "":
		meta.Annotations["cert-manager.io/issuer"] = cfg.Issuer
	case tls.SecretName == "" && cfg.ClusterIssuer != "":
		meta.Annotations["cert-manager.io/cluster-issuer"] = cfg.ClusterIssuer
	}
	secret := tls.SecretName
	if secret == "" {
		secret = ingressTLSSecretName(b.Spec.VMName)
	}
	class := b.Spec.Ingress.ClassName
	if class == "" {
		class = cfg.IngressClass
	}
	pathType := networkingv1.PathTypePrefix
	ingress := &networkingv1.Ingress{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "Ingress"},
		ObjectMeta: meta,
		Spec: networkingv1.IngressSpec{
			TLS: []networkingv1.IngressTLS{{Hosts: []string{host}, SecretName: secret}},
			Rules: []networkingv1.IngressRule{{
				Host: host,
				IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
					Paths: []networkingv1.HTTPIngressPath{{
						Path:     "/",
						PathType: &pathType,
						Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{
							Name: meta.Name, Port: networkingv1.ServiceBackendPort{Name: "redfish"},
						}},
					}},
				}},
			}},
		},
	}
	if class != "" {
		ingress.Spec.IngressClassName = &class
	}
	return ingress, "https://" + host + "/redfish/v1/", nil
}

// instancetypes is the VM's instancetype, namespaced or cluster-wide (the
// other one ""), which its BMC may read.
func instancetypes(vm *kubevirtv1.VirtualMachine) (namespaced, cluster string) {
	it := vm.Spec.Instancetype
	switch {
	case it == nil:
		return "", ""
	case strings.EqualFold(it.Kind, "VirtualMachineInstancetype"):
		return it.Name, ""
	case it.Kind == "" || strings.EqualFold(it.Kind, "VirtualMachineClusterInstancetype"):
		// KubeVirt's default kind for an instancetype matcher is the cluster one.
		return "", it.Name
	}
	return "", ""
}

// rbacObjects renders deploy/bmc's RBAC as typed namespaced and cluster
// objects.
func rbacObjects(p bmc.RBACParams) (namespaced, cluster []client.Object, err error) {
	rendered, err := bmc.RBACObjects(p)
	if err != nil {
		return nil, nil, err
	}
	for _, u := range rendered {
		obj, err := typedRBAC(u.GetKind())
		if err != nil {
			return nil, nil, err
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj); err != nil {
			return nil, nil, fmt.Errorf("rendered %s: %w", u.GetKind(), err)
		}
		if obj.GetNamespace() == "" {
			cluster = append(cluster, obj)
		} else {
			namespaced = append(namespaced, obj)
		}
	}
	return namespaced, cluster, nil
}

func typedRBAC(kind string) (client.Object, error) {
	switch kind {
	case "ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "Role":
		return &rbacv1.Role{}, nil
	case "RoleBinding":
		return &rbacv1.RoleBinding{}, nil
	case "ClusterRole":
		return &rbacv1.ClusterRole{}, nil
	case "ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}, nil
	}
	return nil, fmt.Errorf("deploy/bmc rendered an unexpected %s", kind)
}

func childLabels(vm string) map[string]string {
	return map[string]string{v1beta1.LabelManagedBy: v1beta1.ManagedByValue, v1beta1.LabelVM: vm}
}
