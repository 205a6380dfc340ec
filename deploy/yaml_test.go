package deploy

import (
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	yaml11 "go.yaml.in/yaml/v2"
	yaml12 "go.yaml.in/yaml/v3"

	"github.com/virtmetal/virtmetal/deploy/bmc"
)

// TestYAMLReadsTheSameIn11And12 parses every YAML file of the repository
// (and the rendered per-VM RBAC template) with a YAML 1.1 parser and a YAML
// 1.2 one and wants the same strings: kubectl, kustomize and client-go mix
// both, and a value that YAML 1.1 reads as a boolean or a number must be
// quoted. Go's YAML 1.1 parser reads yes, on, y as booleans but skips the
// spec's base-60 numbers, which other YAML 1.1 parsers (PyYAML, SnakeYAML)
// read: a plain 12:34:56:12:34:56 is the integer 50 821 409 296. Plain
// scalars of that form are reported too.
func TestYAMLReadsTheSameIn11And12(t *testing.T) {
	t.Run("the trap is caught", func(t *testing.T) {
		for _, doc := range []string{"mac: 12:34:56:12:34:56\n", "enabled: yes\n", "- on\n", "ratio: 1:30.5\n"} {
			if err := sameIn11And12([]byte(doc)); err == nil {
				t.Errorf("%q: no difference found", doc)
			}
		}
		if err := sameIn11And12([]byte("mac: \"12:34:56:12:34:56\"\nenabled: \"yes\"\nother: 02:FF:FF:FF:FF:FF\n")); err != nil {
			t.Errorf("quoted values: %v", err)
		}
	})
	// Helm's templates are Go templates that make YAML: deploy/helm's tests
	// read what they render.
	out, err := exec.Command("git", "-C", "..", "ls-files", "-z", "--", "*.yaml", "*.yml", ":(exclude)deploy/helm/virtmetal/templates").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	files := strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	if len(files) < 10 {
		t.Fatalf("git ls-files found only %q", files)
	}
	for _, file := range files {
		t.Run(file, func(t *testing.T) {
			if err := sameIn11And12([]byte(readFile(t, filepath.Join("..", file)))); err != nil {
				t.Error(err)
			}
		})
	}
	t.Run("deploy/bmc/rbac.yaml.tmpl rendered", func(t *testing.T) {
		for _, p := range []bmc.RBACParams{
			{Namespace: "tenant-a", VMName: "web1", Instancetype: "u1.small"},
			{Namespace: "tenant-a", VMName: "web1", ClusterInstancetype: "u1.small"},
			{Namespace: "tenant-a", VMs: []string{"web1", "web2"}, Instancetypes: []string{"u1.small"}, ClusterInstancetypes: []string{"u1.large"}},
		} {
			data, err := bmc.RenderRBAC(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := sameIn11And12(data); err != nil {
				t.Error(err)
			}
		}
	})
}

// sameIn11And12 parses every document of data with both parsers and
// compares them as strings.
func sameIn11And12(data []byte) error {
	d11 := yaml11.NewDecoder(strings.NewReader(string(data)))
	d12 := yaml12.NewDecoder(strings.NewReader(string(data)))
	for doc := 0; ; doc++ {
		var v11, v12 any
		var node yaml12.Node
		err11, err12 := d11.Decode(&v11), d12.Decode(&node)
		if errors.Is(err11, io.EOF) && errors.Is(err12, io.EOF) {
			return nil
		}
		if err12 == nil {
			err12 = node.Decode(&v12)
		}
		if err11 != nil || err12 != nil {
			return fmt.Errorf("document %d: YAML 1.1: %v, YAML 1.2: %v", doc, err11, err12)
		}
		var diffs []string
		compare("", v11, v12, &diffs)
		sexagesimals(&node, &diffs)
		if len(diffs) > 0 {
			return fmt.Errorf("document %d reads differently in YAML 1.1 and 1.2 (quote these values):\n%s", doc, strings.Join(diffs, "\n"))
		}
	}
}

// Base-60 numbers of YAML 1.1 (yaml.org/type/int, yaml.org/type/float).
var sexagesimal = regexp.MustCompile(`^[-+]?([1-9][0-9_]*(:[0-5]?[0-9])+|[0-9][0-9_]*(:[0-5]?[0-9])+\.[0-9_]*)$`)

func sexagesimals(n *yaml12.Node, diffs *[]string) {
	if n.Kind == yaml12.ScalarNode && n.Style == 0 && n.Tag == "!!str" && sexagesimal.MatchString(n.Value) {
		*diffs = append(*diffs, fmt.Sprintf("  line %d: %s is a base-60 number in YAML 1.1", n.Line, n.Value))
	}
	for _, c := range n.Content {
		sexagesimals(c, diffs)
	}
}

func compare(path string, a, b any, diffs *[]string) {
	ma, mb := asMap(a), asMap(b)
	if ma != nil && mb != nil {
		keys := map[string]bool{}
		for k := range ma {
			keys[k] = true
		}
		for k := range mb {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		for _, k := range sorted {
			compare(path+"."+k, ma[k], mb[k], diffs)
		}
		return
	}
	la, okA := a.([]any)
	lb, okB := b.([]any)
	if okA && okB && len(la) == len(lb) {
		for i := range la {
			compare(fmt.Sprintf("%s[%d]", path, i), la[i], lb[i], diffs)
		}
		return
	}
	if sa, sb := scalar(a), scalar(b); sa != sb {
		*diffs = append(*diffs, fmt.Sprintf("  %s: YAML 1.1 %s, YAML 1.2 %s", path, sa, sb))
	}
}

// asMap returns a mapping with its keys as strings, whichever parser made it.
func asMap(v any) map[string]any {
	switch m := v.(type) {
	case map[string]any:
		return m
	case map[any]any:
		out := make(map[string]any, len(m))
		for k, v := range m {
			out[fmt.Sprintf("%v", k)] = v
		}
		return out
	}
	return nil
}

// scalar writes a value with its kind, so that "1" and 1 differ.
func scalar(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("%q", v)
	case nil:
		return "null"
	case []any, map[string]any, map[any]any:
		return fmt.Sprintf("%T of %d", v, lenOf(v))
	}
	return fmt.Sprintf("%v", v)
}

func lenOf(v any) int {
	switch v := v.(type) {
	case []any:
		return len(v)
	case map[string]any:
		return len(v)
	case map[any]any:
		return len(v)
	}
	return 0
}
