package redfish_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	bios0         = system0 + "/Bios"
	biosSettings0 = bios0 + "/Settings"
	secureBoot0   = system0 + "/SecureBoot"
)

// firmwareSnapshot is every body a firmware or locator write could change.
func firmwareSnapshot(f *fixture) [][]byte {
	var bodies [][]byte
	for _, path := range []string{system0, bios0, biosSettings0, secureBoot0, "/redfish/v1/Chassis/vm-0"} {
		bodies = append(bodies, f.do(asAdmin("GET", path, "")).raw)
	}
	return bodies
}

// TestFirmwareBadInputChangesNothing: each refused write answers its Base
// message and leaves every resource as it was, valid parts of the body
// included.
func TestFirmwareBadInputChangesNothing(t *testing.T) {
	legacy := func(f *fixture) {
		patchOK(f, biosSettings0, `{"Attributes":{"BootMode":"Legacy","SecureBoot":"Disabled"}}`)
	}
	secure := func(f *fixture) { patchOK(f, secureBoot0, `{"SecureBootEnable":true}`) }
	stale := func(method, path, body string) request {
		r := asAdmin(method, path, body)
		r.headers = map[string]string{"If-Match": `"stale"`}
		return r
	}
	tests := []struct {
		name       string
		setup      func(*fixture)
		req        request
		wantStatus int
		wantIDs    []string
	}{
		{"unknown attribute", nil, asAdmin("PATCH", biosSettings0, `{"Attributes":{"TurboMode":"Enabled"}}`), 400, []string{"PropertyUnknown"}},
		{"attribute of wrong type", nil, asAdmin("PATCH", biosSettings0, `{"Attributes":{"BootMode":1}}`), 400, []string{"PropertyValueTypeError"}},
		{"attribute value not allowed", nil, asAdmin("PATCH", biosSettings0, `{"Attributes":{"SecureBoot":"Sometimes"}}`), 400, []string{"PropertyValueNotInList"}},
		{"read-only attribute", nil, asAdmin("PATCH", biosSettings0, `{"Attributes":{"ProcessorCores":64}}`), 400, []string{"PropertyNotWritable"}},
		{"Attributes not an object", nil, asAdmin("PATCH", biosSettings0, `{"Attributes":"BootMode=Legacy"}`), 400, []string{"PropertyValueTypeError"}},
		{"valid and unknown together", nil, asAdmin("PATCH", biosSettings0, `{"Id":"x","Attributes":{"BootMode":"Legacy","Colour":"red"}}`), 400,
			[]string{"PropertyNotWritable", "PropertyUnknown"}},
		{"apply time not offered", nil, asAdmin("PATCH", biosSettings0, `{"Attributes":{"BootMode":"Legacy"},"@Redfish.SettingsApplyTime":{"ApplyTime":"Immediate"}}`), 400,
			[]string{"PropertyValueNotInList"}},
		{"apply time at a maintenance window", nil, asAdmin("PATCH", biosSettings0,
			`{"Attributes":{"BootMode":"Legacy"},"@Redfish.SettingsApplyTime":{"ApplyTime":"OnReset","MaintenanceWindowStartTime":"2030-01-01T00:00:00Z"}}`), 400,
			[]string{"PropertyUnknown"}},
		{"apply time not an object", nil, asAdmin("PATCH", biosSettings0, `{"Attributes":{"BootMode":"Legacy"},"@Redfish.SettingsApplyTime":"OnReset"}`), 400,
			[]string{"PropertyValueTypeError"}},
		{"apply time of another type", nil, asAdmin("PATCH", biosSettings0,
			`{"Attributes":{"BootMode":"Legacy"},"@Redfish.SettingsApplyTime":{"@odata.type":"#Bios.v1_2_0.Bios","ApplyTime":1}}`), 400,
			[]string{"PropertyValueNotInList", "PropertyValueTypeError"}},
		{"stale If-Match on Bios settings", nil, stale("PATCH", biosSettings0, `{"Attributes":{"BootMode":"Legacy"}}`), 412, []string{"PreconditionFailed"}},
		{"legacy under Secure Boot", secure, asAdmin("PATCH", biosSettings0, `{"Attributes":{"BootMode":"Legacy"}}`), 409, []string{"PropertyValueResourceConflict"}},
		{"current Bios is read-only", nil, asAdmin("PATCH", bios0, `{"Attributes":{"BootMode":"Legacy"}}`), 405, []string{"OperationNotAllowed"}},
		{"ResetBios with a parameter", nil, asAdmin("POST", bios0+"/Actions/Bios.ResetBios", `{"Now":true}`), 400, []string{"ActionParameterUnknown"}},

		{"SecureBootEnable of wrong type", nil, asAdmin("PATCH", secureBoot0, `{"SecureBootEnable":"yes"}`), 400, []string{"PropertyValueTypeError"}},
		{"SecureBootCurrentBoot is read-only", nil, asAdmin("PATCH", secureBoot0, `{"SecureBootCurrentBoot":"Enabled"}`), 400, []string{"PropertyNotWritable"}},
		{"Secure Boot on Legacy", legacy, asAdmin("PATCH", secureBoot0, `{"SecureBootEnable":true}`), 409, []string{"PropertyValueResourceConflict"}},
		{"stale If-Match on SecureBoot", nil, stale("PATCH", secureBoot0, `{"SecureBootEnable":true}`), 412, []string{"PreconditionFailed"}},
		{"ResetKeys", nil, asAdmin("POST", secureBoot0+"/Actions/SecureBoot.ResetKeys", `{"ResetKeysType":"ResetAllKeysToDefault"}`), 400, []string{"ActionNotSupported"}},

		{"boot mode Legacy under Secure Boot", secure, asAdmin("PATCH", system0, `{"Boot":{"BootSourceOverrideMode":"Legacy"}}`), 409, []string{"PropertyValueResourceConflict"}},
		{"locator of wrong type", nil, asAdmin("PATCH", system0, `{"LocationIndicatorActive":"on"}`), 400, []string{"PropertyValueTypeError"}},
		{"blinking LED", nil, asAdmin("PATCH", system0, `{"IndicatorLED":"Blinking"}`), 400, []string{"PropertyValueNotInList"}},
		{"locator with a bad boot", nil, asAdmin("PATCH", system0, `{"LocationIndicatorActive":true,"Boot":{"BootSourceOverrideTarget":"Floppy"}}`), 400, []string{"PropertyValueNotInList"}},
		{"stale If-Match on the locator", nil, stale("PATCH", system0, `{"LocationIndicatorActive":true}`), 412, []string{"PreconditionFailed"}},
		{"chassis read-only property", nil, asAdmin("PATCH", "/redfish/v1/Chassis/vm-0", `{"LocationIndicatorActive":true,"ChassisType":"Rack"}`), 400, []string{"PropertyNotWritable"}},
		{"chassis locator of wrong type", nil, asAdmin("PATCH", "/redfish/v1/Chassis/vm-0", `{"IndicatorLED":true}`), 400, []string{"PropertyValueTypeError"}},
		{"stale If-Match on the chassis", nil, stale("PATCH", "/redfish/v1/Chassis/vm-0", `{"LocationIndicatorActive":true}`), 412, []string{"PreconditionFailed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, nil)
			if tt.setup != nil {
				tt.setup(f)
			}
			before := firmwareSnapshot(f)
			res := f.do(tt.req)
			if res.status != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", res.status, tt.wantStatus, res.raw)
			}
			got := messageIDs(t, res)
			var want []string
			for _, id := range tt.wantIDs {
				want = append(want, "Base.1.19."+id)
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("MessageIds = %v, want %v", got, want)
			}
			for i, after := range firmwareSnapshot(f) {
				if !bytes.Equal(before[i], after) {
					t.Errorf("a refused request changed a resource:\nbefore %s\nafter  %s", before[i], after)
				}
			}
		})
	}
}

