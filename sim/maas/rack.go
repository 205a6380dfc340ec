package maas

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/yaml"

	maasclient "github.com/virtmetal/virtmetal/maas"
	"github.com/virtmetal/virtmetal/sim/guest"
)

// bootTimeout is how long the rack waits for a commissioning's network
// boot, as MaaS does.
const bootTimeout = 2 * time.Minute

// PowerDriver is the part of a MaaS power driver commissioning uses.
type PowerDriver interface {
	PowerOn(ctx context.Context) error // with a PXE boot once
	PowerOff(ctx context.Context) error
}

// RackStep is a step of a machine's way through the rack, told to
// RackOptions.Tell.
type RackStep int

// The steps, in the order a machine takes them.
const (
	// RackPXEBoot: a guest booted from the network (every boot).
	RackPXEBoot RackStep = iota
	// RackEnlisted: an unknown guest was enlisted as New.
	RackEnlisted
	// RackPowerConfig: the enlistment's bmc-config script set its power
	// configuration.
	RackPowerConfig
	// RackCommissioning: the region accepted a commissioning, and the rack
	// takes it.
	RackCommissioning
	// RackCommissioningBoot: the commissioning's network boot happened;
	// the scripts run next.
	RackCommissioningBoot
	// RackReady: the commissioning ended, the machine is Ready.
	RackReady
)

// RackEvent is a machine reaching a step.
type RackEvent struct {
	VM       maasclient.VMRef
	Step     RackStep
	SystemID string // "" before enlistment
	Detail   string
}

// RackOptions are what a rack needs from its surroundings.
type RackOptions struct {
	// Region is the region API the rack enlists into and takes
	// commissionings from.
	Region *Server
	// Domain is the BMC domain: a machine's power address names its VM.
	Domain string
	// Script is the bmc-config commissioning script, run with python3.
	Script string
	// Dir is a folder for the script's runs.
	Dir string
	// Driver is the power driver for a machine, by its power parameters.
	Driver func(ctx context.Context, m Machine, vm maasclient.VMRef) (PowerDriver, error)
	// Tell is told every step, synchronously; nil: not told.
	Tell func(RackEvent)
	// Logf tells what went wrong; nil drops it.
	Logf func(format string, args ...any)
}

// Rack is MaaS toward the machines (the API side is Server): it answers
// each network boot (NetworkBoot), enlisting unknown guests as New with
// their MACs and firmware UUID and running the bmc-config commissioning
// script, the real one, in their enlistment; and when the region accepts a
// commissioning (after Start) it powers the machine on with a PXE boot
// through its power driver, waits for that boot, runs the scripts, powers
// the machine off and marks it Ready.
type Rack struct {
	opts RackOptions

	mu      sync.Mutex
	waiting map[string]chan guest.NetBoot // system_id → its commissioning's boot
	enlist  sync.Mutex                    // one enlistment at a time, so a MAC enlists once
	// oldScript are the VMs enlisted with the address form of the
	// commissioning script's earlier versions (UseOldScriptAddress).
	oldScript map[maasclient.VMRef]bool
	// powerOnFaults is how many of each VM's next commissioning power-ons
	// fail (FailPowerOn); startFailures counts, per system_id, the
	// commissionings that could not power their machine on.
	powerOnFaults map[maasclient.VMRef]int
	startFailures map[string]int

	python     sync.Once
	pythonPath string // the interpreter python3 resolves to
	pythonErr  error
}

// NewRack makes a rack; Start connects it to the region's commissionings.
func NewRack(opts RackOptions) *Rack {
	return &Rack{opts: opts, waiting: map[string]chan guest.NetBoot{}, oldScript: map[maasclient.VMRef]bool{},
		powerOnFaults: map[maasclient.VMRef]int{}, startFailures: map[string]int{}}
}

// Start makes the rack take every commissioning the region accepts from
// now on; they run until ctx ends.
func (s *Rack) Start(ctx context.Context) {
	s.opts.Region.OnCommission(func(systemID string) { s.commissioned(ctx, systemID) })
}

