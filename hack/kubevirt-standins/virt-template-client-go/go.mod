// Stand-in for kubevirt.io/virt-template-client-go v0.2.0, whose module zip
// the Go module proxy refuses; see ../README.md. hack/setup-kubevirt.sh uses
// it through a replace directive only when the real module cannot be
// downloaded (and then replaces kubevirt.io/virt-template-api too).
module kubevirt.io/virt-template-client-go

go 1.24.0

require (
	k8s.io/apimachinery v0.34.3
	k8s.io/client-go v0.34.3
	kubevirt.io/virt-template-api v0.2.0
)