func patchOK(f *fixture, path, body string) response {
	f.t.Helper()
	res := f.do(asAdmin("PATCH", path, body))
	if res.status != 200 {
		f.t.Fatalf("PATCH %s %s: %d %s", path, body, res.status, res.raw)
	}
	return res
}

// TestFirmwareAppliesAtReset: while the machine runs, a Bios or SecureBoot
// change waits in Bios/Settings, the answer asks for a reset, and the
// reset makes it current; while it is off the next power-on applies it.
func TestFirmwareAppliesAtReset(t *testing.T) {
	f := newFixture(t, nil)
	attr := func(path, name string) any { return lookup(f.do(asAdmin("GET", path, "")).json, "Attributes", name) }
	get := func(path string, keys ...string) any { return lookup(f.do(asAdmin("GET", path, "")).json, keys...) }
	success := []string{"Base.1.19.Success"}
	resetRequired := []string{"Base.1.19.Success", "Base.1.19.ResetRequired"}

	res := patchOK(f, secureBoot0, `{"SecureBootEnable":true}`)
	if ids := extendedIDs(res.json); !slices.Equal(ids, success) {
		t.Errorf("off: messages %v, want %v", ids, success)
	}
	if got := attr(bios0, "SecureBoot"); got != "Enabled" {
		t.Errorf("off: current SecureBoot %v, want Enabled: nothing runs that differs", got)
	}
	if res := f.do(asAdmin("POST", reset0, `{"ResetType":"On"}`)); res.status != 204 {
		t.Fatalf("On: %d %s", res.status, res.raw)
	}
	etag := f.do(asAdmin("GET", biosSettings0, "")).header.Get("ETag")
	patch := asAdmin("PATCH", biosSettings0, `{"Attributes":{"BootMode":"Legacy","SecureBoot":"Disabled"}}`)
	patch.headers = map[string]string{"If-Match": etag}
	res = f.do(patch)
	if res.status != 200 {
		t.Fatalf("PATCH with the current ETag: %d %s", res.status, res.raw)
	}
	if ids := extendedIDs(res.json); !slices.Equal(ids, resetRequired) {
		t.Errorf("running: messages %v, want %v", ids, resetRequired)
	}
	checks := []struct {
		name string
		got  any
		want any
	}{
		{"pending BootMode", attr(biosSettings0, "BootMode"), "Legacy"},
		{"current BootMode", attr(bios0, "BootMode"), "UEFI"},
		{"current SecureBoot", get(secureBoot0, "SecureBootCurrentBoot"), "Enabled"},
		{"next SecureBoot", get(secureBoot0, "SecureBootEnable"), false},
		{"next boot's mode", get(system0, "Boot", "BootSourceOverrideMode"), "Legacy"},
		{"BiosVersion of the running boot", get(system0, "BiosVersion"), "in-memory UEFI firmware"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("before the reset: %s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if res := f.do(asAdmin("POST", reset0, `{"ResetType":"ForceRestart"}`)); res.status != 204 {
		t.Fatalf("ForceRestart: %d %s", res.status, res.raw)
	}
	if got, version := attr(bios0, "BootMode"), get(system0, "BiosVersion"); got != "Legacy" || version != "in-memory Legacy firmware" {
		t.Errorf("after the reset: current BootMode %v, BiosVersion %v; want Legacy", got, version)
	}
	res = f.do(asAdmin("POST", bios0+"/Actions/Bios.ResetBios", ""))
	if res.status != 200 || !slices.Equal(extendedIDs(res.json), resetRequired) {
		t.Errorf("ResetBios: %d %v, want 200 %v", res.status, extendedIDs(res.json), resetRequired)
	}
	if got := attr(biosSettings0, "BootMode"); got != "UEFI" {
		t.Errorf("after ResetBios: pending BootMode %v, want the default UEFI", got)
	}
}

// TestLocator: both spellings, on the system or its chassis, write the one
// light, shown on both as LocationIndicatorActive (IndicatorLED is
// deprecated).
func TestLocator(t *testing.T) {
	f := newFixture(t, nil)
	steps := []struct {
		path   string
		body   string
		active bool
	}{
		{system0, `{"LocationIndicatorActive":true}`, true},
		{system0, `{"IndicatorLED":"Off"}`, false},
		{system0, `{"IndicatorLED":"Lit"}`, true},
		{system0, `{"LocationIndicatorActive":false,"IndicatorLED":"Lit"}`, false},
		{"/redfish/v1/Chassis/vm-0", `{"LocationIndicatorActive":true}`, true},
		{"/redfish/v1/Chassis/vm-0", `{"IndicatorLED":"Off"}`, false},
	}
	for _, step := range steps {
		patchOK(f, step.path, step.body)
		for _, path := range []string{system0, "/redfish/v1/Chassis/vm-0"} {
			body := f.do(asAdmin("GET", path, "")).json
			if body["LocationIndicatorActive"] != step.active {
				t.Errorf("after %s: %s shows LocationIndicatorActive %v, want %v", step.body, path, body["LocationIndicatorActive"], step.active)
			}
		}
	}
}

// TestSystemETagSurvivesFirmwareTakingEffect: a power-off that makes a
// pending firmware current changes BiosVersion, which is not a setting, so
// a Boot PATCH with the ETag read before it still applies (MaaS's
// ForceOff, PATCH, On).
func TestSystemETagSurvivesFirmwareTakingEffect(t *testing.T) {
	f := newFixture(t, nil)
	f.do(asAdmin("POST", reset0, `{"ResetType":"On"}`))
	patchOK(f, biosSettings0, `{"Attributes":{"BootMode":"Legacy"}}`)
	before := f.do(asAdmin("GET", system0, ""))
	f.do(asAdmin("POST", reset0, `{"ResetType":"ForceOff"}`))
	if after := f.do(asAdmin("GET", system0, "")); after.json["BiosVersion"] == before.json["BiosVersion"] {
		t.Fatalf("BiosVersion %v before and after the firmware took effect", after.json["BiosVersion"])
	}
	patch := asAdmin("PATCH", system0, `{"Boot":{"BootSourceOverrideTarget":"Pxe"}}`)
	patch.headers = map[string]string{"If-Match": before.header.Get("ETag")}
	if res := f.do(patch); res.status != 200 {
		t.Fatalf("PATCH with the ETag from before the power-off: %d %s", res.status, res.raw)
	}
}

// TestBiosRegistryDescribesAttributes: the registry Bios names lists every
// attribute Bios shows, read-only exactly where a PATCH is refused, and
// each value it offers is one a PATCH accepts.
func TestBiosRegistryDescribesAttributes(t *testing.T) {
	f := newFixture(t, nil)
	bios := f.do(asAdmin("GET", system0+"/Bios", ""))
	registryID, _ := bios.json["AttributeRegistry"].(string)
	file := f.do(asAdmin("GET", "/redfish/v1/Registries/"+registryID, ""))
	if file.status != http.StatusOK {
		t.Fatalf("registry file %q: status %d", registryID, file.status)
	}
	location := file.json["Location"].([]any)[0].(map[string]any)["Uri"].(string)
	registry := f.do(asAdmin("GET", location, ""))
	if registry.status != http.StatusOK || registry.json["Id"] != registryID {
		t.Fatalf("registry at %s: status %d, Id %v, want %s", location, registry.status, registry.json["Id"], registryID)
	}
	entries := registry.json["RegistryEntries"].(map[string]any)["Attributes"].([]any)
	described := map[string]map[string]any{}
	for _, e := range entries {
		entry := e.(map[string]any)
		described[entry["AttributeName"].(string)] = entry
	}
	attributes := bios.json["Attributes"].(map[string]any)
	if len(described) != len(attributes) {
		t.Errorf("registry describes %d attributes, Bios shows %d", len(described), len(attributes))
	}
	for name := range attributes {
		entry, ok := described[name]
		if !ok {
			t.Errorf("attribute %s is not in the registry", name)
			continue
		}
		t.Run(name, func(t *testing.T) {
			if entry["ReadOnly"] == true {
				current, _ := json.Marshal(attributes[name])
				res := f.do(asAdmin("PATCH", system0+"/Bios/Settings", `{"Attributes":{"`+name+`":`+string(current)+`}}`))
				if res.status != http.StatusBadRequest || !strings.Contains(string(res.raw), "PropertyNotWritable") {
					t.Errorf("PATCH of read-only %s with its value: status %d, want 400 PropertyNotWritable: %s", name, res.status, res.raw)
				}
				return
			}
			values, _ := entry["Value"].([]any)
			if len(values) == 0 || entry["ResetRequired"] != true {
				t.Fatalf("writable %s: values %v, ResetRequired %v", name, values, entry["ResetRequired"])
			}
			for _, v := range values {
				value := v.(map[string]any)["ValueName"].(string)
				// From the first firmware each time: one value alone.
				f.do(asAdmin("POST", bios0+"/Actions/Bios.ResetBios", `{}`))
				res := f.do(asAdmin("PATCH", system0+"/Bios/Settings", `{"Attributes":{"`+name+`":"`+value+`"}}`))
				if res.status != http.StatusOK {
					t.Errorf("PATCH %s=%s: status %d: %s", name, value, res.status, res.raw)
				}
			}
		})
	}
}

// TestBiosSettingsOutcome: Bios's @Redfish.Settings names the settings in
// effect by Bios/Settings' ETag, and says Success, or ResetRequired while
// a change waits for the next boot.
func TestBiosSettingsOutcome(t *testing.T) {
	f := newFixture(t, nil)
	outcome := func() (etag, messageID string) {
		settings := f.do(asAdmin("GET", bios0, "")).json["@Redfish.Settings"].(map[string]any)
		msgs := settings["Messages"].([]any)
		return settings["ETag"].(string), msgs[0].(map[string]any)["MessageId"].(string)
	}
	f.do(asAdmin("POST", system0+"/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`))
	inEffect := f.do(asAdmin("GET", biosSettings0, "")).header.Get("ETag")
	if etag, id := outcome(); etag != inEffect || !strings.HasSuffix(id, ".Success") {
		t.Errorf("before a change: ETag %s, %s; want %s, Success", etag, id, inEffect)
	}
	if res := f.do(asAdmin("PATCH", biosSettings0, `{"Attributes":{"BootMode":"Legacy"}}`)); res.status != http.StatusOK {
		t.Fatalf("PATCH: %d %s", res.status, res.raw)
	}
	if etag, id := outcome(); etag != inEffect || !strings.HasSuffix(id, ".ResetRequired") {
		t.Errorf("change pending: ETag %s, %s; want the applied %s, ResetRequired", etag, id, inEffect)
	}
	f.do(asAdmin("POST", system0+"/Actions/ComputerSystem.Reset", `{"ResetType":"ForceRestart"}`))
	now := f.do(asAdmin("GET", biosSettings0, "")).header.Get("ETag")
	if etag, id := outcome(); etag != now || etag == inEffect || !strings.HasSuffix(id, ".Success") {
		t.Errorf("after the restart: ETag %s, %s; want %s (not %s), Success", etag, id, now, inEffect)
	}
}

// ironicBiosPatch is the PATCH Ironic's redfish BIOS interface (sushy's
// Bios.set_attributes) sends for apply_configuration: the attributes and,
// because Bios advertises OnReset, @Redfish.SettingsApplyTime.
const ironicBiosPatch = `{"Attributes":{"SecureBoot":"Enabled"},` +
	`"@Redfish.SettingsApplyTime":{"@odata.type":"#Settings.v1_0_0.PreferredApplyTime","ApplyTime":"OnReset"}}`

// TestBiosApplyTimeAsIronicSendsIt: Ironic's apply_configuration against a
// running machine: Bios offers OnReset, the PATCH with its apply time is
// taken and asks for the reset, Bios/Settings says when its settings
// apply (and takes that annotation back), and after Ironic's reboot Bios
// shows the attribute with Success and the reboot's Time.
func TestBiosApplyTimeAsIronicSendsIt(t *testing.T) {
	f := newFixture(t, nil)
	f.do(asAdmin("POST", reset0, `{"ResetType":"On"}`))
	bios := f.do(asAdmin("GET", bios0, "")).json
	if got, _ := lookup(bios, "@Redfish.Settings", "SupportedApplyTimes").([]any); !slices.Contains(got, any("OnReset")) {
		t.Errorf("SupportedApplyTimes %v, want OnReset among them", got)
	}
	res := f.do(asAdmin("PATCH", biosSettings0, ironicBiosPatch))
	if res.status != http.StatusOK {
		t.Fatalf("Ironic's PATCH: %d %s", res.status, res.raw)
	}
	if ids := extendedIDs(res.json); !slices.Equal(ids, []string{"Base.1.19.Success", "Base.1.19.ResetRequired"}) {
		t.Errorf("messages %v, want Success and ResetRequired", ids)
	}
	settings := f.do(asAdmin("GET", biosSettings0, "")).json
	if got := lookup(settings, "@Redfish.SettingsApplyTime", "ApplyTime"); got != "OnReset" {
		t.Errorf("Bios/Settings ApplyTime %v, want OnReset", got)
	}
	// A client may write back the annotation it read.
	readBack, _ := json.Marshal(map[string]any{"@Redfish.SettingsApplyTime": settings["@Redfish.SettingsApplyTime"]})
	patchOK(f, biosSettings0, string(readBack))
	if got := lookup(f.do(asAdmin("GET", bios0, "")).json, "Attributes", "SecureBoot"); got != "Disabled" {
		t.Errorf("before the reboot: current SecureBoot %v, want Disabled", got)
	}
	applied := func() any { return lookup(f.do(asAdmin("GET", bios0, "")).json, "@Redfish.Settings", "Time") }
	if got, want := applied(), f.clock.Now().UTC().Format(time.RFC3339); got != want {
		t.Errorf("settings applied at %v, want the power-on's %s", got, want)
	}
	// Ironic's redfish reboot of a running machine.
	f.clock.Advance(time.Minute)
	f.do(asAdmin("POST", reset0, `{"ResetType":"ForceRestart"}`))
	if got, want := applied(), f.clock.Now().UTC().Format(time.RFC3339); got != want {
		t.Errorf("after the reboot the settings were applied at %v, want the reboot's %s", got, want)
	}
	bios = f.do(asAdmin("GET", bios0, "")).json
	msgs, _ := lookup(bios, "@Redfish.Settings", "Messages").([]any)
	if got := lookup(bios, "Attributes", "SecureBoot"); got != "Enabled" || len(msgs) != 1 || !strings.HasSuffix(lookup(msgs[0].(map[string]any), "MessageId").(string), ".Success") {
		t.Errorf("after the reboot: current SecureBoot %v, messages %v; want Enabled, Success", got, msgs)
	}
}
