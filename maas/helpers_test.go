package maas_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/internal/bmcspec"

	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

const testDomain = "bmc.example.org"

// macOf and uuidOf are a VM's hardware identity in these tests: its one
// interface MAC and its SMBIOS UUID, as the controller would set them.
func macOf(vm maas.VMRef) string {
	sum := sha256.Sum256([]byte(vm.String()))
	return fmt.Sprintf("02:00:%02x:%02x:%02x:%02x", sum[0], sum[1], sum[2], sum[3])
}

func uuidOf(vm maas.VMRef) string {
	sum := sha256.Sum256([]byte("uuid " + vm.String()))
	return fmt.Sprintf("%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
}

// proofOf is a VM's machine proof in these tests: random in the
// controller, here fixed per VM so a test can tell whose a machine carries.
func proofOf(vm maas.VMRef) string {
	sum := sha256.Sum256([]byte("proof " + vm.String()))
	return fmt.Sprintf("vmp1-%x", sum[:16])
}

// proofReport is the commissioning set MaaS stores when the bmc-config
// script ran on a guest reporting proof.
func proofReport(proof string) []maassim.ScriptResult {
	return []maassim.ScriptResult{{Name: maas.BMCConfigScript, Status: maassim.ScriptPassed,
		Stdout: "INFO: Redfish BMC configured\n" + bmcspec.ProofReportKey + ": " + proof + "\n"}}
}

// ours is a machine as it looks right after enlistment of the VM with the
// virtmetal commissioning script: Redfish, our address, placeholder
// credentials,
// the VM's MAC and UUID, and the VM's proof in its stored commissioning
// output.
func ours(systemID string, vm maas.VMRef, status int) maassim.Machine {
	return maassim.Machine{
		SystemID:      systemID,
		Hostname:      "enlisted-" + systemID,
		Status:        status,
		PowerType:     maas.PowerTypeRedfish,
		HardwareUUID:  uuidOf(vm),
		MACs:          []string{macOf(vm)},
		Commissioning: proofReport(proofOf(vm)),
		PowerParameters: map[string]string{
			maas.PowerAddress: maas.BMCAddress(vm, testDomain),
			maas.PowerUser:    maas.PlaceholderUser,
			maas.PowerPass:    "placeholder-" + systemID,
			maas.PowerNodeID:  vm.Name,
		},
	}
}

// fakeCluster is an in-memory Cluster that can be told to fail.
type fakeCluster struct {
	mu        sync.Mutex
	vms       map[maas.VMRef]*maas.EnrolledVM // enrolled VMs, Reported unset
	statuses  map[maas.VMRef]maas.MachineStatus
	instances map[maas.VMRef][]string
	events    []fakeEvent

	enrolledErr  error            // returned by Enrolled when set
	instancesErr error            // returned by InstanceMACs when set
	reportErr    map[string]error // returned by ReportStatus, by namespace

	enrolledCalls, instanceCalls, reportCalls int
}

type fakeEvent struct {
	vm                      maas.VMRef
	eventType, reason, text string
}

func newFakeCluster() *fakeCluster {
	return &fakeCluster{
		vms: map[maas.VMRef]*maas.EnrolledVM{}, statuses: map[maas.VMRef]maas.MachineStatus{},
		instances: map[maas.VMRef][]string{}, reportErr: map[string]error{},
	}
}

// withVM enrolls a VM with its MAC and UUID and, when password is not
// empty, its credentials Secret.
func (f *fakeCluster) withVM(vm maas.VMRef, password string) *fakeCluster {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := &maas.EnrolledVM{VM: vm, VMFound: true, MACs: []string{macOf(vm)}, FirmwareUUID: uuidOf(vm), Proof: proofOf(vm)}
	if password != "" {
		e.Credentials = maas.Credentials{Username: "admin", Password: password}
	} else {
		e.CredentialsErr = fmt.Errorf("credentials Secret %s/%s-bmc: %w", vm.Namespace, vm.Name, maas.ErrNotFound)
	}
	f.vms[vm] = e
	return f
}

// edit changes an enrolled VM.
func (f *fakeCluster) edit(vm maas.VMRef, change func(*maas.EnrolledVM)) *fakeCluster {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(f.vms[vm])
	return f
}

func (f *fakeCluster) Enrolled(context.Context) (map[maas.VMRef]*maas.EnrolledVM, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.enrolledCalls++
	if f.enrolledErr != nil {
		return nil, f.enrolledErr
	}
	out := map[maas.VMRef]*maas.EnrolledVM{}
	for ref, vm := range f.vms {
		c := *vm
		c.MACs = slices.Clone(vm.MACs)
		c.Reported = copyStatus(f.statuses[ref])
		out[ref] = &c
	}
	return out, nil
}

func (f *fakeCluster) InstanceMACs(context.Context) (map[maas.VMRef][]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.instanceCalls++
	if f.instancesErr != nil {
		return nil, f.instancesErr
	}
	return maps.Clone(f.instances), nil
}

func (f *fakeCluster) ReportStatus(_ context.Context, vm maas.VMRef, status maas.MachineStatus) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reportCalls++
	if err := f.reportErr[vm.Namespace]; err != nil {
		return err
	}
	if _, ok := f.vms[vm]; !ok {
		return fmt.Errorf("VirtualMachineBMC %s: %w", vm, maas.ErrNotFound)
	}
	f.statuses[vm] = copyStatus(status)
	return nil
}

func (f *fakeCluster) RecordEvent(_ context.Context, vm *maas.EnrolledVM, eventType, reason, message string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, fakeEvent{vm: vm.VM, eventType: eventType, reason: reason, text: message})
	return nil
}

func copyStatus(s maas.MachineStatus) maas.MachineStatus {
	return maas.MachineStatus{MaaS: s.MaaS.DeepCopy(), Condition: s.Condition.DeepCopy()}
}

// status is what the VM's VirtualMachineBMC status shows; the zero
// MaaSStatus and Condition when unset.
func (f *fakeCluster) status(vm maas.VMRef) (v1beta1.MaaSStatus, metav1.Condition) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.statuses[vm]
	var m v1beta1.MaaSStatus
	var c metav1.Condition
	if s.MaaS != nil {
		m = *s.MaaS
	}
	if s.Condition != nil {
		c = *s.Condition
	}
	return m, c
}

func (f *fakeCluster) eventsOf(vm maas.VMRef) []fakeEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []fakeEvent
	for _, e := range f.events {
		if e.vm == vm {
			out = append(out, e)
		}
	}
	return out
}

func (f *fakeCluster) setPassword(vm maas.VMRef, password string) {
	f.edit(vm, func(e *maas.EnrolledVM) {
		e.Credentials, e.CredentialsErr = maas.Credentials{Username: "admin", Password: password}, nil
	})
}

func newReconciler(t testing.TB, s *maassim.Server, c maas.Cluster) *maas.Reconciler {
	return &maas.Reconciler{MaaS: s.Client(t), Cluster: c, Domain: testDomain, Out: io.Discard, Log: logr.Discard()}
}

// writes counts the requests that change MaaS.
func writes(s *maassim.Server) int {
	n := 0
	for _, r := range s.Requests() {
		if r.Method != "GET" {
			n++
		}
	}
	return n
}

// commissions counts the commission requests MaaS carried out.
func commissions(s *maassim.Server, systemID string) int {
	n := 0
	for _, r := range s.Requests() {
		if r.Op == "commission" && r.Path == "machines/"+systemID+"/" && r.Applied {
			n++
		}
	}
	return n
}
