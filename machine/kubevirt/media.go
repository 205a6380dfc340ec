package kubevirt

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/virtmetal/virtmetal/machine"
)

const (
	// mediaDevice names the CD-ROM disk and its volume on the VM.
	mediaDevice = "virtmetal-media"
	// mediaAnnotation holds the URL of the inserted image.
	mediaAnnotation = "virtmetal.io/media-image"
	// mediaMarkLabel and mediaMarkValue mark the DataVolumes the BMC
	// makes; with an owner reference to the VM's UID they tell a media
	// volume the BMC may replace or delete from one a user made under the
	// same name, which is never touched.
	mediaMarkLabel = "app.kubernetes.io/managed-by"
	mediaMarkValue = "virtmetal"
)

// mediaDataVolume names the DataVolume the image is imported into.
func (b *Backend) mediaDataVolume() string { return b.vmName + "-" + mediaDevice }

// VirtualMedia reports the CD-ROM the backend attached, if any, and how
// far CDI has imported its image.
func (m *Machine) VirtualMedia(ctx context.Context) (machine.VirtualMedia, error) {
	vm, _, err := m.b.read(ctx)
	if err != nil {
		return machine.VirtualMedia{}, err
	}
	if !hasMedia(vm) {
		return machine.VirtualMedia{WriteProtected: true}, nil
	}
	media := machine.VirtualMedia{Inserted: true, Image: vm.Annotations[mediaAnnotation], WriteProtected: true}
	if err := m.b.readImport(ctx, vm, &media); err != nil {
		return machine.VirtualMedia{}, err
	}
	return media, nil
}

// importDone is an import seen Succeeded, which a DataVolume never
// leaves: the image, the VM's generation it was attached at, and the media
// it read. An eject and insert change the generation, so a new import of
// the same URL is read afresh. (A Failed import is read again: CDI may
// still retry it.)
type importDone struct {
	image      string
	generation int64
	media      machine.VirtualMedia
}

// readImport fills media's State, Percent and Problem from the
// DataVolume's status. A Succeeded import is remembered, so a drive that
// is ready costs no API call per read.
func (b *Backend) readImport(ctx context.Context, vm *kubevirtv1.VirtualMachine, media *machine.VirtualMedia) error {
	if done := b.mediaDone.Load(); done != nil && done.image == media.Image && done.generation == vm.Generation {
		*media = done.media
		return nil
	}
	dv, err := b.getMediaDataVolume(ctx)
	switch {
	case apierrors.IsNotFound(err):
		// Attached without its volume: deleted by someone else. The VM
		// cannot start with it; an eject mends it.
		media.State, media.Problem = machine.MediaFailed, "DataVolume "+b.mediaDataVolume()+" is missing"
		return nil
	case err != nil:
		return b.apiError(err, "reading DataVolume "+b.mediaDataVolume()+" of")
	}
	media.State, media.Percent, media.Problem = importState(dv.Status)
	if media.State == machine.MediaReady {
		b.mediaDone.Store(&importDone{image: media.Image, generation: vm.Generation, media: *media})
	}
	return nil
}

// getMediaDataVolume reads the media DataVolume.
func (b *Backend) getMediaDataVolume(ctx context.Context) (*cdiv1beta1.DataVolume, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	dv := &cdiv1beta1.DataVolume{}
	return dv, b.api.cdi.Get().Namespace(b.namespace).Resource(dataVolumeResource).Name(b.mediaDataVolume()).Do(ctx).Into(dv)
}

// importState maps a DataVolume's status onto the media's: Succeeded is
// Ready, Failed is Failed with the condition that says why, a volume
// waiting for its first consumer (a WaitForFirstConsumer storage class
// binds it when the VM starts) is Pending, and every other phase is an
// import under way.
func importState(status cdiv1beta1.DataVolumeStatus) (machine.MediaState, int, string) {
	switch status.Phase {
	case cdiv1beta1.Succeeded:
		return machine.MediaReady, 100, ""
	case cdiv1beta1.Failed:
		return machine.MediaFailed, importPercent(status.Progress), importProblem(status.Conditions)
	case cdiv1beta1.WaitForFirstConsumer, cdiv1beta1.PendingPopulation:
		return machine.MediaPending, 0, ""
	}
	return machine.MediaImporting, importPercent(status.Progress), ""
}

