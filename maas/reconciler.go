package maas

import (
	"cmp"
	"context"
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
)

// Reconciler brings the MaaS machines whose power address is a virtmetal BMC
// under Domain to their wanted state, and reports them to Kubernetes:
//
//   - power_user/power_pass (and node_id) follow the VM's BMC Secret, in every
//     status: a rotated password must reach Ready and Deployed machines too,
//     or MaaS loses power control;
//   - hostname "<vm>-<namespace>" and the resource pool named after the
//     namespace (created when missing) are set while the machine is New, and
//     while it is Ready once its VM's BMC Secret is found: MaaS commissions
//     at enlistment by default (enlist_commissioning), so a machine may be
//     Ready before the reconciler first sees it. A Ready machine renamed or
//     moved by hand is put back. Machines in any other status (allocated,
//     deployed, commissioning, failed, broken...) keep their names: renaming
//     a deployed machine would change its DNS name under its workload;
//   - a New machine is commissioned once its credentials, hostname and pool
//     are in place (MaaS needs the credentials to power it on). Machines in
//     any other status are never commissioned.
//
// One cycle costs one machine list and one bulk power-parameters request,
// plus a pool list only when some machine needs moving, plus one request per
// change: machines that need nothing cost nothing. Machines of other tools
// and physical servers are left alone.
//
// A Reconciler remembers what it last reported to Kubernetes; it is not safe
// for concurrent use.
type Reconciler struct {
	MaaS    *Client
	Cluster Cluster
	// Domain is the DNS domain of the BMC addresses: <vm>.<namespace>.<Domain>.
	Domain string
	// DryRun plans changes and prints them to Out instead of making them.
	DryRun bool
	Out    io.Writer
	Log    logr.Logger

	reported map[VMRef]report
}

type report struct{ systemID, status string }

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
	ActionSetIdentity    = "set hostname and pool"
	ActionCommission     = "commission"
	ActionReport         = "annotate VM"
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
	Managed  int      // machines whose power address is one of ours
	Changes  []Change // made, or planned in a dry run
}

// managedMachine is a MaaS machine whose BMC is a virtmetal VM's.
type managedMachine struct {
	Machine
	vm     VMRef
	params PowerParameters
}

// Reconcile runs one cycle. It returns every failure joined; machines not
// touched by a failure are still reconciled, and nothing half-done is
// repeated wrongly next cycle (pools are looked up before creation, and a
// machine is commissioned only while MaaS says it is New).
func (r *Reconciler) Reconcile(ctx context.Context) (CycleResult, error) {
	var result CycleResult
	machines, err := r.MaaS.Machines(ctx)
	if err != nil {
		return result, fmt.Errorf("list machines: %w", err)
	}
	params, err := r.MaaS.PowerParameters(ctx)
	if err != nil {
		return result, fmt.Errorf("read power parameters: %w", err)
	}
	result.Machines = len(machines)

	holders := make(map[string]string, len(machines)) // hostname → system_id
	var managed []managedMachine
	for _, m := range machines {
		holders[m.Hostname] = m.SystemID
		if m.PowerType != PowerTypeRedfish {
			continue
		}
		vm, ok := ParseBMCAddress(params[m.SystemID].String(PowerAddress), r.Domain)
		if !ok {
			continue
		}
		managed = append(managed, managedMachine{Machine: m, vm: vm, params: params[m.SystemID]})
	}
	slices.SortFunc(managed, func(a, b managedMachine) int { return cmp.Compare(a.SystemID, b.SystemID) })
	result.Managed = len(managed)

	var errs []error
	record := func(c Change) {
		result.Changes = append(result.Changes, c)
		if r.DryRun && r.Out != nil {
			fmt.Fprintln(r.Out, "would "+c.String())
		}
	}
	fail := func(err error) {
		errs = append(errs, err)
	}

	// Credentials first: whether a VM's Secret exists decides whether a
	// Ready machine is ours to name, and so which pools are needed.
	credentialsSet := make([]bool, len(managed))
	credentialsErr := make([]error, len(managed))
	for i, m := range managed {
		credentialsSet[i], credentialsErr[i] = r.reconcileCredentials(ctx, r.logFor(m), m, record)
	}
	ownsIdentity := func(i int) bool {
		return managed[i].Status == StatusNew || (managed[i].Status == StatusReady && credentialsSet[i])
	}
	var poolsWanted []string
	for i, m := range managed {
		if credentialsErr[i] == nil && ownsIdentity(i) && m.Pool.Name != m.vm.Namespace && !slices.Contains(poolsWanted, m.vm.Namespace) {
			poolsWanted = append(poolsWanted, m.vm.Namespace)
		}
	}
	poolErrs := r.ensurePools(ctx, poolsWanted, record, fail)
	for i, m := range managed {
		current, err := m.Machine, credentialsErr[i]
		if err == nil && ownsIdentity(i) {
			current, err = r.reconcileIdentityAndCommission(ctx, r.logFor(m), m, credentialsSet[i], holders, poolErrs, record)
		}
		if err := errors.Join(err, r.report(ctx, r.logFor(m), m, current, record)); err != nil {
			fail(err)
		}
	}
	r.Log.Info("cycle done", "machines", result.Machines, "managed", result.Managed,
		"changes", len(result.Changes), "errors", len(errs), "dryRun", r.DryRun)
	return result, errors.Join(errs...)
}

