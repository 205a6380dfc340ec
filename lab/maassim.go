package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/maas"
	"github.com/virtmetal/virtmetal/maas/maastest"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/kubevirt/virtsim"
)

// What MaaS waits for while it commissions a machine.
const (
	bootTimeout  = 2 * time.Minute
	powerTimeout = 2 * time.Minute
)

// maasSim is MaaS toward the machines (the API side is maastest): it sees
// each VM instance that boots from the network (the guest's PXE request),
// enlists unknown ones as New with the VM's MACs and firmware UUID and runs
// the bmc-config commissioning script, the real one, in its enlistment; and
// when a commissioning is accepted it powers the machine on with a PXE boot
// through its BMC as MaaS's power driver does, waits for that boot, runs the
// scripts, powers the machine off and marks it Ready. Machines whose BMC
// serves IPMI are powered through IPMI with freeipmi, the others through
// Redfish.
type maasSim struct {
	l      *Lab
	script string // the commissioning script, BMC_DOMAIN filled in

	mu      sync.Mutex
	seen    map[types.UID]bool                                 // VM instances already booted
	waiting map[string]chan *kubevirtv1.VirtualMachineInstance // system_id → its commissioning's boot
	enlist  sync.Mutex                                         // one enlistment at a time, so a MAC enlists once
	// consumed says, per VM, whether the BMC showed the Once override
	// gone once the commissioning's PXE boot happened.
	consumed map[maas.VMRef]bool
	// oldScript are the VMs enlisted with the address form of the
	// commissioning script's earlier versions (VMOptions.OldScriptAddress).
	oldScript map[maas.VMRef]bool
	// powerOnFaults is how many of each VM's next commissioning power-ons
	// fail (FailPowerOn); startFailures counts, per system_id, the
	// commissionings that could not power their machine on.
	powerOnFaults map[maas.VMRef]int
	startFailures map[string]int
}

func newMaaSSim(l *Lab) (*maasSim, error) {
	source, err := os.ReadFile(filepath.Join(l.root, commissioningFile))
	if err != nil {
		return nil, err
	}
	// The deploy step of deploy/maas/README.md: fill in the domain.
	filled := strings.ReplaceAll(string(source), "@VIRTMETAL_BMC_DOMAIN@", l.Domain)
	dir := filepath.Join(l.dir, "maas")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	script := filepath.Join(dir, "50-virtmetal-bmc-config")
	if err := os.WriteFile(script, []byte(filled), 0o700); err != nil {
		return nil, err
	}
	return &maasSim{l: l, script: script, seen: map[types.UID]bool{}, waiting: map[string]chan *kubevirtv1.VirtualMachineInstance{}, consumed: map[maas.VMRef]bool{}, oldScript: map[maas.VMRef]bool{},
		powerOnFaults: map[maas.VMRef]int{}, startFailures: map[string]int{}}, nil
}

