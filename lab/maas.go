package lab

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/conformance/maasdriver"
	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
	"github.com/virtmetal/virtmetal/sim/node"
)

// powerTimeout is how long MaaS's Redfish driver waits for a power change,
// and powerPoll how often it reads the power state meanwhile. MaaS reads
// it 3 s after the change first; the lab reads every second, so that its
// figures are not MaaS's schedule, without a TLS handshake every 100 ms per
// machine loading the machine it measures.
const (
	powerTimeout = 2 * time.Minute
	powerPoll    = time.Second
)

// rackSteps are the lab's steps for the rack's; the rest are not the
// lab's.
var rackSteps = map[maassim.RackStep]Step{
	maassim.RackPXEBoot:       StepPXEBoot,
	maassim.RackEnlisted:      StepEnlisted,
	maassim.RackPowerConfig:   StepPowerConfig,
	maassim.RackCommissioning: StepCommissioning,
	maassim.RackReady:         StepReady,
}

// onceConsumed says, per VM, whether the BMC showed the Once override gone
// once the commissioning's PXE boot happened.
type onceConsumed struct {
	mu sync.Mutex
	vm map[maas.VMRef]bool
}

// newRack is the MaaS rack of the lab's machines, running the commissioning
// script of deploy/maas. Machines whose BMC serves IPMI are powered through
// IPMI with freeipmi, the others through Redfish.
func (l *Lab) newRack() (*maassim.Rack, error) {
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
	return maassim.NewRack(maassim.RackOptions{
		Region: l.MaaS, Domain: l.Domain, Script: script, Dir: dir,
		Driver: l.driverFor, Tell: l.rackStep, Logf: l.logf,
	}), nil
}

// rackStep records the rack's steps as the VM's.
func (l *Lab) rackStep(e maassim.RackEvent) {
	switch e.Step {
	case maassim.RackCommissioning:
		// Named before commissioned, whether or not watchProgress saw it.
		if m, ok := l.MaaS.Machine(e.SystemID); ok {
			l.noticeNamed(m)
		}
	case maassim.RackCommissioningBoot:
		if system := l.RedfishSystem(l.ctx, e.VM); system != nil {
			boot, _ := system["Boot"].(map[string]any)
			l.consumed.mu.Lock()
			l.consumed.vm[e.VM] = boot["BootSourceOverrideEnabled"] == "Disabled"
			l.consumed.mu.Unlock()
		}
	}
	if step, ok := rackSteps[e.Step]; ok {
		l.progress.record(e.VM, step, e.Detail)
	}
}

// driverFor picks IPMI for a VM whose BMC serves it, else Redfish, with
// the machine's power parameters.
func (l *Lab) driverFor(ctx context.Context, m maassim.Machine, vm maas.VMRef) (maassim.PowerDriver, error) {
	params := m.PowerParameters
	var bmc v1beta1.VirtualMachineBMC
	if err := l.Client.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name}, &bmc); err == nil && bmc.Status.IPMIAddress != "" {
		return &maasdriver.IPMIDriver{
			Address:  func() (string, bool) { return l.node.IPMIAddress(vm) },
			Username: params["power_user"], Password: params["power_pass"],
			Dir: filepath.Join(l.dir, "maas"),
		}, nil
	}
	if m.PowerType != maas.PowerTypeRedfish {
		return nil, fmt.Errorf("power type %q: the lab's MaaS drives redfish and ipmi", m.PowerType)
	}
	return newRedfishDriver(params["power_address"], params["power_user"], params["power_pass"], params["node_id"], l.node.Dial), nil
}

// newRedfishDriver is MaaS's Redfish power driver for a machine's power
// parameters, reaching BMC host names through dial.
func newRedfishDriver(address, username, password, nodeID string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *maasdriver.RedfishDriver {
	return &maasdriver.RedfishDriver{
		Address: address, Username: username, Password: password, NodeID: nodeID,
		Dial: dial, PowerTimeout: powerTimeout, PollInterval: powerPoll,
	}
}

// FailPowerOn makes the next n commissioning power-ons of the VM fail, as
// when its BMC cannot be reached.
func (l *Lab) FailPowerOn(vm maas.VMRef, n int) { l.rack.FailPowerOn(vm, n) }

// CommissioningStartFailures is how many commissionings of the machine
// could not power it on, and so returned it to its previous status.
func (l *Lab) CommissioningStartFailures(systemID string) int {
	return l.rack.StartFailures(systemID)
}

// OnceConsumed says whether the VM's BMC showed no boot override left right
// after the commissioning's PXE boot: the Once override MaaS set was used
// by that boot. (MaaS's redfish power_off sets Once/Pxe again for the next
// power-on; its IPMI power-off does not.)
func (l *Lab) OnceConsumed(vm maas.VMRef) bool {
	l.consumed.mu.Lock()
	defer l.consumed.mu.Unlock()
	return l.consumed.vm[vm]
}

// BMC is what a user needs to reach one VM's BMC in the lab.
type BMC = node.BMC

// BMCs lists the BMCs of the VMs whose Ingress leads to a process.
func (l *Lab) BMCs() []BMC { return l.node.BMCs() }

// KillBMC kills the bmc-server process serving the VM (the VMs it shares
// it with lose it too), as a crash would; the lab starts it again as its
// Deployment would. It reports whether one ran.
func (l *Lab) KillBMC(vm maas.VMRef) bool { return l.node.Kill(vm) }

// RedfishSystem reads the VM's ComputerSystem through its BMC, by its host
// name, with its credentials; nil when it cannot.
func (l *Lab) RedfishSystem(ctx context.Context, vm maas.VMRef) map[string]any {
	for _, b := range l.BMCs() {
		if b.VM != vm || !b.Ready {
			continue
		}
		d := newRedfishDriver("https://"+b.Host, b.Username, b.Password, vm.Name, l.node.Dial)
		system, _, err := d.Request(ctx, "GET", maasdriver.SystemURI(vm.Name), "", "")
		if err != nil {
			l.logf("reading the system of %s: %v", vm, err)
			return nil
		}
		return system
	}
	return nil
}
