// Package bmc renders the least-privilege RBAC of one VM's bmc-server from
// rbac.yaml.tmpl, for the controller and for the tests that prove it.
package bmc

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"text/template"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

//go:embed rbac.yaml.tmpl
var rbacTemplate string

var rbac = template.Must(template.New("rbac.yaml.tmpl").Option("missingkey=error").Parse(rbacTemplate))

// RBACParams fills the template.
type RBACParams struct {
	Namespace string
	VMName    string
	// ServiceAccount the bmc-server runs as; empty means "bmc-" + VMName.
	ServiceAccount string
	// Instancetype or ClusterInstancetype names the VM's instancetype (by
	// the kind in its spec.instancetype), which Inventory reads.
	Instancetype        string
	ClusterInstancetype string
}

// RenderRBAC returns the ServiceAccount, Role and RoleBinding (and, for a
// cluster instancetype, a ClusterRole and ClusterRoleBinding) as YAML.
func RenderRBAC(p RBACParams) ([]byte, error) {
	if p.ServiceAccount == "" {
		p.ServiceAccount = "bmc-" + p.VMName
	}
	for _, name := range []string{p.Namespace, p.VMName, p.ServiceAccount} {
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return nil, fmt.Errorf("invalid name %q: %v", name, errs)
		}
	}
	for _, name := range []string{p.Instancetype, p.ClusterInstancetype} {
		if errs := validation.IsDNS1123Subdomain(name); name != "" && len(errs) > 0 {
			return nil, fmt.Errorf("invalid instancetype name %q: %v", name, errs)
		}
	}
	var out bytes.Buffer
	if err := rbac.Execute(&out, p); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// RBACObjects renders the RBAC and decodes it into objects ready to create.
func RBACObjects(p RBACParams) ([]*unstructured.Unstructured, error) {
	data, err := RenderRBAC(p)
	if err != nil {
		return nil, err
	}
	decoder := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		obj := &unstructured.Unstructured{}
		err := decoder.Decode(&obj.Object)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
}
