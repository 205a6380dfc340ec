package redfish_test

import (
	"encoding/xml"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/redfish"
)

func bootOf(t *testing.T, f *fixture) (target, enabled, mode any) {
	t.Helper()
	body := f.do(asAdmin("GET", system0, "")).json
	return lookup(body, "Boot", "BootSourceOverrideTarget"), lookup(body, "Boot", "BootSourceOverrideEnabled"), lookup(body, "Boot", "BootSourceOverrideMode")
}

// TestPatchBootMerges: partial PATCHes merge with the current override.
func TestPatchBootMerges(t *testing.T) {
	tests := []struct {
		name  string
		steps []string // PATCH bodies of Boot
		want  [3]string
	}{
		{"MaaS power on", []string{`{"BootSourceOverrideEnabled":"Once","BootSourceOverrideTarget":"Pxe"}`}, [3]string{"Pxe", "Once", "UEFI"}},
		{"mode alone keeps no override", []string{`{"BootSourceOverrideMode":"Legacy"}`}, [3]string{"None", "Disabled", "Legacy"}},
		{"target alone lasts one boot", []string{`{"BootSourceOverrideTarget":"Cd"}`}, [3]string{"Cd", "Once", "UEFI"}},
		{"duration changes, target stays", []string{`{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once"}`, `{"BootSourceOverrideEnabled":"Continuous"}`}, [3]string{"Pxe", "Continuous", "UEFI"}},
		{"target changes, duration stays", []string{`{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Continuous"}`, `{"BootSourceOverrideTarget":"Hdd"}`}, [3]string{"Hdd", "Continuous", "UEFI"}},
		{"Disabled clears", []string{`{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Continuous"}`, `{"BootSourceOverrideEnabled":"Disabled"}`}, [3]string{"None", "Disabled", "UEFI"}},
		{"None clears", []string{`{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once"}`, `{"BootSourceOverrideTarget":"None"}`}, [3]string{"None", "Disabled", "UEFI"}},
		{"explicit Disabled with target", []string{`{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Disabled"}`}, [3]string{"None", "Disabled", "UEFI"}},
		{"empty Boot changes nothing", []string{`{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once"}`, `{}`}, [3]string{"Pxe", "Once", "UEFI"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, nil)
			for _, step := range tt.steps {
				res := f.do(asAdmin("PATCH", system0, `{"Boot":`+step+`}`))
				if res.status != http.StatusOK {
					t.Fatalf("PATCH %s: status %d: %s", step, res.status, res.raw)
				}
				if res.json["@odata.id"] != system0 || res.header.Get("ETag") == "" {
					t.Errorf("PATCH answers the updated system with its ETag; got %s", res.raw)
				}
			}
			target, enabled, mode := bootOf(t, f)
			if got := [3]string{fmt.Sprint(target), fmt.Sprint(enabled), fmt.Sprint(mode)}; got != tt.want {
				t.Errorf("boot = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestRejectedPatchChangesNothing: a 400 leaves the override as it was,
// even when part of the body was valid.
func TestRejectedPatchChangesNothing(t *testing.T) {
	f := newFixture(t, nil)
	res := f.do(asAdmin("PATCH", system0, `{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Forever"}}`))
	if res.status != http.StatusBadRequest {
		t.Fatalf("status %d, want 400", res.status)
	}
	if target, enabled, _ := bootOf(t, f); target != "None" || enabled != "Disabled" {
		t.Errorf("boot = %v/%v after a rejected PATCH", target, enabled)
	}
}

func TestETags(t *testing.T) {
	f := newFixture(t, nil)
	first := f.do(asAdmin("GET", system0, ""))
	etag := first.header.Get("ETag")
	if !strings.HasPrefix(etag, `"`) || !strings.HasSuffix(etag, `"`) || len(etag) < 10 {
		t.Fatalf("ETag %q is not a strong quoted tag", etag)
	}
	if again := f.do(asAdmin("GET", system0, "")).header.Get("ETag"); again != etag {
		t.Errorf("ETag changed without a change: %s then %s", etag, again)
	}
	if other := f.do(asAdmin("GET", "/redfish/v1/Systems/vm-1", "")).header.Get("ETag"); other == etag {
		t.Errorf("two different systems share ETag %s", etag)
	}

	notModified := f.do(request{method: "GET", path: system0, user: adminUser, pass: adminPass, headers: map[string]string{"If-None-Match": etag}})
	if notModified.status != http.StatusNotModified || len(notModified.raw) != 0 {
		t.Errorf("If-None-Match with the current ETag: %d %q, want 304 and no body", notModified.status, notModified.raw)
	}

	// A PATCH with the current ETag succeeds and changes it; the old ETag
	// is then stale.
	patch := `{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once"}}`
	res := f.do(request{method: "PATCH", path: system0, body: patch, user: adminUser, pass: adminPass, headers: map[string]string{"If-Match": etag}})
	if res.status != http.StatusOK {
		t.Fatalf("PATCH with current ETag: %d %s", res.status, res.raw)
	}
	newTag := res.header.Get("ETag")
	if newTag == etag {
		t.Errorf("ETag did not change with the boot override")
	}
	if got := f.do(asAdmin("GET", system0, "")).header.Get("ETag"); got != newTag {
		t.Errorf("GET ETag %s differs from the PATCH answer's %s", got, newTag)
	}
	res = f.do(request{method: "PATCH", path: system0, body: patch, user: adminUser, pass: adminPass, headers: map[string]string{"If-Match": etag}})
	if res.status != http.StatusPreconditionFailed {
		t.Errorf("PATCH with the old ETag: %d, want 412", res.status)
	}
	for _, ifMatch := range []string{"*", `"other", ` + newTag} {
		res = f.do(request{method: "PATCH", path: system0, body: patch, user: adminUser, pass: adminPass, headers: map[string]string{"If-Match": ifMatch}})
		if res.status != http.StatusOK {
			t.Errorf("If-Match %s: %d, want 200", ifMatch, res.status)
		}
	}

	// Power changes are changes too.
	before := f.do(asAdmin("GET", system0, "")).header.Get("ETag")
	f.do(asAdmin("POST", reset0, `{"ResetType":"On"}`))
	after := f.do(asAdmin("GET", system0, "")).header.Get("ETag")
	if after == before {
		t.Errorf("ETag unchanged after power on")
	}
	if res := f.do(request{method: "GET", path: system0, user: adminUser, pass: adminPass, headers: map[string]string{"If-None-Match": before}}); res.status != http.StatusOK {
		t.Errorf("If-None-Match with the pre-power ETag: %d, want 200 with the new body", res.status)
	}
}

// MaaS reads the ETag, a power transition ends, then it PATCHes Boot: the
// PATCH must succeed, since only PowerState changed in between.
func TestPatchWithETagFromBeforeAPowerChange(t *testing.T) {
	f := newFixture(t, nil)
	before := f.do(asAdmin("GET", system0, "")).header.Get("ETag")
	f.do(asAdmin("POST", reset0, `{"ResetType":"On"}`))
	patch := `{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once"}}`
	res := f.do(request{method: "PATCH", path: system0, body: patch, user: adminUser, pass: adminPass, headers: map[string]string{"If-Match": before}})
	if res.status != http.StatusOK {
		t.Fatalf("PATCH with an ETag read before a power change: %d %s, want 200", res.status, res.raw)
	}
	// A settings change in between still fails it.
	res = f.do(request{method: "PATCH", path: system0, body: patch, user: adminUser, pass: adminPass, headers: map[string]string{"If-Match": before}})
	if res.status != http.StatusPreconditionFailed {
		t.Fatalf("PATCH with an ETag read before a Boot change: %d, want 412", res.status)
	}
}

func TestResetDrivesTheMachine(t *testing.T) {
	tests := []struct {
		resetType string
		start     machine.PowerState
		want      machine.PowerState
	}{
		{"On", machine.PowerOff, machine.PowerOn},
		{"ForceOn", machine.PowerOff, machine.PowerOn},
		{"ForceOff", machine.PowerOn, machine.PowerOff},
		{"GracefulShutdown", machine.PowerOn, machine.PowerOff},
		{"ForceRestart", machine.PowerOff, machine.PowerOn},
		{"PowerCycle", machine.PowerOn, machine.PowerOn},
		{"Nmi", machine.PowerOn, machine.PowerOn},
	}
	for _, tt := range tests {
		t.Run(tt.resetType, func(t *testing.T) {
			f := newFixture(t, nil)
			m := f.backend.Get("vm-0")
			if tt.start == machine.PowerOn {
				if err := m.Reset(t.Context(), machine.ResetOn); err != nil {
					t.Fatal(err)
				}
			}
			res := f.do(asAdmin("POST", reset0, `{"ResetType":"`+tt.resetType+`"}`))
			if res.status != http.StatusNoContent || len(res.raw) != 0 {
				t.Fatalf("status %d body %q, want 204 and no body", res.status, res.raw)
			}
			checkCommonHeaders(t, res, "")
			if got := f.do(asAdmin("GET", system0, "")).json["PowerState"]; got != string(tt.want) {
				t.Errorf("PowerState = %v, want %s", got, tt.want)
			}
		})
	}
}

func TestManagerReset(t *testing.T) {
	f := newFixture(t, nil)
	for _, rt := range []string{"GracefulRestart", "ForceRestart"} {
		if res := f.do(asAdmin("POST", manager0+"/Actions/Manager.Reset", `{"ResetType":"`+rt+`"}`)); res.status != http.StatusNoContent {
			t.Errorf("%s: status %d, want 204", rt, res.status)
		}
	}
	if p, _ := f.backend.Get("vm-0").PowerState(t.Context()); p != machine.PowerOff {
		t.Errorf("a BMC restart changed the host's power to %s", p)
	}
}

// TestManagerIdentity: each Manager's UUID is a name-based UUID of its
// machine's system UUID (stable across servers, distinct from the system's
// and from the other BMCs'), derived from the machine ID when the system
// has no UUID; FirmwareVersion is the configured build version.
func TestManagerIdentity(t *testing.T) {
	uuidOf := func(f *fixture, path string) string {
		t.Helper()
		res := f.do(asAdmin("GET", path, ""))
		if res.status != http.StatusOK {
			t.Fatalf("GET %s: %d", path, res.status)
		}
		id, _ := res.json["UUID"].(string)
		return id
	}
	version := func(c *redfish.Config, _ *stubBackend) { c.FirmwareVersion = "v1.2.3" }
	first, second := newFixture(t, version), newFixture(t, version)
	m0, m1 := uuidOf(first, manager0), uuidOf(first, "/redfish/v1/Managers/vm-1")
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(m0) {
		t.Fatalf("Manager UUID %q is not a lower-case version 5 UUID", m0)
	}
	if again := uuidOf(second, manager0); again != m0 {
		t.Errorf("Manager UUID differs between two servers on the same machine: %q, %q", m0, again)
	}
	if m1 == m0 || m0 == uuidOf(first, system0) {
		t.Errorf("Manager UUID %q is shared (vm-1's manager %q, vm-0's system %q)", m0, m1, uuidOf(first, system0))
	}
	if got := first.do(asAdmin("GET", manager0, "")).json["FirmwareVersion"]; got != "v1.2.3" {
		t.Errorf("FirmwareVersion = %v, want the configured v1.2.3", got)
	}

	noUUID := newFixture(t, func(_ *redfish.Config, b *stubBackend) {
		b.replaced["vm-0"] = &stubMachine{Machine: b.Get("vm-0"), decorate: func(inv *machine.Inventory) { inv.UUID = "" }}
	})
	fromID := uuidOf(noUUID, manager0)
	if fromID == "" || fromID == m0 || fromID != uuidOf(noUUID, manager0) {
		t.Errorf("Manager UUID without a system UUID = %q; want a stable one of its own", fromID)
	}
	if got, _ := noUUID.do(asAdmin("GET", manager0, "")).json["FirmwareVersion"].(string); got == "" {
		t.Error("FirmwareVersion is empty by default; want the build version")
	}
}

// mediaOwners are the two resources the one virtual CD hangs under.
var mediaOwners = []struct{ name, path string }{{"system", system0}, {"manager", manager0}}

// TestVirtualMedia: insert and eject through the CD under the system and
// under the manager, whose body names its own path and action targets.
func TestVirtualMedia(t *testing.T) {
	for _, owner := range mediaOwners {
		t.Run(owner.name, func(t *testing.T) {
			f := newFixture(t, nil)
			cdPath := owner.path + "/VirtualMedia/Cd"
			insert, eject := cdPath+"/Actions/VirtualMedia.InsertMedia", cdPath+"/Actions/VirtualMedia.EjectMedia"
			res := f.do(asAdmin("POST", insert, `{"Image":"`+image+`","Inserted":true,"WriteProtected":true}`))
			if res.status != http.StatusNoContent {
				t.Fatalf("insert: %d %s", res.status, res.raw)
			}
			cd := f.do(asAdmin("GET", cdPath, "")).json
			if cd["Image"] != image || cd["Inserted"] != true || cd["ConnectedVia"] != "URI" {
				t.Errorf("after insert: %v", cd)
			}
			if got, _ := f.backend.Get("vm-0").VirtualMedia(t.Context()); got.Image != image {
				t.Errorf("backend media = %+v", got)
			}
			// Ironic's retry, with the protocol sushy adds when a BMC asks for it
			// and the transfer method the ActionInfo offers.
			if res := f.do(asAdmin("POST", insert, `{"Image":"`+image+`","TransferProtocolType":"HTTP","TransferMethod":"Upload"}`)); res.status != http.StatusNoContent {
				t.Errorf("inserting the inserted image again: %d %s, want 204", res.status, res.raw)
			}
			wantIDs := map[string]any{"@odata.id": cdPath, "InsertMedia target": insert, "EjectMedia target": eject, "ActionInfo": cdPath + "/InsertMediaActionInfo"}
			gotIDs := map[string]any{
				"@odata.id":          cd["@odata.id"],
				"InsertMedia target": lookup(cd, "Actions", "#VirtualMedia.InsertMedia", "target"),
				"EjectMedia target":  lookup(cd, "Actions", "#VirtualMedia.EjectMedia", "target"),
				"ActionInfo":         lookup(cd, "Actions", "#VirtualMedia.InsertMedia", "@Redfish.ActionInfo"),
			}
			if !maps.Equal(gotIDs, wantIDs) {
				t.Errorf("the CD's body points at %v, want %v", gotIDs, wantIDs)
			}
			if res := f.do(asAdmin("POST", eject, `{}`)); res.status != http.StatusNoContent {
				t.Fatalf("eject: %d %s", res.status, res.raw)
			}
			cd = f.do(asAdmin("GET", cdPath, "")).json
			if cd["Image"] != nil || cd["Inserted"] != false || cd["ConnectedVia"] != "NotConnected" {
				t.Errorf("after eject: %v", cd)
			}
			// Ejecting an empty drive is fine.
			if res := f.do(asAdmin("POST", eject, "")); res.status != http.StatusNoContent {
				t.Errorf("second eject: %d", res.status)
			}
		})
	}
}

// TestManagerVirtualMediaIsTheSystemsDrive: the Manager links a
// VirtualMedia collection (where Ironic's sushy 4.3 and most real BMCs
// have it) that is the system's one drive: what one path changes the other
// shows, both answer the same ETag, and an insert through either finds the
// same Task.
func TestManagerVirtualMediaIsTheSystemsDrive(t *testing.T) {
	f := newFixture(t, nil)
	slowMedia(f)
	const mgrCD = manager0 + "/VirtualMedia/Cd"
	if got := lookup(f.do(asAdmin("GET", manager0, "")).json, "VirtualMedia", "@odata.id"); got != manager0+"/VirtualMedia" {
		t.Errorf("the Manager's VirtualMedia link = %v, want %s/VirtualMedia", got, manager0)
	}
	members, _ := f.do(asAdmin("GET", manager0+"/VirtualMedia", "")).json["Members"].([]any)
	if len(members) != 1 || lookup(members[0].(map[string]any), "@odata.id") != mgrCD {
		t.Errorf("the Manager's collection lists %v, want %s", members, mgrCD)
	}
	sameETag := func(when string) {
		t.Helper()
		for _, suffix := range []string{"", "/Cd", "/Cd/InsertMediaActionInfo"} {
			sys := f.do(asAdmin("GET", system0+"/VirtualMedia"+suffix, ""))
			mgr := f.do(asAdmin("GET", manager0+"/VirtualMedia"+suffix, ""))
			if sys.status != http.StatusOK || mgr.status != http.StatusOK {
				t.Fatalf("%s: GET VirtualMedia%s: %d under the system, %d under the manager", when, suffix, sys.status, mgr.status)
			}
			if a, b := sys.header.Get("ETag"), mgr.header.Get("ETag"); a == "" || a != b {
				t.Errorf("%s: VirtualMedia%s ETag %q under the system, %q under the manager", when, suffix, a, b)
			}
		}
	}
	sameETag("empty")
	emptyETag := f.do(asAdmin("GET", sysCD0, "")).header.Get("ETag")

	viaManager := f.do(asAdmin("POST", mgrCD+"/Actions/VirtualMedia.InsertMedia", `{"Image":"`+image+`"}`))
	if viaManager.status != http.StatusAccepted || viaManager.header.Get("Location") != taskMonitor1 {
		t.Fatalf("insert through the manager: %d, Location %q, want 202 and %s: %s", viaManager.status, viaManager.header.Get("Location"), taskMonitor1, viaManager.raw)
	}
	viaSystem := f.do(asAdmin("POST", sysInsert0, `{"Image":"`+image+`"}`))
	if viaSystem.status != http.StatusAccepted || viaSystem.json["@odata.id"] != task1 {
		t.Errorf("the same insert through the system: %d, task %v, want 202 and %s", viaSystem.status, viaSystem.json["@odata.id"], task1)
	}
	if cd := f.do(asAdmin("GET", sysCD0, "")).json; cd["Image"] != image {
		t.Errorf("the system's CD after an insert through the manager: Image %v, want %s", cd["Image"], image)
	}
	sameETag("inserted")
	if f.do(asAdmin("GET", mgrCD, "")).header.Get("ETag") == emptyETag {
		t.Error("the manager's CD kept its ETag across an insert")
	}

	if res := f.do(asAdmin("POST", sysEject0, "")); res.status != http.StatusNoContent {
		t.Fatalf("eject through the system: %d %s", res.status, res.raw)
	}
	if cd := f.do(asAdmin("GET", mgrCD, "")).json; cd["Inserted"] != false || cd["Image"] != nil {
		t.Errorf("the manager's CD after an eject through the system: %v", cd)
	}
	sameETag("ejected")
}

// TestVirtualMediaErrors: every bad request to the CD gets its Base
// message.
func TestVirtualMediaErrors(t *testing.T) {
	occupied := func(f *fixture) {
		if err := f.backend.Get("vm-0").InsertMedia(f.t.Context(), image); err != nil {
			f.t.Fatal(err)
		}
	}
	unavailable := func(f *fixture) {
		f.backend.Get("vm-0").SetFault(machine.Errorf(machine.ErrUnavailable, "API server down"))
	}
	tests := []struct {
		name       string
		setup      func(*fixture)
		method     string
		suffix     string // appended to the VirtualMedia collection path
		body       string
		wantStatus int
		wantID     string
	}{
		{name: "unknown media", method: "GET", suffix: "/Floppy", wantStatus: 404, wantID: "ResourceNotFound"},
		{name: "insert into unknown media", method: "POST", suffix: "/Floppy/Actions/VirtualMedia.InsertMedia", body: `{"Image":"` + image + `"}`, wantStatus: 404, wantID: "ResourceNotFound"},
		{name: "DELETE the drive", method: "DELETE", suffix: "/Cd", wantStatus: 405, wantID: "OperationNotAllowed"},
		{name: "GET an action", method: "GET", suffix: "/Cd/Actions/VirtualMedia.EjectMedia", wantStatus: 405, wantID: "OperationNotAllowed"},
		{name: "insert without image", method: "POST", suffix: "/Cd/Actions/VirtualMedia.InsertMedia", body: `{}`, wantStatus: 400, wantID: "ActionParameterMissing"},
		{name: "insert unsupported parameter", method: "POST", suffix: "/Cd/Actions/VirtualMedia.InsertMedia", body: `{"Image":"` + image + `","UserName":"x"}`, wantStatus: 400, wantID: "ActionParameterNotSupported"},
		{name: "insert non-http image", method: "POST", suffix: "/Cd/Actions/VirtualMedia.InsertMedia", body: `{"Image":"ftp://images.example/boot.iso"}`, wantStatus: 400, wantID: "ActionParameterValueFormatError"},
		{name: "insert into occupied drive", setup: occupied, method: "POST", suffix: "/Cd/Actions/VirtualMedia.InsertMedia", body: `{"Image":"` + image + `?other"}`, wantStatus: 409, wantID: "ResourceInUse"},
		{name: "eject with parameter", method: "POST", suffix: "/Cd/Actions/VirtualMedia.EjectMedia", body: `{"Now":true}`, wantStatus: 400, wantID: "ActionParameterUnknown"},
		{name: "eject with parameter from occupied drive", setup: occupied, method: "POST", suffix: "/Cd/Actions/VirtualMedia.EjectMedia", body: `{"Now":true}`, wantStatus: 400, wantID: "ActionParameterUnknown"},
		{name: "insert over FTP", method: "POST", suffix: "/Cd/Actions/VirtualMedia.InsertMedia", body: `{"Image":"` + image + `","TransferProtocolType":"FTP"}`, wantStatus: 400, wantID: "ActionParameterValueNotInList"},
		{name: "insert with its action info's path", method: "POST", suffix: "/Cd/InsertMediaActionInfo", body: `{"Image":"` + image + `"}`, wantStatus: 405, wantID: "OperationNotAllowed"},
		{name: "backend unavailable", setup: unavailable, method: "GET", suffix: "/Cd", wantStatus: 503, wantID: "ServiceTemporarilyUnavailable"},
	}
	for _, owner := range mediaOwners {
		for _, tt := range tests {
			t.Run(owner.name+"/"+tt.name, func(t *testing.T) {
				f := newFixture(t, nil)
				if tt.setup != nil {
					tt.setup(f)
				}
				before, beforeErr := f.backend.Get("vm-0").VirtualMedia(t.Context())
				path := owner.path + "/VirtualMedia" + tt.suffix
				res := f.do(asAdmin(tt.method, path, tt.body))
				if res.status != tt.wantStatus {
					t.Fatalf("%s %s: status %d, want %d: %s", tt.method, path, res.status, tt.wantStatus, res.raw)
				}
				// A refused request leaves the drive as it was.
				if after, err := f.backend.Get("vm-0").VirtualMedia(t.Context()); after != before || (err == nil) != (beforeErr == nil) {
					t.Errorf("the drive went from %+v to %+v", before, after)
				}
				if ids := messageIDs(t, res); !slices.Equal(ids, []string{"Base.1.19." + tt.wantID}) {
					t.Errorf("MessageIds = %v, want [Base.1.19.%s]", ids, tt.wantID)
				}
			})
		}
	}
}

func TestNoVirtualMediaWithoutCapability(t *testing.T) {
	f := newFixture(t, func(_ *redfish.Config, b *stubBackend) {
		caps := b.Get("vm-0").Capabilities()
		caps.VirtualMedia = false
		b.replaced["vm-0"] = &stubMachine{Machine: b.Get("vm-0"), caps: &caps}
	})
	for _, owner := range []string{system0, manager0} {
		if _, linked := f.do(asAdmin("GET", owner, "")).json["VirtualMedia"]; linked {
			t.Errorf("%s links VirtualMedia the machine does not have", owner)
		}
	}
	const mgrCD = manager0 + "/VirtualMedia/Cd"
	for _, req := range []request{
		asAdmin("GET", system0+"/VirtualMedia", ""), asAdmin("GET", sysCD0, ""), asAdmin("POST", sysInsert0, `{"Image":"`+image+`"}`), asAdmin("POST", sysEject0, ""),
		asAdmin("GET", manager0+"/VirtualMedia", ""), asAdmin("GET", mgrCD, ""), asAdmin("GET", mgrCD+"/InsertMediaActionInfo", ""),
		asAdmin("POST", mgrCD+"/Actions/VirtualMedia.InsertMedia", `{"Image":"`+image+`"}`), asAdmin("POST", mgrCD+"/Actions/VirtualMedia.EjectMedia", ""),
	} {
		if res := f.do(req); res.status != http.StatusNotFound {
			t.Errorf("%s %s: %d, want 404", req.method, req.path, res.status)
		}
	}
	// vm-1 keeps the capability, so the link is there.
	const vm1 = "/redfish/v1/Systems/vm-1"
	if got := lookup(f.do(asAdmin("GET", vm1, "")).json, "VirtualMedia", "@odata.id"); got != vm1+"/VirtualMedia" {
		t.Errorf("%s: VirtualMedia link = %v, want %s/VirtualMedia", vm1, got, vm1)
	}
}

func TestEthernetInterfaceAddresses(t *testing.T) {
	f := newFixture(t, func(_ *redfish.Config, b *stubBackend) {
		b.replaced["vm-0"] = &stubMachine{Machine: b.Get("vm-0"), decorate: func(inv *machine.Inventory) {
			inv.NICs[0].IPs = []string{"10.0.0.5", "fd00::5", "192.168.1.7/24", "garbage"}
		}}
	})
	nic := f.do(asAdmin("GET", system0+"/EthernetInterfaces/default", "")).json
	if got := fmt.Sprint(nic["IPv4Addresses"]); got != "[map[Address:10.0.0.5] map[Address:192.168.1.7]]" {
		t.Errorf("IPv4Addresses = %s", got)
	}
	if got := fmt.Sprint(nic["IPv6Addresses"]); got != "[map[Address:fd00::5]]" {
		t.Errorf("IPv6Addresses = %s", got)
	}
	inv, _ := f.backend.Get("vm-0").Inventory(t.Context())
	if nic["MACAddress"] != inv.NICs[0].MAC {
		t.Errorf("MACAddress = %v, want %s", nic["MACAddress"], inv.NICs[0].MAC)
	}
}

// TestEthernetInterfaceWithoutMAC: a NIC whose MAC is not known yet has no
// MACAddress or PermanentMACAddress rather than "", which the schema's
// pattern refuses (the DMTF Service Validator's failure on a KubeVirt VM
// with no MAC in its spec and no instance).
func TestEthernetInterfaceWithoutMAC(t *testing.T) {
	f := newFixture(t, func(_ *redfish.Config, b *stubBackend) {
		b.replaced["vm-0"] = &stubMachine{Machine: b.Get("vm-0"), decorate: func(inv *machine.Inventory) { inv.NICs[0].MAC = "" }}
	})
	nic := f.do(asAdmin("GET", system0+"/EthernetInterfaces/default", "")).json
	for _, property := range []string{"MACAddress", "PermanentMACAddress"} {
		if v, ok := nic[property]; ok {
			t.Errorf("%s = %q, want it left out", property, v)
		}
	}
	if nic["Id"] != "default" {
		t.Errorf("the interface itself is gone: %v", nic)
	}
}

// TestTrailingSlashAndMaaSHeaders: MaaS sends Content-Type on bodiless
// GETs and retries 404s with a trailing slash; both spellings must work.
func TestTrailingSlashAndMaaSHeaders(t *testing.T) {
	f := newFixture(t, nil)
	maas := map[string]string{"Content-Type": "application/json; charset=utf-8", "Accept": "application/json", "User-Agent": "MAAS"}
	for _, path := range []string{"/redfish/v1/Systems", system0, reset0, system0 + "/VirtualMedia", "/redfish/v1/AccountService/Roles/Operator"} {
		for _, p := range []string{path, path + "/"} {
			method := "GET"
			body := ""
			if strings.HasSuffix(path, "Reset") {
				method, body = "POST", `{"ResetType":"On"}`
			}
			res := f.do(request{method: method, path: p, body: body, user: adminUser, pass: adminPass, headers: maas})
			if res.status >= 300 {
				t.Errorf("%s %s: status %d", method, p, res.status)
			}
		}
	}
	a := f.do(asAdmin("GET", "/redfish/v1/Systems", ""))
	b := f.do(asAdmin("GET", "/redfish/v1/Systems/", ""))
	if string(a.raw) != string(b.raw) {
		t.Errorf("bodies differ with and without the slash")
	}
}

func TestResponseHeaders(t *testing.T) {
	f := newFixture(t, nil)
	paths := map[string]string{
		"/redfish/v1/":                   "http://redfish.dmtf.org/schemas/v1/ServiceRoot.v1_20_0.json",
		"/redfish/v1/Systems":            "http://redfish.dmtf.org/schemas/v1/ComputerSystemCollection.json",
		system0:                          "http://redfish.dmtf.org/schemas/v1/ComputerSystem.v1_27_0.json",
		sysCD0:                           "http://redfish.dmtf.org/schemas/v1/VirtualMedia.v1_6_0.json",
		system0 + "/Storage/1/Volumes":   "http://redfish.dmtf.org/schemas/swordfish/v1/VolumeCollection.json",
		system0 + "/Storage/1/Volumes/1": "http://redfish.dmtf.org/schemas/swordfish/v1/Volume.v1_10_0.json",
		"/redfish/v1/odata":              "http://redfish.dmtf.org/schemas/v1/odata-v4.json",
	}
	for path, schema := range paths {
		res := f.do(asAdmin("GET", path, ""))
		checkCommonHeaders(t, res, "application/json; charset=utf-8")
		if got, want := res.header.Get("Link"), "<"+schema+">; rel=describedby"; got != want {
			t.Errorf("%s: Link = %q, want %q", path, got, want)
		}
		if res.header.Get("ETag") == "" {
			t.Errorf("%s: no ETag", path)
		}
	}
	res := f.do(asAdmin("GET", "/redfish/v1/Nowhere", ""))
	if got := res.header.Get("Link"); got != "<http://redfish.dmtf.org/schemas/v1/redfish-error.v1_0_2.json>; rel=describedby" {
		t.Errorf("error Link = %q", got)
	}
}

// TestMetadata: $metadata references the DMTF CSDL file of every type the
// service serves.
func TestMetadata(t *testing.T) {
	f := newFixture(t, nil)
	res := f.do(request{method: "GET", path: "/redfish/v1/$metadata"})
	checkCommonHeaders(t, res, "application/xml; charset=utf-8")
	const edmx, edm = "http://docs.oasis-open.org/odata/ns/edmx", "http://docs.oasis-open.org/odata/ns/edm"
	var doc struct {
		XMLName    xml.Name
		Version    string `xml:"Version,attr"`
		References []struct {
			XMLName  xml.Name
			URI      string `xml:"Uri,attr"`
			Includes []struct {
				XMLName   xml.Name
				Namespace string `xml:"Namespace,attr"`
				Alias     string `xml:"Alias,attr"`
			} `xml:"Include"`
		} `xml:"Reference"`
		Schema struct {
			XMLName   xml.Name
			Namespace string `xml:"Namespace,attr"`
			Container struct {
				XMLName xml.Name
				Name    string `xml:"Name,attr"`
				Extends string `xml:"Extends,attr"`
			} `xml:"EntityContainer"`
		} `xml:"DataServices>Schema"`
	}
	if err := xml.Unmarshal(res.raw, &doc); err != nil {
		t.Fatalf("$metadata is not XML: %v\n%s", err, res.raw)
	}
	// The OData CSDL namespaces, element by element: a reader such as the
	// DMTF validator resolves elements by namespace, not by prefix.
	if doc.XMLName != (xml.Name{Space: edmx, Local: "Edmx"}) || doc.Version != "4.0" {
		t.Errorf("root element %v Version %q, want edmx:Edmx 4.0", doc.XMLName, doc.Version)
	}
	if doc.Schema.XMLName != (xml.Name{Space: edm, Local: "Schema"}) || doc.Schema.Namespace != "Service" ||
		doc.Schema.Container.XMLName != (xml.Name{Space: edm, Local: "EntityContainer"}) || doc.Schema.Container.Name != "Service" {
		t.Errorf("schema %v %q, container %v %q", doc.Schema.XMLName, doc.Schema.Namespace, doc.Schema.Container.XMLName, doc.Schema.Container.Name)
	}
	aliases := map[string]string{}
	for _, ref := range doc.References {
		for _, inc := range ref.Includes {
			if ref.XMLName.Space != edmx || inc.XMLName.Space != edmx {
				t.Errorf("reference %s: element %v / %v outside the edmx namespace", ref.URI, ref.XMLName, inc.XMLName)
			}
			if inc.Alias != "" {
				aliases[inc.Alias] = inc.Namespace
			}
		}
	}
	if aliases["Redfish"] != "RedfishExtensions.v1_0_0" {
		t.Errorf("alias Redfish is %q, want RedfishExtensions.v1_0_0", aliases["Redfish"])
	}
	namespaces := map[string]string{}
	for _, ref := range doc.References {
		dmtf := strings.HasPrefix(ref.URI, "http://redfish.dmtf.org/schemas/v1/")
		// Volume's schemas are Swordfish's, published under its own path.
		swordfish := strings.HasPrefix(ref.URI, "http://redfish.dmtf.org/schemas/swordfish/v1/Volume")
		if !dmtf && !swordfish || !strings.HasSuffix(ref.URI, "_v1.xml") {
			t.Errorf("reference %q is not a DMTF CSDL URI", ref.URI)
		}
		for _, inc := range ref.Includes {
			namespaces[inc.Namespace] = ref.URI
		}
	}
	// Every @odata.type the service shows must be declared.
	for _, path := range []string{"/redfish/v1/", "/redfish/v1/Systems", system0, system0 + "/EthernetInterfaces/default", system0 + "/SimpleStorage/1",
		sysCD0, manager0, "/redfish/v1/Chassis/vm-0", "/redfish/v1/SessionService", "/redfish/v1/AccountService",
		"/redfish/v1/AccountService/Accounts/1", "/redfish/v1/AccountService/Roles/ReadOnly",
		system0 + "/Processors", system0 + "/Processors/1", system0 + "/Memory", system0 + "/Memory/1",
		system0 + "/Storage", system0 + "/Storage/1", "/redfish/v1/Chassis/vm-0/Drives", "/redfish/v1/Chassis/vm-0/Drives/1",
		system0 + "/Storage/1/Volumes", system0 + "/Storage/1/Volumes/1"} {
		odataType, _ := f.do(asAdmin("GET", path, "")).json["@odata.type"].(string)
		parts := strings.Split(strings.TrimPrefix(odataType, "#"), ".")
		ns := strings.Join(parts[:len(parts)-1], ".")
		if _, ok := namespaces[ns]; !ok {
			t.Errorf("%s: namespace %s of %s is not in $metadata", path, ns, odataType)
		}
	}
	if doc.Schema.Container.Extends != "ServiceRoot.v1_20_0.ServiceContainer" {
		t.Errorf("EntityContainer Extends = %q", doc.Schema.Container.Extends)
	}
}

func TestServiceDocument(t *testing.T) {
	f := newFixture(t, nil)
	res := f.do(request{method: "GET", path: "/redfish/v1/odata"})
	values, _ := res.json["value"].([]any)
	var urls []string
	for _, v := range values {
		urls = append(urls, v.(map[string]any)["url"].(string))
	}
	for _, want := range []string{"/redfish/v1/", "/redfish/v1/Systems", "/redfish/v1/Managers", "/redfish/v1/Chassis"} {
		if !slices.Contains(urls, want) {
			t.Errorf("service document lacks %s: %v", want, urls)
		}
	}
}

func TestCollections(t *testing.T) {
	f := newFixture(t, nil)
	f.login(readerUser, readerPass)
	tests := []struct {
		path        string
		wantMembers []string
	}{
		{"/redfish/v1/Systems", []string{"/redfish/v1/Systems/vm-0", "/redfish/v1/Systems/vm-1"}},
		{"/redfish/v1/Managers", []string{"/redfish/v1/Managers/vm-0", "/redfish/v1/Managers/vm-1"}},
		{"/redfish/v1/Chassis", []string{"/redfish/v1/Chassis/vm-0", "/redfish/v1/Chassis/vm-1"}},
		{system0 + "/EthernetInterfaces", []string{system0 + "/EthernetInterfaces/default"}},
		{system0 + "/SimpleStorage", []string{system0 + "/SimpleStorage/1"}},
		{system0 + "/VirtualMedia", []string{sysCD0}},
		{"/redfish/v1/AccountService/Accounts", []string{"/redfish/v1/AccountService/Accounts/1", "/redfish/v1/AccountService/Accounts/2", "/redfish/v1/AccountService/Accounts/3"}},
		{"/redfish/v1/AccountService/Roles", []string{"/redfish/v1/AccountService/Roles/Administrator", "/redfish/v1/AccountService/Roles/Operator", "/redfish/v1/AccountService/Roles/ReadOnly"}},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			body := f.do(asAdmin("GET", tt.path, "")).json
			var got []string
			for _, m := range body["Members"].([]any) {
				got = append(got, m.(map[string]any)["@odata.id"].(string))
			}
			if !slices.Equal(got, tt.wantMembers) {
				t.Errorf("Members = %v, want %v", got, tt.wantMembers)
			}
			if body["Members@odata.count"] != float64(len(tt.wantMembers)) {
				t.Errorf("Members@odata.count = %v, want %d", body["Members@odata.count"], len(tt.wantMembers))
			}
		})
	}
	sessions := f.do(asAdmin("GET", sessionsURI, "")).json
	if sessions["Members@odata.count"] != float64(1) {
		t.Errorf("sessions: %v", sessions)
	}
}

// TestEveryLinkResolves crawls from the service root: every @odata.id in
// any body answers 200 with a body whose @odata.id is that URI. (The
// conformance crawler validates the same bodies against the DMTF schemas.)
func TestEveryLinkResolves(t *testing.T) {
	f := newFixture(t, nil)
	f.login(adminUser, adminPass)
	seen := map[string]bool{}
	queue := []string{"/redfish/v1/"}
	var collect func(v any)
	collect = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, child := range v {
				if id, ok := child.(string); ok && k == "@odata.id" && !seen[id] {
					seen[id] = true
					queue = append(queue, id)
				}
				collect(child)
			}
		case []any:
			for _, child := range v {
				collect(child)
			}
		}
	}
	for len(queue) > 0 {
		path := queue[0]
		queue = queue[1:]
		res := f.do(asAdmin("GET", path, ""))
		if res.status != http.StatusOK {
			t.Errorf("%s: status %d", path, res.status)
			continue
		}
		if res.json["@odata.id"] != path {
			t.Errorf("%s: @odata.id = %v", path, res.json["@odata.id"])
		}
		if _, ok := res.json["@odata.type"].(string); !ok {
			t.Errorf("%s: no @odata.type", path)
		}
		collect(res.json)
	}
	if len(seen) < 30 {
		t.Errorf("crawl reached only %d resources", len(seen))
	}
}
