// Package bmc renders the least-privilege RBAC of a bmc-server (of one VM,
// or shared by several VMs of a namespace) from rbac.yaml.tmpl, for the
// controller and for the tests that prove it.
package bmc

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/template"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/virtmetal/virtmetal/internal/bmcspec"
)

//go:embed rbac.yaml.tmpl
var rbacTemplate string

var rbac = template.Must(template.New("rbac.yaml.tmpl").Option("missingkey=error").
	Funcs(template.FuncMap{"list": func(names []string) string { return strings.Join(names, ", ") }}).
	Parse(rbacTemplate))

// SharedServiceAccount is the default ServiceAccount of a bmc-server shared
// by several VMs.
const SharedServiceAccount = "virtmetal-bmcs"

// RBACParams fills the template: VMName for one VM's bmc-server, or VMs for
// one bmc-server shared by several VMs of the namespace.
type RBACParams struct {
	Namespace string
	VMName    string
	// ServiceAccount the bmc-server runs as; empty means "bmc-" + VMName,
	// or SharedServiceAccount with VMs.
	ServiceAccount string
	// Instancetype or ClusterInstancetype names the VM's instancetype (by
	// the kind in its spec.instancetype), which Inventory reads.
	Instancetype        string
	ClusterInstancetype string
	// Claims are the PersistentVolumeClaims of the namespace whose size
	// the bmc-server reads (machine/kubevirt.ReferencedClaims of the VM,
	// or of all of them with VMs).
	Claims []string

	// VMs, instead of VMName, are the VMs of a shared bmc-server; its
	// objects are labelled virtmetal.io/shared rather than with one VM.
	VMs []string
	// Instancetypes and ClusterInstancetypes are, with VMs, those of all
	// of them.
	Instancetypes        []string
	ClusterInstancetypes []string
}

// rendering is what the template reads: RBACParams as lists either way.
type rendering struct {
	Namespace, ServiceAccount, VMName, ClusterName                  string
	Shared                                                          bool
	VMs, Media, States, Claims, Instancetypes, ClusterInstancetypes []string
}

// ClusterRBACName is the name of the ClusterRole and ClusterRoleBinding that
// grant the cluster instancetypes; vm is "" for a shared bmc-server. A
// namespace's name holds no dot, so the dot after it keeps every
// (namespace, VM) pair's name its own: one tenant cannot name a VM so that
// its BMC's cluster RBAC takes over another tenant's.
func ClusterRBACName(namespace, vm string) string {
	if vm == "" {
		return "virtmetal-bmcs." + namespace
	}
	return "virtmetal-bmc." + namespace + "." + vm
}

// LegacyClusterRBACName is the name earlier versions gave the same
// objects, joined by dashes, under which namespace a and VM b-c met
// namespace a-b and VM c. The controller deletes objects of that name made
// for the same VM.
func LegacyClusterRBACName(namespace, vm string) string {
	if vm == "" {
		return "virtmetal-bmcs-" + namespace
	}
	return "virtmetal-bmc-" + namespace + "-" + vm
}

// RenderRBAC returns the ServiceAccount, Role and RoleBinding (and, for a
// cluster instancetype, a ClusterRole and ClusterRoleBinding) as YAML.
func RenderRBAC(p RBACParams) ([]byte, error) {
	r, err := p.rendering()
	if err != nil {
		return nil, err
	}
	for _, name := range slices.Concat([]string{r.Namespace, r.ServiceAccount}, r.VMs) {
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return nil, fmt.Errorf("invalid name %q: %v", name, errs)
		}
	}
	for _, name := range slices.Concat(r.Instancetypes, r.ClusterInstancetypes) {
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return nil, fmt.Errorf("invalid instancetype name %q: %v", name, errs)
		}
	}
	for _, name := range r.Claims {
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return nil, fmt.Errorf("invalid claim name %q: %v", name, errs)
		}
	}
	var out bytes.Buffer
	if err := rbac.Execute(&out, r); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func (p RBACParams) rendering() (rendering, error) {
	r := rendering{Namespace: p.Namespace, ServiceAccount: p.ServiceAccount, VMName: p.VMName, Claims: p.Claims}
	switch {
	case p.VMName != "" && len(p.VMs) > 0:
		return r, errors.New("VMName and VMs exclude each other")
	case len(p.VMs) > 0:
		r.Shared, r.VMs = true, p.VMs
		r.Instancetypes, r.ClusterInstancetypes = p.Instancetypes, p.ClusterInstancetypes
		if r.ServiceAccount == "" {
			r.ServiceAccount = SharedServiceAccount
		}
	default:
		r.VMs = []string{p.VMName}
		if p.Instancetype != "" {
			r.Instancetypes = []string{p.Instancetype}
		}
		if p.ClusterInstancetype != "" {
			r.ClusterInstancetypes = []string{p.ClusterInstancetype}
		}
		if r.ServiceAccount == "" {
			r.ServiceAccount = "bmc-" + p.VMName
		}
	}
	r.ClusterName = ClusterRBACName(p.Namespace, p.VMName)
	for _, vm := range r.VMs {
		r.Media = append(r.Media, vm+"-virtmetal-media")
		if !r.Shared {
			r.States = append(r.States, bmcspec.StateSecretName(vm))
		}
	}
	if r.Shared {
		// One state Secret for the namespace's VMs: a name per VM would
		// be a Secret per VM for the controller to create.
		r.States = []string{bmcspec.SharedStateSecret}
	}
	return r, nil
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
