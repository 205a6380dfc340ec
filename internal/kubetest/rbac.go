package kubetest

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// AggregateClusterRoles gives every ClusterRole with an aggregationRule the
// rules of the ClusterRoles its selectors match, as kube-controller-manager's
// aggregation controller does in a cluster. envtest runs no controller
// manager: without this, the built-in admin, edit and view roles grant
// nothing, and a tenant bound to admin in its namespace could do nothing
// there. Call it again after adding a ClusterRole meant for aggregation.
func (e *Env) AggregateClusterRoles(ctx context.Context) error {
	var list rbacv1.ClusterRoleList
	if err := e.Client.List(ctx, &list); err != nil {
		return err
	}
	roles := map[string]*rbacv1.ClusterRole{}
	for i := range list.Items {
		roles[list.Items[i].Name] = &list.Items[i]
	}
	aggregated := map[string][]rbacv1.PolicyRule{}
	// rulesOf resolves aggregated roles that select other aggregated roles
	// (admin selects edit, which selects view) in one pass.
	var rulesOf func(role *rbacv1.ClusterRole, seen []string) ([]rbacv1.PolicyRule, error)
	rulesOf = func(role *rbacv1.ClusterRole, seen []string) ([]rbacv1.PolicyRule, error) {
		if role.AggregationRule == nil {
			return role.Rules, nil
		}
		if rules, ok := aggregated[role.Name]; ok {
			return rules, nil
		}
		if slices.Contains(seen, role.Name) {
			return nil, fmt.Errorf("ClusterRoles aggregate each other: %v", append(seen, role.Name))
		}
		var rules []rbacv1.PolicyRule
		for _, selector := range role.AggregationRule.ClusterRoleSelectors {
			s, err := metav1.LabelSelectorAsSelector(&selector)
			if err != nil {
				return nil, fmt.Errorf("ClusterRole %s: %w", role.Name, err)
			}
			for _, name := range slices.Sorted(maps.Keys(roles)) {
				other := roles[name]
				if name == role.Name || !s.Matches(labels.Set(other.Labels)) {
					continue
				}
				more, err := rulesOf(other, append(seen, role.Name))
				if err != nil {
					return nil, err
				}
				for _, r := range more {
					if !slices.ContainsFunc(rules, func(have rbacv1.PolicyRule) bool { return reflect.DeepEqual(have, r) }) {
						rules = append(rules, r)
					}
				}
			}
		}
		aggregated[role.Name] = rules
		return rules, nil
	}
	for _, role := range roles {
		rules, err := rulesOf(role, nil)
		if err != nil {
			return err
		}
		if role.AggregationRule == nil || reflect.DeepEqual(rules, role.Rules) {
			continue
		}
		role.Rules = rules
		if err := e.Client.Update(ctx, role); err != nil {
			return fmt.Errorf("aggregating ClusterRole %s: %w", role.Name, err)
		}
	}
	return nil
}
