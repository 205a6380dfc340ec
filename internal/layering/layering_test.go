// Package layering checks the project's import rules, which nothing else
// would notice breaking: protocols never reach Kubernetes, controllers never
// reach the protocols, virtual hosts never reach Kubernetes, metrics stay
// out of the protocols and the backend contract,
// bmc-server, one process per VM (or per namespace), links none of the
// Kubernetes machinery it does not use nor Prometheus's client library, and its command is wiring only:
// internal/bmcserver assembles the protocols and backends. The simulators
// and the lab that runs them link no "testing": they are programs' code,
// not tests'.
package layering

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/virtmetal/virtmetal"

func TestImportRules(t *testing.T) {
	tests := []struct {
		pkg       string
		forbidden []string // import path prefixes
		why       string
	}{
		{"redfish", []string{"k8s.io/", "sigs.k8s.io/", "kubevirt.io/"}, "protocols speak the backend contract, never Kubernetes"},
		{"ipmi", []string{"k8s.io/", "sigs.k8s.io/", "kubevirt.io/"}, "protocols speak the backend contract, never Kubernetes"},
		{"internal/vhost", []string{"k8s.io/", "sigs.k8s.io/", "kubevirt.io/"}, "virtual hosts route to backends through the machine contract; bmc-server wires the kubevirt one"},
		{"controllers/...", []string{module + "/redfish", module + "/ipmi"}, "controllers never import the protocol packages"},
		{"internal/bmcmetrics", []string{module + "/redfish", module + "/ipmi", "k8s.io/", "sigs.k8s.io/", "kubevirt.io/"},
			"metrics observe through the protocols' and the backend's hooks; bmc-server wires them"},
		{"machine", []string{"github.com/prometheus/"}, "the backend contract knows no metrics system"},
		{"internal/auditlog", []string{"k8s.io/", "sigs.k8s.io/", "kubevirt.io/", "github.com/prometheus/", module + "/redfish", module + "/ipmi"},
			"the audit log speaks the machine contract; the protocols and the backend's ActionRecorder use it"},
		{"redfish", []string{"github.com/prometheus/"}, "protocols tell an Observer; what it does with that is the wiring's"},
		{"ipmi", []string{"github.com/prometheus/"}, "protocols tell what they count; what is done with that is the wiring's"},
		{"internal/bmcspec", []string{"k8s.io/", "sigs.k8s.io/", "kubevirt.io/", module + "/api", module + "/controllers", module + "/deploy",
			module + "/maas", module + "/machine", module + "/redfish", module + "/ipmi", module + "/internal/vhost"},
			"the contracts between bmc-server, the controller and the MaaS reconciler import none of them"},
		{"cmd/bmc-server", []string{"sigs.k8s.io/controller-runtime", "k8s.io/client-go/kubernetes", "k8s.io/client-go/informers"},
			"a BMC pod per VM: controller-runtime's client and client-go's typed clientset cost about 10 MB of every pod (docs/benchmarks.md)"},
		{"internal/bmcserver", []string{"sigs.k8s.io/controller-runtime", "k8s.io/client-go/kubernetes", "k8s.io/client-go/informers"},
			"it is what every BMC pod runs: controller-runtime's client and client-go's typed clientset cost about 10 MB of every pod (docs/benchmarks.md)"},
		{"cmd/bmc-server", []string{"github.com/prometheus/", "google.golang.org/protobuf/", "text/template", module + "/deploy"},
			"a BMC pod per VM: Prometheus's client library with its protocol buffers, and deploy/bmc's RBAC template, cost about 2 MB of every pod; internal/bmcmetrics writes the text format itself (docs/benchmarks.md)"},
		{"internal/bmcserver", []string{"github.com/prometheus/", "google.golang.org/protobuf/", "text/template", module + "/deploy"},
			"it is what every BMC pod runs: Prometheus's client library with its protocol buffers, and deploy/bmc's RBAC template, cost about 2 MB of every pod (docs/benchmarks.md)"},
		{"cmd/bmc-server", []string{"encoding/xml"},
			"a BMC pod per VM: redfish writes $metadata as text, and encoding/xml with its reflection was pages of every pod's memory (docs/benchmarks.md)"},
		{"sim/...", []string{"testing"}, "simulators are importable by the lab, a program; a test helper takes the test's T as an interface"},
		{"cmd/bmc-server", []string{"testing"}, "product binaries link no test helper (internal/poll, the simulators' test side)"},
		{"cmd/bmc-controller", []string{"testing"}, "product binaries link no test helper (internal/poll, the simulators' test side)"},
		{"cmd/reconciler", []string{"testing"}, "product binaries link no test helper (internal/poll, the simulators' test side)"},
		{"cmd/lab", []string{"testing"}, "the lab is a program: it starts the simulators with their own constructors, not a test's helpers"},
	}
	for _, tc := range tests {
		t.Run(tc.pkg, func(t *testing.T) {
			for _, dep := range goList(t, "-deps", "-f", "{{.ImportPath}}", module+"/"+tc.pkg) {
				if forbidden(dep, tc.forbidden) {
					t.Errorf("%s depends on %s: %s", tc.pkg, dep, tc.why)
				}
			}
		})
	}
}

// TestBMCServerCommandIsWiring: cmd/bmc-server parses its flags and calls
// internal/bmcserver, which assembles the protocols and backends; the
// command importing one of them itself is logic growing back into it. Its
// own imports only: through internal/bmcserver it depends on them all.
func TestBMCServerCommandIsWiring(t *testing.T) {
	assembled := []string{module + "/redfish", module + "/ipmi", module + "/machine", module + "/internal/vhost", module + "/internal/throttle",
		module + "/internal/auditlog", module + "/internal/bmcmetrics", module + "/internal/metricsserver", module + "/internal/certs", "k8s.io/client-go/"}
	for _, imp := range goList(t, "-f", `{{join .Imports "\n"}}`, module+"/cmd/bmc-server") {
		if forbidden(imp, assembled) {
			t.Errorf("cmd/bmc-server imports %s: internal/bmcserver is where it is used", imp)
		}
	}
}

// goList runs go list with args and returns the words it prints.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	return strings.Fields(string(out))
}

// forbidden tells whether pkg is one of prefixes or below one.
func forbidden(pkg string, prefixes []string) bool {
	return slices.ContainsFunc(prefixes, func(prefix string) bool {
		return pkg == prefix || strings.HasPrefix(pkg, strings.TrimSuffix(prefix, "/")+"/")
	})
}
