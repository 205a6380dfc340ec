package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/internal/kubetest"
	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
		check   func(t *testing.T, o options)
	}{
		{
			name: "flags",
			args: []string{"--maas-url", "http://maas/MAAS", "--domain", "bmc.example.org", "--interval", "30s", "--once", "--dry-run"},
			check: func(t *testing.T, o options) {
				if o.maasURL != "http://maas/MAAS" || o.domain != "bmc.example.org" || o.interval != 30*time.Second || !o.once || !o.dryRun {
					t.Errorf("options = %+v", o)
				}
			},
		},
		{
			name: "environment",
			env:  map[string]string{"MAAS_URL": "http://maas/MAAS", "VIRTMETAL_BMC_DOMAIN": "bmc.example.org", "MAAS_API_KEY_FILE": "/k"},
			check: func(t *testing.T, o options) {
				if o.maasURL != "http://maas/MAAS" || o.domain != "bmc.example.org" || o.maasAPIKeyFile != "/k" || o.interval != time.Minute {
					t.Errorf("options = %+v", o)
				}
			},
		},
		{name: "no URL", args: []string{"--domain", "d.org"}, wantErr: "--maas-url"},
		{name: "no domain", args: []string{"--maas-url", "http://m"}, wantErr: "--domain"},
		{name: "bad domain", args: []string{"--maas-url", "http://m", "--domain", "bad_domain.org"}, wantErr: "--domain"},
		{name: "zero interval", args: []string{"--maas-url", "http://m", "--domain", "d.org", "--interval", "0s"}, wantErr: "--interval"},
		{
			name: "recurrence and commission back-off",
			args: []string{"--maas-url", "http://m", "--domain", "d.org", "--fail-after", "5", "--commission-backoff", "2m", "--max-commission-backoff", "30m"},
			check: func(t *testing.T, o options) {
				if o.failAfter != 5 || o.commission.backoff != 2*time.Minute || o.commission.maxBackoff != 30*time.Minute {
					t.Errorf("options = %+v", o)
				}
			},
		},
		{
			name: "concurrency",
			args: []string{"--maas-url", "http://m", "--domain", "d.org", "--concurrency", "3"},
			check: func(t *testing.T, o options) {
				if o.concurrency != 3 {
					t.Errorf("concurrency = %d", o.concurrency)
				}
			},
		},
		{name: "no concurrency", args: []string{"--maas-url", "http://m", "--domain", "d.org", "--concurrency", "0"}, wantErr: "--concurrency"},
		{name: "metrics with --once", args: []string{"--maas-url", "http://m", "--domain", "d.org", "--once", "--metrics-listen", ":9100"}, wantErr: "--metrics-listen"},
		{name: "negative fail-after", args: []string{"--maas-url", "http://m", "--domain", "d.org", "--fail-after", "-1"}, wantErr: "--fail-after"},
		{name: "back-off above its cap", args: []string{"--maas-url", "http://m", "--domain", "d.org", "--commission-backoff", "2h"}, wantErr: "--commission-backoff"},
		{name: "stray argument", args: []string{"--maas-url", "http://m", "--domain", "d.org", "extra"}, wantErr: "unexpected"},
		{name: "unknown flag", args: []string{"--api-key", "x"}, wantErr: "flag provided but not defined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags(tt.args, env(tt.env), io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, o)
		})
	}
}

func TestLoadAPIKey(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(good, []byte("c:t:s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("only-secret-part"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		file    string
		env     map[string]string
		want    maas.APIKey
		wantErr bool
	}{
		{name: "file", file: good, want: maas.APIKey{Consumer: "c", Token: "t", Secret: "s"}},
		{name: "file wins over env", file: good, env: map[string]string{"MAAS_API_KEY": "x:y:z"}, want: maas.APIKey{Consumer: "c", Token: "t", Secret: "s"}},
		{name: "env", env: map[string]string{"MAAS_API_KEY": "x:y:z"}, want: maas.APIKey{Consumer: "x", Token: "y", Secret: "z"}},
		{name: "malformed file", file: bad, wantErr: true},
		{name: "malformed env", env: map[string]string{"MAAS_API_KEY": "only-secret-part"}, wantErr: true},
		{name: "missing file", file: filepath.Join(dir, "nope"), wantErr: true},
		{name: "none", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := loadAPIKey(options{maasAPIKeyFile: tt.file}, env(tt.env))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("got %v, %v", got, err)
			}
			if err != nil && strings.Contains(err.Error(), "only-secret-part") {
				t.Errorf("error leaks the key: %v", err)
			}
		})
	}
}

