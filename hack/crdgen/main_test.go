package main

import (
	"os"
	"path/filepath"
	"testing"
)

const sampleValidations = "package components\n\nvar CRDsValidation map[string]string = map[string]string{\n" +
	"\t\"widget\": `openAPIV3Schema:\n  nullable: true\n  properties:\n    spec:\n      properties:\n        size:\n          type: integer\n      type: object\n    status:\n      nullable: true\n      type: object\n  type: object\n`,\n}\n"

func TestReadAndBuild(t *testing.T) {
	path := filepath.Join(t.TempDir(), "validations_generated.go")
	if err := os.WriteFile(path, []byte(sampleValidations), 0o644); err != nil {
		t.Fatal(err)
	}
	schemas, err := readSchemas(path)
	if err != nil {
		t.Fatalf("readSchemas: %v", err)
	}
	spec := crdSpec{schemaKey: "widget", group: "example.io", versions: []string{"v1", "v1beta1"},
		plural: "widgets", singular: "widget", kind: "Widget", status: true, openStatus: true}
	crd, err := build(spec, schemas, "test")
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	if crd.Name != "widgets.example.io" || len(crd.Spec.Versions) != 2 {
		t.Fatalf("crd = %+v", crd)
	}
	v1, beta := crd.Spec.Versions[0], crd.Spec.Versions[1]
	if !v1.Storage || beta.Storage || !v1.Served || !beta.Served || v1.Subresources == nil || v1.Subresources.Status == nil {
		t.Fatalf("versions = %+v", crd.Spec.Versions)
	}
	root := v1.Schema.OpenAPIV3Schema
	if root.Nullable || root.Properties["spec"].Properties["size"].Type != "integer" {
		t.Fatalf("schema = %+v", root)
	}
	if st := root.Properties["status"]; st.XPreserveUnknownFields == nil || !*st.XPreserveUnknownFields {
		t.Fatalf("status schema not opened: %+v", st)
	}
	if _, err := build(crdSpec{schemaKey: "missing"}, schemas, "test"); err == nil {
		t.Fatalf("build accepted a missing schema")
	}
}