// importPercent reads CDI's progress ("45.3%", or "N/A"), rounded down; 0
// when unknown.
func importPercent(progress cdiv1beta1.DataVolumeProgress) int {
	f, err := strconv.ParseFloat(strings.TrimSuffix(string(progress), "%"), 64)
	if err != nil || f < 0 {
		return 0
	}
	return int(min(f, 100))
}

// importProblem is the first message of a condition that is not True
// (CDI explains a failed import on Running or Ready).
func importProblem(conditions []cdiv1beta1.DataVolumeCondition) string {
	for _, c := range conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			return c.Message
		}
	}
	return "the import failed"
}

// InsertMedia imports the image into a CDI DataVolume (CDI fetches it over
// http(s) and unpacks iso, qcow2, raw, gz and xz) and attaches it to the VM
// as a CD-ROM. A running VM sees the drive on its next boot, or at once
// where KubeVirt's declarative volume hotplug is enabled.
func (m *Machine) InsertMedia(ctx context.Context, image string) error {
	if err := machine.CheckImageURL(image); err != nil {
		return err
	}
	if !m.b.cdiInstalled(ctx) {
		return machine.Errorf(machine.ErrNotSupported, "virtual media needs CDI: the DataVolume API (cdi.kubevirt.io/v1beta1) is not installed")
	}
	// One drive, one DataVolume name: inserts and ejects take turns, so
	// one insert never replaces the DataVolume another has just attached.
	m.b.mediaMu.Lock()
	defer m.b.mediaMu.Unlock()
	vm, _, err := m.b.readLive(ctx)
	if err != nil {
		return err
	}
	if hasMedia(vm) {
		return sameOrConflict(vm, image)
	}
	dv, err := m.b.createMediaDataVolume(ctx, vm, image)
	if err != nil {
		return err
	}
	_, err = m.b.updateVM(ctx, func(vm *kubevirtv1.VirtualMachine, _ *kubevirtv1.VirtualMachineInstance) (bool, error) {
		if hasMedia(vm) {
			// Inserted since the read above, by another BMC: this call's
			// DataVolume replaced that one's, so it is no retry.
			return false, machine.Errorf(machine.ErrConflict, "media %q is already inserted", vm.Annotations[mediaAnnotation])
		}
		spec := &vm.Spec.Template.Spec
		spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, kubevirtv1.Disk{
			Name:       mediaDevice,
			DiskDevice: kubevirtv1.DiskDevice{CDRom: &kubevirtv1.CDRomTarget{Bus: kubevirtv1.DiskBusSATA}},
		})
		spec.Volumes = append(spec.Volumes, kubevirtv1.Volume{
			Name:         mediaDevice,
			VolumeSource: kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: m.b.mediaDataVolume()}},
		})
		setAnnotation(vm, mediaAnnotation, image)
		return true, nil
	})
	if err != nil {
		// Not attached: the DataVolume this call made must not outlive it.
		if cleanupErr := m.b.deleteMediaDataVolume(ctx, dv.UID); cleanupErr != nil {
			m.b.log.Error(cleanupErr, "cannot delete the DataVolume of a failed insert", "dataVolume", dv.Name)
		}
	}
	return err
}

// EjectMedia detaches the CD-ROM and deletes its DataVolume, if the BMC
// made it: a DataVolume of that name someone else made stays, and the
// drive is empty all the same.
func (m *Machine) EjectMedia(ctx context.Context) error {
	m.b.mediaMu.Lock()
	defer m.b.mediaMu.Unlock()
	var vmUID types.UID
	_, err := m.b.updateVM(ctx, func(vm *kubevirtv1.VirtualMachine, _ *kubevirtv1.VirtualMachineInstance) (bool, error) {
		vmUID = vm.UID
		if !hasMedia(vm) {
			return false, nil
		}
		spec := &vm.Spec.Template.Spec
		spec.Domain.Devices.Disks = slices.DeleteFunc(spec.Domain.Devices.Disks, func(d kubevirtv1.Disk) bool { return d.Name == mediaDevice })
		spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v kubevirtv1.Volume) bool { return v.Name == mediaDevice })
		delete(vm.Annotations, mediaAnnotation)
		return true, nil
	})
	if err != nil {
		return err
	}
	if err := m.b.deleteOwnMediaDataVolume(ctx, vmUID); errors.Is(err, errNotOurs) {
		m.b.log.Info("media DataVolume left alone: the BMC did not make it", "dataVolume", m.b.mediaDataVolume())
	} else if err != nil {
		return err
	}
	return nil
}

