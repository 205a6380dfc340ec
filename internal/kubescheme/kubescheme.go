// Package kubescheme is the scheme of every Kubernetes type virtmetal's
// programs and tests use: the built-in API groups, KubeVirt's, its
// instancetypes' and pools', and CDI's. bmc-server does not use it: it registers only
// the kinds it reads, to keep every BMC pod small.
package kubescheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	kubevirtv1 "kubevirt.io/api/core/v1"
	instancetypev1beta1 "kubevirt.io/api/instancetype/v1beta1"
	poolv1beta1 "kubevirt.io/api/pool/v1beta1"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
)

// New returns a scheme with those types.
func New() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, kubevirtv1.AddToScheme, instancetypev1beta1.AddToScheme, poolv1beta1.AddToScheme, cdiv1beta1.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(err) // static registrations: cannot fail
		}
	}
	return s
}
