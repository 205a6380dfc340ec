// Package reconciler_test checks the reconciler's manifests: they decode
// strictly into their API types, and the names and permissions they share
// agree with each other and with what the reconciler does.
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
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

type manifests struct {
	namespace      corev1.Namespace
	serviceAccount corev1.ServiceAccount
	clusterRole    rbacv1.ClusterRole
	roleBinding    rbacv1.ClusterRoleBinding
	deployment     appsv1.Deployment
	secret         corev1.Secret
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
		"Namespace":          &m.namespace,
		"ServiceAccount":     &m.serviceAccount,
		"ClusterRole":        &m.clusterRole,
		"ClusterRoleBinding": &m.roleBinding,
		"Deployment":         &m.deployment,
		"Secret":             &m.secret,
	}
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, file := range files {
		if file == "kustomization.yaml" {
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

func TestKustomizationListsExistingFiles(t *testing.T) {
	var k struct {
		Namespace string   `json:"namespace"`
		Resources []string `json:"resources"`
	}
	data, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	m := load(t)
	if k.Namespace != m.namespace.Name || k.Namespace != m.deployment.Namespace {
		t.Errorf("kustomization namespace %q, Namespace %q, Deployment in %q", k.Namespace, m.namespace.Name, m.deployment.Namespace)
	}
	for _, r := range k.Resources {
		if _, err := os.Stat(r); err != nil {
			t.Errorf("resource %s: %v", r, err)
		}
		if strings.Contains(r, "example") {
			t.Errorf("example %s must not be applied by default", r)
		}
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
	if m.deployment.Spec.Template.Spec.ServiceAccountName != m.serviceAccount.Name {
		t.Errorf("Deployment runs as %q, not %q", m.deployment.Spec.Template.Spec.ServiceAccountName, m.serviceAccount.Name)
	}
}

func TestDeploymentUsesTheMaaSSecret(t *testing.T) {
	m := load(t)
	pod := m.deployment.Spec.Template.Spec
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
	for _, e := range c.Env {
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != m.secret.Name {
			t.Errorf("env %s does not come from Secret %s", e.Name, m.secret.Name)
			continue
		}
		if key := e.ValueFrom.SecretKeyRef.Key; keys[key] == "" {
			t.Errorf("env %s uses key %q, not in the example Secret", e.Name, key)
		}
	}
}

func TestPodIsRestricted(t *testing.T) {
	m := load(t)
	pod := m.deployment.Spec.Template.Spec
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot ||
		pod.SecurityContext.SeccompProfile == nil || pod.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context = %+v", pod.SecurityContext)
	}
	for _, c := range pod.Containers {
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("container %s security context = %+v", c.Name, sc)
		}
	}
}
