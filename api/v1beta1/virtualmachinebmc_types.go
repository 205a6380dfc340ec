package v1beta1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels and annotations shared by everything virtmetal creates and by the
// objects users mark.
const (
	// LabelManagedBy marks every object the controller creates, with the
	// value ManagedByValue.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedByValue = "virtmetal"
	// LabelVM names the VirtualMachine an object belongs to, and
	// LabelNamespace its namespace where the object is cluster-scoped.
	LabelVM        = "virtmetal.io/vm"
	LabelNamespace = "virtmetal.io/namespace"
	// LabelShared, "true", marks the objects of a namespace's shared
	// bmc-server, which serves several VMs.
	LabelShared = "virtmetal.io/shared"
	// AnnotationBMC on a VirtualMachine set to BMCDisabled opts it out of
	// enrolment.
	AnnotationBMC = "virtmetal.io/bmc"
	BMCDisabled   = "disabled"
	// AnnotationRotateCredentials on a VirtualMachineBMC asks for new
	// credentials: every new value rotates them once.
	AnnotationRotateCredentials = "bmc.virtmetal.io/rotate-credentials"
	// AnnotationRotatedFor on a credentials Secret is the rotation request
	// its password answers. It is written with the password, so a
	// reconcile that reads the VirtualMachineBMC's status from before the
	// rotation does not rotate a second time.
	AnnotationRotatedFor = "bmc.virtmetal.io/rotated-for"
	// LabelEnrolled marks a VirtualMachineBMC and Secret that enrolment
	// created (as opposed to ones a user wrote), so that enrolment removes
	// only its own when a VM leaves.
	LabelEnrolled = "bmc.virtmetal.io/enrolled"
)

// Keys of the credentials Secret.
const (
	SecretUsernameKey = "username"
	SecretPasswordKey = "password"
)

// CredentialsSecretName is the default credentials Secret of a VM's BMC.
func CredentialsSecretName(vm string) string { return vm + "-bmc" }

// VirtualMachineBMCSpec is the wanted BMC of one VirtualMachine.
type VirtualMachineBMCSpec struct {
	// VMName is the VirtualMachine in this namespace that the BMC serves.
	// It must equal the VirtualMachineBMC's own name, so that a VM has at
	// most one BMC.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	VMName string `json:"vmName"`

	// CredentialsSecret names a Secret in this namespace with the keys
	// "username" and "password" of the BMC's one account. Defaults to
	// "<vmName>-bmc"; the controller creates that one when it is missing,
	// except for a BMC of the namespace's shared bmc-server (the
	// controller's shared workload mode): its credentials are then the
	// "username" and "password" of the JSON under the key <vmName> of the
	// Secret virtmetal-bmcs.
	// +optional
	CredentialsSecret string `json:"credentialsSecret,omitempty"`

	// Redfish configures the Redfish service.
	// +optional
	Redfish RedfishSpec `json:"redfish,omitempty"`

	// IPMI configures the IPMI-over-LAN service.
	// +optional
	IPMI IPMISpec `json:"ipmi,omitempty"`

	// Ingress configures how the Redfish service is exposed.
	// +optional
	Ingress IngressSpec `json:"ingress,omitempty"`

	// Resources of the bmc-server container. Defaults to small requests and
	// limits that fit one VM's BMC. A BMC served by its namespace's shared
	// bmc-server (the controller's shared workload mode) has no container of
	// its own: the shared one is sized by the number of VMs it serves.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
}

// RedfishSpec configures the Redfish service.
type RedfishSpec struct {
	// Enabled serves Redfish (HTTPS on port 443 of the Service and through
	// the Ingress). Defaults to true.
	// +kubebuilder:default=true
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
}

// IPMISpec configures the IPMI-over-LAN service.
type IPMISpec struct {
	// Enabled serves IPMI 2.0 (RMCP+) on UDP port 623 of the Service.
	// Defaults to the controller's --ipmi-default (off unless set).
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
}

// IngressSpec configures the Redfish Ingress.
type IngressSpec struct {
	// Host is the Ingress host name. Defaults to "<vm>.<namespace>.<domain>";
	// another value must end in ".<namespace>.<domain>", so no namespace can
	// take another's host names.
	// +optional
	Host string `json:"host,omitempty"`

	// ClassName is the IngressClass. Defaults to the controller's
	// --ingress-class.
	// +optional
	ClassName string `json:"className,omitempty"`

	// TLS chooses the Ingress certificate.
	// +optional
	TLS IngressTLS `json:"tls,omitempty"`
}

// IngressTLS chooses where the Ingress certificate comes from: an existing
// Secret, or a cert-manager issuer that writes it.
type IngressTLS struct {
	// SecretName is the TLS Secret in this namespace. Defaults to
	// "bmc-<vm>-tls".
	// +optional
	SecretName string `json:"secretName,omitempty"`

	// Issuer is the cert-manager Issuer in this namespace that issues the
	// certificate. Defaults to the controller's configured issuer.
	// +optional
	Issuer string `json:"issuer,omitempty"`

	// ClusterIssuer is the cert-manager ClusterIssuer that issues the
	// certificate, instead of Issuer.
	// +optional
	ClusterIssuer string `json:"clusterIssuer,omitempty"`
}

