package kubevirt

import (
	"context"
	"slices"

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
)

// mediaDataVolume names the DataVolume the image is imported into.
func (b *Backend) mediaDataVolume() string { return b.vmName + "-" + mediaDevice }

// VirtualMedia reports the CD-ROM the backend attached, if any.
func (m *Machine) VirtualMedia(ctx context.Context) (machine.VirtualMedia, error) {
	vm, _, err := m.b.read(ctx)
	if err != nil {
		return machine.VirtualMedia{}, err
	}
	if !hasMedia(vm) {
		return machine.VirtualMedia{WriteProtected: true}, nil
	}
	return machine.VirtualMedia{Inserted: true, Image: vm.Annotations[mediaAnnotation], WriteProtected: true}, nil
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
		return machine.Errorf(machine.ErrConflict, "media %q is already inserted", vm.Annotations[mediaAnnotation])
	}
	dv, err := m.b.createMediaDataVolume(ctx, vm, image)
	if err != nil {
		return err
	}
	_, err = m.b.updateVM(ctx, func(vm *kubevirtv1.VirtualMachine, _ *kubevirtv1.VirtualMachineInstance) (bool, error) {
		if hasMedia(vm) {
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
		if cleanupErr := m.b.deleteMediaDataVolume(ctx, &dv.UID); cleanupErr != nil {
			m.b.log.Error(cleanupErr, "cannot delete the DataVolume of a failed insert", "dataVolume", dv.Name)
		}
	}
	return err
}

// EjectMedia detaches the CD-ROM and deletes its DataVolume.
func (m *Machine) EjectMedia(ctx context.Context) error {
	m.b.mediaMu.Lock()
	defer m.b.mediaMu.Unlock()
	_, err := m.b.updateVM(ctx, func(vm *kubevirtv1.VirtualMachine, _ *kubevirtv1.VirtualMachineInstance) (bool, error) {
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
	return m.b.deleteMediaDataVolume(ctx, nil)
}

// createMediaDataVolume creates the DataVolume, replacing one left behind
// (by a BMC that died mid-insert: vm, read live under mediaMu, does not
// use it). The VM owns it, so deleting the VM deletes it.
func (b *Backend) createMediaDataVolume(ctx context.Context, vm *kubevirtv1.VirtualMachine, image string) (*cdiv1beta1.DataVolume, error) {
	if err := b.deleteMediaDataVolume(ctx, nil); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	dv := &cdiv1beta1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:      b.mediaDataVolume(),
			Namespace: b.namespace,
			Labels:    map[string]string{"app.kubernetes.io/managed-by": "virtmetal"},
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

// deleteMediaDataVolume deletes the media DataVolume; with uid, only that
// one (not a newer one of the same name).
func (b *Backend) deleteMediaDataVolume(ctx context.Context, uid *types.UID) error {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	name := b.mediaDataVolume()
	background := metav1.DeletePropagationBackground
	opts := &metav1.DeleteOptions{PropagationPolicy: &background}
	if uid != nil {
		opts.Preconditions = preconditionUID(*uid)
	}
	err := b.deleteIn(ctx, b.api.cdi, dataVolumeResource, name, opts)
	if apierrors.IsNotFound(err) || uid != nil && apierrors.IsConflict(err) {
		return nil
	}
	return b.apiError(err, "deleting DataVolume "+name+" of")
}

func hasMedia(vm *kubevirtv1.VirtualMachine) bool {
	for _, v := range vm.Spec.Template.Spec.Volumes {
		if v.Name == mediaDevice {
			return true
		}
	}
	return false
}
