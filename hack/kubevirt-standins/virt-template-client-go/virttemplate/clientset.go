// Package virttemplate is a stand-in for
// kubevirt.io/virt-template-client-go/virttemplate v0.2.0, whose module zip
// the Go module proxy refuses (see hack/kubevirt-standins/README.md). It
// declares the names kubevirt.io/kubevirt v1.9.0 compiles against:
// NewForConfig and Clientset.TemplateV1beta1().RESTClient(), a REST client
// of template.kubevirt.io/v1beta1 that virt-controller lists and watches
// virtualmachinetemplates with.
package virttemplate

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"

	"kubevirt.io/virt-template-api/core/v1beta1"
)

// TemplateV1beta1Interface is the client of template.kubevirt.io/v1beta1.
type TemplateV1beta1Interface interface {
	RESTClient() rest.Interface
}

// Clientset holds the clients of the virt-template API groups.
type Clientset struct {
	templateV1beta1 *templateV1beta1Client
}

// TemplateV1beta1 returns the client of template.kubevirt.io/v1beta1.
func (c *Clientset) TemplateV1beta1() TemplateV1beta1Interface {
	return c.templateV1beta1
}

type templateV1beta1Client struct {
	restClient rest.Interface
}

func (c *templateV1beta1Client) RESTClient() rest.Interface {
	if c == nil {
		return nil
	}
	return c.restClient
}

var scheme = runtime.NewScheme()

func init() {
	if err := v1beta1.AddToScheme(scheme); err != nil {
		panic(err)
	}
}

// NewForConfig returns a Clientset for c; c is not changed.
func NewForConfig(c *rest.Config) (*Clientset, error) {
	config := *c
	gv := v1beta1.SchemeGroupVersion
	config.GroupVersion = &gv
	config.APIPath = "/apis"
	config.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if config.UserAgent == "" {
		config.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	client, err := rest.RESTClientFor(&config)
	if err != nil {
		return nil, err
	}
	return &Clientset{templateV1beta1: &templateV1beta1Client{restClient: client}}, nil
}
