package schemacheck_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/virtmetal/virtmetal/conformance/schemacheck"
)

const validSystem = `{
	"@odata.id": "/redfish/v1/Systems/vm-0",
	"@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem",
	"Id": "vm-0",
	"Name": "vm-0",
	"SystemType": "Virtual",
	"UUID": "6f1b8f8e-2f0c-4a53-9f59-1b0a6f1e2d3c",
	"PowerState": "On",
	"Status": {"State": "Enabled", "Health": "OK"},
	"Boot": {
		"BootSourceOverrideTarget": "Pxe",
		"BootSourceOverrideTarget@Redfish.AllowableValues": ["None", "Pxe", "Hdd", "Cd"],
		"BootSourceOverrideEnabled": "Once",
		"BootSourceOverrideMode": "UEFI"
	},
	"Links": {"ManagedBy": [{"@odata.id": "/redfish/v1/Managers/vm-0"}], "ManagedBy@odata.count": 1},
	"VirtualMedia": {"@odata.id": "/redfish/v1/Systems/vm-0/VirtualMedia"},
	"Actions": {
		"#ComputerSystem.Reset": {
			"target": "/redfish/v1/Systems/vm-0/Actions/ComputerSystem.Reset",
			"ResetType@Redfish.AllowableValues": ["On", "ForceOff"]
		}
	}
}`

// withProperty returns validSystem with one more top-level property.
func withProperty(property string) string {
	return strings.Replace(validSystem, `"Id": "vm-0",`, `"Id": "vm-0", `+property+`,`, 1)
}

func TestValidatorReportsViolations(t *testing.T) {
	tests := []struct {
		name string
		body string
		// want holds one substring per expected violation, matched against
		// Violation.String() in order (violations are sorted by pointer).
		want []string
	}{
		{name: "valid system", body: validSystem},
		{
			name: "valid collection",
			body: `{"@odata.id": "/redfish/v1/Systems", "@odata.type": "#ComputerSystemCollection.ComputerSystemCollection",
				"Name": "Computer System Collection", "Members": [{"@odata.id": "/redfish/v1/Systems/vm-0"}], "Members@odata.count": 1}`,
		},
		{
			name: "missing errata falls back to the newest of the same minor version",
			body: strings.Replace(validSystem, "v1_20_0", "v1_20_1", 1),
		},
		{
			name: "unknown property",
			body: withProperty(`"Bogus": 1`),
			want: []string{`/Bogus: property "Bogus" is not defined by the schema (additionalProperties is false) [ComputerSystem.v1_20_0.json#/definitions/ComputerSystem/additionalProperties]`},
		},
		{
			name: "wrong enum value",
			body: strings.Replace(validSystem, `"PowerState": "On"`, `"PowerState": "Of"`, 1),
			want: []string{`/PowerState: value must be one of 'On', 'Off', 'PoweringOn', 'PoweringOff', 'Paused' [Resource.json#/definitions/PowerState/enum]`},
		},
		{
			name: "wrong type",
			body: strings.Replace(validSystem, `"BootSourceOverrideTarget": "Pxe"`, `"BootSourceOverrideTarget": 3`, 1),
			want: []string{`/Boot/BootSourceOverrideTarget: got number, want string or null [ComputerSystem.json#/definitions/BootSource/type]`},
		},
		{
			name: "missing required property",
			body: strings.Replace(validSystem, `"Name": "vm-0",`, ``, 1),
			want: []string{`(body): missing property 'Name' [ComputerSystem.v1_20_0.json#/definitions/ComputerSystem/required]`},
		},
		{
			name: "link that is not a reference",
			body: strings.Replace(validSystem, `"ManagedBy": [{"@odata.id": "/redfish/v1/Managers/vm-0"}]`, `"ManagedBy": [{"@odata.id": "/redfish/v1/Managers/vm-0", "Name": "x"}]`, 1),
			want: []string{`/Links/ManagedBy/0/Name: property "Name" is not defined by the schema (additionalProperties is false) [odata-v4.json#/definitions/idRef/additionalProperties]`},
		},
		{
			name: "missing @odata.type",
			body: strings.Replace(validSystem, `"@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem",`, ``, 1),
			want: []string{`/@odata.type: missing or not a string`},
		},
		{
			name: "malformed @odata.type",
			body: strings.Replace(validSystem, `#ComputerSystem.v1_20_0.ComputerSystem`, `ComputerSystem`, 1),
			want: []string{`/@odata.type: "ComputerSystem" is not of the form`},
		},
		{
			name: "resource type without version",
			body: strings.Replace(validSystem, `#ComputerSystem.v1_20_0.ComputerSystem`, `#ComputerSystem.ComputerSystem`, 1),
			want: []string{`/@odata.type: #ComputerSystem.ComputerSystem names no version`},
		},
		{
			name: "property whose schema is outside the bundle",
			body: withProperty(`"HostedServices": {"StorageServices": {"@odata.id": "/redfish/v1/StorageServices"}}`),
			want: []string{`/HostedServices/StorageServices: value uses schema http://redfish.dmtf.org/schemas/swordfish/v1/HostedStorageServices.json#/definitions/HostedStorageServices, which is not in the DMTF bundle`},
		},
		{name: "not JSON", body: `{"@odata.id": `, want: []string{`(body): body is not JSON`}},
		{name: "JSON array", body: `[]`, want: []string{`(body): body is JSON but not an object`}},
	}
	validator := bundleValidator(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := validator.Validate("/redfish/v1/Systems/vm-0", []byte(tt.body))
			if err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d violations, want %d:\n%s", len(got), len(tt.want), joinViolations(got))
			}
			for i, want := range tt.want {
				if s := got[i].String(); !strings.Contains(s, want) {
					t.Errorf("violation %d = %s\nwant it to contain %s", i, s, want)
				}
				if got[i].URI != "/redfish/v1/Systems/vm-0" {
					t.Errorf("violation %d has URI %q", i, got[i].URI)
				}
			}
		})
	}
}

func TestValidatorFailsWithoutSchema(t *testing.T) {
	tests := []struct {
		name       string
		odataType  string
		wantErrMsg string
	}{
		{name: "unknown schema file", odataType: "#Bogus.v1_0_0.Bogus", wantErrMsg: "Bogus.v1_0_0.json"},
		{name: "no file of that minor version", odataType: "#ComputerSystem.v1_99_0.ComputerSystem", wantErrMsg: "ComputerSystem.v1_99_"},
		{name: "unknown definition", odataType: "#ComputerSystem.v1_20_0.Bogus", wantErrMsg: `no definition "Bogus"`},
	}
	validator := bundleValidator(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"@odata.id": "/redfish/v1/x", "@odata.type": "` + tt.odataType + `", "Id": "x", "Name": "x"}`
			got, err := validator.Validate("/redfish/v1/x", []byte(body))
			if err == nil {
				t.Fatalf("Validate passed with violations %v; a missing schema must be an error", got)
			}
			if !errors.Is(err, schemacheck.ErrSchemaNotFound) || !strings.Contains(err.Error(), tt.wantErrMsg) {
				t.Errorf("error = %v; want ErrSchemaNotFound mentioning %q", err, tt.wantErrMsg)
			}
		})
	}
}

func TestNewValidatorNeedsTheMetaschema(t *testing.T) {
	_, err := schemacheck.NewValidator(t.TempDir())
	if !errors.Is(err, schemacheck.ErrSchemaNotFound) {
		t.Fatalf("NewValidator(empty folder) error = %v; want ErrSchemaNotFound", err)
	}
}
