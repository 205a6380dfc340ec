// Package layering checks the project's import rules, which nothing else
// would notice breaking: protocols never reach Kubernetes, controllers never
// reach the protocols, virtual hosts never reach Kubernetes, metrics stay
// out of the protocols and the backend contract, and
// bmc-server, one process per VM (or per namespace), links none of the
// Kubernetes machinery it does not use.
package layering

import (
	"os/exec"
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
	}
	for _, tc := range tests {
		t.Run(tc.pkg, func(t *testing.T) {
			out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", module+"/"+tc.pkg).Output()
			if err != nil {
				t.Fatalf("go list: %v", err)
			}
			for dep := range strings.FieldsSeq(string(out)) {
				for _, prefix := range tc.forbidden {
					if dep == prefix || strings.HasPrefix(dep, strings.TrimSuffix(prefix, "/")+"/") {
						t.Errorf("%s depends on %s: %s", tc.pkg, dep, tc.why)
					}
				}
			}
		})
	}
}