// runGuests watches the VM instances come up; each that boots from the
// network asks MaaS what to do.
func (s *maasSim) runGuests(ctx context.Context) {
	for {
		var vmis kubevirtv1.VirtualMachineInstanceList
		if err := s.l.Client.List(ctx, &vmis); err == nil {
			for i := range vmis.Items {
				vmi := &vmis.Items[i]
				if vmi.Status.Phase != kubevirtv1.Running || vmi.DeletionTimestamp != nil {
					continue
				}
				s.mu.Lock()
				seen := s.seen[vmi.UID]
				s.seen[vmi.UID] = true
				s.mu.Unlock()
				if !seen && virtsim.BootDevice(&vmi.Spec) == machine.BootPxe {
					go s.pxeBoot(ctx, vmi)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func macsOf(vmi *kubevirtv1.VirtualMachineInstance) []string {
	var macs []string
	for _, iface := range vmi.Spec.Domain.Devices.Interfaces {
		if mac := maas.NormalizeMAC(iface.MacAddress); mac != "" {
			macs = append(macs, mac)
		}
	}
	return macs
}

// pxeBoot is MaaS answering a network boot: an unknown machine enlists, a
// commissioning one boots its ephemeral environment, others boot locally.
func (s *maasSim) pxeBoot(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) {
	vm := maas.VMRef{Namespace: vmi.Namespace, Name: vmi.Name}
	macs := macsOf(vmi)
	s.l.progress.record(vm, StepPXEBoot, fmt.Sprintf("from %v", macs))
	s.enlist.Lock()
	known := s.machineByMAC(macs)
	if known == nil {
		id, err := s.enlistMachine(vm, vmi, macs)
		s.enlist.Unlock()
		if err != nil {
			s.l.logf("enlisting %s: %v", vm, err)
			return
		}
		s.runEnlistmentScripts(ctx, id, vm, vmi)
		return
	}
	s.enlist.Unlock()
	s.mu.Lock()
	boot := s.waiting[known.SystemID]
	s.mu.Unlock()
	if boot != nil && known.Status == maastest.StatusCommissioning {
		select {
		case boot <- vmi:
		default:
		}
	}
}

func (s *maasSim) machineByMAC(macs []string) *maastest.Machine {
	for _, m := range s.l.MaaS.Machines() {
		for _, mac := range m.MACs {
			for _, want := range macs {
				if maas.NormalizeMAC(mac) == want {
					return &m
				}
			}
		}
	}
	return nil
}

// enlistMachine adds the machine as New, with the VM's MACs and firmware
// UUID.
func (s *maasSim) enlistMachine(vm maas.VMRef, vmi *kubevirtv1.VirtualMachineInstance, macs []string) (string, error) {
	if len(macs) == 0 {
		return "", errors.New("it booted from the network without a MAC")
	}
	var uuid string
	if fw := vmi.Spec.Domain.Firmware; fw != nil {
		uuid = string(fw.UUID)
	}
	id, err := s.l.MaaS.Enlist(maastest.Machine{Hostname: petname(), Status: maastest.StatusNew, MACs: macs, HardwareUUID: uuid})
	if err != nil {
		return "", err
	}
	s.l.progress.record(vm, StepEnlisted, fmt.Sprintf("system_id %s, MAC %s, UUID %s", id, macs[0], uuid))
	return id, nil
}

// runEnlistmentScripts runs the bmc-config script and stores the power
// configuration it writes.
func (s *maasSim) runEnlistmentScripts(ctx context.Context, systemID string, vm maas.VMRef, vmi *kubevirtv1.VirtualMachineInstance) {
	config, err := s.runBMCConfig(ctx, vmi)
	if err != nil {
		s.l.logf("enlistment scripts of %s: %v", systemID, err)
		return
	}
	s.mu.Lock()
	old := s.oldScript[vm]
	s.mu.Unlock()
	if config != nil && old {
		config["power_address"] = "https://" + config["power_address"]
	}
	if config != nil {
		// MaaS stores what the script wrote to BMC_CONFIG_PATH, where its
		// region accepts it.
		if err := s.l.MaaS.StoreBMCConfig(systemID, config); err != nil {
			s.l.logf("enlistment scripts of %s: %v", systemID, err)
			return
		}
		s.l.progress.record(vm, StepPowerConfig, fmt.Sprintf("%s %s node_id %s", config["power_type"], config["power_address"], config["node_id"]))
	}
}

// petname is a hostname like the ones MaaS makes up at enlistment.
func petname() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return "enlisted-" + hex.EncodeToString(b)
}

// runBMCConfig runs the real commissioning script as MaaS does, on a
// "hardware" whose dmidecode tells the VM instance's SMBIOS. It returns the
// configuration the script wrote, nil when it wrote none.
func (s *maasSim) runBMCConfig(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) (map[string]string, error) {
	dir, err := os.MkdirTemp(filepath.Join(s.l.dir, "maas"), "run-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	serial, uuid := "Not Specified", "Not Settable"
	if fw := vmi.Spec.Domain.Firmware; fw != nil {
		if fw.Serial != "" {
			serial = fw.Serial
		}
		if fw.UUID != "" {
			uuid = string(fw.UUID)
		}
	}
	// KubeVirt's SMBIOS manufacturer is "KubeVirt" unless the cluster
	// configures another.
	dmidecode := "#!/bin/sh\n[ \"$1\" = -s ] || exit 2\ncase \"$2\" in\n" +
		"system-manufacturer) echo 'KubeVirt' ;;\n" +
		"system-serial-number) echo '" + shellSafe(serial) + "' ;;\n" +
		"system-uuid) echo '" + shellSafe(uuid) + "' ;;\n" +
		"*) echo \"Invalid string keyword: $2\" >&2; exit 2 ;;\nesac\n"
	if err := os.WriteFile(filepath.Join(dir, "dmidecode"), []byte(dmidecode), 0o700); err != nil {
		return nil, err
	}
	configPath := filepath.Join(dir, "bmc-config.yaml")
	ctx, cancel := context.WithTimeout(ctx, time.Minute) // the script's own timeout
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", s.script)
	cmd.Env = []string{
		"PATH=" + dir + string(os.PathListSeparator) + os.Getenv("PATH"),
		"BMC_CONFIG_PATH=" + configPath,
		"RESULT_PATH=" + filepath.Join(dir, "result.yaml"),
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s", filepath.Base(s.script), err, out)
	}
	data, err := os.ReadFile(configPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	config := map[string]string{}
	if err := yaml.Unmarshal(data, &config); err != nil {
		return nil, fmt.Errorf("BMC_CONFIG_PATH: %w", err)
	}
	return config, nil
}

// shellSafe keeps a value inside single quotes.
func shellSafe(s string) string { return strings.ReplaceAll(s, "'", "") }

// commissioned is told by the API of each accepted commissioning.
func (s *maasSim) commissioned(systemID string) {
	m, ok := s.l.MaaS.Machine(systemID)
	if !ok {
		return
	}
	vm, _ := maas.ParseBMCAddress(m.PowerParameters["power_address"], s.l.Domain)
	s.l.noticeNamed(m)
	s.l.progress.record(vm, StepCommissioning, "system_id "+systemID+" as "+m.Hostname)
	boot := make(chan *kubevirtv1.VirtualMachineInstance, 1)
	s.mu.Lock()
	s.waiting[systemID] = boot
	s.mu.Unlock()
	go s.commission(s.l.ctx, systemID, vm, boot)
}

// commission is MaaS's commissioning of one machine.
func (s *maasSim) commission(ctx context.Context, systemID string, vm maas.VMRef, boot chan *kubevirtv1.VirtualMachineInstance) {
	defer func() {
		s.mu.Lock()
		delete(s.waiting, systemID)
		s.mu.Unlock()
	}()
	fail := func(err error) {
		s.l.logf("commissioning %s (%s) failed: %v", systemID, vm, err)
		s.l.MaaS.Update(systemID, func(m *maastest.Machine) { m.Status = maastest.StatusFailedCommissioning })
	}
	// MaaS does not fail a commissioning it could not start: when the
	// power-on fails, the machine goes back to its previous status (New,
	// for an enlisted machine), to be commissioned again.
	notStarted := func(err error) {
		s.l.logf("commissioning %s (%s) not started: %v", systemID, vm, err)
		s.mu.Lock()
		s.startFailures[systemID]++
		s.mu.Unlock()
		s.l.MaaS.Update(systemID, func(m *maastest.Machine) { m.Status = m.PreviousStatus })
	}
	m, _ := s.l.MaaS.Machine(systemID)
	driver, err := s.driverFor(ctx, m, vm)
	if err != nil {
		notStarted(err)
		return
	}
	if err := s.powerOn(ctx, vm, driver); err != nil {
		notStarted(fmt.Errorf("power on: %w", err))
		return
	}
	var vmi *kubevirtv1.VirtualMachineInstance
	select {
	case vmi = <-boot:
	case <-time.After(bootTimeout):
		fail(errors.New("the machine did not boot from the network"))
		return
	case <-ctx.Done():
		return
	}
	if system := s.l.RedfishSystem(ctx, vm); system != nil {
		boot, _ := system["Boot"].(map[string]any)
		s.mu.Lock()
		s.consumed[vm] = boot["BootSourceOverrideEnabled"] == "Disabled"
		s.mu.Unlock()
	}
	if !s.l.MaaS.SkipsBMCConfig(systemID) {
		config, err := s.runBMCConfig(ctx, vmi)
		if err != nil {
			fail(err)
			return
		}
		if config != nil {
			if err := s.l.MaaS.StoreBMCConfig(systemID, config); err != nil {
				s.l.logf("commissioning scripts of %s: %v", systemID, err)
			}
		}
	}
	if err := driver.PowerOff(ctx); err != nil {
		fail(fmt.Errorf("power off: %w", err))
		return
	}
	s.l.MaaS.Update(systemID, func(m *maastest.Machine) { m.Status = maastest.StatusReady })
	s.l.progress.record(vm, StepReady, "system_id "+systemID)
}

// powerOn is the driver's power-on, unless FailPowerOn asked this one to
// fail.
func (s *maasSim) powerOn(ctx context.Context, vm maas.VMRef, driver powerDriver) error {
	s.mu.Lock()
	faulted := s.powerOnFaults[vm] > 0
	if faulted {
		s.powerOnFaults[vm]--
	}
	s.mu.Unlock()
	if faulted {
		return errors.New("the BMC did not answer (FailPowerOn)")
	}
	return driver.PowerOn(ctx)
}

// FailPowerOn makes the next n commissioning power-ons of the VM fail, as
// when its BMC cannot be reached.
func (l *Lab) FailPowerOn(vm maas.VMRef, n int) {
	l.sim.mu.Lock()
	defer l.sim.mu.Unlock()
	l.sim.powerOnFaults[vm] = n
}

// CommissioningStartFailures is how many commissionings of the machine
// could not power it on, and so returned it to its previous status.
func (l *Lab) CommissioningStartFailures(systemID string) int {
	l.sim.mu.Lock()
	defer l.sim.mu.Unlock()
	return l.sim.startFailures[systemID]
}

// powerDriver is the part of a MaaS power driver commissioning uses.
type powerDriver interface {
	PowerOn(ctx context.Context) error // with a PXE boot once
	PowerOff(ctx context.Context) error
}

// driverFor picks IPMI for a VM whose BMC serves it, else Redfish, with
// the machine's power parameters.
func (s *maasSim) driverFor(ctx context.Context, m maastest.Machine, vm maas.VMRef) (powerDriver, error) {
	params := m.PowerParameters
	var bmc v1beta1.VirtualMachineBMC
	if err := s.l.Client.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name}, &bmc); err == nil && bmc.Status.IPMIAddress != "" {
		return &ipmiDriver{
			address:  func() (string, bool) { return s.l.bmcs.ipmiAddress(vm) },
			username: params["power_user"], password: params["power_pass"],
			dir: filepath.Join(s.l.dir, "maas"),
		}, nil
	}
	if m.PowerType != maas.PowerTypeRedfish {
		return nil, fmt.Errorf("power type %q: the lab's MaaS drives redfish and ipmi", m.PowerType)
	}
	return newRedfishDriver(params["power_address"], params["power_user"], params["power_pass"], params["node_id"], s.l.bmcs.dial), nil
}

// OnceConsumed says whether the VM's BMC showed no boot override left right
// after the commissioning's PXE boot: the Once override MaaS set was used
// by that boot. (MaaS's redfish power_off sets Once/Pxe again for the next
// power-on; its IPMI power-off does not.)
func (l *Lab) OnceConsumed(vm maas.VMRef) bool {
	l.sim.mu.Lock()
	defer l.sim.mu.Unlock()
	return l.sim.consumed[vm]
}