func (s *Rack) tell(vm maasclient.VMRef, step RackStep, systemID, detail string) {
	if s.opts.Tell != nil {
		s.opts.Tell(RackEvent{VM: vm, Step: step, SystemID: systemID, Detail: detail})
	}
}

func (s *Rack) logf(format string, args ...any) {
	if s.opts.Logf != nil {
		s.opts.Logf(format, args...)
	}
}

// UseOldScriptAddress makes the VM's enlistment store its power address as
// the commissioning script before issue 23 wrote it: with https://.
func (s *Rack) UseOldScriptAddress(vm maasclient.VMRef) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.oldScript[vm] = true
}

func macsOf(b guest.NetBoot) []string {
	var macs []string
	for _, mac := range b.MACs {
		if mac := maasclient.NormalizeMAC(mac); mac != "" {
			macs = append(macs, mac)
		}
	}
	return macs
}

// NetworkBoot is MaaS answering a network boot: an unknown machine
// enlists, a commissioning one boots its ephemeral environment, others
// boot locally. It returns once the enlistment, if any, is done.
func (s *Rack) NetworkBoot(ctx context.Context, b guest.NetBoot) {
	vm := maasclient.VMRef{Namespace: b.Namespace, Name: b.Name}
	macs := macsOf(b)
	s.tell(vm, RackPXEBoot, "", fmt.Sprintf("from %v", macs))
	s.enlist.Lock()
	known := s.machineByMAC(macs)
	if known == nil {
		err := s.enlistMachine(ctx, vm, b, macs)
		s.enlist.Unlock()
		if err != nil {
			s.logf("enlisting %s: %v", vm, err)
		}
		return
	}
	s.enlist.Unlock()
	s.mu.Lock()
	boot := s.waiting[known.SystemID]
	s.mu.Unlock()
	if boot != nil && known.Status == StatusCommissioning {
		select {
		case boot <- b:
		default:
		}
	}
}

func (s *Rack) machineByMAC(macs []string) *Machine {
	for _, m := range s.opts.Region.Machines() {
		for _, mac := range m.MACs {
			for _, want := range macs {
				if maasclient.NormalizeMAC(mac) == want {
					return &m
				}
			}
		}
	}
	return nil
}

// enlistMachine is MaaS's enlistment runner in the guest's ephemeral
// environment (docs/maas-region.md, "Enlistment by MaaS's own runner"):
// it runs the bmc-config script first if the region's enlistment runs it
// (by its tags and enlist_commissioning), before the machine exists;
// creates the machine anonymously with commission=true and the power
// settings the script wrote (without them when the region refuses them,
// and then the script's result fails); posts the results and the
// inventory's hardware UUID with the node's token; and signals the end:
// the machine is New again, its enlistment's set current.
func (s *Rack) enlistMachine(ctx context.Context, vm maasclient.VMRef, b guest.NetBoot, macs []string) error {
	if len(macs) == 0 {
		return errors.New("it booted from the network without a MAC")
	}
	var config map[string]string
	var results []ScriptResult
	var scriptErr error
	if s.opts.Region.RunsAtEnlistment(s.scriptTags()) {
		var result ScriptResult
		config, result, scriptErr = s.runBMCConfig(ctx, b)
		results = append(results, result)
	}
	s.mu.Lock()
	old := s.oldScript[vm]
	s.mu.Unlock()
	if config != nil && old {
		config["power_address"] = "https://" + config["power_address"]
	}
	form := url.Values{"architecture": {"amd64/generic"}, "mac_addresses": macs, "commission": {"true"}}
	if config != nil {
		params := maps.Clone(config)
		delete(params, "power_type")
		raw, err := json.Marshal(params)
		if err != nil {
			return err
		}
		form.Set("power_type", config["power_type"])
		form.Set("power_parameters", string(raw))
	}
	id, err := s.opts.Region.EnlistAnonymously(form)
	if apiErr, refused := errors.AsType[*maasclient.APIError](err); refused && config != nil {
		// The runner enlists without the power settings the region
		// refused, and fails the script that wrote them.
		form.Del("power_type")
		form.Del("power_parameters")
		id, err = s.opts.Region.EnlistAnonymously(form)
		results[0].Status, results[0].ExitStatus = ScriptFailed, 1
		results[0].Stderr += fmt.Sprintf("\n\nError: Unable to send BMC config to MAAS - HTTP Error %d", apiErr.StatusCode)
		scriptErr, config = fmt.Errorf("the region refused its BMC config: %w", apiErr), nil
	}
	if err != nil {
		return err
	}
	s.tell(vm, RackEnlisted, id, fmt.Sprintf("system_id %s, MAC %s, UUID %s", id, macs[0], b.UUID))
	if config != nil {
		s.tell(vm, RackPowerConfig, id, fmt.Sprintf("%s %s node_id %s", config["power_type"], config["power_address"], config["node_id"]))
	}
	if err := s.opts.Region.Signal(id, NodeSignal{Status: SignalWorking, Results: results, HardwareUUID: b.UUID}); err != nil {
		return err
	}
	end := SignalOK
	if scriptErr != nil {
		end = SignalFailed
		s.logf("enlistment scripts of %s: %v", id, scriptErr)
	}
	return s.opts.Region.Signal(id, NodeSignal{Status: end})
}

