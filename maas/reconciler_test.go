package maas_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

var (
	vmA = maas.VMRef{Namespace: "tenant-a", Name: "vm-0"}
	vmB = maas.VMRef{Namespace: "tenant-b", Name: "vm-0"} // same VM name, other namespace
)

// reconcile runs a cycle that must not fail as a whole.
func reconcile(t *testing.T, r *maas.Reconciler) maas.CycleResult {
	t.Helper()
	result, err := r.Reconcile(context.Background())
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	return result
}

// failures joins a cycle's machine failures, for errors.Is.
func failures(result maas.CycleResult) error {
	var errs []error
	for _, f := range result.Failures {
		errs = append(errs, f)
	}
	return errors.Join(errs...)
}

func TestNewMachineLifecycle(t *testing.T) {
	s := maassim.New(t).WithMachine(ours("m1", vmA, maassim.StatusNew))
	cluster := newFakeCluster().withVM(vmA, "s3cret")
	r := newReconciler(t, s, cluster)

	result := reconcile(t, r)
	if result.Machines != 1 || result.Managed != 1 {
		t.Fatalf("result = %+v", result)
	}
	m, _ := s.Machine("m1")
	if m.PowerParameters[maas.PowerUser] != "admin" || m.PowerParameters[maas.PowerPass] != "s3cret" {
		t.Errorf("credentials not set: %v", m.PowerParameters)
	}
	if m.Hostname != "vm-0-tenant-a" || m.Pool != "tenant-a" || m.Status != maassim.StatusCommissioning {
		t.Errorf("machine = hostname %q pool %q status %d", m.Hostname, m.Pool, m.Status)
	}
	if got := s.Pools(); !slices.Equal(got, []string{maassim.DefaultPool, "tenant-a"}) {
		t.Errorf("pools = %v", got)
	}
	var commission maassim.Request
	for _, req := range s.Requests() {
		if req.Op == "commission" {
			commission = req
		}
	}
	if commission.Form["skip_bmc_config"] != "1" {
		t.Errorf("commission form = %v, want skip_bmc_config=1 so the password survives", commission.Form)
	}
	if st, c := cluster.status(vmA); st.SystemID != "m1" || st.StatusName != "Commissioning" || st.Hostname != "vm-0-tenant-a" ||
		st.Pool != "tenant-a" || st.LastUpdateTime == nil || c.Status != metav1.ConditionTrue || c.Reason != maas.ReasonBound {
		t.Errorf("status = %+v, condition %+v", st, c)
	}
	if ev := cluster.eventsOf(vmA); len(ev) != 1 || ev[0].eventType != "Normal" || ev[0].reason != "MaaSMachineBound" {
		t.Errorf("events = %+v", ev)
	}

	s.Step()
	s.ResetRequests()
	reconcile(t, r)
	if st, _ := cluster.status(vmA); st.StatusName != "Ready" {
		t.Errorf("status after commissioning = %q, want Ready", st.StatusName)
	}
	if ev := cluster.eventsOf(vmA); len(ev) != 1 {
		t.Errorf("a status change that keeps the condition made an Event: %+v", ev)
	}
	if m, _ := s.Machine("m1"); m.PowerParameters[maas.PowerPass] != "s3cret" {
		t.Errorf("password lost by commissioning: %v", m.PowerParameters)
	}
	if writes(s) != 0 || commissions(s, "m1") != 0 {
		t.Errorf("a Ready machine was changed: %+v", s.Requests())
	}

	// Converged: a cycle costs the two list requests and nothing else.
	s.ResetRequests()
	cluster.reportCalls = 0
	reconcile(t, r)
	if got := len(s.Requests()); got != 2 {
		t.Errorf("idle cycle made %d requests, want 2: %+v", got, s.Requests())
	}
	if cluster.reportCalls != 0 {
		t.Errorf("idle cycle reported %d times to Kubernetes, want 0", cluster.reportCalls)
	}
}

