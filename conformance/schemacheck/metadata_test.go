package schemacheck_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/virtmetal/virtmetal/conformance/schemacheck"
)

// metadataDoc builds a $metadata document from edmx:Reference elements.
func metadataDoc(references string) string {
	return `<?xml version="1.0" encoding="UTF-8"?>
<edmx:Edmx xmlns:edmx="http://docs.oasis-open.org/odata/ns/edmx" Version="4.0">` + references + `
  <edmx:DataServices>
    <Schema xmlns="http://docs.oasis-open.org/odata/ns/edm" Namespace="Service">
      <EntityContainer Name="Service" Extends="ServiceRoot.v1_20_0.ServiceContainer"/>
    </Schema>
  </edmx:DataServices>
</edmx:Edmx>`
}

const goodReferences = `
  <edmx:Reference Uri="http://redfish.dmtf.org/schemas/v1/ServiceRoot_v1.xml">
    <edmx:Include Namespace="ServiceRoot"/>
    <edmx:Include Namespace="ServiceRoot.v1_20_0"/>
  </edmx:Reference>
  <edmx:Reference Uri="http://redfish.dmtf.org/schemas/v1/ComputerSystemCollection_v1.xml">
    <edmx:Include Namespace="ComputerSystemCollection"/>
  </edmx:Reference>`

func TestMetadataViolations(t *testing.T) {
	types := []string{"#ServiceRoot.v1_20_0.ServiceRoot", "#ComputerSystemCollection.ComputerSystemCollection"}
	tests := []struct {
		name string
		doc  string
		want []string // one substring per expected violation, in order
	}{
		{name: "covers every type", doc: metadataDoc(goodReferences)},
		{
			name: "reference to a file outside the bundle",
			doc: metadataDoc(goodReferences + `
  <edmx:Reference Uri="http://docs.oasis-open.org/odata/odata/v4.0/errata03/csd01/complete/vocabularies/Org.OData.Core.V1.xml">
    <edmx:Include Namespace="Org.OData.Core.V1" Alias="OData"/>
  </edmx:Reference>`),
			want: []string{`edmx:Reference[3] Uri="http://docs.oasis-open.org/odata/odata/v4.0/errata03/csd01/complete/vocabularies/Org.OData.Core.V1.xml": names Org.OData.Core.V1.xml, which is not a CSDL file of the DMTF bundle`},
		},
		{
			name: "include of a namespace the file does not declare",
			doc: metadataDoc(goodReferences + `
  <edmx:Reference Uri="http://redfish.dmtf.org/schemas/v1/ComputerSystem_v1.xml">
    <edmx:Include Namespace="ComputerSystem.v1_99_0"/>
  </edmx:Reference>`),
			want: []string{`includes Namespace "ComputerSystem.v1_99_0", which ComputerSystem_v1.xml does not declare`},
		},
		{
			name: "type whose namespace is not included",
			doc: metadataDoc(`
  <edmx:Reference Uri="http://redfish.dmtf.org/schemas/v1/ServiceRoot_v1.xml">
    <edmx:Include Namespace="ServiceRoot.v1_19_0"/>
  </edmx:Reference>`),
			want: []string{
				`no edmx:Include of Namespace "ServiceRoot.v1_20_0", used by @odata.type "#ServiceRoot.v1_20_0.ServiceRoot"`,
				`no edmx:Include of Namespace "ComputerSystemCollection"`,
			},
		},
		{
			name: "wrong version",
			doc:  strings.Replace(metadataDoc(goodReferences), `Version="4.0"`, `Version="4.01"`, 1),
			want: []string{`Version is "4.01", want "4.0"`},
		},
		{name: "not XML", doc: `{"@odata.id": "/redfish/v1/$metadata"}`, want: []string{"not an edmx:Edmx XML document"}},
		{
			name: "XML that is not edmx",
			doc:  `<Edmx Version="4.0"/>`,
			want: []string{"not an edmx:Edmx XML document"},
		},
	}
	csdlDir := filepath.Join(schemacheck.RequireBundle(t), "csdl")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := schemacheck.MetadataViolations("/redfish/v1/$metadata", []byte(tt.doc), csdlDir, types)
			if err != nil {
				t.Fatalf("MetadataViolations: %v", err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d violations, want %d:\n%s", len(got), len(tt.want), joinViolations(got))
			}
			for i, want := range tt.want {
				if s := got[i].String(); !strings.Contains(s, want) {
					t.Errorf("violation %d = %s\nwant it to contain %s", i, s, want)
				}
			}
		})
	}
}

func TestCheckMetadataChecksTheResponse(t *testing.T) {
	tests := []struct {
		name    string
		headers map[string]string
		want    []string
	}{
		{name: "XML with OData-Version", headers: map[string]string{"Content-Type": "application/xml"}},
		{name: "served as JSON", want: []string{`Content-Type is "application/json; charset=utf-8", want application/xml`}},
		{
			name:    "no OData-Version",
			headers: map[string]string{"Content-Type": "application/xml", "OData-Version": ""},
			want:    []string{`OData-Version is "", want "4.0"`},
		},
	}
	csdlDir := filepath.Join(schemacheck.RequireBundle(t), "csdl")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			service := fixtureService(t, map[string]string{"/redfish/v1/$metadata": metadataDoc(goodReferences)},
				map[string]map[string]string{"/redfish/v1/$metadata": tt.headers})
			crawler := &schemacheck.Crawler{Client: service.Client(), BaseURL: service.URL, Username: "admin", Password: "password"}
			got, err := crawler.CheckMetadata(t.Context(), csdlDir, []string{"#ServiceRoot.v1_20_0.ServiceRoot"})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d violations, want %d:\n%s", len(got), len(tt.want), joinViolations(got))
			}
			for i, want := range tt.want {
				if s := got[i].String(); !strings.Contains(s, want) {
					t.Errorf("violation %d = %s\nwant it to contain %s", i, s, want)
				}
			}
		})
	}
}