// Condition types of a VirtualMachineBMC. Ready sums up the ones the
// controller owns; MaaSMachine is the MaaS reconciler's.
const (
	ConditionReady               = "Ready"
	ConditionVMFound             = "VMFound"
	ConditionCredentialsReady    = "CredentialsReady"
	ConditionDeploymentAvailable = "DeploymentAvailable"
	ConditionServiceReady        = "ServiceReady"
	ConditionIngressReady        = "IngressReady"
	ConditionMaaSMachine         = "MaaSMachine"
)

// VirtualMachineBMCStatus is what the controller and the MaaS reconciler
// observed.
type VirtualMachineBMCStatus struct {
	// ObservedGeneration is the generation of the spec the controller last
	// acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, VMFound, CredentialsReady, DeploymentAvailable,
	// ServiceReady, IngressReady (the controller's) and MaaSMachine (the
	// MaaS reconciler's).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// RedfishURL is the service root of the BMC through its Ingress.
	// +optional
	RedfishURL string `json:"redfishURL,omitempty"`

	// IPMIAddress is host:port of the IPMI service when IPMI is on.
	// +optional
	IPMIAddress string `json:"ipmiAddress,omitempty"`

	// CredentialsRotation is the last value of the rotate-credentials
	// annotation the controller acted on.
	// +optional
	CredentialsRotation string `json:"credentialsRotation,omitempty"`

	// MaaS is the VM's machine in MaaS, as the MaaS reconciler last saw it.
	// +optional
	MaaS *MaaSStatus `json:"maas,omitempty"`
}

// MaaSStatus is one MaaS machine as the reconciler last saw it.
type MaaSStatus struct {
	// SystemID is MaaS's system_id of the machine.
	// +optional
	SystemID string `json:"systemID,omitempty"`
	// StatusName is MaaS's status, e.g. New, Commissioning, Ready.
	// +optional
	StatusName string `json:"statusName,omitempty"`
	// Hostname is the machine's hostname in MaaS.
	// +optional
	Hostname string `json:"hostname,omitempty"`
	// Pool is the machine's resource pool in MaaS.
	// +optional
	Pool string `json:"pool,omitempty"`
	// LastUpdateTime is when the reconciler last changed this report. It
	// writes only what changed, so a machine in shape keeps the time it was
	// last found different (a write per machine per cycle would make idle
	// cycles cost a request per machine).
	// +optional
	LastUpdateTime *metav1.Time `json:"lastUpdateTime,omitempty"`
	// Problems are what keeps the machine out of shape, one per kind, the
	// one the MaaSMachine condition names first. They outlive a reconciler
	// run (a CronJob's --once), so a problem that recurs is counted and a
	// refused commission waits before it is tried again.
	// +listType=map
	// +listMapKey=reason
	// +optional
	Problems []MaaSProblem `json:"problems,omitempty"`
}

// MaaSProblem is one kind of problem the reconciler met with a VM's MaaS
// machine.
type MaaSProblem struct {
	// Reason is the kind: CommissionRefused, AddressRejected,
	// DuplicateClaim or Failing, as in the MaaSMachine condition.
	Reason string `json:"reason"`
	// Message says what MaaS answered or what was found.
	Message string `json:"message"`
	// Cycles counts the consecutive reconciler cycles that met it; while a
	// refused commission waits, only the attempts count.
	Cycles int32 `json:"cycles"`
	// Since is when it was first met.
	Since metav1.Time `json:"since"`
	// RetryAfter is, for a refused commission, when it is tried again. The
	// wait doubles with each refusal up to a cap, and starts again when the
	// machine, its status or MaaS's answer changes.
	// +optional
	RetryAfter *metav1.Time `json:"retryAfter,omitempty"`
	// Machines are the other MaaS machines involved: for DuplicateClaim,
	// the system IDs of the machines that claimed this VM's BMC and were
	// detached from it. The problem stays while one of them is in MaaS.
	// +optional
	Machines []string `json:"machines,omitempty"`
}

// VirtualMachineBMC is the BMC of one KubeVirt VirtualMachine: a bmc-server
// Deployment serving Redfish (and optionally IPMI) for the VM, its Service,
// least-privilege RBAC and Ingress. It is named after its VM.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=vmbmc,categories=virtmetal
// +kubebuilder:printcolumn:name="VM",type=string,JSONPath=`.spec.vmName`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=`.status.redfishURL`
// +kubebuilder:printcolumn:name="MaaS Status",type=string,JSONPath=`.status.maas.statusName`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name == self.spec.vmName",message="a VirtualMachineBMC is named after its VM: metadata.name must equal spec.vmName"
type VirtualMachineBMC struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VirtualMachineBMCSpec   `json:"spec"`
	Status VirtualMachineBMCStatus `json:"status,omitempty"`
}

// VirtualMachineBMCList is a list of VirtualMachineBMCs.
//
// +kubebuilder:object:root=true
type VirtualMachineBMCList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineBMC `json:"items"`
}

func init() {
	SchemeBuilder.Register(&VirtualMachineBMC{}, &VirtualMachineBMCList{})
}