func TestRules(t *testing.T) {
	withHostname := func(m maassim.Machine, hostname, pool string) maassim.Machine {
		m.Hostname, m.Pool = hostname, pool
		return m
	}
	dotted := maas.VMRef{Namespace: "ns", Name: "web.prod"}
	type want struct {
		hostname, pool, password string
		status                   int
	}
	tests := []struct {
		name     string
		machines []maassim.Machine
		pools    []string
		devices  []string
		vms      map[maas.VMRef]string // VM → Secret password ("" = no Secret)
		want     map[string]want       // system_id → final state
		writes   int                   // MaaS write requests in the cycle
	}{
		{
			name:     "New machine gets everything",
			machines: []maassim.Machine{ours("m1", vmA, maassim.StatusNew)},
			vms:      map[maas.VMRef]string{vmA: "pw"},
			want:     map[string]want{"m1": {"vm-0-tenant-a", "tenant-a", "pw", maassim.StatusCommissioning}},
			writes:   4, // pool, credentials, hostname+pool, commission
		},
		{
			name:     "existing pool is reused",
			machines: []maassim.Machine{ours("m1", vmA, maassim.StatusNew)},
			pools:    []string{"tenant-a"},
			vms:      map[maas.VMRef]string{vmA: "pw"},
			want:     map[string]want{"m1": {"vm-0-tenant-a", "tenant-a", "pw", maassim.StatusCommissioning}},
			writes:   3,
		},
		{
			name:     "same VM name in two namespaces",
			machines: []maassim.Machine{ours("m1", vmA, maassim.StatusNew), ours("m2", vmB, maassim.StatusNew)},
			vms:      map[maas.VMRef]string{vmA: "pa", vmB: "pb"},
			want: map[string]want{
				"m1": {"vm-0-tenant-a", "tenant-a", "pa", maassim.StatusCommissioning},
				"m2": {"vm-0-tenant-b", "tenant-b", "pb", maassim.StatusCommissioning},
			},
			writes: 8,
		},
		{
			name:     "dotted VM name",
			machines: []maassim.Machine{ours("m1", dotted, maassim.StatusNew)},
			vms:      map[maas.VMRef]string{dotted: "pw"},
			want:     map[string]want{"m1": {"web-prod-ns", "ns", "pw", maassim.StatusCommissioning}},
			writes:   4,
		},
		{
			name: "hostname held by another machine falls back to the hashed name",
			machines: []maassim.Machine{
				ours("m1", vmA, maassim.StatusNew),
				{SystemID: "other", Hostname: "vm-0-tenant-a", PowerType: "ipmi"},
			},
			vms:    map[maas.VMRef]string{vmA: "pw"},
			want:   map[string]want{"m1": {maas.HashedHostname(vmA), "tenant-a", "pw", maassim.StatusCommissioning}},
			writes: 4,
		},
		{
			name:     "hostname held by a device, which the machine list does not show",
			machines: []maassim.Machine{ours("m1", vmA, maassim.StatusNew)},
			devices:  []string{"vm-0-tenant-a"},
			vms:      map[maas.VMRef]string{vmA: "pw"},
			want:     map[string]want{"m1": {maas.HashedHostname(vmA), "tenant-a", "pw", maassim.StatusCommissioning}},
			writes:   5, // the refused PUT included
		},
		{
			name:     "New machine without Secret is named and pooled but not commissioned",
			machines: []maassim.Machine{ours("m1", vmA, maassim.StatusNew)},
			vms:      map[maas.VMRef]string{vmA: ""},
			want:     map[string]want{"m1": {"vm-0-tenant-a", "tenant-a", "placeholder-m1", maassim.StatusNew}},
			writes:   2,
		},
		{
			name:     "converged New machine is only commissioned",
			machines: []maassim.Machine{withPassword(withHostname(ours("m1", vmA, maassim.StatusNew), "vm-0-tenant-a", "tenant-a"), "pw")},
			pools:    []string{"tenant-a"},
			vms:      map[maas.VMRef]string{vmA: "pw"},
			want:     map[string]want{"m1": {"vm-0-tenant-a", "tenant-a", "pw", maassim.StatusCommissioning}},
			writes:   1,
		},
		{
			// MaaS commissions at enlistment by default: the machine is Ready
			// with a generated name before the reconciler first sees it.
			name:     "Ready machine is named, pooled and given credentials, not commissioned",
			machines: []maassim.Machine{withHostname(ours("m1", vmA, maassim.StatusReady), "able-cat", maassim.DefaultPool)},
			vms:      map[maas.VMRef]string{vmA: "pw"},
			want:     map[string]want{"m1": {"vm-0-tenant-a", "tenant-a", "pw", maassim.StatusReady}},
			writes:   3,
		},
		{
			name:     "Ready machine whose VM has no BMC Secret keeps its name and pool",
			machines: []maassim.Machine{withHostname(ours("m1", vmA, maassim.StatusReady), "able-cat", maassim.DefaultPool)},
			vms:      map[maas.VMRef]string{vmA: ""},
			want:     map[string]want{"m1": {"able-cat", maassim.DefaultPool, "placeholder-m1", maassim.StatusReady}},
			writes:   0,
		},
		{
			name:     "Deployed machine gets rotated password only",
			machines: []maassim.Machine{withPassword(withHostname(ours("m1", vmA, maassim.StatusDeployed), "x", maassim.DefaultPool), "old")},
			vms:      map[maas.VMRef]string{vmA: "new"},
			want:     map[string]want{"m1": {"x", maassim.DefaultPool, "new", maassim.StatusDeployed}},
			writes:   1,
		},
		{
			name: "Commissioning, Failed, Broken and Testing machines are not commissioned or renamed",
			machines: []maassim.Machine{
				withPassword(ours("c", vmA, maassim.StatusCommissioning), "pw"),
				withPassword(ours("f", vmB, maassim.StatusFailedCommissioning), "pw"),
				withPassword(ours("b", maas.VMRef{Namespace: "n", Name: "b"}, maassim.StatusBroken), "pw"),
				withPassword(ours("t", maas.VMRef{Namespace: "n", Name: "t"}, maassim.StatusFailedTesting), "pw"),
			},
			vms: map[maas.VMRef]string{vmA: "pw", vmB: "pw", {Namespace: "n", Name: "b"}: "pw", {Namespace: "n", Name: "t"}: "pw"},
			want: map[string]want{
				"c": {"enlisted-c", maassim.DefaultPool, "pw", maassim.StatusCommissioning},
				"f": {"enlisted-f", maassim.DefaultPool, "pw", maassim.StatusFailedCommissioning},
				"b": {"enlisted-b", maassim.DefaultPool, "pw", maassim.StatusBroken},
				"t": {"enlisted-t", maassim.DefaultPool, "pw", maassim.StatusFailedTesting},
			},
			writes: 0,
		},
		{
			name: "physical machine and another tool's Redfish machine are left alone",
			machines: []maassim.Machine{
				{SystemID: "phys", Hostname: "rack1-node4", PowerType: "ipmi", PowerParameters: map[string]string{maas.PowerAddress: "10.0.0.4", maas.PowerUser: "root"}},
				{SystemID: "other", Hostname: "other", PowerType: "redfish", PowerParameters: map[string]string{maas.PowerAddress: "https://vm-0.tenant-a.bmc.other.org"}},
				{SystemID: "ipmi-ours", Hostname: "odd", PowerType: "ipmi", PowerParameters: map[string]string{maas.PowerAddress: maas.BMCAddress(vmA, testDomain)}},
			},
			vms: map[maas.VMRef]string{vmA: "pw"},
			want: map[string]want{
				"phys":      {"rack1-node4", maassim.DefaultPool, "", maassim.StatusNew},
				"other":     {"other", maassim.DefaultPool, "", maassim.StatusNew},
				"ipmi-ours": {"odd", maassim.DefaultPool, "", maassim.StatusNew},
			},
			writes: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := maassim.New(t)
			for _, p := range tt.pools {
				s.WithPool(p)
			}
			for _, m := range tt.machines {
				s.WithMachine(m)
			}
			for _, d := range tt.devices {
				s.WithDevice(d)
			}
			cluster := newFakeCluster()
			for vm, password := range tt.vms {
				cluster.withVM(vm, password)
			}
			r := newReconciler(t, s, cluster)
			reconcile(t, r)
			if got := writes(s); got != tt.writes {
				t.Errorf("writes = %d, want %d: %+v", got, tt.writes, s.Requests())
			}
			for id, w := range tt.want {
				m, _ := s.Machine(id)
				got := want{m.Hostname, m.Pool, m.PowerParameters[maas.PowerPass], m.Status}
				if got != w {
					t.Errorf("%s = %+v, want %+v", id, got, w)
				}
			}
			seen := map[string]bool{}
			for _, p := range s.Pools() {
				if seen[p] {
					t.Errorf("duplicate pool %q: %v", p, s.Pools())
				}
				seen[p] = true
			}
			// A second cycle changes nothing more in MaaS.
			s.ResetRequests()
			reconcile(t, r)
			if got := writes(s); got != 0 {
				t.Errorf("second cycle wrote %d times: %+v", got, s.Requests())
			}
		})
	}
}

