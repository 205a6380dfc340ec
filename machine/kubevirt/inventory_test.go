package kubevirt

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	instancetypev1beta1 "kubevirt.io/api/instancetype/v1beta1"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/virtmetal/virtmetal/machine"
)

func TestCPUOf(t *testing.T) {
	model := "Skylake-Server"
	tests := []struct {
		name string
		spec kubevirtv1.VirtualMachineInstanceSpec
		it   *instancetypev1beta1.VirtualMachineInstancetypeSpec
		want machine.CPU
	}{
		{"nothing stated: one amd64 CPU", kubevirtv1.VirtualMachineInstanceSpec{}, nil,
			machine.CPU{Sockets: 1, Cores: 1, Threads: 1, Architecture: machine.ArchAMD64}},
		{"threads only", kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{CPU: &kubevirtv1.CPU{Threads: 2}}}, nil,
			machine.CPU{Sockets: 1, Cores: 1, Threads: 2, Architecture: machine.ArchAMD64}},
		{"instancetype wins over the domain, its model too", kubevirtv1.VirtualMachineInstanceSpec{
			Architecture: "arm64", Domain: kubevirtv1.DomainSpec{CPU: &kubevirtv1.CPU{Cores: 4}},
		}, &instancetypev1beta1.VirtualMachineInstancetypeSpec{CPU: instancetypev1beta1.CPUInstancetype{Guest: 4, Model: &model}},
			machine.CPU{Sockets: 4, Cores: 1, Threads: 1, Model: model, Architecture: machine.ArchARM64}},
		{"CPU request rounded up", kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{
			Resources: kubevirtv1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1200m")}},
		}}, nil, machine.CPU{Sockets: 2, Cores: 1, Threads: 1, Architecture: machine.ArchAMD64}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := cpuOf(&tt.spec, tt.it); got != tt.want {
				t.Errorf("cpuOf = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestDisks(t *testing.T) {
	gi := func(n string) corev1.ResourceList {
		return corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(n)}
	}
	vm := &kubevirtv1.VirtualMachine{Spec: kubevirtv1.VirtualMachineSpec{
		DataVolumeTemplates: []kubevirtv1.DataVolumeTemplateSpec{
			{ObjectMeta: metav1.ObjectMeta{Name: "root-dv"}, Spec: cdiv1beta1.DataVolumeSpec{
				Storage: &cdiv1beta1.StorageSpec{Resources: corev1.VolumeResourceRequirements{Requests: gi("20Gi")}}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "data-dv"}, Spec: cdiv1beta1.DataVolumeSpec{
				PVC: &corev1.PersistentVolumeClaimSpec{Resources: corev1.VolumeResourceRequirements{Requests: gi("5Gi")}}}},
		},
		Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
			Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Disks: []kubevirtv1.Disk{
				{Name: "root", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}},
				{Name: "data", DiskDevice: kubevirtv1.DiskDevice{LUN: &kubevirtv1.LunTarget{Bus: kubevirtv1.DiskBusSCSI}}},
				{Name: "scratch", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusSATA}}},
				{Name: "claim"},
				{Name: "template-claim"},
				{Name: "imported", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}},
				{Name: "missing"},
				{Name: "bad"},
				{Name: "cd", DiskDevice: kubevirtv1.DiskDevice{CDRom: &kubevirtv1.CDRomTarget{Bus: kubevirtv1.DiskBusSATA}}},
				{Name: "media", DiskDevice: kubevirtv1.DiskDevice{CDRom: &kubevirtv1.CDRomTarget{Bus: kubevirtv1.DiskBusSATA}}},
			}}},
			Volumes: []kubevirtv1.Volume{
				{Name: "root", VolumeSource: kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: "root-dv"}}},
				{Name: "data", VolumeSource: kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: "data-dv"}}},
				{Name: "scratch", VolumeSource: kubevirtv1.VolumeSource{EmptyDisk: &kubevirtv1.EmptyDiskSource{Capacity: resource.MustParse("1Gi")}}},
				{Name: "claim", VolumeSource: kubevirtv1.VolumeSource{PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{
					PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "existing"}}}},
				{Name: "template-claim", VolumeSource: kubevirtv1.VolumeSource{PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{
					PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-dv"}}}},
				// A DataVolume the VM does not make: its claim has its name.
				{Name: "imported", VolumeSource: kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: "golden-image"}}},
				{Name: "missing", VolumeSource: kubevirtv1.VolumeSource{PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{
					PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "not-yet"}}}},
				{Name: "cd", VolumeSource: kubevirtv1.VolumeSource{PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{
					PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "installer-iso"}}}},
				{Name: "media", VolumeSource: kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: "vm-virtmetal-media"}}},
				// Not a name a claim can have: never read, never in a Role.
				{Name: "bad", VolumeSource: kubevirtv1.VolumeSource{PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{
					PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "Not_A/Name"}}}},
			},
		}},
	}}
	want := []machine.Disk{
		{Name: "root", Kind: machine.DiskKindDisk, Bus: machine.DiskBusVirtio, CapacityBytes: 20 << 30},
		{Name: "data", Kind: machine.DiskKindDisk, Bus: machine.DiskBusSCSI, CapacityBytes: 5 << 30},
		{Name: "scratch", Kind: machine.DiskKindDisk, Bus: machine.DiskBusSATA, CapacityBytes: 1 << 30},
		// Claims made outside the VM: their size is the claim's.
		{Name: "claim", Kind: machine.DiskKindDisk, CapacityBytes: 30 << 30},
		// The claim a DataVolume template makes has the template's size.
		{Name: "template-claim", Kind: machine.DiskKindDisk, CapacityBytes: 5 << 30},
		{Name: "imported", Kind: machine.DiskKindDisk, Bus: machine.DiskBusVirtio, CapacityBytes: 10 << 30},
		// A claim that does not exist (yet): a disk of unknown size.
		{Name: "missing", Kind: machine.DiskKindDisk},
		{Name: "bad", Kind: machine.DiskKindDisk},
		// CD-ROMs' claims are not read: they are media, not Drives.
		{Name: "cd", Kind: machine.DiskKindCdrom, Bus: machine.DiskBusSATA},
		{Name: "media", Kind: machine.DiskKindCdrom, Bus: machine.DiskBusSATA},
	}
	sizes := map[string]int64{"existing": 30 << 30, "golden-image": 10 << 30, "installer-iso": 1 << 30, "vm-virtmetal-media": 1 << 30, "data-dv": 7 << 30}
	var read []string
	got := disks(vm, func(claim string) int64 { read = append(read, claim); return sizes[claim] })
	if !slices.Equal(got, want) {
		t.Errorf("disks =\n%+v\nwant\n%+v", got, want)
	}
	wantRead := []string{"existing", "golden-image", "not-yet"}
	if slices.Sort(read); !slices.Equal(read, wantRead) {
		t.Errorf("claims read %v, want %v", read, wantRead)
	}
	if got := ReferencedClaims(vm); !slices.Equal(got, wantRead) {
		t.Errorf("ReferencedClaims = %v, want %v (what disks reads)", got, wantRead)
	}
}

