package maas

import (
	"cmp"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/internal/bounded"
)

// Reconciler brings the MaaS machines that are proven to be enrolled
// virtmetal VMs to their wanted state, and reports them to Kubernetes:
//
//   - a machine whose power address names a virtmetal BMC under Domain only
//     claims a VM: anyone can enlist a machine in MaaS (enlistment is
//     anonymous) with any address, and the SMBIOS serial, UUID and MACs a
//     machine shows derive from the VM's name or are broadcast. The claim
//     counts when the VM is enrolled (it has a VirtualMachineBMC) and the
//     machine is proven to be the VM (see judge and readProofs): the
//     bmc-config script's output MaaS stored for it (Client.BMCConfigOutput,
//     read before anything is written to the machine) carries the VM's
//     machine proof, a random secret only the controller and the VM's guest
//     know (EnrolledVM.Proof), and its hardware fits (hardwareFits: every
//     MAC is the VM's; the hardware UUID, where both sides know one, the
//     VM's firmware UUID). Until then the machine gets no credentials,
//     pool, name or commission, and the VirtualMachineBMC's MaaSMachine
//     condition and an Event say why; a VM with no proof yet gets no new
//     machine. The machine bound first (the one status.maas names, proven
//     by its proof or bound before machine proofs) keeps the VM while it
//     still claims it and its hardware fits, without its output being read
//     again; a machine proven later never displaces it. Of several machines
//     proven with none bound before, none gets the VM. The other claimants
//     are reported as duplicates and detached, never given credentials;
//   - a machine is commissioned only once the VM's status names it
//     (recordBinding): commissioning replaces the output that proved it;
//   - credentials are written together with the power type, address and
//     node id they belong with, so they never land next to an address
//     someone changed since the cycle's list; the read-back checks the
//     machine's own address, and a machine the VM's status names that no
//     longer names the VM's BMC has its user and password replaced by
//     placeholders (blankCredentials; MaaS refuses empty ones);
//   - power_user/power_pass (and node_id) follow the VM's BMC Secret, in every
//     status: a rotated password must reach Ready and Deployed machines too,
//     or MaaS loses power control;
//   - hostname "<vm>-<namespace>" (else its hashed form, else, when other
//     machines hold both, "<vm>-<namespace>-<system id>", which no one can
//     predict before the machine enlists; an unproven New machine claiming
//     the VM is renamed rather, see renameSquatters) and the resource pool named after
//     the namespace (created when missing) are set while the machine is New, and
//     while it is Ready once its VM's BMC Secret is found: MaaS commissions
//     at enlistment by default (enlist_commissioning), so a machine may be
//     Ready before the reconciler first sees it. A Ready machine renamed or
//     moved by hand is put back. Machines in any other status (allocated,
//     deployed, commissioning, failed, broken...) keep their names: renaming
//     a deployed machine would change its DNS name under its workload;
//   - a New machine is commissioned once its credentials, hostname and pool
//     are in place (MaaS needs the credentials to power it on). Machines in
//     any other status are never commissioned;
//   - the machine's system ID, status, hostname and pool, and the
//     MaaSMachine condition, go to the VirtualMachineBMC status, written only
//     when they differ from what the status shows (so a removed value is put
//     back and an unchanged one costs nothing).
//
// One cycle costs one machine list and one bulk power-parameters request
// in MaaS, and three lists in Kubernetes (Cluster.Enrolled; a fourth,
// Cluster.InstanceMACs, only while a claimed VM sets no MAC in its spec),
// plus one stored-output read per claimant that needs proving (none for a
// bound machine), a pool list only when some machine needs moving, one
// request per change and, in a cycle that wrote credentials, one bulk
// power-parameters read-back: machines that need nothing cost nothing. Machines of other tools
// and physical servers are left alone.
//
// A machine's problems (a refused commission, a rejected address, other
// machines claiming its VM's BMC) go to the VirtualMachineBMC status too,
// counted across cycles; a refused commission is tried again only after a
// wait that doubles with each refusal (see v1beta1.MaaSProblem).
//
// A Reconciler keeps no state between cycles: what must outlive one is in
// the VirtualMachineBMC status. It is not safe for concurrent use; within a
// cycle it works on machines concurrently (Concurrency).
type Reconciler struct {
	MaaS    *Client
	Cluster Cluster
	// Domain is the DNS domain of the BMC addresses: <vm>.<namespace>.<Domain>.
	Domain string
	// DryRun plans changes and prints them to Out instead of making them.
	DryRun bool
	Out    io.Writer
	Log    logr.Logger
	// Now stamps reports, condition transitions and problems; time.Now
	// when nil.
	Now func() time.Time
	// CommissionBackoff is the first wait after MaaS refused to commission
	// a machine, doubling with each refusal up to MaxCommissionBackoff
	// (defaults DefaultCommissionBackoff, DefaultMaxCommissionBackoff).
	CommissionBackoff, MaxCommissionBackoff time.Duration
	// Metrics, when set, is told of every cycle.
	Metrics *Metrics
	// Concurrency is how many machines a cycle works on at once (zero:
	// DefaultConcurrency). Each machine's own steps stay in order
	// (detach, credentials, then hostname and pool, then commission), and
	// a machine MaaS is slow or failing for holds one slot, not the fleet.
	Concurrency int
}

// DefaultConcurrency is Reconciler.Concurrency's default: enough for a
// lab's 50 new VMs to be commissioned in one cycle without a request
// burst a MaaS region would notice.
const DefaultConcurrency = 8

// eachConcurrently calls work(i) for i in [0, n), at most r.Concurrency at
// once, and returns when all have.
func (r *Reconciler) eachConcurrently(n int, work func(i int)) {
	bounded.Each(n, cmp.Or(r.Concurrency, DefaultConcurrency), work)
}

// Change is one thing a cycle changed (or, in a dry run, would change).
type Change struct {
	Action   string // see the action constants
	SystemID string // empty for pool creation
	VM       VMRef
	Detail   string // never a secret
}

// Actions a Change can describe.
const (
	ActionCreatePool     = "create pool"
	ActionSetCredentials = "set power credentials"
	// ActionBlankCredentials: a machine that held the VM's credentials
	// no longer names its BMC.
	ActionBlankCredentials = "blank power credentials"
	ActionDetach           = "detach from the VM's BMC"
	// ActionRenameSquatter: an unproven New machine claiming the VM held
	// one of the VM's hostnames.
	ActionRenameSquatter = "rename an unproven machine"
	ActionSetIdentity    = "set hostname and pool"
	ActionCommission     = "commission"
	ActionReport         = "report status"
)

