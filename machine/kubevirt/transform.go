package kubevirt

import (
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// lastAppliedAnnotation is kubectl's copy of the whole object, often the
// largest thing on it.
const lastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// keepWhatIsRead is the cache's transform: it drops what the backend never
// reads from the cache (managedFields, status it does not look at, the
// VMI's labels and annotations), so a BMC pod holds one small VM and VMI.
// Writes read the VM from the API server, never from the cache, so nothing
// dropped here can be written back as missing.
func keepWhatIsRead(obj any) (any, error) {
	switch o := obj.(type) {
	case *kubevirtv1.VirtualMachine:
		o.ManagedFields = nil
		delete(o.Annotations, lastAppliedAnnotation)
		// PowerState tells an Off settled by virt-controller from a start
		// under way by the strategy it acted on and the requests it has.
		o.Status = kubevirtv1.VirtualMachineStatus{
			PrintableStatus:     o.Status.PrintableStatus,
			RunStrategy:         o.Status.RunStrategy,
			StateChangeRequests: o.Status.StateChangeRequests,
		}
	case *kubevirtv1.VirtualMachineInstance:
		o.ManagedFields = nil
		o.Annotations, o.Labels, o.OwnerReferences, o.Finalizers = nil, nil, nil, nil
		// A running VMI's Paused condition tells PowerState Paused from On
		// while the VM's printableStatus lags.
		var paused []kubevirtv1.VirtualMachineInstanceCondition
		for _, c := range o.Status.Conditions {
			if c.Type == kubevirtv1.VirtualMachineInstancePaused {
				paused = append(paused, c)
			}
		}
		o.Status = kubevirtv1.VirtualMachineInstanceStatus{Phase: o.Status.Phase, Interfaces: o.Status.Interfaces, Conditions: paused}
	}
	return obj, nil
}