// ensurePools creates the wanted pools that are missing. It lists pools only
// when some machine needs moving, and creates each missing pool once. It
// returns, per namespace, why its pool may not exist.
func (r *Reconciler) ensurePools(ctx context.Context, wanted []string, record func(Change), fail func(error)) map[string]error {
	if len(wanted) == 0 {
		return nil
	}
	poolErrs := map[string]error{}
	pools, err := r.MaaS.Pools(ctx)
	if err != nil {
		err = fmt.Errorf("list resource pools: %w", err)
		fail(err)
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
			fail(err)
			poolErrs[name] = err
		}
	}
	return poolErrs
}

func (r *Reconciler) logFor(m managedMachine) logr.Logger {
	return r.Log.WithValues("systemID", m.SystemID, "namespace", m.vm.Namespace, "vm", m.vm.Name)
}

// reconcileIdentityAndCommission sets the hostname and pool and, for a New
// machine whose credentials are in place, commissions it. It returns the
// machine as MaaS last showed it.
func (r *Reconciler) reconcileIdentityAndCommission(ctx context.Context, log logr.Logger, m managedMachine, credentialsSet bool, holders map[string]string, poolErrs map[string]error, record func(Change)) (Machine, error) {
	identitySet, err := r.reconcileIdentity(ctx, log, m, holders, poolErrs, record)
	if err != nil || !identitySet || m.Status != StatusNew {
		return m.Machine, err
	}
	if !credentialsSet {
		log.Info("not commissioning until the BMC secret exists", "secret", BMCSecretName(m.vm.Name))
		return m.Machine, nil
	}
	record(Change{Action: ActionCommission, SystemID: m.SystemID, VM: m.vm, Detail: "New machine"})
	if r.DryRun {
		return m.Machine, nil
	}
	// The power parameters are right already, so the bmc-config scripts must
	// not run again: MaaS would store their YAML and blank the password.
	commissioned, err := r.MaaS.Commission(ctx, m.SystemID, CommissionOptions{SkipBMCConfig: true})
	if err != nil {
		return m.Machine, fmt.Errorf("commission %s: %w", m.SystemID, err)
	}
	log.Info("commissioning started", "hostname", commissioned.Hostname)
	return commissioned, nil
}

// reconcileCredentials copies the BMC Secret into the power parameters when
// they differ. It reports whether MaaS has (or, in a dry run, would have) the
// Secret's credentials.
func (r *Reconciler) reconcileCredentials(ctx context.Context, log logr.Logger, m managedMachine, record func(Change)) (bool, error) {
	creds, err := r.Cluster.BMCCredentials(ctx, m.vm)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("machine %s: %w", m.SystemID, err)
	}
	changed := map[string]string{}
	if m.params.String(PowerUser) != creds.Username {
		changed[PowerUser] = creds.Username
	}
	if m.params.String(PowerPass) != creds.Password {
		changed[PowerPass] = creds.Password
	}
	if m.params.String(PowerNodeID) != m.vm.Name {
		changed[PowerNodeID] = m.vm.Name
	}
	if len(changed) == 0 {
		return true, nil
	}
	record(Change{Action: ActionSetCredentials, SystemID: m.SystemID, VM: m.vm, Detail: changedKeys(changed) + " from secret " + BMCSecretName(m.vm.Name)})
	if r.DryRun {
		return true, nil
	}
	if _, err := r.MaaS.UpdateMachine(ctx, m.SystemID, MachineUpdate{PowerType: PowerTypeRedfish, PowerParameters: changed}); err != nil {
		return false, fmt.Errorf("set power credentials of %s: %w", m.SystemID, err)
	}
	log.Info("power credentials updated", "keys", changedKeys(changed))
	return true, nil
}