func TestRotation(t *testing.T) {
	s := maassim.New(t).WithMachine(ours("m1", vmA, maassim.StatusNew))
	cluster := newFakeCluster().withVM(vmA, "first")
	r := newReconciler(t, s, cluster)
	reconcile(t, r)
	s.Step()

	for _, password := range []string{"second", "third"} {
		cluster.setPassword(vmA, password)
		s.ResetRequests()
		reconcile(t, r)
		puts := s.Count(maassim.Match{Method: http.MethodPut})
		if puts != 1 || writes(s) != 1 {
			t.Fatalf("rotation to %q: %d PUTs, %d writes, want 1: %+v", password, puts, writes(s), s.Requests())
		}
		if m, _ := s.Machine("m1"); m.PowerParameters[maas.PowerPass] != password || m.Status != maassim.StatusReady {
			t.Fatalf("after rotation: %v status %d", m.PowerParameters, m.Status)
		}
	}
	s.ResetRequests()
	reconcile(t, r)
	if writes(s) != 0 {
		t.Fatalf("unchanged Secret cost %d writes", writes(s))
	}
}

// TestOutages injects a failure into the first cycle, then lets a second,
// clean cycle run: the second converges with one pool and one commission.
func TestOutages(t *testing.T) {
	tests := []struct {
		name    string
		match   maassim.Match
		fault   maassim.Fault
		wantErr error
		fleet   bool // the cycle fails as a whole; else each machine does
	}{
		{"machine list 503", maassim.Match{Method: "GET", Path: "machines/", Op: ""}, maassim.FaultServerError, maas.ErrUnavailable, true},
		{"machine list connection drop", maassim.Match{Method: "GET", Path: "machines/", Op: ""}, maassim.FaultDropConnection, maas.ErrUnavailable, true},
		{"bulk power parameters malformed", maassim.Match{Op: "power_parameters"}, maassim.FaultMalformedJSON, maas.ErrUnavailable, true},
		{"pool list 503", maassim.Match{Method: "GET", Path: "resourcepools/"}, maassim.FaultServerError, maas.ErrUnavailable, false},
		{"pool creation 503", maassim.Match{Method: "POST", Path: "resourcepools/"}, maassim.FaultServerError, maas.ErrUnavailable, false},
		{"pool creation 409", maassim.Match{Method: "POST", Path: "resourcepools/"}, maassim.FaultConflict, maas.ErrInvalidArgument, false},
		{"pool created but answer lost", maassim.Match{Method: "POST", Path: "resourcepools/"}, maassim.FaultDropResponse, maas.ErrUnavailable, false},
		{"machine update 503", maassim.Match{Method: "PUT"}, maassim.FaultServerError, maas.ErrUnavailable, false},
		{"machine update 409", maassim.Match{Method: "PUT"}, maassim.FaultConflict, maas.ErrConflict, false},
		{"commission 409", maassim.Match{Op: "commission"}, maassim.FaultConflict, maas.ErrConflict, false},
		{"commission malformed reply", maassim.Match{Op: "commission"}, maassim.FaultMalformedJSON, maas.ErrUnavailable, false},
		{"commissioned but answer lost", maassim.Match{Op: "commission"}, maassim.FaultDropResponse, maas.ErrUnavailable, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := maassim.New(t).
				WithMachine(ours("m1", vmA, maassim.StatusNew)).
				WithMachine(ours("m2", vmB, maassim.StatusNew))
			cluster := newFakeCluster().withVM(vmA, "pa").withVM(vmB, "pb")
			r := newReconciler(t, s, cluster)

			s.FailMatching(tt.match, -1, tt.fault)
			result, err := r.Reconcile(context.Background())
			if tt.fleet && !errors.Is(err, tt.wantErr) {
				t.Fatalf("faulted cycle: err = %v, want %v", err, tt.wantErr)
			}
			if !tt.fleet && (err != nil || len(result.Failures) != 2 || !errors.Is(failures(result), tt.wantErr)) {
				t.Fatalf("faulted cycle: err = %v, failures %v; want both machines failing with %v", err, result.Failures, tt.wantErr)
			}
			if !tt.fleet {
				if _, c := cluster.status(vmA); c.Reason != maas.ReasonFailing || c.Status != metav1.ConditionFalse {
					t.Errorf("condition after the fault = %+v, want Failing", c)
				}
			}
			s.ClearFaults()
			if result := reconcile(t, r); len(result.Failures) != 0 {
				t.Fatalf("clean cycle: %v", result.Failures)
			}
			s.ResetRequests()
			if result := reconcile(t, r); len(result.Failures) != 0 || writes(s) != 0 {
				t.Fatalf("third cycle: failures %v, writes %d", result.Failures, writes(s))
			}

			if got := s.Pools(); !slices.Equal(got, []string{maassim.DefaultPool, "tenant-a", "tenant-b"}) {
				t.Errorf("pools = %v, want each namespace once", got)
			}
			for id, vm := range map[string]maas.VMRef{"m1": vmA, "m2": vmB} {
				m, _ := s.Machine(id)
				if m.Status != maassim.StatusCommissioning || m.Hostname != maas.Hostname(vm) || m.Pool != vm.Namespace {
					t.Errorf("%s = status %d hostname %q pool %q", id, m.Status, m.Hostname, m.Pool)
				}
				if st, c := cluster.status(vm); st.StatusName != "Commissioning" || c.Reason != maas.ReasonBound {
					t.Errorf("%s status = %+v, condition %+v", id, st, c)
				}
			}
		})
	}
}

