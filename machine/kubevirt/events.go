package kubevirt

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/machine"
)

// EventReportingController names bmc-server in the Events it records.
const EventReportingController = "virtmetal.io/bmc-server"

var _ machine.ActionRecorder = (*Backend)(nil)

// RecordAction implements machine.ActionRecorder with an events.k8s.io/v1
// Event on the VM, note being, e.g., "Reset ForceOff by admin from
// 10.0.0.5 via Redfish: done". The Role allows creating Events in the VM's
// namespace only.
func (b *Backend) RecordAction(ctx context.Context, machineID, action string, failed bool, note string) error {
	if machineID != b.vmName {
		return machine.Errorf(machine.ErrNotFound, "machine %q (this BMC serves %q)", machineID, b.vmName)
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	regarding := corev1.ObjectReference{
		APIVersion: kubevirtv1.SchemeGroupVersion.String(), Kind: "VirtualMachine",
		Namespace: b.namespace, Name: b.vmName,
	}
	if vm, err := fromCache[*kubevirtv1.VirtualMachine](b.informers.vms, b, vmResource); err == nil {
		regarding.UID, regarding.ResourceVersion = vm.UID, vm.ResourceVersion
	}
	now := time.Now()
	eventType := corev1.EventTypeNormal
	if failed {
		eventType = corev1.EventTypeWarning
	}
	if len(note) > 1024 {
		note = note[:1024] // the API's limit
	}
	event := &eventsv1.Event{
		// events.k8s.io refuses a generateName ending in ".": named as
		// client-go's recorder names them, within the 253 characters.
		ObjectMeta:          metav1.ObjectMeta{Namespace: b.namespace, Name: fmt.Sprintf("%s.%x", b.vmName[:min(len(b.vmName), 236)], now.UnixNano())},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: EventReportingController,
		ReportingInstance:   b.reportingInstance,
		Action:              action,
		Reason:              "BMC" + action,
		Regarding:           regarding,
		Note:                note,
		Type:                eventType,
	}
	return b.apiError(b.api.events.Post().Namespace(b.namespace).Resource("events").Body(event).Do(ctx).Error(), "recording an event on")
}
