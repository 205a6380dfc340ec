package maas

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtmetal/virtmetal/api/v1beta1"
)

// A bound VM's machine keeps its problems in the VirtualMachineBMC status
// (status.maas.problems), not in the reconciler: a CronJob runs a fresh
// process each cycle, and a problem must be counted across them, and a
// refused commission must wait across them.

// Defaults of the wait before a refused commission is tried again.
const (
	DefaultCommissionBackoff    = time.Minute
	DefaultMaxCommissionBackoff = time.Hour
)

// Problem is one problem of a VM's machine as a cycle left it.
type Problem struct {
	VM       VMRef
	SystemID string
	v1beta1.MaaSProblem
}

func (p Problem) String() string {
	return fmt.Sprintf("machine %s (vm %s): %s for %d cycles since %s: %s",
		p.SystemID, p.VM, p.Reason, p.Cycles, p.Since.UTC().Format(time.RFC3339), p.Message)
}

// failureKind gives a machine's failure the condition reason that names its
// kind. waiting marks a refused commission not tried this cycle: the
// reported problem stands as it is.
type failureKind struct {
	reason  string
	err     error
	waiting bool
}

func (f *failureKind) Error() string { return f.err.Error() }
func (f *failureKind) Unwrap() error { return f.err }

// failureReason is the condition reason for a machine's failure.
func failureReason(err error) string {
	if kind, ok := errors.AsType[*failureKind](err); ok {
		return kind.reason
	}
	return ReasonFailing
}

// priorProblems are the problems the VM's status reports of machine m, by
// reason; none when it reports another machine (they were that one's).
func priorProblems(reported MachineStatus, m Machine) map[string]v1beta1.MaaSProblem {
	prior := map[string]v1beta1.MaaSProblem{}
	if reported.MaaS == nil || reported.MaaS.SystemID != m.SystemID {
		return prior
	}
	for _, p := range reported.MaaS.Problems {
		prior[p.Reason] = *p.DeepCopy()
	}
	return prior
}

// commissionWaiting tells whether machine m's last commission was refused
// and its wait has not ended. A change of the machine (another system ID,
// another status) ends the wait.
func commissionWaiting(reported MachineStatus, m Machine, now time.Time) (v1beta1.MaaSProblem, bool) {
	refused, ok := priorProblems(reported, m)[ReasonCommissionRefused]
	if !ok || refused.RetryAfter == nil || reported.MaaS.StatusName != statusName(m) {
		return refused, false
	}
	return refused, now.Before(refused.RetryAfter.Time)
}

// problems is what the VM's status should list of its bound machine m after
// this cycle: the cycle's failure, counted on from the reported one of its
// kind, and the other machines that claim or claimed the VM's BMC, while
// MaaS still has them. The failure comes first: it names the condition.
func (r *Reconciler) problems(b binding, m Machine, failure error, inMaaS map[string]bool, now metav1.Time) []v1beta1.MaaSProblem {
	prior := priorProblems(b.vm.Reported, m)
	var problems []v1beta1.MaaSProblem
	if failure != nil {
		reason := failureReason(failure)
		previous, seen := prior[reason]
		if kind, ok := errors.AsType[*failureKind](failure); ok && kind.waiting && seen {
			problems = append(problems, previous)
		} else {
			p := v1beta1.MaaSProblem{Reason: reason, Message: failure.Error(), Cycles: 1, Since: now}
			if seen {
				p.Cycles, p.Since = previous.Cycles+1, previous.Since
			}
			if reason == ReasonCommissionRefused {
				if seen && previous.Message != p.Message {
					p.Cycles, p.Since = 1, now // another refusal: its wait starts again
				}
				retry := metav1.NewTime(now.Add(RetryDelay(r.commissionBackoff(), r.maxCommissionBackoff(), int(p.Cycles))))
				p.RetryAfter = &retry
			}
			problems = append(problems, p)
		}
	}
	if claim, ok := duplicateClaim(b, prior[ReasonDuplicateClaim], inMaaS, now); ok {
		if i := slices.IndexFunc(problems, func(p v1beta1.MaaSProblem) bool { return p.Reason == ReasonDuplicateClaim }); i >= 0 {
			problems[i].Machines = claim.Machines // the detach failed: the failure's words
		} else {
			problems = append(problems, claim)
		}
	}
	return problems
}

// duplicateClaim is the DuplicateClaim problem of a bound VM: the machines
// claiming its BMC this cycle, detached from it, and those detached before
// that MaaS still has. A cycle that finds a claimant counts one more.
func duplicateClaim(b binding, previous v1beta1.MaaSProblem, inMaaS map[string]bool, now metav1.Time) (v1beta1.MaaSProblem, bool) {
	var claimants, why []string
	for i, c := range b.claims {
		if i != b.winner {
			claimants = append(claimants, c.m.SystemID)
			why = append(why, c.m.SystemID+" ("+c.why+")")
		}
	}
	machines := slices.Clone(claimants)
	for _, id := range previous.Machines {
		if inMaaS[id] && !slices.Contains(machines, id) {
			machines = append(machines, id)
		}
	}
	if len(machines) == 0 {
		return v1beta1.MaaSProblem{}, false
	}
	slices.Sort(machines)
	p := previous
	p.Machines = machines
	if previous.Reason == "" {
		p = v1beta1.MaaSProblem{Reason: ReasonDuplicateClaim, Since: now, Machines: machines}
	}
	if len(claimants) > 0 {
		p.Cycles++
		p.Message = "machines " + strings.Join(why, ", ") + " also claim this VM's BMC: detached from it (power type manual), they get no credentials"
	} else if !slices.Equal(previous.Machines, machines) || p.Message == "" {
		p.Message = fmt.Sprintf("machines %v claimed this VM's BMC and were detached from it (power type manual); deleting them from MaaS clears this", machines)
	}
	return p, true
}

func problemsEqual(a, b []v1beta1.MaaSProblem) bool {
	return slices.EqualFunc(a, b, func(x, y v1beta1.MaaSProblem) bool {
		return x.Reason == y.Reason && x.Message == y.Message && x.Cycles == y.Cycles && x.Since.Equal(&y.Since) &&
			x.RetryAfter.Equal(y.RetryAfter) && slices.Equal(x.Machines, y.Machines)
	})
}

func (r *Reconciler) commissionBackoff() time.Duration {
	return cmp.Or(r.CommissionBackoff, DefaultCommissionBackoff)
}

func (r *Reconciler) maxCommissionBackoff() time.Duration {
	return cmp.Or(r.MaxCommissionBackoff, DefaultMaxCommissionBackoff)
}