// TestOutagesNeverCommissionTwice counts, over several cycles, the
// commissions MaaS carried out when the first commission request failed.
func TestOutagesNeverCommissionTwice(t *testing.T) {
	for _, fault := range []maassim.Fault{maassim.FaultDropResponse, maassim.FaultConflict, maassim.FaultServerError} {
		s := maassim.New(t).WithMachine(ours("m1", vmA, maassim.StatusNew))
		r := newReconciler(t, s, newFakeCluster().withVM(vmA, "pw"))
		s.FailMatching(maassim.Match{Op: "commission"}, 1, fault)
		for range 3 {
			_, _ = r.Reconcile(context.Background())
		}
		if got := commissions(s, "m1"); got != 1 {
			t.Errorf("fault %d: MaaS carried out %d commissions, want 1", fault, got)
		}
	}
}

func TestPoolCreatedConcurrently(t *testing.T) {
	// Someone else creates the pool between our list and our create: MaaS
	// refuses the duplicate and the machine still moves into the pool.
	s := maassim.New(t).WithMachine(ours("m1", vmA, maassim.StatusNew))
	r := newReconciler(t, s, newFakeCluster().withVM(vmA, "pw"))
	r.MaaS = newRacingClient(t, s, func() { s.WithPool("tenant-a") })
	if _, err := r.Reconcile(context.Background()); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if got := s.Pools(); !slices.Equal(got, []string{maassim.DefaultPool, "tenant-a"}) {
		t.Errorf("pools = %v", got)
	}
	if m, _ := s.Machine("m1"); m.Pool != "tenant-a" || m.Status != maassim.StatusCommissioning {
		t.Errorf("machine = %+v", m)
	}
}

