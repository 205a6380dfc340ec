// Stand-in for kubevirt.io/virt-template-api v0.2.0, whose module zip the Go
// module proxy refuses; see ../README.md. hack/setup-kubevirt.sh uses it
// through a replace directive only when the real module cannot be downloaded.
module kubevirt.io/virt-template-api

go 1.24.0

require k8s.io/apimachinery v0.34.3