// Reasons of the MaaSMachine condition.
const (
	// ReasonBound: one machine is proven to be the VM's and is in shape.
	ReasonBound = "Bound"
	// ReasonUnverified: machines claim the VM but none is proven to be it.
	ReasonUnverified = "Unverified"
	// ReasonDuplicateClaim: more than one machine claims the VM; the ones
	// that are not the proven machine are detached from the VM's BMC.
	ReasonDuplicateClaim = "DuplicateClaim"
	// ReasonCommissionRefused: MaaS refused to commission the VM's machine.
	ReasonCommissionRefused = "CommissionRefused"
	// ReasonAddressRejected: MaaS refused the machine's power address.
	ReasonAddressRejected = "AddressRejected"
	// ReasonFailing: the VM's machine could not be brought in shape for
	// another reason.
	ReasonFailing = "Failing"
	// ReasonNoMachine: no MaaS machine claims the VM.
	ReasonNoMachine = "NoMachine"
)

func (c Change) String() string {
	text := c.Action
	if c.SystemID != "" {
		text += " " + c.SystemID
	}
	if c.VM != (VMRef{}) {
		text += " (vm " + c.VM.String() + ")"
	}
	return text + ": " + c.Detail
}

// CycleResult says what one cycle found and did.
type CycleResult struct {
	Machines int      // machines in MaaS
	Managed  int      // machines whose power address names a virtmetal BMC
	Bound    int      // of those, the ones proven to be their enrolled VM
	Changes  []Change // made, or planned in a dry run
	// Failures are the machines (or VMs) that could not be brought in
	// shape; each touched only itself.
	Failures []MachineFailure
	// Problems are the bound machines' problems as their VMs' statuses
	// list them after the cycle (see v1beta1.MaaSProblem), counted across
	// cycles.
	Problems []Problem
}

// Recurring are the problems met in at least n consecutive cycles.
func (c CycleResult) Recurring(n int) []Problem {
	var out []Problem
	for _, p := range c.Problems {
		if int(p.Cycles) >= n {
			out = append(out, p)
		}
	}
	return out
}

// MachineFailure is a failure local to one machine or VM.
type MachineFailure struct {
	SystemID string // empty when the VM has no machine
	VM       VMRef
	Err      error
}

func (f MachineFailure) Error() string {
	if f.SystemID == "" {
		return "vm " + f.VM.String() + ": " + f.Err.Error()
	}
	return "machine " + f.SystemID + " (vm " + f.VM.String() + "): " + f.Err.Error()
}

func (f MachineFailure) Unwrap() error { return f.Err }

// managedMachine is a MaaS machine whose power address names a virtmetal
// VM's BMC.
type managedMachine struct {
	Machine
	vm     VMRef
	params PowerParameters
}

// hardwareFits checks what a claimant's hardware says against the VM it
// claims. Neither is a proof (MACs and the SMBIOS UUID are derived from
// names and broadcast), but a machine that fails them is not the VM
// whatever it reports: all its MACs must be the VM's (a machine that also
// carries another's MAC may be the other's guest reporting through it), and
// its hardware UUID, where MaaS and the VM both know one, the VM's.
func hardwareFits(m Machine, vm *EnrolledVM) (bool, string) {
	if !vm.VMFound {
		return false, "the VirtualMachine does not exist"
	}
	if len(vm.MACs) == 0 {
		return false, "the VM's MACs are unknown (none in its spec, no running instance)"
	}
	var machineMACs []string
	for _, mac := range m.MACs() {
		if mac = NormalizeMAC(mac); mac != "" && !slices.Contains(machineMACs, mac) {
			machineMACs = append(machineMACs, mac)
		}
	}
	if len(machineMACs) == 0 {
		return false, "MaaS shows no MAC of it"
	}
	for _, mac := range machineMACs {
		if !slices.Contains(vm.MACs, mac) {
			return false, fmt.Sprintf("its MAC %s is not one of the VM's %v", mac, vm.MACs)
		}
	}
	if hardwareUUID := NormalizeUUID(m.HardwareUUID); hardwareUUID != "" && vm.FirmwareUUID != "" && hardwareUUID != vm.FirmwareUUID {
		return false, fmt.Sprintf("its hardware UUID %s is not the VM's firmware UUID %s", hardwareUUID, vm.FirmwareUUID)
	}
	return true, ""
}

// claim is one machine's claim on an enrolled VM and how it was judged.
type claim struct {
	m      managedMachine
	proven bool
	why    string
	// needsProof: the claim is judged by the output MaaS stored for the
	// machine, read before anything is written (readProofs).
	needsProof bool
}

// binding is what a cycle decided for one enrolled VM.
type binding struct {
	vm     *EnrolledVM
	claims []claim // sorted by system ID
	winner int     // index into claims; -1 when no machine is the VM's
	tie    bool    // several machines carry the VM's proof
}

// incumbent is the machine the VM's status says was bound to it: the
// reconciler writes status.maas only for the machine it bound.
func incumbent(vm *EnrolledVM) string {
	if vm.Reported.MaaS == nil {
		return ""
	}
	return vm.Reported.MaaS.SystemID
}

// judge starts the binding of vm among the machines claiming it. The
// machine bound first (the incumbent, whether it proved itself by the
// machine proof or, bound before machine proofs, by its hardware) keeps
// the VM while it still claims it and its hardware fits: a machine proven
// later never displaces it, and its stored output is not read again. Without
// one, every claimant whose hardware fits is to be proven by the output MaaS
// stored for it (readProofs, then decide); none is while the VM has no
// proof.
func judge(vm *EnrolledVM, machines []managedMachine) binding {
	b := binding{vm: vm, winner: -1}
	current := incumbent(vm)
	for _, m := range machines {
		c := claim{m: m}
		fits, why := hardwareFits(m.Machine, vm)
		switch {
		case !fits:
			c.why = why
		case m.SystemID == current:
			c.proven = true
		case vm.Proof == "":
			c.why = "the VM has no machine proof yet (spec.template.spec.domain.chassis.asset, which the controller stamps), so no machine can prove it is the VM"
		default:
			c.needsProof = true
		}
		b.claims = append(b.claims, c)
	}
	for i, c := range b.claims {
		if c.proven {
			b.winner = i
			for j := range b.claims {
				if b.claims[j].needsProof {
					b.claims[j].needsProof = false
					b.claims[j].why = "another machine was bound to the VM first"
				}
			}
		}
	}
	return b
}