// env is the package's one API server.
var kubeEnv *kubetest.Env

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	ctrllog.SetLogger(logr.Discard()) // controller-runtime's client logs through the global logger
	var err error
	kubeEnv, err = kubetest.Start(kubetest.Options{WithoutCDI: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "envtest:", err)
		return 1
	}
	defer func() { _ = kubeEnv.Stop() }()
	return m.Run()
}

var namespaces atomic.Int64

const testMAC, testUUID = "02:00:00:00:00:01", "6f1e2a9c-0000-4000-8000-000000000001"

// testProof is the test VM's machine proof.
const testProof = "vmp1-0123456789abcdef0123456789abcdef"

// enrolledVM creates, in a fresh namespace, a VM and what the controller
// gives it: a credentials Secret and a VirtualMachineBMC.
func enrolledVM(t *testing.T) maas.VMRef {
	t.Helper()
	ctx := context.Background()
	ref := maas.VMRef{Namespace: fmt.Sprintf("cmd-%d", namespaces.Add(1)), Name: "vm-0"}
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ref.Namespace}},
		&kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name},
			Spec: kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				Spec: kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{
					Firmware: &kubevirtv1.Firmware{UUID: testUUID},
					Chassis:  &kubevirtv1.Chassis{Asset: testProof},
					Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{{
						Name: "default", MacAddress: testMAC,
						InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}},
					}}},
				}},
			}},
		},
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: v1beta1.CredentialsSecretName(ref.Name),
				Labels: map[string]string{v1beta1.LabelManagedBy: v1beta1.ManagedByValue, v1beta1.LabelVM: ref.Name}},
			Data: map[string][]byte{v1beta1.SecretUsernameKey: []byte("admin"), v1beta1.SecretPasswordKey: []byte("pw")},
		},
		&v1beta1.VirtualMachineBMC{
			ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name},
			Spec:       v1beta1.VirtualMachineBMCSpec{VMName: ref.Name},
		},
	} {
		if err := kubeEnv.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	return ref
}

func maasStatus(t *testing.T, vm maas.VMRef) *v1beta1.MaaSStatus {
	t.Helper()
	var bmc v1beta1.VirtualMachineBMC
	if err := kubeEnv.Client.Get(context.Background(), types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name}, &bmc); err != nil {
		t.Fatal(err)
	}
	return bmc.Status.MaaS
}

// kube connects as cmd/reconciler does, to the test API server.
func kube() (maas.Cluster, error) { return maas.NewKubeCluster(kubeEnv.Config) }

// machineOf is vm's machine as it enlists: its BMC address and hardware.
func machineOf(systemID string, vm maas.VMRef) maassim.Machine {
	return maassim.Machine{
		SystemID: systemID, Hostname: "enlisted-" + systemID, PowerType: "redfish",
		HardwareUUID: testUUID, MACs: []string{testMAC},
		// Its guest reported the VM's machine proof when it enlisted.
		Commissioning: []maassim.ScriptResult{{Name: maas.BMCConfigScript, Status: maassim.ScriptPassed,
			Stdout: bmcspec.ProofReportKey + ": " + testProof + "\n"}},
		PowerParameters: map[string]string{"power_address": maas.BMCAddress(vm, "bmc.example.org"), "node_id": vm.Name},
	}
}

func args(s *maassim.Server, extra ...string) []string {
	return append([]string{"--maas-url", s.URL(), "--domain", "bmc.example.org"}, extra...)
}

var keyEnv = env(map[string]string{"MAAS_API_KEY": maassim.APIKey})

