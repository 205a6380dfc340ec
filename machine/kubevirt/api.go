package kubevirt

import (
	"context"
	"fmt"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	instancetypev1beta1 "kubevirt.io/api/instancetype/v1beta1"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
)

// The backend talks to the API server through client-go's REST clients and
// informers, one per API group it uses, rather than through
// controller-runtime's client and cache: those link client-go's whole typed
// clientset and every built-in API group, whose initialisation alone holds
// about 10 MB of every BMC pod's memory (docs/benchmarks.md).

// apiGroups holds a REST client for each API group the backend reads or
// writes.
type apiGroups struct {
	kubevirt      rest.Interface // kubevirt.io/v1: the VM and its VMI
	instancetypes rest.Interface // instancetype.kubevirt.io/v1beta1
	cdi           rest.Interface // cdi.kubevirt.io/v1beta1: media DataVolumes
	// subresources calls virt-api's stop and restart (KubeVirt's API group
	// subresources.kubevirt.io), the only way to force a VM off at once.
	subresources rest.Interface
	events       rest.Interface // events.k8s.io/v1: the audit trail on the VM
	core         rest.Interface // v1: the state Secret
	// consoles opens virt-api's console and vnc WebSockets.
	consoles *consoleDialer
}

// newAPIGroups makes the clients; consoleCfg is cfg without the
// reachability wrapper (a console's stream is no answer of the API server).
func newAPIGroups(cfg, consoleCfg *rest.Config, httpClient *http.Client, scheme *runtime.Scheme) (apiGroups, error) {
	codecs := newCodecs(scheme)
	forGroup := func(gv schema.GroupVersion) (rest.Interface, error) {
		c := rest.CopyConfig(cfg)
		c.APIPath = "/apis"
		c.GroupVersion = &gv
		c.NegotiatedSerializer = codecs
		if c.UserAgent == "" {
			c.UserAgent = rest.DefaultKubernetesUserAgent()
		}
		return rest.RESTClientForConfigAndClient(c, httpClient)
	}
	var g apiGroups
	core := rest.CopyConfig(cfg)
	core.APIPath = "/api"
	core.GroupVersion = &corev1.SchemeGroupVersion
	core.NegotiatedSerializer = codecs
	if core.UserAgent == "" {
		core.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	var err error
	if g.consoles, err = newConsoleDialer(consoleCfg); err != nil {
		return apiGroups{}, fmt.Errorf("console dialer: %w", err)
	}
	if g.core, err = rest.RESTClientForConfigAndClient(core, httpClient); err != nil {
		return apiGroups{}, fmt.Errorf("REST client for %s: %w", corev1.SchemeGroupVersion, err)
	}
	for _, group := range []struct {
		gv     schema.GroupVersion
		client *rest.Interface
	}{
		{kubevirtv1.SchemeGroupVersion, &g.kubevirt},
		{instancetypev1beta1.SchemeGroupVersion, &g.instancetypes},
		{cdiv1beta1.SchemeGroupVersion, &g.cdi},
		{schema.GroupVersion{Group: kubevirtv1.SubresourceGroupName, Version: kubevirtv1.ApiLatestVersion}, &g.subresources},
		{eventsv1.SchemeGroupVersion, &g.events},
	} {
		c, err := forGroup(group.gv)
		if err != nil {
			return apiGroups{}, fmt.Errorf("REST client for %s: %w", group.gv, err)
		}
		*group.client = c
	}
	return g, nil
}

// Resources of the API groups above.
const (
	vmResource                  = "virtualmachines"
	vmiResource                 = "virtualmachineinstances"
	instancetypeResource        = "virtualmachineinstancetypes"
	clusterInstancetypeResource = "virtualmachineclusterinstancetypes"
	dataVolumeResource          = "datavolumes"
)

// fromCache returns a copy of the cache's object named after the VM,
// or a NotFound error.
func fromCache[T runtime.Object](cache *objectCache, b *Backend, resource string) (T, error) {
	var zero T
	obj, exists, err := cache.get(b.namespace + "/" + b.vmName)
	if err != nil {
		return zero, err
	}
	if !exists {
		return zero, notFound(resource, b.vmName)
	}
	return obj.(runtime.Object).DeepCopyObject().(T), nil
}

// getVM and getVMI read from the API server.
func (b *Backend) getVM(ctx context.Context) (*kubevirtv1.VirtualMachine, error) {
	vm := &kubevirtv1.VirtualMachine{}
	return vm, b.api.kubevirt.Get().Namespace(b.namespace).Resource(vmResource).Name(b.vmName).Do(ctx).Into(vm)
}

func (b *Backend) getVMI(ctx context.Context) (*kubevirtv1.VirtualMachineInstance, error) {
	vmi := &kubevirtv1.VirtualMachineInstance{}
	return vmi, b.api.kubevirt.Get().Namespace(b.namespace).Resource(vmiResource).Name(b.vmName).Do(ctx).Into(vmi)
}

// putVM writes vm back (optimistic concurrency on its resourceVersion) and
// updates it to the stored object.
func (b *Backend) putVM(ctx context.Context, vm *kubevirtv1.VirtualMachine) error {
	return b.api.kubevirt.Put().Namespace(b.namespace).Resource(vmResource).Name(vm.Name).Body(vm).Do(ctx).Into(vm)
}

// deleteIn deletes a namespaced object of an API group with opts.
func (b *Backend) deleteIn(ctx context.Context, group rest.Interface, resource, name string, opts *metav1.DeleteOptions) error {
	return group.Delete().Namespace(b.namespace).Resource(resource).Name(name).Body(opts).Do(ctx).Error()
}

// preconditionUID makes a delete apply only to the object with that UID,
// never to a newer one of the same name.
func preconditionUID(uid types.UID) *metav1.Preconditions {
	return &metav1.Preconditions{UID: &uid}
}

func notFound(resource, name string) error {
	return apierrors.NewNotFound(schema.GroupResource{Group: kubevirtv1.SchemeGroupVersion.Group, Resource: resource}, name)
}