// readProofs reads, for every claim judge left to prove, the bmc-config
// output MaaS stored for the machine, and proves it when it carries the
// VM's proof. It runs before anything is written to any machine, and only
// for claimants: an idle fleet of bound machines costs no read.
func (r *Reconciler) readProofs(ctx context.Context, bindings []binding) {
	var pending []*claim
	var proofs []string
	for i := range bindings {
		for j := range bindings[i].claims {
			if c := &bindings[i].claims[j]; c.needsProof {
				pending = append(pending, c)
				proofs = append(proofs, bindings[i].vm.Proof)
			}
		}
	}
	r.eachConcurrently(len(pending), func(i int) {
		c := pending[i]
		output, err := r.MaaS.BMCConfigOutput(ctx, c.m.SystemID)
		switch {
		case errors.Is(err, ErrNotFound):
			c.why = "MaaS stored no commissioning output for it (" + BMCConfigScript + " never ran on it)"
		case err != nil:
			c.why = "its commissioning output could not be read: " + err.Error()
		case subtle.ConstantTimeCompare([]byte(bmcspec.ProofFromReport(output)), []byte(proofs[i])) == 1:
			c.proven = true
		default:
			// Never what it reported: a wrong proof is someone's guess,
			// and the message reaches the VM's status.
			c.why = "its commissioning output does not carry the VM's machine proof"
		}
		c.needsProof = false
	})
}

// decide picks the winner of a binding judge could not decide alone: the
// one claimant proven by its output; several are a tie and none wins.
func decide(b binding) binding {
	if b.winner >= 0 {
		return b
	}
	var proven []int
	for i, c := range b.claims {
		if c.proven {
			proven = append(proven, i)
		}
	}
	switch len(proven) {
	case 0:
	case 1:
		b.winner = proven[0]
	default:
		b.tie = true
		for _, i := range proven {
			b.claims[i].why = "it carries the VM's machine proof too"
		}
	}
	return b
}

// Reconcile runs one cycle. Its error is a failure of the whole fleet
// (MaaS's or Kubernetes's lists failing); failures of single machines are in
// the result, and the other machines are still reconciled. Nothing half-done
// is repeated wrongly next cycle (pools are looked up before creation, and a
// machine is commissioned only while MaaS says it is New).
func (r *Reconciler) Reconcile(ctx context.Context) (CycleResult, error) {
	start := time.Now()
	result, err := r.cycle(ctx)
	took := time.Since(start)
	if r.Metrics != nil {
		r.Metrics.observe(result, took, err)
	}
	if err == nil {
		r.Log.Info("cycle done", "machines", result.Machines, "managed", result.Managed, "bound", result.Bound,
			"changes", len(result.Changes), "failures", len(result.Failures), "problems", len(result.Problems),
			"duration", took.Round(time.Millisecond).String(), "dryRun", r.DryRun)
	}
	return result, err
}

func (r *Reconciler) cycle(ctx context.Context) (CycleResult, error) {
	var result CycleResult
	machines, err := r.MaaS.Machines(ctx)
	if err != nil {
		return result, fmt.Errorf("list machines: %w", err)
	}
	params, err := r.MaaS.PowerParameters(ctx)
	if err != nil {
		return result, fmt.Errorf("read power parameters: %w", err)
	}
	enrolled, err := r.Cluster.Enrolled(ctx)
	if err != nil {
		return result, fmt.Errorf("read enrolled VMs: %w", err)
	}
	result.Machines = len(machines)
	now := metav1.NewTime(r.now().UTC().Truncate(time.Second))

	holders := make(map[string]string, len(machines)) // hostname → system_id
	inMaaS := make(map[string]bool, len(machines))
	claims := map[VMRef][]managedMachine{}
	for _, m := range machines {
		holders[m.Hostname] = m.SystemID
		inMaaS[m.SystemID] = true
		if m.PowerType != PowerTypeRedfish {
			continue
		}
		vm, ok := ParseBMCAddress(params[m.SystemID].String(PowerAddress), r.Domain)
		if !ok {
			continue
		}
		result.Managed++
		claims[vm] = append(claims[vm], managedMachine{Machine: m, vm: vm, params: params[m.SystemID]})
	}
	if err := r.fillInstanceMACs(ctx, enrolled, claims); err != nil {
		return result, err
	}

	var bindings []binding
	for _, ref := range slices.SortedFunc(maps.Keys(claims), compareVMRefs) {
		vm, ok := enrolled[ref]
		if !ok {
			for _, m := range claims[ref] {
				r.logFor(m).V(1).Info("machine claims a VM that is not enrolled (no VirtualMachineBMC); left alone")
			}
			continue
		}
		slices.SortFunc(claims[ref], func(a, b managedMachine) int { return cmp.Compare(a.SystemID, b.SystemID) })
		bindings = append(bindings, judge(vm, claims[ref]))
	}
	r.readProofs(ctx, bindings)
	for i := range bindings {
		bindings[i] = decide(bindings[i])
	}
	for _, ref := range slices.SortedFunc(maps.Keys(enrolled), compareVMRefs) {
		if _, claimed := claims[ref]; !claimed {
			bindings = append(bindings, binding{vm: enrolled[ref], winner: -1})
		}
	}

	record := func(c Change) {
		result.Changes = append(result.Changes, c)
		if r.DryRun && r.Out != nil {
			fmt.Fprintln(r.Out, "would "+c.String())
		}
	}
	result.Failures = append(result.Failures, r.blankStrayed(ctx, bindings, machines, inMaaS, params, record)...)
	current, failures := r.reconcileBound(ctx, bindings, holders, now, record)
	for _, b := range bindings {
		var failure error
		if b.winner >= 0 {
			result.Bound++
			failure = failures[b.claims[b.winner].m.SystemID]
			if failure != nil {
				result.Failures = append(result.Failures, MachineFailure{SystemID: b.claims[b.winner].m.SystemID, VM: b.vm.VM, Err: failure})
			}
		}
		want, err := r.report(ctx, b, r.wantedStatus(b, current, failure, inMaaS, now), now, record)
		if err != nil {
			result.Failures = append(result.Failures, MachineFailure{VM: b.vm.VM, Err: err})
		}
		if want.MaaS != nil {
			for _, p := range want.MaaS.Problems {
				result.Problems = append(result.Problems, Problem{VM: b.vm.VM, SystemID: want.MaaS.SystemID, MaaSProblem: p})
			}
		}
	}
	for _, f := range result.Failures {
		r.Log.Error(f.Err, "machine not in shape", "systemID", f.SystemID, "namespace", f.VM.Namespace, "vm", f.VM.Name)
	}
	return result, nil
}

