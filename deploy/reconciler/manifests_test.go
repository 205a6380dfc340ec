// Package reconciler_test checks the reconciler's manifests (the CronJob
// here, the loop-mode Deployment of deploy/components/reconciler-loop): they
// decode strictly into their API types, and the names and permissions they
// share agree with each other and with what the reconciler does.
package reconciler_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// loopDir is the component that runs the reconciler as a Deployment.
const loopDir = "../components/reconciler-loop"

type manifests struct {
	serviceAccount corev1.ServiceAccount
	clusterRole    rbacv1.ClusterRole
	roleBinding    rbacv1.ClusterRoleBinding
	cronJob        batchv1.CronJob
	deployment     appsv1.Deployment
	secret         corev1.Secret
}

// pods are the pod templates that run the reconciler, by kind.
func (m manifests) pods() map[string]corev1.PodSpec {
	return map[string]corev1.PodSpec{
		"CronJob":    m.cronJob.Spec.JobTemplate.Spec.Template.Spec,
		"Deployment": m.deployment.Spec.Template.Spec,
	}
}

// documents splits a YAML file into its documents.
func documents(t *testing.T, file string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(bytes.TrimSpace(doc)) > 0 {
			docs = append(docs, doc)
		}
	}
}

func load(t *testing.T) manifests {
	t.Helper()
	var m manifests
	targets := map[string]any{
		"ServiceAccount":     &m.serviceAccount,
		"ClusterRole":        &m.clusterRole,
		"ClusterRoleBinding": &m.roleBinding,
		"CronJob":            &m.cronJob,
		"Deployment":         &m.deployment,
		"Secret":             &m.secret,
	}
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	loop, err := filepath.Glob(filepath.Join(loopDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, loop...)
	seen := map[string]bool{}
	for _, file := range files {
		if filepath.Base(file) == "kustomization.yaml" {
			continue
		}
		for _, doc := range documents(t, file) {
			var meta struct{ Kind string }
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			target, ok := targets[meta.Kind]
			if !ok || seen[meta.Kind] {
				t.Fatalf("%s: unexpected or repeated kind %q", file, meta.Kind)
			}
			if err := yaml.UnmarshalStrict(doc, target); err != nil {
				t.Fatalf("%s: %s does not decode strictly: %v", file, meta.Kind, err)
			}
			seen[meta.Kind] = true
		}
	}
	for kind := range targets {
		if !seen[kind] {
			t.Fatalf("no %s among the manifests", kind)
		}
	}
	return m
}

func TestKustomizationsListExistingFiles(t *testing.T) {
	m := load(t)
	for _, dir := range []string{".", loopDir} {
		var k struct {
			Resources []string `json:"resources"`
		}
		data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, &k); err != nil {
			t.Fatal(err)
		}
		if len(k.Resources) == 0 {
			t.Errorf("%s lists no resources", dir)
		}
		for _, r := range k.Resources {
			if _, err := os.Stat(filepath.Join(dir, r)); err != nil {
				t.Errorf("resource %s: %v", r, err)
			}
			if strings.Contains(r, "example") {
				t.Errorf("example %s must not be applied", r)
			}
		}
	}
	if m.cronJob.Namespace != m.secret.Namespace || m.deployment.Namespace != m.secret.Namespace {
		t.Errorf("CronJob in %q, Deployment in %q, the maas-api Secret in %q", m.cronJob.Namespace, m.deployment.Namespace, m.secret.Namespace)
	}
}

// TestModes: the CronJob runs one cycle every two minutes, never two at
// once; the Deployment loops, alone.
func TestModes(t *testing.T) {
	m := load(t)
	cj := m.cronJob.Spec
	if cj.Schedule != "*/2 * * * *" || cj.ConcurrencyPolicy != batchv1.ForbidConcurrent {
		t.Errorf("CronJob schedule %q, concurrencyPolicy %q", cj.Schedule, cj.ConcurrencyPolicy)
	}
	if args := cj.JobTemplate.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--once") {
		t.Errorf("CronJob args %q lack --once", args)
	}
	if args := m.deployment.Spec.Template.Spec.Containers[0].Args; slices.Contains(args, "--once") {
		t.Errorf("loop Deployment args %q have --once", args)
	}
	if m.deployment.Spec.Replicas == nil || *m.deployment.Spec.Replicas != 1 {
		t.Errorf("loop Deployment replicas = %v, want 1", m.deployment.Spec.Replicas)
	}
}