// newRacingClient is a client that runs race just before it sends the first
// pool creation.
func newRacingClient(t *testing.T, s *maassim.Server, race func()) *maas.Client {
	key, _ := maas.ParseAPIKey(maassim.APIKey)
	raced := false
	transport := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/resourcepools/") && !raced {
			raced = true
			race()
		}
		return http.DefaultTransport.RoundTrip(req)
	})
	c, err := maas.NewClient(s.URL(), key, &http.Client{Transport: transport})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

func TestClusterFailures(t *testing.T) {
	t.Run("enrolled VMs unreadable: the cycle fails, MaaS untouched", func(t *testing.T) {
		s := maassim.New(t).WithMachine(ours("m1", vmA, maassim.StatusNew))
		cluster := newFakeCluster().withVM(vmA, "pw")
		cluster.enrolledErr = maas.ErrUnavailable
		r := newReconciler(t, s, cluster)
		if _, err := r.Reconcile(context.Background()); !errors.Is(err, maas.ErrUnavailable) {
			t.Fatalf("err = %v", err)
		}
		if writes(s) != 0 {
			t.Errorf("changed MaaS without knowing the VMs: %+v", s.Requests())
		}
	})
	t.Run("status write fails in one namespace: the others converge, retried next cycle", func(t *testing.T) {
		s := maassim.New(t).WithMachine(ours("m1", vmA, maassim.StatusNew)).WithMachine(ours("m2", vmB, maassim.StatusNew))
		cluster := newFakeCluster().withVM(vmA, "pa").withVM(vmB, "pb")
		cluster.reportErr[vmA.Namespace] = maas.ErrForbidden
		r := newReconciler(t, s, cluster)
		result := reconcile(t, r)
		// A's binding could not be recorded, so A's machine is not
		// commissioned: that would replace the output that proves it.
		if len(result.Failures) != 2 || result.Failures[0].SystemID != "m1" || result.Failures[1].VM != vmA ||
			!errors.Is(result.Failures[0], maas.ErrForbidden) || !errors.Is(result.Failures[1], maas.ErrForbidden) {
			t.Fatalf("failures = %v, want vm A's status writes only", result.Failures)
		}
		if m, _ := s.Machine("m1"); m.Status != maassim.StatusNew || m.Hostname != maas.Hostname(vmA) {
			t.Errorf("m1 = %+v, want named but New", m)
		}
		if m, _ := s.Machine("m2"); m.Status != maassim.StatusCommissioning {
			t.Errorf("m2 status = %d, want commissioned", m.Status)
		}
		if st, _ := cluster.status(vmB); st.SystemID != "m2" {
			t.Errorf("vm B status = %+v", st)
		}
		delete(cluster.reportErr, vmA.Namespace)
		reconcile(t, r)
		if st, _ := cluster.status(vmA); st.StatusName != "Commissioning" {
			t.Errorf("vm A status after recovery = %+v", st)
		}
	})
	t.Run("one VM's Secret missing: that machine only, named but not commissioned", func(t *testing.T) {
		s := maassim.New(t).WithMachine(ours("m1", vmA, maassim.StatusNew)).WithMachine(ours("m2", vmB, maassim.StatusNew))
		cluster := newFakeCluster().withVM(vmA, "").withVM(vmB, "pb")
		r := newReconciler(t, s, cluster)
		result := reconcile(t, r)
		if len(result.Failures) != 1 || result.Failures[0].SystemID != "m1" || !errors.Is(result.Failures[0], maas.ErrNotFound) {
			t.Fatalf("failures = %v", result.Failures)
		}
		if m, _ := s.Machine("m1"); m.Status != maassim.StatusNew || m.PowerParameters[maas.PowerPass] != "placeholder-m1" || m.Pool != "tenant-a" {
			t.Errorf("m1 = %+v", m)
		}
		if m, _ := s.Machine("m2"); m.Status != maassim.StatusCommissioning {
			t.Errorf("m2 status = %d", m.Status)
		}
		if _, c := cluster.status(vmA); c.Reason != maas.ReasonFailing || !strings.Contains(c.Message, "credentials Secret") {
			t.Errorf("vm A condition = %+v", c)
		}
	})
	t.Run("VM not enrolled: machine left alone, nothing reported", func(t *testing.T) {
		s := maassim.New(t).WithMachine(ours("m1", vmA, maassim.StatusReady))
		cluster := newFakeCluster()
		r := newReconciler(t, s, cluster)
		result := reconcile(t, r)
		if writes(s) != 0 || cluster.reportCalls != 0 || result.Bound != 0 || result.Managed != 1 {
			t.Errorf("orphan machine was changed or reported: %+v, %d reports", s.Requests(), cluster.reportCalls)
		}
	})
}