func compareVMRefs(a, b VMRef) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// fillInstanceMACs gives the claimed VMs whose spec sets no MAC their
// running instance's MACs. It lists instances only when some VM needs it.
func (r *Reconciler) fillInstanceMACs(ctx context.Context, enrolled map[VMRef]*EnrolledVM, claims map[VMRef][]managedMachine) error {
	var needed []*EnrolledVM
	for ref := range claims {
		if vm, ok := enrolled[ref]; ok && vm.VMFound && len(vm.MACs) == 0 {
			needed = append(needed, vm)
		}
	}
	if len(needed) == 0 {
		return nil
	}
	instances, err := r.Cluster.InstanceMACs(ctx)
	if err != nil {
		return fmt.Errorf("read instance MACs: %w", err)
	}
	for _, vm := range needed {
		vm.MACs = instances[vm.VM]
	}
	return nil
}

// bound is a cycle's work on one VM's proven machine: the scope its steps
// share.
type bound struct {
	m              managedMachine
	vm             *EnrolledVM
	others         []managedMachine // the other machines claiming the VM
	credentialsSet bool
	wrote          bool // credentials written this cycle
	err            error
	// changes are the machine's, recorded in order once its phase is done:
	// machines run concurrently, the cycle's list does not.
	changes []Change
	// hostname is the one the machine may hold, claimed before the machines
	// run (in their order, so the same machine wins a name every cycle), or
	// why it may hold none.
	hostname    string
	hostnameErr error
}

// recordOwn keeps a change for the cycle's list.
func (x *bound) recordOwn(c Change) { x.changes = append(x.changes, c) }

// reconcileBound brings every bound machine in shape: credentials first
// (whether they are set decides whether a Ready machine is ours to name, and
// so which pools are needed), then pools, hostnames and commissioning. It
// returns the machines as MaaS last showed them and each one's failure.
func (r *Reconciler) reconcileBound(ctx context.Context, bindings []binding, holders map[string]string, now metav1.Time, record func(Change)) (map[string]Machine, map[string]error) {
	recordAll := func(all []*bound) {
		for _, x := range all {
			for _, c := range x.changes {
				record(c)
			}
			x.changes = nil
		}
	}
	var all []*bound
	for _, b := range bindings {
		if b.winner >= 0 {
			x := &bound{m: b.claims[b.winner].m, vm: b.vm}
			for i, c := range b.claims {
				if i != b.winner {
					x.others = append(x.others, c.m)
				}
			}
			all = append(all, x)
		}
	}
	current := make(map[string]Machine, len(all))
	failures := map[string]error{}
	var written []*bound
	for _, x := range all {
		current[x.m.SystemID] = x.m.Machine
	}
	r.eachConcurrently(len(all), func(i int) {
		x := all[i]
		// MaaS shares one BMC row among redfish machines of one address:
		// credentials written on the proven machine would reach every other
		// claimant, so they are detached first, or nothing is written.
		if x.err = r.detach(ctx, x.m, x.others, x.recordOwn); x.err == nil {
			x.credentialsSet, x.wrote, x.err = r.reconcileCredentials(ctx, r.logFor(x.m), x.m, x.vm, x.recordOwn)
		}
	})
	recordAll(all)
	for _, x := range all {
		if x.wrote {
			written = append(written, x)
		}
	}
	// One read-back for every write of the cycle, not one per write.
	if len(written) > 0 {
		params, err := r.MaaS.PowerParameters(ctx)
		for _, x := range written {
			if err == nil {
				x.err = cmp.Or(r.checkOwnAddress(ctx, x.m, params[x.m.SystemID], record), r.detachOtherHolders(ctx, x.m, x.vm.Credentials, params))
			} else {
				x.err = fmt.Errorf("read back power parameters: %w", err)
			}
			x.credentialsSet = x.err == nil
		}
	}
	ownsIdentity := func(x *bound) bool {
		// A missing Secret does not stop a New machine being named.
		return (x.err == nil || errors.Is(x.err, ErrNotFound)) &&
			(x.m.Status == StatusNew || (x.m.Status == StatusReady && x.credentialsSet))
	}
	var poolsWanted []string
	for _, x := range all {
		if ownsIdentity(x) && x.m.Pool.Name != x.m.vm.Namespace && !slices.Contains(poolsWanted, x.m.vm.Namespace) {
			poolsWanted = append(poolsWanted, x.m.vm.Namespace)
		}
	}
	poolErrs := r.ensurePools(ctx, poolsWanted, record)
	var identities []*bound
	for _, x := range all {
		if ownsIdentity(x) {
			identities = append(identities, x)
			if poolErrs[x.m.vm.Namespace] == nil {
				r.renameSquatters(ctx, x.m, x.others, holders, record)
				x.hostname, x.hostnameErr = claimHostname(x.m, holders)
			}
		}
	}
	r.eachConcurrently(len(identities), func(i int) {
		x := identities[i]
		m, err := r.reconcileIdentityAndCommission(ctx, x, poolErrs, now)
		x.m.Machine, x.err = m, cmp.Or(err, x.err)
	})
	recordAll(identities)
	for _, x := range identities {
		current[x.m.SystemID] = x.m.Machine
	}
	for _, x := range all {
		if x.err != nil {
			failures[x.m.SystemID] = x.err
		}
	}
	return current, failures
}