func TestRunOnce(t *testing.T) {
	vm := enrolledVM(t)
	s := maassim.New(t).WithMachine(machineOf("m1", vm))
	var stderr bytes.Buffer
	if err := run(context.Background(), args(s, "--once"), keyEnv, io.Discard, &stderr, kube); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	m, _ := s.Machine("m1")
	if m.Status != maassim.StatusCommissioning || m.Hostname != maas.Hostname(vm) || m.PowerParameters["power_pass"] != "pw" {
		t.Errorf("machine = %+v", m)
	}
	if st := maasStatus(t, vm); st == nil || st.SystemID != "m1" || st.StatusName != "Commissioning" {
		t.Errorf("status.maas = %+v", st)
	}
	if strings.Contains(stderr.String(), "tokensecret") || strings.Contains(stderr.String(), `"pw"`) || strings.Contains(stderr.String(), testProof) {
		t.Errorf("log leaks a secret:\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), `"systemID":"m1"`) {
		t.Errorf("log lacks lowerCamel machine keys:\n%s", stderr.String())
	}
}

func TestRunOnceFailsWhenMaaSDoes(t *testing.T) {
	vm := enrolledVM(t)
	s := maassim.New(t).WithMachine(machineOf("m1", vm))
	s.FailMatching(maassim.Match{}, -1, maassim.FaultServerError)
	err := run(context.Background(), args(s, "--once"), keyEnv, io.Discard, io.Discard, kube)
	if !errors.Is(err, maas.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
}

// TestRunOnceFailsWhenKubernetesDoes: an identity that may not list the
// VirtualMachineBMCs fails the whole run.
func TestRunOnceFailsWhenKubernetesDoes(t *testing.T) {
	vm := enrolledVM(t)
	s := maassim.New(t).WithMachine(machineOf("m1", vm))
	cfg, err := kubeEnv.ConfigFor("nobody")
	if err != nil {
		t.Fatal(err)
	}
	nobody := func() (maas.Cluster, error) { return maas.NewKubeCluster(cfg) }
	if err := run(context.Background(), args(s, "--once"), keyEnv, io.Discard, io.Discard, nobody); !errors.Is(err, maas.ErrForbidden) {
		t.Fatalf("err = %v, want ErrForbidden", err)
	}
	if m, _ := s.Machine("m1"); m.PowerParameters["power_pass"] != "" || m.Status != maassim.StatusNew {
		t.Errorf("machine changed without knowing the VMs: %+v", m)
	}
}

// TestRunOnceReportsMachineFailures: one machine MaaS refuses does not fail
// the run; it is printed, and the other machine converges.
func TestRunOnceReportsMachineFailures(t *testing.T) {
	good, bad := enrolledVM(t), enrolledVM(t)
	badMachine := machineOf("m-bad", bad)
	badMachine.MACs, badMachine.HardwareUUID = []string{"02:00:00:00:00:02"}, ""
	s := maassim.New(t).WithMachine(machineOf("m-good", good)).WithMachine(badMachine)
	// The bad VM's machine is proven by MAC; MaaS refuses its changes.
	var vm kubevirtv1.VirtualMachine
	ctx := context.Background()
	if err := kubeEnv.Client.Get(ctx, types.NamespacedName{Namespace: bad.Namespace, Name: bad.Name}, &vm); err != nil {
		t.Fatal(err)
	}
	vm.Spec.Template.Spec.Domain.Devices.Interfaces[0].MacAddress = "02:00:00:00:00:02"
	if err := kubeEnv.Client.Update(ctx, &vm); err != nil {
		t.Fatal(err)
	}
	s.FailMatching(maassim.Match{Path: "machines/m-bad/"}, -1, maassim.FaultConflict)
	var stderr bytes.Buffer
	if err := run(ctx, args(s, "--once"), keyEnv, io.Discard, &stderr, kube); err != nil {
		t.Fatalf("run failed for one machine's fault: %v", err)
	}
	if !strings.Contains(stderr.String(), "reconciler: failed: machine m-bad") {
		t.Errorf("failure not reported:\n%s", stderr.String())
	}
	if m, _ := s.Machine("m-good"); m.Status != maassim.StatusCommissioning {
		t.Errorf("good machine = %+v", m)
	}
}

// TestRunOnceFailsWhenAProblemRecurs: the CronJob's runs count a machine's
// problem through the VirtualMachineBMC status; the run that sees it for
// the --fail-after'th time exits non-zero, after doing the other machines'
// work.
func TestRunOnceFailsWhenAProblemRecurs(t *testing.T) {
	good, bad := enrolledVM(t), enrolledVM(t)
	s := maassim.New(t).WithMachine(machineOf("m-good", good)).WithMachine(machineOf("m-bad", bad))
	s.FailMatching(maassim.Match{Method: "PUT", Path: "machines/m-bad/"}, -1, maassim.FaultAddressRejected)
	ctx := context.Background()
	for runNo := 1; runNo <= 3; runNo++ {
		var stderr bytes.Buffer
		err := run(ctx, args(s, "--once", "--fail-after", "2"), keyEnv, io.Discard, &stderr, kube)
		if wantFail := runNo >= 2; errors.Is(err, ErrRecurring) != wantFail {
			t.Fatalf("run %d: err = %v, want failure %v\n%s", runNo, err, wantFail, stderr.String())
		}
		if runNo >= 2 && !strings.Contains(stderr.String(), "reconciler: recurring: machine m-bad") {
			t.Errorf("run %d: the recurring problem is not named:\n%s", runNo, stderr.String())
		}
		st := maasStatus(t, bad)
		if st == nil || len(st.Problems) != 1 || st.Problems[0].Reason != maas.ReasonAddressRejected || st.Problems[0].Cycles != int32(runNo) {
			t.Fatalf("run %d: bad VM's status.maas = %+v", runNo, st)
		}
		if m, _ := s.Machine("m-good"); m.Status != maassim.StatusCommissioning || m.PowerParameters["power_pass"] != "pw" {
			t.Errorf("run %d: the good VM's machine = %+v", runNo, m)
		}
	}
	if err := run(ctx, args(s, "--once", "--fail-after", "0"), keyEnv, io.Discard, io.Discard, kube); err != nil {
		t.Errorf("--fail-after 0: %v", err)
	}
}

// TestRunOnceWaitsOutARefusedCommission: the wait after a refused
// commission spans the CronJob's runs.
func TestRunOnceWaitsOutARefusedCommission(t *testing.T) {
	vm := enrolledVM(t)
	s := maassim.New(t).WithoutBootImages(true).WithMachine(machineOf("m1", vm))
	ctx := context.Background()
	for range 2 {
		if err := run(ctx, args(s, "--once", "--commission-backoff", "1h", "--max-commission-backoff", "2h"), keyEnv, io.Discard, io.Discard, kube); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Count(maassim.Match{Op: "commission"}); n != 1 {
		t.Errorf("%d commission requests in two runs, want 1 (the second run waits)", n)
	}
	st := maasStatus(t, vm)
	if st == nil || len(st.Problems) != 1 || st.Problems[0].Reason != maas.ReasonCommissionRefused || st.Problems[0].RetryAfter == nil ||
		st.Problems[0].RetryAfter.Sub(st.Problems[0].Since.Time) != time.Hour {
		t.Errorf("status.maas = %+v", st)
	}
}

func TestRunDryRun(t *testing.T) {
	vm := enrolledVM(t)
	s := maassim.New(t).WithMachine(machineOf("m1", vm))
	var stdout bytes.Buffer
	if err := run(context.Background(), args(s, "--once", "--dry-run"), keyEnv, &stdout, io.Discard, kube); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "would commission m1") {
		t.Errorf("stdout = %q", stdout.String())
	}
	for _, r := range s.Requests() {
		if r.Method != "GET" {
			t.Errorf("dry run sent %s %s", r.Method, r.Path)
		}
	}
	if st := maasStatus(t, vm); st != nil {
		t.Errorf("dry run wrote the status: %+v", st)
	}
}

// TestRunLoopServesMetrics: in loop mode --metrics-listen serves the
// reconciler's metrics, and they count the cycles run.
func TestRunLoopServesMetrics(t *testing.T) {
	s := maassim.New(t).WithMachine(machineOf("m1", enrolledVM(t)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout, printed := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, args(s, "--interval", "5ms", "--metrics-listen", "127.0.0.1:0"), keyEnv, printed, io.Discard, kube)
		printed.Close()
	}()
	urls := make(chan string, 1)
	go func() {
		pattern := regexp.MustCompile(`Metrics at (http://\S+/metrics)`)
		for lines := bufio.NewScanner(stdout); lines.Scan(); {
			if m := pattern.FindStringSubmatch(lines.Text()); m != nil {
				urls <- m[1]
			}
		}
	}()
	var url string
	select {
	case url = <-urls:
	case <-time.After(10 * time.Second):
		t.Fatal("no metrics address printed")
	}
	poll.Until(t, "metrics of two cycles and the bound machine", func() error {
		res, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if strings.Contains(string(body), `virtmetal_maas_reconciler_machines{kind="bound"} 1`) &&
			regexp.MustCompile(`virtmetal_maas_reconciler_cycles_total\{result="ok"\} [2-9]`).Match(body) {
			return nil
		}
		return fmt.Errorf("metrics:\n%s", body)
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

func TestRunLoopUntilCanceled(t *testing.T) {
	s := maassim.New(t).WithMachine(machineOf("m1", enrolledVM(t)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- run(ctx, args(s, "--interval", "5ms"), keyEnv, io.Discard, io.Discard, kube) }()
	poll.True(t, "three cycles of the loop", func() bool { return s.Count(maassim.Match{Method: "GET", Path: "machines/", Op: ""}) >= 3 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

func TestRunConfigErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		env  func(string) string
	}{
		"no key":  {[]string{"--maas-url", "http://127.0.0.1:1/MAAS", "--domain", "d.org", "--once"}, env(nil)},
		"bad URL": {[]string{"--maas-url", "127.0.0.1/MAAS", "--domain", "d.org", "--once"}, keyEnv},
	} {
		t.Run(name, func(t *testing.T) {
			if err := run(context.Background(), tc.args, tc.env, io.Discard, io.Discard, kube); err == nil {
				t.Fatal("run succeeded")
			}
		})
	}
}

// TestDeploymentArgsParse keeps deploy/reconciler/deployment.yaml in step
// with the flags.
// TestManifestArgsParse: the CronJob (--once) and the loop-mode
// Deployment start the command with arguments it accepts.
func TestManifestArgsParse(t *testing.T) {
	tests := []struct {
		file     string
		wantOnce bool
		template func([]byte) (corev1.PodTemplateSpec, error)
	}{
		{"../../deploy/reconciler/cronjob.yaml", true, func(data []byte) (corev1.PodTemplateSpec, error) {
			var c batchv1.CronJob
			err := yaml.UnmarshalStrict(data, &c)
			return c.Spec.JobTemplate.Spec.Template, err
		}},
		{"../../deploy/components/reconciler-loop/deployment.yaml", false, func(data []byte) (corev1.PodTemplateSpec, error) {
			var d appsv1.Deployment
			err := yaml.UnmarshalStrict(data, &d)
			return d.Spec.Template, err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			pod, err := tc.template(data)
			if err != nil {
				t.Fatal(err)
			}
			c := pod.Spec.Containers[0]
			vars := map[string]string{}
			for _, e := range c.Env {
				vars[e.Name] = "http://maas.example.org:5240/MAAS"
				if e.Name == "VIRTMETAL_BMC_DOMAIN" {
					vars[e.Name] = "bmc.example.org"
				}
			}
			o, err := parseFlags(c.Args, env(vars), io.Discard)
			if err != nil {
				t.Fatalf("args %q: %v", c.Args, err)
			}
			if o.once != tc.wantOnce || o.dryRun || o.maasAPIKeyFile == "" {
				t.Errorf("options = %+v, want once=%v with a key file", o, tc.wantOnce)
			}
		})
	}
}