func TestDryRun(t *testing.T) {
	s := maassim.New(t).
		WithMachine(ours("m1", vmA, maassim.StatusNew)).
		WithMachine(withPasswordOnly(ours("m2", vmB, maassim.StatusDeployed), "old"))
	cluster := newFakeCluster().withVM(vmA, "topsecret-a").withVM(vmB, "topsecret-b")
	var out bytes.Buffer
	r := newReconciler(t, s, cluster)
	r.DryRun, r.Out = true, &out

	result := reconcile(t, r)
	if writes(s) != 0 || cluster.reportCalls != 0 || len(cluster.events) != 0 {
		t.Fatalf("dry run wrote: %d MaaS writes, %d reports", writes(s), cluster.reportCalls)
	}
	printed := out.String()
	for _, want := range []string{
		"would create pool: tenant-a",
		"would set power credentials m1 (vm tenant-a/vm-0)",
		"would set hostname and pool m1",
		"would commission m1",
		"would report status m1",
		"would set power credentials m2 (vm tenant-b/vm-0)",
	} {
		if !strings.Contains(printed, want) {
			t.Errorf("dry-run output lacks %q:\n%s", want, printed)
		}
	}
	if strings.Contains(printed, "topsecret") {
		t.Errorf("dry-run output shows a password:\n%s", printed)
	}
	if strings.Contains(printed, "commission m2") || strings.Contains(printed, "hostname and pool m2") {
		t.Errorf("dry run plans to commission or rename a Deployed machine:\n%s", printed)
	}
	if got := strings.Count(printed, "\n"); got != len(result.Changes) {
		t.Errorf("printed %d lines for %d changes", got, len(result.Changes))
	}
}

func withPasswordOnly(m maassim.Machine, password string) maassim.Machine {
	m.PowerParameters[maas.PowerUser] = "admin"
	m.PowerParameters[maas.PowerPass] = password
	return m
}