// ensurePools creates the wanted pools that are missing. It lists pools only
// when some machine needs moving, and creates each missing pool once. It
// returns, per namespace, why its pool may not exist: the failure is its
// machines', not the fleet's.
func (r *Reconciler) ensurePools(ctx context.Context, wanted []string, record func(Change)) map[string]error {
	if len(wanted) == 0 {
		return nil
	}
	poolErrs := map[string]error{}
	pools, err := r.MaaS.Pools(ctx)
	if err != nil {
		err = fmt.Errorf("list resource pools: %w", err)
		for _, name := range wanted {
			poolErrs[name] = err
		}
		return poolErrs
	}
	for _, name := range wanted {
		if slices.ContainsFunc(pools, func(p Pool) bool { return p.Name == name }) {
			continue
		}
		record(Change{Action: ActionCreatePool, Detail: name})
		if r.DryRun {
			continue
		}
		_, err := r.MaaS.CreatePool(ctx, name, "VMs of Kubernetes namespace "+name+" (virtmetal)")
		switch {
		case err == nil:
			r.Log.Info("created resource pool", "pool", name)
		case errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrConflict):
			// MaaS refuses a duplicate name; someone created it since we
			// listed. Moving machines into it will tell if it is not there.
			r.Log.Info("resource pool creation refused, assuming it exists", "pool", name, "reason", err.Error())
		default:
			err = fmt.Errorf("create resource pool %q: %w", name, err)
			poolErrs[name] = err
		}
	}
	return poolErrs
}

func (r *Reconciler) logFor(m managedMachine) logr.Logger {
	return r.Log.WithValues("systemID", m.SystemID, "namespace", m.vm.Namespace, "vm", m.vm.Name)
}

// reconcileIdentityAndCommission sets the hostname and pool and, for a New
// machine whose credentials are in place, commissions it, unless MaaS
// refused that and the wait the VM's status reports has not ended. It
// returns the machine as MaaS last showed it.
func (r *Reconciler) reconcileIdentityAndCommission(ctx context.Context, x *bound, poolErrs map[string]error, now metav1.Time) (Machine, error) {
	log, m := r.logFor(x.m), x.m
	current, identitySet, err := r.reconcileIdentity(ctx, log, m, x.hostname, x.hostnameErr, poolErrs, x.recordOwn)
	if err != nil || !identitySet || m.Status != StatusNew {
		return current, err
	}
	if !x.credentialsSet {
		log.Info("not commissioning until the BMC credentials are set")
		return current, nil
	}
	if refused, waiting := commissionWaiting(x.vm.Reported, current, now.Time); waiting {
		log.V(1).Info("commission refused before, waiting", "retryAfter", refused.RetryAfter.Time)
		return current, &failureKind{reason: ReasonCommissionRefused, waiting: true,
			err: fmt.Errorf("%s (next try after %s)", refused.Message, refused.RetryAfter.UTC().Format(time.RFC3339))}
	}
	x.recordOwn(Change{Action: ActionCommission, SystemID: m.SystemID, VM: m.vm, Detail: "New machine"})
	if r.DryRun {
		return current, nil
	}
	if err := r.recordBinding(ctx, x.vm, current, now); err != nil {
		return current, err
	}
	// The power parameters are right already, so the bmc-config scripts must
	// not run again: MaaS would store their YAML and its placeholder
	// password.
	commissioned, err := r.MaaS.Commission(ctx, m.SystemID, CommissionOptions{SkipBMCConfig: true})
	if err != nil {
		err = fmt.Errorf("commission %s: %w", m.SystemID, err)
		if errors.Is(err, ErrInvalidArgument) {
			return current, &failureKind{reason: ReasonCommissionRefused, err: err}
		}
		return current, err
	}
	log.Info("commissioning started", "hostname", commissioned.Hostname)
	return commissioned, nil
}

// recordBinding writes the VM's status naming m before m is commissioned,
// unless it names m already: commissioning replaces the script output that
// proved m, so from then on only the status tells it is the VM's machine
// (the incumbent). When the write fails, m is not commissioned this cycle.
func (r *Reconciler) recordBinding(ctx context.Context, vm *EnrolledVM, m Machine, now metav1.Time) error {
	if incumbent(vm) == m.SystemID {
		return nil
	}
	status := MachineStatus{
		MaaS: &v1beta1.MaaSStatus{SystemID: m.SystemID, StatusName: statusName(m), Hostname: m.Hostname, Pool: m.Pool.Name, LastUpdateTime: &now},
		Condition: &metav1.Condition{Type: v1beta1.ConditionMaaSMachine, Status: metav1.ConditionTrue, Reason: ReasonBound,
			Message: boundMessage(m.SystemID), LastTransitionTime: now},
	}
	if err := r.Cluster.ReportStatus(ctx, vm.VM, status); err != nil {
		return fmt.Errorf("not commissioned: the binding could not be recorded first (commissioning replaces the output that proves it): %w", err)
	}
	return nil
}

// detach moves every machine but the proven one off the VM's BMC: power type
// manual gives it a BMC row of its own in MaaS. A machine detached stays
// detached (it is no longer a redfish machine), so this costs one request
// per claimant, once.
func (r *Reconciler) detach(ctx context.Context, proven managedMachine, others []managedMachine, record func(Change)) error {
	for _, m := range others {
		record(Change{Action: ActionDetach, SystemID: m.SystemID, VM: proven.vm,
			Detail: "power type manual: it claims the BMC of the VM proven to be machine " + proven.SystemID})
		if r.DryRun {
			continue
		}
		if _, err := r.MaaS.UpdateMachine(ctx, m.SystemID, MachineUpdate{PowerType: PowerTypeManual}); err != nil {
			return &failureKind{reason: ReasonDuplicateClaim,
				err: fmt.Errorf("machine %s also claims this VM's BMC and could not be detached from it, so no credentials are written: %w", m.SystemID, err)}
		}
		r.logFor(m).Info("machine claiming another machine's VM detached from its BMC (power type manual)", "provenSystemID", proven.SystemID)
	}
	return nil
}

// detachOtherHolders checks the power parameters read back after a
// credential write: a machine other than the proven one that holds the VM's
// credentials (it shares the BMC row in a way the list did not show) is
// detached, and the write counts as failed.
func (r *Reconciler) detachOtherHolders(ctx context.Context, m managedMachine, creds Credentials, params map[string]PowerParameters) error {
	var holders []string
	for systemID, p := range params {
		if systemID != m.SystemID && p.String(PowerPass) == creds.Password && p.String(PowerUser) == creds.Username {
			holders = append(holders, systemID)
		}
	}
	slices.Sort(holders)
	for _, systemID := range holders {
		if _, err := r.MaaS.UpdateMachine(ctx, systemID, MachineUpdate{PowerType: PowerTypeManual}); err != nil {
			return &failureKind{reason: ReasonDuplicateClaim, err: fmt.Errorf("machine %s holds this VM's credentials and could not be detached: %w", systemID, err)}
		}
	}
	if len(holders) > 0 {
		return &failureKind{reason: ReasonDuplicateClaim, err: fmt.Errorf("machines %v held this VM's credentials after they were written; detached", holders)}
	}
	return nil
}