// reconcileIdentity gives a machine its hostname and pool. It reports
// whether both are (or, in a dry run, would be) in place.
func (r *Reconciler) reconcileIdentity(ctx context.Context, log logr.Logger, m managedMachine, holders map[string]string, poolErrs map[string]error, record func(Change)) (bool, error) {
	if poolErrs[m.vm.Namespace] != nil {
		// The pool failure is reported once, by ensurePools.
		log.Info("waiting for resource pool", "pool", m.vm.Namespace)
		return false, nil
	}
	hostname, err := claimHostname(m, holders)
	if err != nil {
		return false, err
	}
	update := MachineUpdate{}
	if m.Hostname != hostname {
		update.Hostname = hostname
	}
	if m.Pool.Name != m.vm.Namespace {
		update.Pool = m.vm.Namespace
	}
	if update.Hostname == "" && update.Pool == "" {
		return true, nil
	}
	record(Change{Action: ActionSetIdentity, SystemID: m.SystemID, VM: m.vm,
		Detail: fmt.Sprintf("hostname %q → %q, pool %q → %q", m.Hostname, hostname, m.Pool.Name, m.vm.Namespace)})
	if r.DryRun {
		return true, nil
	}
	_, err = r.MaaS.UpdateMachine(ctx, m.SystemID, update)
	if hostnameRefused(err) && update.Hostname == Hostname(m.vm) {
		// A node the machine list does not show (a device, a controller)
		// holds the name: take the VM's other name.
		log.Info("hostname taken by another node, using the hashed one", "hostname", update.Hostname, "reason", err.Error())
		hostname = HashedHostname(m.vm)
		update.Hostname = hostname
		_, err = r.MaaS.UpdateMachine(ctx, m.SystemID, update)
	}
	if err != nil {
		return false, fmt.Errorf("set hostname and pool of %s: %w", m.SystemID, err)
	}
	log.Info("hostname and pool set", "hostname", hostname, "pool", m.vm.Namespace)
	return true, nil
}

// hostnameRefused tells whether MaaS refused a form for its hostname field.
func hostnameRefused(err error) bool {
	var apiErr *APIError
	return errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusBadRequest &&
		strings.Contains(apiErr.Message, `"hostname"`)
}

// claimHostname picks the machine's hostname: it keeps either of its VM's
// names if it has one already (so a name never flips), else takes the first
// one no other machine holds. holders is updated so two machines of one
// cycle cannot pick the same name.
func claimHostname(m managedMachine, holders map[string]string) (string, error) {
	candidates := []string{Hostname(m.vm), HashedHostname(m.vm)}
	if slices.Contains(candidates, m.Hostname) {
		return m.Hostname, nil
	}
	for _, name := range candidates {
		if holder, taken := holders[name]; !taken || holder == m.SystemID {
			holders[name] = m.SystemID
			return name, nil
		}
	}
	return "", fmt.Errorf("machine %s: hostnames %q are held by other machines (a second MaaS machine for vm %s?): %w",
		m.SystemID, candidates, m.vm, ErrConflict)
}

func (r *Reconciler) report(ctx context.Context, log logr.Logger, m managedMachine, current Machine, record func(Change)) error {
	status := current.StatusName
	if status == "" {
		status = "status " + strconv.Itoa(current.Status)
	}
	want := report{systemID: current.SystemID, status: status}
	if r.reported[m.vm] == want {
		return nil
	}
	record(Change{Action: ActionReport, SystemID: m.SystemID, VM: m.vm, Detail: "MaaS status " + status})
	if r.DryRun {
		return nil
	}
	err := r.Cluster.ReportMachine(ctx, m.vm, want.systemID, want.status)
	if errors.Is(err, ErrNotFound) {
		log.Info("VM not found; MaaS machine left as it is")
		return nil
	}
	if err != nil {
		return fmt.Errorf("report machine %s: %w", m.SystemID, err)
	}
	if r.reported == nil {
		r.reported = map[VMRef]report{}
	}
	r.reported[m.vm] = want
	return nil
}

func changedKeys(changed map[string]string) string {
	return fmt.Sprint(slices.Sorted(maps.Keys(changed)))
}

// Run reconciles every interval until ctx ends. After a failed cycle it
// waits longer each time (see RetryDelay) so a struggling MaaS is not
// hammered; the next successful cycle restores the interval.
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