// TestRBACIsWhatTheReconcilerUses: KubeCluster lists Secrets, VMs, VMIs and
// VirtualMachineBMCs, applies VirtualMachineBMC status and creates Events;
// nothing more (package maas runs the reconciler with this role against a
// real API server).
func TestRBACIsWhatTheReconcilerUses(t *testing.T) {
	m := load(t)
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"list"}},
		{APIGroups: []string{"kubevirt.io"}, Resources: []string{"virtualmachines", "virtualmachineinstances"}, Verbs: []string{"list"}},
		{APIGroups: []string{"bmc.virtmetal.io"}, Resources: []string{"virtualmachinebmcs"}, Verbs: []string{"list"}},
		{APIGroups: []string{"bmc.virtmetal.io"}, Resources: []string{"virtualmachinebmcs/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}},
	}
	if len(m.clusterRole.Rules) != len(want) {
		t.Fatalf("rules = %+v", m.clusterRole.Rules)
	}
	for i, rule := range m.clusterRole.Rules {
		if !slices.Equal(rule.APIGroups, want[i].APIGroups) || !slices.Equal(rule.Resources, want[i].Resources) ||
			!slices.Equal(rule.Verbs, want[i].Verbs) || len(rule.ResourceNames) != 0 {
			t.Errorf("rule %d = %+v, want %+v", i, rule, want[i])
		}
	}
	rb := m.roleBinding
	if rb.RoleRef.Kind != "ClusterRole" || rb.RoleRef.Name != m.clusterRole.Name {
		t.Errorf("ClusterRoleBinding refers to %+v, want ClusterRole %s", rb.RoleRef, m.clusterRole.Name)
	}
	if len(rb.Subjects) != 1 || rb.Subjects[0].Name != m.serviceAccount.Name || rb.Subjects[0].Namespace != m.serviceAccount.Namespace {
		t.Errorf("ClusterRoleBinding subjects = %+v", rb.Subjects)
	}
	for kind, pod := range m.pods() {
		if pod.ServiceAccountName != m.serviceAccount.Name {
			t.Errorf("%s runs as %q, not %q", kind, pod.ServiceAccountName, m.serviceAccount.Name)
		}
	}
}

// TestPodsUseTheMaaSSecretAndTheConfig: the MaaS URL and key come from the
// maas-api Secret, the BMC domain from the controller's ConfigMap.
func TestPodsUseTheMaaSSecretAndTheConfig(t *testing.T) {
	m := load(t)
	var config corev1.ConfigMap
	docs := documents(t, "../controller/config.yaml")
	if len(docs) != 1 {
		t.Fatalf("controller/config.yaml: %d documents", len(docs))
	}
	if err := yaml.UnmarshalStrict(docs[0], &config); err != nil {
		t.Fatal(err)
	}
	for kind, pod := range m.pods() {
		t.Run(kind, func(t *testing.T) {
			if len(pod.Containers) != 1 {
				t.Fatalf("containers = %d", len(pod.Containers))
			}
			c := pod.Containers[0]
			keys := m.secret.StringData

			var mountPath string
			for _, v := range pod.Volumes {
				if v.Secret == nil {
					continue
				}
				if v.Secret.SecretName != m.secret.Name {
					t.Errorf("volume %s mounts Secret %q, want %q", v.Name, v.Secret.SecretName, m.secret.Name)
				}
				for _, mount := range c.VolumeMounts {
					if mount.Name == v.Name {
						mountPath = mount.MountPath
					}
				}
				for _, item := range v.Secret.Items {
					if _, ok := keys[item.Key]; !ok {
						t.Errorf("volume item key %q is not in the example Secret", item.Key)
					}
					want := "--maas-api-key-file=" + filepath.Join(mountPath, item.Path)
					if !slices.Contains(c.Args, want) {
						t.Errorf("args %q lack %q", c.Args, want)
					}
				}
			}
			if mountPath == "" {
				t.Error("no Secret volume mounted")
			}
			var domain bool
			for _, e := range c.Env {
				switch {
				case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == m.secret.Name:
					if key := e.ValueFrom.SecretKeyRef.Key; keys[key] == "" {
						t.Errorf("env %s uses key %q, not in the example Secret", e.Name, key)
					}
				case e.Name == "VIRTMETAL_BMC_DOMAIN" && e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
					ref := e.ValueFrom.ConfigMapKeyRef
					if ref.Name != config.Name || config.Data[ref.Key] == "" {
						t.Errorf("env %s from ConfigMap %s key %s, not the controller's %s domain", e.Name, ref.Name, ref.Key, config.Name)
					}
					domain = true
				default:
					t.Errorf("env %s comes neither from Secret %s nor is the domain from ConfigMap %s", e.Name, m.secret.Name, config.Name)
				}
			}
			if !domain {
				t.Error("no VIRTMETAL_BMC_DOMAIN in the env")
			}
		})
	}
}

func TestPodsAreRestricted(t *testing.T) {
	m := load(t)
	for kind, pod := range m.pods() {
		if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot ||
			pod.SecurityContext.SeccompProfile == nil || pod.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: pod security context = %+v", kind, pod.SecurityContext)
		}
		for _, c := range pod.Containers {
			sc := c.SecurityContext
			if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
				sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
				sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("%s: container %s security context = %+v", kind, c.Name, sc)
			}
		}
	}
}