// checkOwnAddress checks, in the power parameters read back after a
// credential write, that the machine still names its VM's BMC: when its
// address changed after the write, MaaS would send the VM's password to
// that other address, so it is blanked and the write counts as failed.
func (r *Reconciler) checkOwnAddress(ctx context.Context, m managedMachine, readBack PowerParameters, record func(Change)) error {
	address := readBack.String(PowerAddress)
	if address == BMCAddress(m.vm, r.Domain) {
		return nil
	}
	err := fmt.Errorf("machine %s's power address changed to %q while its credentials were written", m.SystemID, address)
	if blankErr := r.blankCredentials(ctx, m.Machine, m.vm, readBack, record); blankErr != nil {
		return fmt.Errorf("%w; blanking them failed: %w", err, blankErr)
	}
	return fmt.Errorf("%w; blanked", err)
}

// blankCredentials replaces a machine's power user and password with
// placeholders (PlaceholderUser, a random password), sending its power
// type, address and node id with them as every credential write does: it
// no longer names vm's BMC but may hold vm's credentials.
func (r *Reconciler) blankCredentials(ctx context.Context, m Machine, vm VMRef, params PowerParameters, record func(Change)) error {
	record(Change{Action: ActionBlankCredentials, SystemID: m.SystemID, VM: vm,
		Detail: fmt.Sprintf("its power address %q no longer names the VM's BMC", params.String(PowerAddress))})
	if r.DryRun {
		return nil
	}
	// Not empty strings: MaaS refuses empty Redfish credentials
	// (docs/maas-region.md, 4), and the VM's would stay.
	blank := map[string]string{PowerAddress: params.String(PowerAddress), PowerNodeID: params.String(PowerNodeID), PowerUser: PlaceholderUser, PowerPass: placeholderPassword()}
	if _, err := r.MaaS.UpdateMachine(ctx, m.SystemID, MachineUpdate{PowerType: PowerTypeRedfish, PowerParameters: blank}); err != nil {
		return fmt.Errorf("blank power credentials of %s: %w", m.SystemID, err)
	}
	r.Log.Info("power credentials blanked: the machine no longer names its VM's BMC", "systemID", m.SystemID, "namespace", vm.Namespace, "vm", vm.Name)
	return nil
}

// blankStrayed blanks the credentials of each VM's incumbent machine that
// no longer claims it (its power address names another BMC, or none) while
// it still holds the VM's credentials. One request per such machine, once:
// afterwards it holds none. The machine list is searched only when some
// incumbent strayed.
func (r *Reconciler) blankStrayed(ctx context.Context, bindings []binding, machines []Machine, inMaaS map[string]bool, params map[string]PowerParameters, record func(Change)) []MachineFailure {
	strayed := map[string]*EnrolledVM{}
	for _, b := range bindings {
		id := incumbent(b.vm)
		if id == "" || !inMaaS[id] || b.vm.CredentialsErr != nil || slices.ContainsFunc(b.claims, func(c claim) bool { return c.m.SystemID == id }) {
			continue
		}
		if params[id].String(PowerPass) == b.vm.Credentials.Password {
			strayed[id] = b.vm
		}
	}
	if len(strayed) == 0 {
		return nil
	}
	var failures []MachineFailure
	for _, m := range machines {
		vm, ok := strayed[m.SystemID]
		if !ok || m.PowerType != PowerTypeRedfish {
			continue
		}
		if err := r.blankCredentials(ctx, m, vm.VM, params[m.SystemID], record); err != nil {
			failures = append(failures, MachineFailure{SystemID: m.SystemID, VM: vm.VM, Err: err})
		}
	}
	return failures
}

// reconcileCredentials copies the BMC Secret into the power parameters when
// they differ. It reports whether MaaS has (or, in a dry run, would have) the
// Secret's credentials, and whether it wrote them (the caller reads them
// back); the error wraps ErrNotFound when the Secret is missing.
func (r *Reconciler) reconcileCredentials(ctx context.Context, log logr.Logger, m managedMachine, vm *EnrolledVM, record func(Change)) (set, wrote bool, err error) {
	if vm.CredentialsErr != nil {
		return false, false, vm.CredentialsErr
	}
	creds := vm.Credentials
	// Credentials travel with the address they are for: every write sends
	// the whole set, so a machine whose address someone changed since the
	// cycle's list gets the VM's address back with the VM's password, never
	// the password next to another address.
	want := map[string]string{
		PowerAddress: BMCAddress(m.vm, r.Domain),
		PowerUser:    creds.Username,
		PowerPass:    creds.Password,
		PowerNodeID:  m.vm.Name,
	}
	// changed names what differs, for the record. An address of an older
	// commissioning script (https://, a port, a slash) differs too: MaaS 3.4
	// refuses any power change of a machine whose address has a scheme.
	changed := map[string]string{}
	for key, value := range want {
		if m.params.String(key) != value {
			changed[key] = value
		}
	}
	if len(changed) == 0 {
		return true, false, nil
	}
	record(Change{Action: ActionSetCredentials, SystemID: m.SystemID, VM: m.vm, Detail: changedKeys(changed) + " from the BMC's credentials"})
	if r.DryRun {
		return true, false, nil
	}
	if _, err := r.MaaS.UpdateMachine(ctx, m.SystemID, MachineUpdate{PowerType: PowerTypeRedfish, PowerParameters: want}); err != nil {
		err = fmt.Errorf("set power credentials of %s: %w", m.SystemID, err)
		if addressRejected(err) {
			return false, false, &failureKind{reason: ReasonAddressRejected, err: err}
		}
		return false, false, err
	}
	log.Info("power credentials updated", "keys", changedKeys(changed))
	return true, true, nil
}

