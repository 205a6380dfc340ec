package maas_test

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"

	"github.com/go-logr/logr"

	"github.com/virtmetal/virtmetal/maas"
	"github.com/virtmetal/virtmetal/maas/maastest"
)

const testDomain = "bmc.example.org"

// ours is a machine as it looks right after enlistment with the virtmetal
// commissioning script: Redfish, our address, no credentials yet.
func ours(systemID string, vm maas.VMRef, status int) maastest.Machine {
	return maastest.Machine{
		SystemID:  systemID,
		Hostname:  "enlisted-" + systemID,
		Status:    status,
		PowerType: maas.PowerTypeRedfish,
		PowerParameters: map[string]string{
			maas.PowerAddress: maas.BMCAddress(vm, testDomain),
			maas.PowerUser:    "",
			maas.PowerPass:    "",
			maas.PowerNodeID:  vm.Name,
		},
	}
}

// fakeCluster is an in-memory Cluster that can be told to fail.
type fakeCluster struct {
	mu      sync.Mutex
	secrets map[maas.VMRef]maas.Credentials
	vms     map[maas.VMRef]map[string]string // annotations of existing VMs

	credentialsErr error // returned by every BMCCredentials when set
	reportErr      error // returned by every ReportMachine when set

	credentialsCalls, reportCalls int
}

func newFakeCluster() *fakeCluster {
	return &fakeCluster{secrets: map[maas.VMRef]maas.Credentials{}, vms: map[maas.VMRef]map[string]string{}}
}

// withVM adds a VM and, when password is not empty, its BMC Secret.
func (f *fakeCluster) withVM(vm maas.VMRef, password string) *fakeCluster {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.vms[vm] = map[string]string{}
	if password != "" {
		f.secrets[vm] = maas.Credentials{Username: "admin", Password: password}
	}
	return f
}

func (f *fakeCluster) BMCCredentials(_ context.Context, vm maas.VMRef) (maas.Credentials, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.credentialsCalls++
	if f.credentialsErr != nil {
		return maas.Credentials{}, f.credentialsErr
	}
	creds, ok := f.secrets[vm]
	if !ok {
		return maas.Credentials{}, fmt.Errorf("secret %s: %w", maas.BMCSecretName(vm.Name), maas.ErrNotFound)
	}
	return creds, nil
}

func (f *fakeCluster) ReportMachine(_ context.Context, vm maas.VMRef, systemID, status string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reportCalls++
	if f.reportErr != nil {
		return f.reportErr
	}
	annotations, ok := f.vms[vm]
	if !ok {
		return fmt.Errorf("vm %s: %w", vm, maas.ErrNotFound)
	}
	annotations[maas.AnnotationSystemID] = systemID
	annotations[maas.AnnotationStatus] = status
	return nil
}

func (f *fakeCluster) annotations(vm maas.VMRef) map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.vms[vm]
}

func (f *fakeCluster) setPassword(vm maas.VMRef, password string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.secrets[vm] = maas.Credentials{Username: "admin", Password: password}
}

func newReconciler(t testing.TB, s *maastest.Server, c maas.Cluster) *maas.Reconciler {
	return &maas.Reconciler{MaaS: s.Client(t), Cluster: c, Domain: testDomain, Out: io.Discard, Log: logr.Discard()}
}

// writes counts the requests that change MaaS.
func writes(s *maastest.Server) int {
	n := 0
	for _, r := range s.Requests() {
		if r.Method != "GET" {
			n++
		}
	}
	return n
}

// commissions counts the commission requests MaaS carried out.
func commissions(s *maastest.Server, systemID string) int {
	n := 0
	for _, r := range s.Requests() {
		if r.Op == "commission" && r.Path == "machines/"+systemID+"/" && r.Applied {
			n++
		}
	}
	return n
}