// createMediaDataVolume creates the DataVolume, replacing one the BMC left
// behind (dying mid-insert: vm, read live under mediaMu, does not use it);
// one of that name the BMC did not make is a conflict, and stays. The VM
// owns it, so deleting the VM deletes it.
func (b *Backend) createMediaDataVolume(ctx context.Context, vm *kubevirtv1.VirtualMachine, image string) (*cdiv1beta1.DataVolume, error) {
	if err := b.deleteOwnMediaDataVolume(ctx, vm.UID); errors.Is(err, errNotOurs) {
		return nil, machine.Errorf(machine.ErrConflict, "%v: virtual media needs that name; rename or delete it", err)
	} else if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	dv := &cdiv1beta1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:      b.mediaDataVolume(),
			Namespace: b.namespace,
			Labels:    map[string]string{mediaMarkLabel: mediaMarkValue},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: kubevirtv1.SchemeGroupVersion.String(), Kind: "VirtualMachine", Name: vm.Name, UID: vm.UID,
			}},
		},
		Spec: cdiv1beta1.DataVolumeSpec{
			Source: &cdiv1beta1.DataVolumeSource{HTTP: &cdiv1beta1.DataVolumeSourceHTTP{URL: image}},
			Storage: &cdiv1beta1.StorageSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources: corev1.VolumeResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceStorage: b.mediaSize},
				},
			},
		},
	}
	if b.mediaSC != "" {
		dv.Spec.Storage.StorageClassName = &b.mediaSC
	}
	if err := b.api.cdi.Post().Namespace(b.namespace).Resource(dataVolumeResource).Body(dv).Do(ctx).Into(dv); err != nil {
		return nil, b.apiError(err, "creating DataVolume "+dv.Name+" for")
	}
	return dv, nil
}

// errNotOurs: the media DataVolume's name is taken by one the BMC did not
// make.
var errNotOurs = errors.New("not made by the BMC")

// deleteOwnMediaDataVolume deletes the media DataVolume if it carries the
// BMC's mark for the VM of vmUID, and returns errNotOurs, deleting
// nothing, if it does not. The delete is bound to the UID read, so a
// DataVolume made under that name since is never the one deleted.
func (b *Backend) deleteOwnMediaDataVolume(ctx context.Context, vmUID types.UID) error {
	dv, err := b.getMediaDataVolume(ctx)
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return b.apiError(err, "reading DataVolume "+b.mediaDataVolume()+" of")
	case !madeForVM(dv, vmUID):
		return fmt.Errorf("DataVolume %s %w", dv.Name, errNotOurs)
	}
	return b.deleteMediaDataVolume(ctx, dv.UID)
}

// madeForVM says whether dv carries the mark the BMC gives the media
// volumes it makes: its label, and the VM of vmUID as owner.
func madeForVM(dv *cdiv1beta1.DataVolume, vmUID types.UID) bool {
	if dv.Labels[mediaMarkLabel] != mediaMarkValue || vmUID == "" {
		return false
	}
	return slices.ContainsFunc(dv.OwnerReferences, func(o metav1.OwnerReference) bool {
		return o.UID == vmUID && o.Kind == "VirtualMachine" && o.APIVersion == kubevirtv1.SchemeGroupVersion.String()
	})
}

// deleteMediaDataVolume deletes the media DataVolume of that uid, not a
// newer one of the same name.
func (b *Backend) deleteMediaDataVolume(ctx context.Context, uid types.UID) error {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	name := b.mediaDataVolume()
	background := metav1.DeletePropagationBackground
	opts := &metav1.DeleteOptions{PropagationPolicy: &background, Preconditions: preconditionUID(uid)}
	err := b.deleteIn(ctx, b.api.cdi, dataVolumeResource, name, opts)
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return b.apiError(err, "deleting DataVolume "+name+" of")
}

// sameOrConflict answers an insert of image into vm's occupied drive: nil
// when image is the one inserted (a client's retry, which changes
// nothing), ErrConflict when another is.
func sameOrConflict(vm *kubevirtv1.VirtualMachine, image string) error {
	if inserted := vm.Annotations[mediaAnnotation]; inserted != image {
		return machine.Errorf(machine.ErrConflict, "media %q is already inserted", inserted)
	}
	return nil
}

func hasMedia(vm *kubevirtv1.VirtualMachine) bool {
	for _, v := range vm.Spec.Template.Spec.Volumes {
		if v.Name == mediaDevice {
			return true
		}
	}
	return false
}