// TestClaimCapacity: a bound claim's capacity, else its request.
func TestClaimCapacity(t *testing.T) {
	storage := func(n string) corev1.ResourceList {
		return corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(n)}
	}
	tests := []struct {
		name string
		pvc  corev1.PersistentVolumeClaim
		want int64
	}{
		{"bound: the volume's size, over the request", corev1.PersistentVolumeClaim{
			Spec:   corev1.PersistentVolumeClaimSpec{Resources: corev1.VolumeResourceRequirements{Requests: storage("10G")}},
			Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, Capacity: storage("10Gi")},
		}, 10 << 30},
		{"pending: the request", corev1.PersistentVolumeClaim{
			Spec:   corev1.PersistentVolumeClaimSpec{Resources: corev1.VolumeResourceRequirements{Requests: storage("4Gi")}},
			Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending},
		}, 4 << 30},
		{"nothing stated", corev1.PersistentVolumeClaim{}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := claimCapacity(&tt.pvc); got != tt.want {
				t.Errorf("claimCapacity = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestLinkState: virt-handler's report first, then the spec's down, then
// no running instance; a running one that reports nothing is unknown.
func TestLinkState(t *testing.T) {
	running := &kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Running}}
	scheduled := &kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Scheduled}}
	down := kubevirtv1.Interface{Name: "default", State: kubevirtv1.InterfaceStateLinkDown}
	plain := kubevirtv1.Interface{Name: "default"}
	tests := []struct {
		name   string
		iface  kubevirtv1.Interface
		report string
		vmi    *kubevirtv1.VirtualMachineInstance
		want   machine.LinkState
	}{
		{"reported up", plain, "up", running, machine.LinkUp},
		{"reported down", plain, "down", running, machine.LinkDown},
		{"set down in the spec", down, "", running, machine.LinkDown},
		{"not running", plain, "", nil, machine.LinkDown},
		{"not running yet", plain, "", scheduled, machine.LinkDown},
		{"running, nothing reported", plain, "", running, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status := kubevirtv1.VirtualMachineInstanceNetworkInterface{Name: "default", LinkState: tt.report}
			if got := linkState(tt.iface, status, tt.vmi); got != tt.want {
				t.Errorf("linkState = %q, want %q", got, tt.want)
			}
		})
	}
}