// scriptTags are the tags in the commissioning script's embedded MaaS
// metadata, as the region reads them when the script is uploaded.
func (s *Rack) scriptTags() []string {
	source, err := os.ReadFile(s.opts.Script)
	if err != nil {
		return nil
	}
	var tags []string
	for line := range strings.Lines(string(source)) {
		if value, ok := strings.CutPrefix(strings.TrimSpace(line), "# tags:"); ok {
			for tag := range strings.SplitSeq(value, ",") {
				tags = append(tags, strings.TrimSpace(tag))
			}
		}
	}
	return tags
}

// petname is a hostname like the ones MaaS makes up at enlistment.
func petname() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return "enlisted-" + hex.EncodeToString(b)
}

// runBMCConfig runs the real commissioning script as MaaS does, on the
// guest's "hardware": its dmidecode tells the guest's SMBIOS. It returns
// the configuration the script wrote (nil when it wrote none) and its
// result as MaaS stores it: stdout and stderr apart.
func (s *Rack) runBMCConfig(ctx context.Context, b guest.NetBoot) (map[string]string, ScriptResult, error) {
	result := ScriptResult{Name: maasclient.BMCConfigScript, Status: ScriptFailed}
	dir, err := os.MkdirTemp(s.opts.Dir, "run-")
	if err != nil {
		return nil, result, err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "dmidecode"), []byte(b.Dmidecode()), 0o700); err != nil {
		return nil, result, err
	}
	configPath := filepath.Join(dir, "bmc-config.yaml")
	ctx, cancel := context.WithTimeout(ctx, time.Minute) // the script's own timeout
	defer cancel()
	python, err := s.interpreter()
	if err != nil {
		return nil, result, err
	}
	cmd := exec.CommandContext(ctx, python, s.opts.Script)
	cmd.Env = []string{
		"PATH=" + dir + string(os.PathListSeparator) + os.Getenv("PATH"),
		"BMC_CONFIG_PATH=" + configPath,
		"RESULT_PATH=" + filepath.Join(dir, "result.yaml"),
	}
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	result.Stdout, result.Stderr, result.ExitStatus = stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
	if err != nil {
		// stderr only: stdout may hold the machine proof, a secret.
		return nil, result, fmt.Errorf("%s: %w: %s", filepath.Base(s.opts.Script), err, result.Stderr)
	}
	result.Status = ScriptPassed
	data, err := os.ReadFile(configPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, result, nil
	}
	if err != nil {
		return nil, result, err
	}
	config := map[string]string{}
	if err := yaml.Unmarshal(data, &config); err != nil {
		return nil, result, fmt.Errorf("BMC_CONFIG_PATH: %w", err)
	}
	return config, result, nil
}

// systemPython is where Debian and Ubuntu, MaaS's ephemeral environment
// among them, install their python3.
const systemPython = "/usr/bin/python3"

