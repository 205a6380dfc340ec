package bmc_test

import (
	"cmp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virtmetal/virtmetal/deploy/bmc"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
)

func TestRBACObjects(t *testing.T) {
	tests := []struct {
		name    string
		params  bmc.RBACParams
		kinds   []string
		account string
		extra   string // a resource the Role (or ClusterRole) must name
	}{
		{"plain", bmc.RBACParams{Namespace: "lab", VMName: "node-1"}, []string{"ServiceAccount", "Role", "RoleBinding"}, "bmc-node-1", ""},
		{"own account", bmc.RBACParams{Namespace: "lab", VMName: "node-1", ServiceAccount: "bmc"}, []string{"ServiceAccount", "Role", "RoleBinding"}, "bmc", ""},
		{"namespaced instancetype", bmc.RBACParams{Namespace: "lab", VMName: "node-1", Instancetype: "large"},
			[]string{"ServiceAccount", "Role", "RoleBinding"}, "bmc-node-1", "virtualmachineinstancetypes"},
		{"cluster instancetype", bmc.RBACParams{Namespace: "lab", VMName: "node-1", ClusterInstancetype: "u1.large"},
			[]string{"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}, "bmc-node-1", "virtualmachineclusterinstancetypes"},
		{"claims", bmc.RBACParams{Namespace: "lab", VMName: "node-1", Claims: []string{"data", "golden"}},
			[]string{"ServiceAccount", "Role", "RoleBinding"}, "bmc-node-1", "persistentvolumeclaims"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := bmc.RBACObjects(tc.params)
			if err != nil {
				t.Fatalf("RBACObjects: %v", err)
			}
			var kinds []string
			for _, o := range objs {
				kinds = append(kinds, o.GetKind())
			}
			if !slices.Equal(kinds, tc.kinds) {
				t.Fatalf("kinds = %v, want %v", kinds, tc.kinds)
			}
			if objs[0].GetName() != tc.account {
				t.Fatalf("ServiceAccount %q, want %q", objs[0].GetName(), tc.account)
			}
			rules, _, _ := unstructured.NestedSlice(objs[1].Object, "rules")
			var forcing, consoles []string // subresources.kubevirt.io resources granted update, get
			for _, r := range rules {
				groups, resources, names, verbs := ruleFields(r)
				if slices.Contains(groups, "subresources.kubevirt.io") {
					switch {
					case slices.Equal(verbs, []string{"update"}):
						forcing = append(forcing, resources...)
					case slices.Equal(verbs, []string{"get"}):
						consoles = append(consoles, resources...)
					default:
						t.Errorf("subresource rule on %v grants %v, want update or get alone", resources, verbs)
					}
					if !slices.Equal(names, []string{tc.params.VMName}) {
						t.Errorf("subresource rule on %v names %v, want [%s]", resources, names, tc.params.VMName)
					}
				}
				// Only create may go without resourceNames: Kubernetes cannot scope it.
				if len(names) == 0 && !slices.Equal(verbs, []string{"create"}) {
					t.Errorf("rule on %v without resourceNames grants %v", resources, verbs)
				}
				if slices.Contains(resources, "virtualmachines") && !slices.Equal(names, []string{tc.params.VMName}) {
					t.Errorf("VM rule names %v", names)
				}
				if slices.Contains(resources, "secrets") && (!slices.Equal(names, []string{bmcspec.StateSecretName(tc.params.VMName)}) || !slices.Equal(verbs, []string{"get", "patch"})) {
					t.Errorf("Secret rule grants %v on %v, want get and patch of the state Secret only", verbs, names)
				}
				if slices.Contains(resources, "persistentvolumeclaims") && (!slices.Equal(names, tc.params.Claims) || !slices.Equal(verbs, []string{"get"})) {
					t.Errorf("claim rule grants %v on %v, want get of %v only", verbs, names, tc.params.Claims)
				}
			}
			// No claims, no claim rule: its resourceNames would be empty,
			// which grants every claim of the namespace.
			if tc.params.Claims == nil && grants(rules, "", "persistentvolumeclaims", "get", "data") {
				t.Error("a Role without claims grants get on a claim")
			}
			slices.Sort(forcing)
			if want := []string{"virtualmachines/restart", "virtualmachines/start", "virtualmachines/stop"}; !slices.Equal(forcing, want) {
				t.Errorf("subresources.kubevirt.io resources updated %v, want %v", forcing, want)
			}
			slices.Sort(consoles)
			if want := []string{"virtualmachineinstances/console", "virtualmachineinstances/vnc"}; !slices.Equal(consoles, want) {
				t.Errorf("subresources.kubevirt.io resources read %v, want %v", consoles, want)
			}
			if tc.extra != "" {
				var all strings.Builder
				for _, o := range objs {
					data, _ := o.MarshalJSON()
					all.Write(data)
				}
				if !strings.Contains(all.String(), tc.extra) {
					t.Errorf("no rule for %s", tc.extra)
				}
			}
		})
	}
}

// TestSharedRBAC: a bmc-server of several VMs gets every rule for exactly
// those VMs (and their media and instancetypes), labelled shared.
func TestSharedRBAC(t *testing.T) {
	tests := []struct {
		name   string
		params bmc.RBACParams
		kinds  []string
	}{
		{"namespaced instancetypes", bmc.RBACParams{Namespace: "lab", VMs: []string{"node-1", "node-2"}, Instancetypes: []string{"large", "small"}},
			[]string{"ServiceAccount", "Role", "RoleBinding"}},
		{"cluster instancetypes", bmc.RBACParams{Namespace: "lab", VMs: []string{"node-1", "node-2"}, ClusterInstancetypes: []string{"u1.large"}},
			[]string{"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}},
		{"claims", bmc.RBACParams{Namespace: "lab", VMs: []string{"node-1", "node-2"}, Claims: []string{"node-1-data", "shared-image"}},
			[]string{"ServiceAccount", "Role", "RoleBinding"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := bmc.RBACObjects(tc.params)
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, o := range objs {
				kinds = append(kinds, o.GetKind())
				if o.GetName() != "virtmetal-bmcs" && o.GetName() != bmc.ClusterRBACName("lab", "") {
					t.Errorf("%s named %s", o.GetKind(), o.GetName())
				}
				if l := o.GetLabels(); l["virtmetal.io/shared"] != "true" || l["virtmetal.io/vm"] != "" {
					t.Errorf("%s labels %v", o.GetKind(), l)
				}
			}
			if !slices.Equal(kinds, tc.kinds) {
				t.Fatalf("kinds = %v, want %v", kinds, tc.kinds)
			}
			for _, o := range objs[1:] {
				rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
				for _, r := range rules {
					_, resources, names, verbs := ruleFields(r)
					var want []string
					switch resources[0] {
					case "virtualmachines", "virtualmachineinstances", "virtualmachines/start", "virtualmachineinstances/console":
						if len(names) == 0 && slices.Equal(verbs, []string{"list", "watch"}) {
							continue // the shared informers: TestSharedRoleWritesOnlyItsVMs
						}
						want = tc.params.VMs
					case "datavolumes":
						if slices.Equal(verbs, []string{"create"}) {
							continue
						}
						want = []string{"node-1-virtmetal-media", "node-2-virtmetal-media"}
					case "secrets":
						want = []string{"virtmetal-bmcs-state"} // one for the namespace, not one a VM
						if !slices.Equal(verbs, []string{"get", "patch"}) {
							t.Errorf("state Secret rule grants %v, want get and patch only", verbs)
						}
					case "persistentvolumeclaims":
						want = tc.params.Claims
						if !slices.Equal(verbs, []string{"get"}) {
							t.Errorf("claim rule grants %v, want get only", verbs)
						}
					case "virtualmachineinstancetypes":
						want = tc.params.Instancetypes
					case "virtualmachineclusterinstancetypes":
						want = tc.params.ClusterInstancetypes
					}
					if !slices.Equal(names, want) {
						t.Errorf("rule on %v names %v, want %v", resources, names, want)
					}
				}
			}
		})
	}
}

// TestSharedRoleWritesOnlyItsVMs: the shared bmc-server's Role lets its
// namespace-wide informers list and watch every VM and VMI of the
// namespace, and grants everything else, reads by name and every write,
// on the VMs it serves alone; the claims its VMs' disks name it may only
// get, by name.
func TestSharedRoleWritesOnlyItsVMs(t *testing.T) {
	objs, err := bmc.RBACObjects(bmc.RBACParams{Namespace: "lab", VMs: []string{"node-1", "node-2"}, Claims: []string{"node-1-data"}})
	if err != nil {
		t.Fatal(err)
	}
	rules, _, _ := unstructured.NestedSlice(objs[1].Object, "rules")
	const kubevirt, subresources, core = "kubevirt.io", "subresources.kubevirt.io", ""
	tests := []struct {
		group, resource, verb, name string // name "" for the namespace
		granted                     bool
	}{
		{kubevirt, "virtualmachines", "list", "", true},
		{kubevirt, "virtualmachines", "watch", "", true},
		{kubevirt, "virtualmachineinstances", "list", "", true},
		{kubevirt, "virtualmachineinstances", "watch", "", true},
		{kubevirt, "virtualmachines", "get", "node-1", true},
		{kubevirt, "virtualmachines", "get", "other", false},
		{kubevirt, "virtualmachines", "update", "node-2", true},
		{kubevirt, "virtualmachines", "patch", "node-2", true},
		{kubevirt, "virtualmachines", "update", "other", false},
		{kubevirt, "virtualmachines", "patch", "other", false},
		{kubevirt, "virtualmachines", "delete", "node-1", false},
		{kubevirt, "virtualmachines", "create", "", false},
		{kubevirt, "virtualmachines", "deletecollection", "", false},
		{kubevirt, "virtualmachineinstances", "delete", "node-1", true},
		{kubevirt, "virtualmachineinstances", "delete", "other", false},
		{kubevirt, "virtualmachineinstances", "deletecollection", "", false},
		{kubevirt, "virtualmachineinstances", "update", "node-1", false},
		{subresources, "virtualmachines/start", "update", "node-1", true},
		{subresources, "virtualmachines/start", "update", "other", false},
		{subresources, "virtualmachines/stop", "update", "other", false},
		{subresources, "virtualmachines/restart", "update", "other", false},
		{subresources, "virtualmachineinstances/console", "get", "node-2", true},
		{subresources, "virtualmachineinstances/vnc", "get", "node-1", true},
		{subresources, "virtualmachineinstances/console", "get", "other", false},
		{subresources, "virtualmachineinstances/vnc", "get", "other", false},
		{subresources, "virtualmachineinstances/portforward", "get", "node-1", false},
		{subresources, "virtualmachineinstances/console", "update", "node-1", false},
		{core, "persistentvolumeclaims", "get", "node-1-data", true},
		{core, "persistentvolumeclaims", "get", "other", false},
		{core, "persistentvolumeclaims", "list", "", false},
		{core, "persistentvolumeclaims", "watch", "", false},
		{core, "persistentvolumeclaims", "update", "node-1-data", false},
	}
	for _, tc := range tests {
		t.Run(tc.verb+" "+tc.resource+" "+cmp.Or(tc.name, "(namespace)"), func(t *testing.T) {
			if got := grants(rules, tc.group, tc.resource, tc.verb, tc.name); got != tc.granted {
				t.Errorf("granted = %v, want %v", got, tc.granted)
			}
		})
	}
}

// grants evaluates a Role's rules as the API server's RBAC does a request
// on one object (name) or on the namespace (name ""), which a rule with
// resourceNames never matches.
func grants(rules []any, group, resource, verb, name string) bool {
	for _, r := range rules {
		groups, resources, names, verbs := ruleFields(r)
		if slices.Contains(groups, group) && slices.Contains(resources, resource) && slices.Contains(verbs, verb) &&
			(len(names) == 0 || name != "" && slices.Contains(names, name)) {
			return true
		}
	}
	return false
}

// ruleFields are a rendered rule's lists.
func ruleFields(r any) (groups, resources, names, verbs []string) {
	rule := r.(map[string]any)
	groups, _, _ = unstructured.NestedStringSlice(rule, "apiGroups")
	resources, _, _ = unstructured.NestedStringSlice(rule, "resources")
	names, _, _ = unstructured.NestedStringSlice(rule, "resourceNames")
	verbs, _, _ = unstructured.NestedStringSlice(rule, "verbs")
	return groups, resources, names, verbs
}

func TestRBACRejectsBadNames(t *testing.T) {
	for _, p := range []bmc.RBACParams{
		{Namespace: "lab", VMName: ""},
		{Namespace: "", VMName: "vm"},
		{Namespace: "lab", VMName: "vm\nkind: ClusterRole"},
		{Namespace: "lab", VMName: "vm", Instancetype: "Bad Name"},
		{Namespace: "lab", VMName: "vm", VMs: []string{"other"}},
		{Namespace: "lab", VMs: []string{"vm", "Bad Name"}},
		{Namespace: "lab", VMs: []string{"vm"}, ClusterInstancetypes: []string{"bad\nkind: x"}},
		{Namespace: "lab", VMName: "vm", Claims: []string{"data, secrets"}},
		{Namespace: "lab", VMName: "vm", Claims: []string{"data]\n- apiGroups: [\"\"]"}},
	} {
		if _, err := bmc.RenderRBAC(p); err == nil {
			t.Errorf("RenderRBAC(%+v) accepted it", p)
		}
	}
}

// TestClusterRBACNamesAreDistinct: no two tenants' VMs (nor a VM and a
// namespace's shared server) share cluster RBAC, however they are named;
// the dash-joined names of earlier versions did for these pairs.
func TestClusterRBACNamesAreDistinct(t *testing.T) {
	pairs := [][2]string{ // namespace, VM ("" for the shared server)
		{"a", "b-c"}, {"a-b", "c"},
		{"a", "b.c"}, {"a-b", ""}, {"s", "a"}, {"a", ""},
		{"team", "web-1"}, {"team-web", "1"}, {"team-web-1", ""},
	}
	seen := map[string][2]string{}
	for _, p := range pairs {
		name := bmc.ClusterRBACName(p[0], p[1])
		if other, ok := seen[name]; ok {
			t.Errorf("%v and %v share the name %s", p, other, name)
		}
		seen[name] = p
	}
	// The clean-up finds what earlier versions made under these names.
	for _, tc := range []struct{ namespace, vm, want string }{
		{"a", "b-c", "virtmetal-bmc-a-b-c"}, {"lab", "", "virtmetal-bmcs-lab"},
	} {
		if got := bmc.LegacyClusterRBACName(tc.namespace, tc.vm); got != tc.want {
			t.Errorf("LegacyClusterRBACName(%q, %q) = %q, want %q", tc.namespace, tc.vm, got, tc.want)
		}
	}
}