func TestRetryDelay(t *testing.T) {
	tests := []struct {
		interval, maxBackoff time.Duration
		failures             int
		want                 time.Duration
	}{
		{time.Minute, 10 * time.Minute, 0, time.Minute},
		{time.Minute, 10 * time.Minute, 1, time.Minute},
		{time.Minute, 10 * time.Minute, 2, 2 * time.Minute},
		{time.Minute, 10 * time.Minute, 4, 8 * time.Minute},
		{time.Minute, 10 * time.Minute, 5, 10 * time.Minute},
		{time.Minute, 10 * time.Minute, 1000, 10 * time.Minute},
		{time.Hour, time.Minute, 3, time.Hour}, // never below the interval
	}
	for _, tt := range tests {
		if got := maas.RetryDelay(tt.interval, tt.maxBackoff, tt.failures); got != tt.want {
			t.Errorf("RetryDelay(%v, %v, %d) = %v, want %v", tt.interval, tt.maxBackoff, tt.failures, got, tt.want)
		}
	}
}

func TestRunRecoversFromOutage(t *testing.T) {
	s := maassim.New(t).WithMachine(ours("m1", vmA, maassim.StatusNew))
	s.FailMatching(maassim.Match{Method: "GET", Path: "machines/", Op: ""}, 3, maassim.FaultServerError)
	r := newReconciler(t, s, newFakeCluster().withVM(vmA, "pw"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error)
	go func() { done <- r.Run(ctx, time.Millisecond, 4*time.Millisecond) }()
	poll.True(t, "the machine commissioned", func() bool { m, _ := s.Machine("m1"); return m.Status == maassim.StatusCommissioning })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := commissions(s, "m1"); got != 1 {
		t.Errorf("commissions = %d", got)
	}
}

// TestSlowMachineDelaysNoOther: MaaS hangs on one machine's commission;
// within the same cycle every other machine is still renamed, pooled,
// given its credentials and commissioned, each in that order, and the
// hanging machine finishes when MaaS answers.
func TestSlowMachineDelaysNoOther(t *testing.T) {
	s, cluster, _ := newMachinesOfVMs(t, "slow")
	release, waiting := s.Hold(maassim.Match{Method: "POST", Path: "machines/m0/", Op: "commission"})
	t.Cleanup(release)
	r := newReconciler(t, s, cluster)
	done := make(chan maas.CycleResult)
	go func() {
		result, err := r.Reconcile(context.Background())
		if err != nil {
			t.Error(err)
		}
		done <- result
	}()
	poll.True(t, "the slow machine's commission waiting", func() bool { return waiting() == 1 })
	poll.Until(t, "the other machines commissioned while it waits", func() error {
		for _, id := range []string{"m1", "m2"} {
			if m, _ := s.Machine(id); m.Status != maassim.StatusCommissioning {
				return fmt.Errorf("%s is %d", id, m.Status)
			}
		}
		return nil
	})
	release()
	result := <-done
	if m, _ := s.Machine("m0"); m.Status != maassim.StatusCommissioning {
		t.Errorf("the slow machine is %d once MaaS answered", m.Status)
	}
	// Each machine's steps in order, and the cycle's changes in machine
	// order whatever order the machines finished in.
	for _, id := range []string{"m0", "m1", "m2"} {
		checkStepsInOrder(t, s, id)
	}
	var order []string
	for _, c := range result.Changes {
		if c.SystemID != "" && c.Action != maas.ActionReport {
			order = append(order, c.Action+" "+c.SystemID)
		}
	}
	want := []string{
		maas.ActionSetCredentials + " m0", maas.ActionSetCredentials + " m1", maas.ActionSetCredentials + " m2",
		maas.ActionSetIdentity + " m0", maas.ActionCommission + " m0", maas.ActionSetIdentity + " m1", maas.ActionCommission + " m1",
		maas.ActionSetIdentity + " m2", maas.ActionCommission + " m2",
	}
	if !slices.Equal(order, want) {
		t.Errorf("changes\n %v\nwant\n %v", order, want)
	}
}

// TestConcurrencyIsBounded: with every machine's first write held, no more
// than Concurrency requests are in MaaS at once.
func TestConcurrencyIsBounded(t *testing.T) {
	s := maassim.New(t)
	cluster := newFakeCluster()
	for i := range 6 {
		vm := maas.VMRef{Namespace: "tenant-a", Name: fmt.Sprintf("web%d", i)}
		s.WithMachine(ours(fmt.Sprintf("m%d", i), vm, maassim.StatusNew))
		cluster.withVM(vm, "s3cret")
	}
	release, waiting := s.Hold(maassim.Match{Method: "PUT"})
	t.Cleanup(release)
	r := newReconciler(t, s, cluster)
	r.Concurrency = 2
	done := make(chan error)
	go func() { _, err := r.Reconcile(context.Background()); done <- err }()
	poll.True(t, "two machines' writes waiting", func() bool { return waiting() == 2 })
	time.Sleep(50 * time.Millisecond) // a third would be let in now, if it could
	if n := waiting(); n != 2 {
		t.Errorf("%d writes in MaaS at once, want Concurrency 2", n)
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := s.MaxInFlight(); n > 2 {
		t.Errorf("MaaS saw %d requests at once, want at most 2", n)
	}
}

// TestFailingMachineStopsNoOther: MaaS fails one machine's step (its
// credentials, or its commission); within the same cycle every other
// machine still gets its credentials, then hostname and pool, then its
// commission, the failure is that machine's alone, and the next cycle
// finishes it.
func TestFailingMachineStopsNoOther(t *testing.T) {
	tests := []struct {
		name  string
		match maassim.Match
		fault maassim.Fault
	}{
		{"credentials 503", maassim.Match{Method: "PUT", Path: "machines/m0/"}, maassim.FaultServerError},
		{"credentials connection dropped", maassim.Match{Method: "PUT", Path: "machines/m0/"}, maassim.FaultDropConnection},
		{"commission 409", maassim.Match{Method: "POST", Path: "machines/m0/", Op: "commission"}, maassim.FaultConflict},
		{"commission malformed reply", maassim.Match{Method: "POST", Path: "machines/m0/", Op: "commission"}, maassim.FaultMalformedJSON},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, cluster, vms := newMachinesOfVMs(t, "failing")
			r := newReconciler(t, s, cluster)
			s.FailMatching(tt.match, -1, tt.fault)
			result := reconcile(t, r)
			if len(result.Failures) != 1 || result.Failures[0].SystemID != "m0" {
				t.Fatalf("failures %v, want m0's alone", result.Failures)
			}
			for _, id := range []string{"m1", "m2"} {
				if m, _ := s.Machine(id); m.Status != maassim.StatusCommissioning {
					t.Errorf("%s is %d after the cycle m0 failed in, want commissioning", id, m.Status)
				}
				checkStepsInOrder(t, s, id)
			}
			s.ClearFaults()
			if result := reconcile(t, r); len(result.Failures) != 0 {
				t.Fatalf("the cycle after: failures %v", result.Failures)
			}
			if m, _ := s.Machine("m0"); m.Status != maassim.StatusCommissioning || m.Hostname != maas.Hostname(vms[0]) || m.Pool != vms[0].Namespace {
				t.Errorf("m0 after the fault cleared: status %d hostname %q pool %q", m.Status, m.Hostname, m.Pool)
			}
			if n := commissions(s, "m0"); n != 1 {
				t.Errorf("m0 commissioned %d times, want once", n)
			}
		})
	}
}