// reconcileIdentity gives a machine its hostname and pool. It returns the
// machine as MaaS last showed it, and whether both are (or, in a dry run,
// would be) in place.
func (r *Reconciler) reconcileIdentity(ctx context.Context, log logr.Logger, m managedMachine, hostname string, hostnameErr error, poolErrs map[string]error, record func(Change)) (Machine, bool, error) {
	if err := poolErrs[m.vm.Namespace]; err != nil {
		return m.Machine, false, err
	}
	if hostnameErr != nil {
		return m.Machine, false, hostnameErr
	}
	update := MachineUpdate{}
	if m.Hostname != hostname {
		update.Hostname = hostname
	}
	if m.Pool.Name != m.vm.Namespace {
		update.Pool = m.vm.Namespace
	}
	if update.Hostname == "" && update.Pool == "" {
		return m.Machine, true, nil
	}
	record(Change{Action: ActionSetIdentity, SystemID: m.SystemID, VM: m.vm,
		Detail: fmt.Sprintf("hostname %q → %q, pool %q → %q", m.Hostname, hostname, m.Pool.Name, m.vm.Namespace)})
	if r.DryRun {
		return m.Machine, true, nil
	}
	updated, err := r.MaaS.UpdateMachine(ctx, m.SystemID, update)
	// A node the machine list does not show (a device, a controller) may
	// hold the name: take the VM's next one.
	candidates := hostnames(m)
	for next := slices.Index(candidates, update.Hostname) + 1; hostnameRefused(err) && next > 0 && next < len(candidates); next++ {
		log.Info("hostname taken by another node, using the next one", "hostname", update.Hostname, "reason", err.Error())
		hostname = candidates[next]
		update.Hostname = hostname
		updated, err = r.MaaS.UpdateMachine(ctx, m.SystemID, update)
	}
	if err != nil {
		return m.Machine, false, fmt.Errorf("set hostname and pool of %s: %w", m.SystemID, err)
	}
	log.Info("hostname and pool set", "hostname", hostname, "pool", m.vm.Namespace)
	return updated, true, nil
}

// addressRejected tells whether MaaS refused a power address: 3.4's region
// answers 500 with netaddr's error for one it cannot parse as an IP or host
// name; a 500 saying nothing of an address is some other failure.
func addressRejected(err error) bool {
	apiErr, ok := errors.AsType[*APIError](err)
	return ok && apiErr.StatusCode == http.StatusInternalServerError && strings.Contains(strings.ToLower(apiErr.Message), "address")
}

// hostnameRefused tells whether MaaS refused a form for its hostname field.
func hostnameRefused(err error) bool {
	var apiErr *APIError
	return errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusBadRequest &&
		strings.Contains(apiErr.Message, `"hostname"`)
}

// renameSquatters gives the VM's predictable names back to its proven
// machine m: another machine claiming the VM that is not proven (detached
// from the VM's BMC this cycle or before) and still New, holding one of
// them, is renamed after its own system ID ("unproven-<id>"). A machine
// in any other status keeps its name (it may be deployed under it), and
// so does a machine that does not claim the VM (a physical server, say):
// claimHostname then falls back to a name no one can predict. holders is
// updated.
func (r *Reconciler) renameSquatters(ctx context.Context, m managedMachine, others []managedMachine, holders map[string]string, record func(Change)) {
	candidates := hostnames(m)
	if slices.Contains(candidates, m.Hostname) {
		return
	}
	for _, o := range others {
		if o.Status != StatusNew || !slices.Contains(candidates[:2], o.Hostname) || holders[o.Hostname] != o.SystemID {
			continue
		}
		name := "unproven-" + strings.ToLower(o.SystemID)
		record(Change{Action: ActionRenameSquatter, SystemID: o.SystemID, VM: m.vm,
			Detail: fmt.Sprintf("hostname %q → %q: it claims the VM's BMC unproven, and machine %s is the VM", o.Hostname, name, m.SystemID)})
		if !r.DryRun {
			if _, err := r.MaaS.UpdateMachine(ctx, o.SystemID, MachineUpdate{Hostname: name}); err != nil {
				r.logFor(o).Error(err, "could not rename the unproven machine holding the VM's hostname")
				continue
			}
		}
		delete(holders, o.Hostname)
		holders[name] = o.SystemID
	}
}

// hostnames are the names the VM's machine may take, in order of
// preference.
func hostnames(m managedMachine) []string {
	return []string{Hostname(m.vm), HashedHostname(m.vm), SystemHostname(m.vm, m.SystemID)}
}

// claimHostname picks the machine's hostname: it keeps any of its VM's
// names if it has one already (so a name never flips), else takes the first
// one no other machine holds. The first two are predictable from the VM's
// name, so another machine (an anonymous enlistment) may hold both; the
// last has the machine's own system ID, which no one knows before it
// enlists. holders is updated so two machines of one cycle cannot pick the
// same name.
func claimHostname(m managedMachine, holders map[string]string) (string, error) {
	candidates := hostnames(m)
	if slices.Contains(candidates, m.Hostname) {
		return m.Hostname, nil
	}
	for _, name := range candidates {
		if holder, taken := holders[name]; !taken || holder == m.SystemID {
			holders[name] = m.SystemID
			return name, nil
		}
	}
	return "", fmt.Errorf("machine %s: hostnames %q are held by other machines: %w",
		m.SystemID, candidates, ErrConflict)
}

// wantedStatus is what the VM's VirtualMachineBMC status should say of its
// MaaS machine; LastUpdateTime and LastTransitionTime are left to report.
func (r *Reconciler) wantedStatus(b binding, current map[string]Machine, failure error, inMaaS map[string]bool, now metav1.Time) MachineStatus {
	condition := func(status metav1.ConditionStatus, reason, message string) *metav1.Condition {
		return &metav1.Condition{Type: v1beta1.ConditionMaaSMachine, Status: status, Reason: reason, Message: message}
	}
	if b.winner < 0 {
		var others []string
		for _, c := range b.claims {
			others = append(others, c.m.SystemID+" ("+c.why+")")
		}
		switch {
		case len(b.claims) == 0:
			return MachineStatus{Condition: condition(metav1.ConditionFalse, ReasonNoMachine, "no MaaS machine's power address names this VM's BMC")}
		case b.tie:
			return MachineStatus{Condition: condition(metav1.ConditionFalse, ReasonDuplicateClaim,
				"machines "+strings.Join(others, ", ")+" claim this VM and more than one carries its machine proof; none gets its credentials until the others are deleted from MaaS")}
		}
		return MachineStatus{Condition: condition(metav1.ConditionFalse, ReasonUnverified,
			"no machine claiming this VM is proven to be it, so none gets its credentials: "+strings.Join(others, ", "))}
	}
	m := current[b.claims[b.winner].m.SystemID]
	problems := r.problems(b, m, failure, inMaaS, now)
	status := MachineStatus{MaaS: &v1beta1.MaaSStatus{SystemID: m.SystemID, StatusName: statusName(m), Hostname: m.Hostname, Pool: m.Pool.Name, Problems: problems}}
	if len(problems) == 0 {
		status.Condition = condition(metav1.ConditionTrue, ReasonBound, boundMessage(m.SystemID))
		return status
	}
	// Every problem is named: a refusal must not hide that the VM is also
	// claimed.
	messages := []string{boundMessage(m.SystemID)}
	for _, p := range problems {
		messages = append(messages, p.Reason+": "+p.Message)
	}
	status.Condition = condition(metav1.ConditionFalse, problems[0].Reason, strings.Join(messages, "; "))
	return status
}

