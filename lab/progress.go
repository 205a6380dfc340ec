package lab

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

// Step is one step of a VM's way to a Ready MaaS machine.
type Step int

// The steps, in the order the flow takes them.
const (
	StepVMCreated     Step = iota // the VM exists
	StepIdentity                  // it has its MAC and SMBIOS serial
	StepBMCReady                  // its bmc-server answers
	StepPXEBoot                   // it booted from the network
	StepEnlisted                  // MaaS enlisted it as New
	StepPowerConfig               // the commissioning script set its power config
	StepNamed                     // the reconciler named and pooled it
	StepCommissioning             // MaaS commissions it
	StepReady                     // MaaS marked it Ready
)

var stepNames = []string{
	"VM created", "MAC and serial", "BMC ready", "PXE boot", "enlisted", "power config",
	"renamed/pooled", "commissioning", "Ready",
}

func (s Step) String() string { return stepNames[s] }

// Steps are all the steps, in order.
func Steps() []Step {
	steps := make([]Step, len(stepNames))
	for i := range steps {
		steps[i] = Step(i)
	}
	return steps
}

// Event is a VM reaching a step, told once per VM and step.
type Event struct {
	VM     maas.VMRef
	Step   Step
	At     time.Time
	Detail string
}

// progress records when each VM reached each step.
type progress struct {
	onEvent func(Event)
	mu      sync.Mutex
	events  map[maas.VMRef]map[Step]Event
}

func newProgress(onEvent func(Event)) *progress {
	return &progress{onEvent: onEvent, events: map[maas.VMRef]map[Step]Event{}}
}

func (p *progress) record(vm maas.VMRef, step Step, detail string) {
	p.mu.Lock()
	steps := p.events[vm]
	if steps == nil {
		steps = map[Step]Event{}
		p.events[vm] = steps
	}
	if _, seen := steps[step]; seen {
		p.mu.Unlock()
		return
	}
	e := Event{VM: vm, Step: step, At: time.Now(), Detail: detail}
	steps[step] = e
	p.mu.Unlock()
	if p.onEvent != nil {
		p.onEvent(e)
	}
}

// seen says whether vm has reached step.
func (p *progress) seen(vm maas.VMRef, step Step) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.events[vm][step]
	return ok
}

// Timeline is when the VM reached each step so far, in step order.
func (l *Lab) Timeline(vm maas.VMRef) []Event {
	l.progress.mu.Lock()
	defer l.progress.mu.Unlock()
	var out []Event
	for _, e := range l.progress.events[vm] {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Event) int { return int(a.Step - b.Step) })
	return out
}

// TimeToReady is how long the VM took from creation to Ready; ok is false
// until it is Ready.
func (l *Lab) TimeToReady(vm maas.VMRef) (time.Duration, bool) {
	l.progress.mu.Lock()
	defer l.progress.mu.Unlock()
	created, ok1 := l.progress.events[vm][StepVMCreated]
	ready, ok2 := l.progress.events[vm][StepReady]
	return ready.At.Sub(created.At), ok1 && ok2
}

// watchProgress notices the steps nobody in the lab performs itself: the
// controller stamping the identity and the reconciler naming the machine.
func (l *Lab) watchProgress(ctx context.Context) {
	for {
		var vms kubevirtv1.VirtualMachineList
		if err := l.watched.List(ctx, &vms); err == nil {
			for _, vm := range vms.Items {
				ref := maas.VMRef{Namespace: vm.Namespace, Name: vm.Name}
				// CreateVM records the creation after the API server has
				// answered; a VM seen before that waits for the next poll.
				if !l.progress.seen(ref, StepVMCreated) {
					continue
				}
				if mac, serial, proof := identity(&vm); mac != "" && serial != "" && proof {
					l.progress.record(ref, StepIdentity, fmt.Sprintf("MAC %s, serial %s, a machine proof", mac, serial))
				}
			}
		}
		for _, m := range l.MaaS.Machines() {
			l.noticeNamed(m)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// identity is the VM's first MAC and its SMBIOS serial, as stamped, and
// whether it has a machine proof (never the proof: it is a secret).
func identity(vm *kubevirtv1.VirtualMachine) (mac, serial string, proof bool) {
	spec := vm.Spec.Template.Spec.Domain
	if len(spec.Devices.Interfaces) > 0 {
		mac = spec.Devices.Interfaces[0].MacAddress
	}
	if spec.Firmware != nil {
		serial = spec.Firmware.Serial
	}
	proof = spec.Chassis != nil && bmcspec.IsMachineProof(spec.Chassis.Asset)
	return mac, serial, proof
}

func (l *Lab) logf(format string, args ...any) {
	line := fmt.Sprintf("lab: "+format, args...)
	if l.opts.Logs != nil {
		fmt.Fprintln(l.opts.Logs, line)
	}
	l.recent.add(line)
}

// recentLines keeps the lab's last messages, so that a test that waited in
// vain can say what went wrong without a log of the whole run.
type recentLines struct {
	mu    sync.Mutex
	lines []string
}

const recentLinesKept = 20

func (r *recentLines) add(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.lines) == recentLinesKept {
		r.lines = slices.Delete(r.lines, 0, 1)
	}
	r.lines = append(r.lines, line)
}

func (r *recentLines) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.lines)
}

// noticeNamed records the step once the machine has its VM's name and pool.
func (l *Lab) noticeNamed(m maassim.Machine) {
	ref, ok := maas.ParseBMCAddress(m.PowerParameters["power_address"], l.Domain)
	if ok && m.Hostname == maas.Hostname(ref) && m.Pool == ref.Namespace && m.Pool != maassim.DefaultPool {
		l.progress.record(ref, StepNamed, fmt.Sprintf("%s in pool %s", m.Hostname, m.Pool))
	}
}