// newMachinesOfVMs gives MaaS three New machines, m0 to m2, of the VMs
// first (tenant-a), web1 (tenant-a) and web2 (tenant-b), each VM with a
// password of its own.
func newMachinesOfVMs(t *testing.T, first string) (*maassim.Server, *fakeCluster, []maas.VMRef) {
	t.Helper()
	vms := []maas.VMRef{{Namespace: "tenant-a", Name: first}, {Namespace: "tenant-a", Name: "web1"}, {Namespace: "tenant-b", Name: "web2"}}
	s := maassim.New(t)
	cluster := newFakeCluster()
	for i, vm := range vms {
		s.WithMachine(ours(fmt.Sprintf("m%d", i), vm, maassim.StatusNew))
		cluster.withVM(vm, "s3cret-"+vm.Name)
	}
	return s, cluster, vms
}

// checkStepsInOrder: the machine's writes were its credentials, then its
// hostname and pool, then its commission.
func checkStepsInOrder(t *testing.T, s *maassim.Server, id string) {
	t.Helper()
	var steps []string
	for _, req := range s.Requests() {
		if (req.Method == "POST" || req.Method == "PUT") && req.Path == "machines/"+id+"/" {
			steps = append(steps, cmp.Or(req.Op, "update"))
		}
	}
	if want := []string{"update", "update", "commission"}; !slices.Equal(steps, want) {
		t.Errorf("%s's writes %v, want credentials, then hostname and pool, then commission", id, steps)
	}
}