// boundMessage says which machine is the VM's; the same whether it proved
// itself this cycle or was bound before, so a bound VM's status is not
// rewritten.
func boundMessage(systemID string) string {
	return "machine " + systemID + " is this VM (proven by its machine proof, or bound before machine proofs)"
}

func statusName(m Machine) string {
	if m.StatusName != "" {
		return m.StatusName
	}
	return "status " + strconv.Itoa(int(m.Status))
}

// upToDate tells whether the reported status says what is wanted, the
// report's timestamps aside; a timestamp someone removed makes it out of
// date.
func upToDate(want, reported MachineStatus) bool {
	if (want.MaaS == nil) != (reported.MaaS == nil) || reported.Condition == nil {
		return false
	}
	if w, r := want.MaaS, reported.MaaS; w != nil && (w.SystemID != r.SystemID || w.StatusName != r.StatusName ||
		w.Hostname != r.Hostname || w.Pool != r.Pool || r.LastUpdateTime == nil || !problemsEqual(w.Problems, r.Problems)) {
		return false
	}
	w, r := want.Condition, reported.Condition
	return w.Status == r.Status && w.Reason == r.Reason && w.Message == r.Message && !r.LastTransitionTime.IsZero()
}

// report writes the wanted status when it differs from what the
// VirtualMachineBMC shows, and records a Warning Event for each problem
// that is new, or an Event when the condition's status or reason changes.
// The status itself is the memory of what was reported. It returns the
// status as written (or as it stands).
func (r *Reconciler) report(ctx context.Context, b binding, want MachineStatus, now metav1.Time, record func(Change)) (MachineStatus, error) {
	reported := b.vm.Reported
	if upToDate(want, reported) {
		return want, nil
	}
	c := want.Condition
	c.LastTransitionTime = now
	if reported.Condition != nil && reported.Condition.Status == c.Status && !reported.Condition.LastTransitionTime.IsZero() {
		c.LastTransitionTime = reported.Condition.LastTransitionTime
	}
	log := r.Log.WithValues("namespace", b.vm.VM.Namespace, "vm", b.vm.VM.Name)
	if want.MaaS != nil {
		want.MaaS.LastUpdateTime = &now
		log = log.WithValues("systemID", want.MaaS.SystemID)
	}
	log.Info("MaaS machine status", "condition", string(c.Status), "reason", c.Reason, "message", c.Message)
	record(Change{Action: ActionReport, SystemID: systemIDOf(want), VM: b.vm.VM, Detail: c.Reason + ": " + c.Message})
	if r.DryRun {
		return want, nil
	}
	if err := r.Cluster.ReportStatus(ctx, b.vm.VM, want); err != nil {
		return want, fmt.Errorf("report status: %w", err)
	}
	type event struct{ eventType, reason, message string }
	var events []event
	if reported.Condition == nil || reported.Condition.Status != c.Status || reported.Condition.Reason != c.Reason {
		eventType := corev1.EventTypeWarning
		if c.Status == metav1.ConditionTrue {
			eventType = corev1.EventTypeNormal
		}
		events = append(events, event{eventType, "MaaSMachine" + c.Reason, c.Message})
	}
	if want.MaaS != nil {
		var before []v1beta1.MaaSProblem
		if reported.MaaS != nil && reported.MaaS.SystemID == want.MaaS.SystemID {
			before = reported.MaaS.Problems
		}
		for _, p := range want.MaaS.Problems {
			isNew := !slices.ContainsFunc(before, func(q v1beta1.MaaSProblem) bool { return q.Reason == p.Reason })
			if isNew && p.Reason != c.Reason {
				events = append(events, event{corev1.EventTypeWarning, "MaaSMachine" + p.Reason, p.Message})
			}
		}
	}
	for _, e := range events {
		if err := r.Cluster.RecordEvent(ctx, b.vm, e.eventType, e.reason, e.message); err != nil {
			// The status says it already; an Event is a courtesy.
			log.Error(err, "recording event")
		}
	}
	return want, nil
}

func systemIDOf(s MachineStatus) string {
	if s.MaaS == nil {
		return ""
	}
	return s.MaaS.SystemID
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func changedKeys(changed map[string]string) string {
	return fmt.Sprint(slices.Sorted(maps.Keys(changed)))
}

// Run reconciles every interval until ctx ends. After a cycle that failed as
// a whole it waits longer each time (see RetryDelay) so a struggling MaaS or
// API server is not hammered; the next successful cycle restores the
// interval. A single machine's failure does not slow the fleet.
func (r *Reconciler) Run(ctx context.Context, interval, maxBackoff time.Duration) error {
	failures := 0
	for {
		if _, err := r.Reconcile(ctx); err != nil {
			failures++
			r.Log.Error(err, "cycle failed", "consecutiveFailures", failures)
		} else {
			failures = 0
		}
		timer := time.NewTimer(RetryDelay(interval, maxBackoff, failures))
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
	}
}

// RetryDelay is the wait before the next cycle: interval after a success,
// doubling with each consecutive failure, capped at maxBackoff (but never
// shorter than interval).
func RetryDelay(interval, maxBackoff time.Duration, failures int) time.Duration {
	limit := max(maxBackoff, interval)
	delay := interval
	for range max(failures-1, 0) {
		if delay >= limit/2 {
			return limit
		}
		delay *= 2
	}
	return min(delay, limit)
}