// interpreter is the python3 the script runs with, found once: the
// system's, as in MaaS's ephemeral environment, else the executable that
// python3 on PATH runs. Not a version manager's shim: it and its python's
// site packages cost several times the script's own run, enough to slow
// what the lab measures.
func (s *Rack) interpreter() (string, error) {
	s.python.Do(func() {
		if _, err := os.Stat(systemPython); err == nil {
			s.pythonPath = systemPython
			return
		}
		out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
		s.pythonPath = strings.TrimSpace(string(out))
		switch {
		case err != nil:
			s.pythonErr = fmt.Errorf("python3: %w", err)
		case s.pythonPath == "":
			s.pythonErr = errors.New("python3 does not tell its executable")
		}
	})
	return s.pythonPath, s.pythonErr
}

// commissioned is told by the region of each accepted commissioning.
func (s *Rack) commissioned(ctx context.Context, systemID string) {
	m, ok := s.opts.Region.Machine(systemID)
	if !ok {
		return
	}
	vm, _ := maasclient.ParseBMCAddress(m.PowerParameters["power_address"], s.opts.Domain)
	s.tell(vm, RackCommissioning, systemID, "system_id "+systemID+" as "+m.Hostname)
	boot := make(chan guest.NetBoot, 1)
	s.mu.Lock()
	s.waiting[systemID] = boot
	s.mu.Unlock()
	go s.commission(ctx, systemID, vm, boot)
}

// commission is MaaS's commissioning of one machine.
func (s *Rack) commission(ctx context.Context, systemID string, vm maasclient.VMRef, boot chan guest.NetBoot) {
	defer func() {
		s.mu.Lock()
		delete(s.waiting, systemID)
		s.mu.Unlock()
	}()
	fail := func(err error) {
		s.logf("commissioning %s (%s) failed: %v", systemID, vm, err)
		s.opts.Region.Update(systemID, func(m *Machine) { m.Status = StatusFailedCommissioning })
	}
	// MaaS does not fail a commissioning it could not start: when the
	// power-on fails, the machine goes back to its previous status (New,
	// for an enlisted machine), to be commissioned again.
	notStarted := func(err error) {
		s.logf("commissioning %s (%s) not started: %v", systemID, vm, err)
		s.mu.Lock()
		s.startFailures[systemID]++
		s.mu.Unlock()
		s.opts.Region.Update(systemID, func(m *Machine) { m.Status = m.PreviousStatus })
	}
	m, _ := s.opts.Region.Machine(systemID)
	driver, err := s.opts.Driver(ctx, m, vm)
	if err != nil {
		notStarted(err)
		return
	}
	if err := s.powerOn(ctx, vm, driver); err != nil {
		notStarted(fmt.Errorf("power on: %w", err))
		return
	}
	var b guest.NetBoot
	select {
	case b = <-boot:
	case <-time.After(bootTimeout):
		fail(errors.New("the machine did not boot from the network"))
		return
	case <-ctx.Done():
		return
	}
	s.tell(vm, RackCommissioningBoot, systemID, "")
	if !s.opts.Region.SkipsBMCConfig(systemID) {
		config, result, err := s.runBMCConfig(ctx, b)
		if err := s.opts.Region.Signal(systemID, NodeSignal{Status: SignalWorking, Results: []ScriptResult{result}}); err != nil {
			s.logf("commissioning scripts of %s: %v", systemID, err)
		}
		if err != nil {
			fail(err)
			return
		}
		if config != nil {
			if err := s.opts.Region.StoreBMCConfig(systemID, config); err != nil {
				s.logf("commissioning scripts of %s: %v", systemID, err)
			}
		}
	}
	if err := driver.PowerOff(ctx); err != nil {
		fail(fmt.Errorf("power off: %w", err))
		return
	}
	s.opts.Region.Update(systemID, func(m *Machine) { m.Status = StatusReady })
	s.tell(vm, RackReady, systemID, "system_id "+systemID)
}

// powerOn is the driver's power-on, unless FailPowerOn asked this one to
// fail.
func (s *Rack) powerOn(ctx context.Context, vm maasclient.VMRef, driver PowerDriver) error {
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
func (s *Rack) FailPowerOn(vm maasclient.VMRef, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.powerOnFaults[vm] = n
}

// StartFailures is how many commissionings of the machine could not power
// it on, and so returned it to its previous status.
func (s *Rack) StartFailures(systemID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.startFailures[systemID]
}
