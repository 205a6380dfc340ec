package redfish_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/redfish"
)

const (
	system0  = "/redfish/v1/Systems/vm-0"
	reset0   = system0 + "/Actions/ComputerSystem.Reset"
	manager0 = "/redfish/v1/Managers/vm-0"
	// The virtual CD of vm-0.
	sysCD0     = system0 + "/VirtualMedia/Cd"
	sysInsert0 = sysCD0 + "/Actions/VirtualMedia.InsertMedia"
	sysEject0  = sysCD0 + "/Actions/VirtualMedia.EjectMedia"
	image      = "http://images.example/boot.iso"
)

// TestErrorResponses checks every error the service can give: status,
// Base registry MessageId(s), extra headers, and the headers every answer
// carries.
func TestErrorResponses(t *testing.T) {
	// limited advertises only On and ForceOff for vm-1.
	limited := func(_ *redfish.Config, b *stubBackend) {
		b.replaced["vm-1"] = &stubMachine{
			Machine: b.Get("vm-1"),
			caps:    &machine.Capabilities{ResetTypes: []machine.ResetType{machine.ResetOn, machine.ResetForceOff}, BootModes: []machine.BootMode{machine.BootModeUEFI}},
		}
	}
	// vm-1 as the KubeVirt backend answers for a VM without the device a
	// boot target needs.
	noDevice := func(_ *redfish.Config, b *stubBackend) {
		b.replaced["vm-1"] = &stubMachine{Machine: b.Get("vm-1"), bootRefused: machine.Errorf(machine.ErrConflict, "the VM has no CD-ROM drive: insert virtual media first")}
	}
	fault := func(err error) func(*fixture) {
		return func(f *fixture) { f.backend.Get("vm-0").SetFault(err) }
	}
	tests := []struct {
		name       string
		tweak      func(*redfish.Config, *stubBackend)
		setup      func(*fixture)
		req        request
		wantStatus int
		wantIDs    []string
		wantHeader map[string]string
		wantArgs   []string // MessageArgs of the one message, when set
	}{
		// 404
		{name: "unknown URI", req: asAdmin("GET", "/redfish/v1/Nowhere", ""), wantStatus: 404, wantIDs: []string{"ResourceNotFound"}},
		{name: "unknown system", req: asAdmin("GET", "/redfish/v1/Systems/vm-9", ""), wantStatus: 404, wantIDs: []string{"ResourceNotFound"}},
		{name: "unknown system action", req: asAdmin("POST", "/redfish/v1/Systems/vm-9/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`), wantStatus: 404, wantIDs: []string{"ResourceNotFound"}},
		{name: "unknown manager", req: asAdmin("GET", "/redfish/v1/Managers/vm-9", ""), wantStatus: 404, wantIDs: []string{"ResourceNotFound"}},
		{name: "unknown chassis", req: asAdmin("GET", "/redfish/v1/Chassis/vm-9", ""), wantStatus: 404, wantIDs: []string{"ResourceNotFound"}},
		{name: "unknown NIC", req: asAdmin("GET", system0+"/EthernetInterfaces/eth9", ""), wantStatus: 404, wantIDs: []string{"ResourceNotFound"}},
		{name: "unknown storage", req: asAdmin("GET", system0+"/SimpleStorage/2", ""), wantStatus: 404, wantIDs: []string{"ResourceNotFound"}},
		{name: "unknown media", req: asAdmin("GET", system0+"/VirtualMedia/Floppy", ""), wantStatus: 404, wantIDs: []string{"ResourceNotFound"}},
		{name: "unknown system's media", req: asAdmin("GET", "/redfish/v1/Systems/vm-9/VirtualMedia/Cd", ""), wantStatus: 404, wantIDs: []string{"ResourceNotFound"}},
		{name: "unknown system's media collection", req: asAdmin("GET", "/redfish/v1/Systems/vm-9/VirtualMedia", ""), wantStatus: 404, wantIDs: []string{"ResourceNotFound"}},
		{name: "unknown role", req: asAdmin("GET", "/redfish/v1/AccountService/Roles/Wizard", ""), wantStatus: 404, wantIDs: []string{"ResourceNotFound"}},
		{name: "unknown account", req: asAdmin("GET", "/redfish/v1/AccountService/Accounts/99", ""), wantStatus: 404, wantIDs: []string{"ResourceNotFound"}},
		{name: "unknown session", req: asAdmin("GET", "/redfish/v1/SessionService/Sessions/nope", ""), wantStatus: 404, wantIDs: []string{"ResourceNotFound"}},
		{name: "delete unknown session", req: asAdmin("DELETE", "/redfish/v1/SessionService/Sessions/nope", ""), wantStatus: 404, wantIDs: []string{"ResourceNotFound"}},
		{name: "unclean path", req: asAdmin("GET", "/redfish/v1//Systems", ""), wantStatus: 404, wantIDs: []string{"ResourceNotFound"}},
		{name: "backend says not found", setup: fault(machine.Errorf(machine.ErrNotFound, "VM deleted")), req: asAdmin("GET", system0, ""), wantStatus: 404, wantIDs: []string{"ResourceNotFound"}},

		// 405 with Allow from the route table
		{name: "DELETE a system", req: asAdmin("DELETE", system0, ""), wantStatus: 405, wantIDs: []string{"OperationNotAllowed"}, wantHeader: map[string]string{"Allow": "GET, HEAD, PATCH, OPTIONS"}},
		{name: "PUT the service root", req: request{method: "PUT", path: "/redfish/v1/"}, wantStatus: 405, wantIDs: []string{"OperationNotAllowed"}, wantHeader: map[string]string{"Allow": "GET, HEAD, OPTIONS"}},
		{name: "GET an action", req: asAdmin("GET", reset0, ""), wantStatus: 405, wantIDs: []string{"OperationNotAllowed"}, wantHeader: map[string]string{"Allow": "POST, OPTIONS"}},
		{name: "PATCH sessions", req: asAdmin("PATCH", "/redfish/v1/SessionService/Sessions", "{}"), wantStatus: 405, wantIDs: []string{"OperationNotAllowed"}, wantHeader: map[string]string{"Allow": "GET, HEAD, POST, OPTIONS"}},

		// 401 / 403
		{name: "no credentials", req: request{method: "GET", path: system0}, wantStatus: 401, wantIDs: []string{"NoValidSession"}, wantHeader: map[string]string{"WWW-Authenticate": `Basic realm="virtmetal"`}},
		{name: "no credentials on unknown URI", req: request{method: "GET", path: "/redfish/v1/Nowhere"}, wantStatus: 401, wantIDs: []string{"NoValidSession"}},
		{name: "wrong password", req: request{method: "GET", path: system0, user: adminUser, pass: "guess"}, wantStatus: 401, wantIDs: []string{"NoValidSession"}},
		{name: "unknown token", req: request{method: "GET", path: system0, headers: map[string]string{"X-Auth-Token": "forged"}}, wantStatus: 401, wantIDs: []string{"NoValidSession"}},
		{name: "read-only reset", req: request{method: "POST", path: reset0, body: `{"ResetType":"On"}`, user: readerUser, pass: readerPass}, wantStatus: 403, wantIDs: []string{"InsufficientPrivilege"}},
		{name: "login with wrong password", req: request{method: "POST", path: "/redfish/v1/SessionService/Sessions", body: `{"UserName":"admin","Password":"guess"}`}, wantStatus: 401, wantIDs: []string{"NoValidSession"}},

		// request bodies
		{name: "malformed JSON", req: asAdmin("PATCH", system0, `{"Boot":`), wantStatus: 400, wantIDs: []string{"MalformedJSON"}},
		{name: "JSON array body", req: asAdmin("POST", reset0, `["On"]`), wantStatus: 400, wantIDs: []string{"MalformedJSON"}},
		{name: "trailing garbage", req: asAdmin("POST", reset0, `{"ResetType":"On"} {}`), wantStatus: 400, wantIDs: []string{"MalformedJSON"}},
		{name: "empty PATCH", req: asAdmin("PATCH", system0, `{}`), wantStatus: 400, wantIDs: []string{"EmptyJSON"}},
		{name: "oversized body", tweak: func(c *redfish.Config, _ *stubBackend) { c.MaxBodyBytes = 1024 },
			req: asAdmin("PATCH", system0, `{"Boot":{"BootSourceOverrideTarget":"`+strings.Repeat("x", 2048)+`"}}`), wantStatus: 413, wantIDs: []string{"PayloadTooLarge"}},

		// PATCH properties
		{name: "unknown property", req: asAdmin("PATCH", system0, `{"Colour":"blue"}`), wantStatus: 400, wantIDs: []string{"PropertyUnknown"}},
		{name: "read-only property", req: asAdmin("PATCH", system0, `{"PowerState":"On"}`), wantStatus: 400, wantIDs: []string{"PropertyNotWritable"}},
		{name: "unknown Boot member", req: asAdmin("PATCH", system0, `{"Boot":{"BootNext":"x"}}`), wantStatus: 400, wantIDs: []string{"PropertyUnknown"}},
		{name: "read-only Boot annotation", req: asAdmin("PATCH", system0, `{"Boot":{"BootSourceOverrideTarget@Redfish.AllowableValues":["Pxe"]}}`), wantStatus: 400, wantIDs: []string{"PropertyNotWritable"}},
		{name: "Boot not an object", req: asAdmin("PATCH", system0, `{"Boot":"Pxe"}`), wantStatus: 400, wantIDs: []string{"PropertyValueTypeError"}},
		{name: "target of wrong type", req: asAdmin("PATCH", system0, `{"Boot":{"BootSourceOverrideTarget":5}}`), wantStatus: 400, wantIDs: []string{"PropertyValueTypeError"}},
		{name: "null target", req: asAdmin("PATCH", system0, `{"Boot":{"BootSourceOverrideTarget":null}}`), wantStatus: 400, wantIDs: []string{"PropertyValueTypeError"}},
		{name: "target not allowed", req: asAdmin("PATCH", system0, `{"Boot":{"BootSourceOverrideTarget":"Floppy"}}`), wantStatus: 400, wantIDs: []string{"PropertyValueNotInList"}},
		{name: "duration not allowed", req: asAdmin("PATCH", system0, `{"Boot":{"BootSourceOverrideEnabled":"Sometimes"}}`), wantStatus: 400, wantIDs: []string{"PropertyValueNotInList"}},
		{name: "mode outside capabilities", tweak: limited, req: asAdmin("PATCH", "/redfish/v1/Systems/vm-1", `{"Boot":{"BootSourceOverrideMode":"Legacy"}}`), wantStatus: 400, wantIDs: []string{"PropertyValueNotInList"}},
		{name: "every problem reported", req: asAdmin("PATCH", system0, `{"Colour":"blue","Id":"x","Boot":{"BootSourceOverrideTarget":"Floppy","BootSourceOverrideMode":1}}`), wantStatus: 400,
			wantIDs: []string{"PropertyUnknown", "PropertyNotWritable", "PropertyValueTypeError", "PropertyValueNotInList"}},
		{name: "boot target the VM has no device for", tweak: noDevice, req: asAdmin("PATCH", "/redfish/v1/Systems/vm-1", `{"Boot":{"BootSourceOverrideTarget":"Cd"}}`), wantStatus: 409,
			wantIDs: []string{"PropertyValueResourceConflict"}, wantArgs: []string{"/Boot/BootSourceOverrideTarget", "Cd", "/redfish/v1/Systems/vm-1/VirtualMedia/Cd"}},
		{name: "stale If-Match", req: request{method: "PATCH", path: system0, body: `{"Boot":{"BootSourceOverrideTarget":"Pxe"}}`, user: adminUser, pass: adminPass, headers: map[string]string{"If-Match": `"stale"`}}, wantStatus: 412, wantIDs: []string{"PreconditionFailed"}},

		// actions
		{name: "reset without ResetType", req: asAdmin("POST", reset0, `{}`), wantStatus: 400, wantIDs: []string{"ActionParameterMissing"}},
		{name: "reset without body", req: asAdmin("POST", reset0, ""), wantStatus: 400, wantIDs: []string{"ActionParameterMissing"}},
		{name: "reset with number", req: asAdmin("POST", reset0, `{"ResetType":1}`), wantStatus: 400, wantIDs: []string{"ActionParameterValueTypeError"}},
		{name: "reset with unknown type", req: asAdmin("POST", reset0, `{"ResetType":"Explode"}`), wantStatus: 400, wantIDs: []string{"ActionParameterValueNotInList"}},
		{name: "reset with extra parameter", req: asAdmin("POST", reset0, `{"ResetType":"On","Force":true}`), wantStatus: 400, wantIDs: []string{"ActionParameterUnknown"}},
		{name: "reset outside capabilities", tweak: limited, req: asAdmin("POST", "/redfish/v1/Systems/vm-1/Actions/ComputerSystem.Reset", `{"ResetType":"ForceRestart"}`), wantStatus: 400, wantIDs: []string{"ActionParameterValueNotInList"}},
		{name: "NMI while off", req: asAdmin("POST", reset0, `{"ResetType":"Nmi"}`), wantStatus: 409, wantIDs: []string{"ResourceInUse"}},
		{name: "manager reset type", req: asAdmin("POST", manager0+"/Actions/Manager.Reset", `{"ResetType":"ForceOff"}`), wantStatus: 400, wantIDs: []string{"ActionParameterValueNotInList"}},
		{name: "insert without image", req: asAdmin("POST", sysInsert0, `{}`), wantStatus: 400, wantIDs: []string{"ActionParameterMissing"}},
		{name: "insert image of wrong type", req: asAdmin("POST", sysInsert0, `{"Image":5}`), wantStatus: 400, wantIDs: []string{"ActionParameterValueTypeError"}},
		{name: "insert unsupported parameter", req: asAdmin("POST", sysInsert0, `{"Image":"`+image+`","UserName":"root"}`), wantStatus: 400, wantIDs: []string{"ActionParameterNotSupported"}},
		{name: "insert streamed", req: asAdmin("POST", sysInsert0, `{"Image":"`+image+`","TransferMethod":"Stream"}`), wantStatus: 400, wantIDs: []string{"ActionParameterValueNotInList"}},
		{name: "insert method of wrong type", req: asAdmin("POST", sysInsert0, `{"Image":"`+image+`","TransferMethod":true}`), wantStatus: 400, wantIDs: []string{"ActionParameterValueTypeError"}},
		{name: "insert over NFS", req: asAdmin("POST", sysInsert0, `{"Image":"`+image+`","TransferProtocolType":"NFS"}`), wantStatus: 400, wantIDs: []string{"ActionParameterValueNotInList"}},
		{name: "insert http image over HTTPS", req: asAdmin("POST", sysInsert0, `{"Image":"`+image+`","TransferProtocolType":"HTTPS"}`), wantStatus: 400, wantIDs: []string{"ActionParameterValueNotInList"}},
		{name: "insert protocol of wrong type", req: asAdmin("POST", sysInsert0, `{"Image":"`+image+`","TransferProtocolType":1}`), wantStatus: 400, wantIDs: []string{"ActionParameterValueTypeError"}},
		{name: "insert not inserted", req: asAdmin("POST", sysInsert0, `{"Image":"`+image+`","Inserted":false}`), wantStatus: 400, wantIDs: []string{"ActionParameterValueNotInList"}},
		{name: "insert writable", req: asAdmin("POST", sysInsert0, `{"Image":"`+image+`","WriteProtected":"no"}`), wantStatus: 400, wantIDs: []string{"ActionParameterValueTypeError"}},
		{name: "insert unknown parameter", req: asAdmin("POST", sysInsert0, `{"Image":"`+image+`","Colour":"red"}`), wantStatus: 400, wantIDs: []string{"ActionParameterUnknown"}},
		{name: "insert non-http image", req: asAdmin("POST", sysInsert0, `{"Image":"ftp://images.example/boot.iso"}`), wantStatus: 400, wantIDs: []string{"ActionParameterValueFormatError"}},
		{name: "insert into occupied drive", setup: func(f *fixture) {
			if res := f.do(asAdmin("POST", sysInsert0, `{"Image":"`+image+`"}`)); res.status != 204 {
				f.t.Fatalf("first insert: %d %s", res.status, res.raw)
			}
		}, req: asAdmin("POST", sysInsert0, `{"Image":"`+image+`?other"}`), wantStatus: 409, wantIDs: []string{"ResourceInUse"}},
		{name: "eject with parameter", req: asAdmin("POST", sysEject0, `{"Now":true}`), wantStatus: 400, wantIDs: []string{"ActionParameterUnknown"}},
		{name: "login without user name", req: request{method: "POST", path: "/redfish/v1/SessionService/Sessions", body: `{"Password":"x"}`}, wantStatus: 400, wantIDs: []string{"PropertyMissing"}},
		{name: "login with numeric password", req: request{method: "POST", path: "/redfish/v1/SessionService/Sessions", body: `{"UserName":"admin","Password":1}`}, wantStatus: 400, wantIDs: []string{"PropertyValueTypeError"}},

		// backend failures, mapped in one place
		{name: "backend unavailable", setup: fault(machine.Errorf(machine.ErrUnavailable, "API server down")), req: asAdmin("GET", system0, ""), wantStatus: 503,
			wantIDs: []string{"ServiceTemporarilyUnavailable"}, wantHeader: map[string]string{"Retry-After": "5"}},
		{name: "backend cannot reset", setup: fault(machine.Errorf(machine.ErrNotSupported, "no NMI here")), req: asAdmin("POST", reset0, `{"ResetType":"Nmi"}`), wantStatus: 400, wantIDs: []string{"ActionParameterNotSupported"}},
		{name: "backend cannot at all", setup: fault(machine.Errorf(machine.ErrNotSupported, "nope")), req: asAdmin("GET", system0, ""), wantStatus: 501, wantIDs: []string{"OperationNotAllowed"}},
		{name: "backend conflict", setup: fault(machine.Errorf(machine.ErrConflict, "busy")), req: asAdmin("POST", reset0, `{"ResetType":"On"}`), wantStatus: 409, wantIDs: []string{"ResourceInUse"}},
		{name: "backend bug", setup: fault(errors.New("boom")), req: asAdmin("GET", system0, ""), wantStatus: 500, wantIDs: []string{"InternalError"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.tweak)
			if tt.setup != nil {
				tt.setup(f)
			}
			res := f.do(tt.req)
			if res.status != tt.wantStatus {
				t.Fatalf("status = %d, want %d; body %s", res.status, tt.wantStatus, res.raw)
			}
			var want []string
			for _, id := range tt.wantIDs {
				want = append(want, "Base.1.19."+id)
			}
			got := messageIDs(t, res)
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("MessageIds = %v, want %v", got, want)
			}
			errObj := res.json["error"].(map[string]any)
			if len(want) == 1 && errObj["code"] != want[0] {
				t.Errorf("error.code = %v, want %s", errObj["code"], want[0])
			}
			if msg, _ := errObj["message"].(string); msg == "" || strings.Contains(msg, "%1") {
				t.Errorf("error.message = %q, want the registry text with its arguments filled in", msg)
			}
			if tt.wantArgs != nil {
				info := errObj["@Message.ExtendedInfo"].([]any)[0].(map[string]any)
				if got := fmt.Sprint(info["MessageArgs"]); got != fmt.Sprint(tt.wantArgs) {
					t.Errorf("MessageArgs = %s, want %v", got, tt.wantArgs)
				}
			}
			for k, v := range tt.wantHeader {
				if got := res.header.Get(k); got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
			checkCommonHeaders(t, res, "application/json; charset=utf-8")
		})
	}
}

func checkCommonHeaders(t *testing.T, res response, contentType string) {
	t.Helper()
	want := map[string]string{"OData-Version": "4.0", "Content-Type": contentType, "Cache-Control": "no-cache"}
	for k, v := range want {
		if got := res.header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
}

// TestResetOutsideCapabilitiesNeverReachesBackend: the advertised list is
// enforced by the protocol layer, so a backend never sees a reset it did
// not offer.
func TestResetOutsideCapabilitiesNeverReachesBackend(t *testing.T) {
	var stub *stubMachine
	f := newFixture(t, func(_ *redfish.Config, b *stubBackend) {
		stub = &stubMachine{Machine: b.Get("vm-0"), caps: &machine.Capabilities{ResetTypes: []machine.ResetType{machine.ResetOn}}}
		b.replaced["vm-0"] = stub
	})
	for _, rt := range []string{"ForceOff", "Nmi", "Explode"} {
		res := f.do(asAdmin("POST", reset0, fmt.Sprintf(`{"ResetType":%q}`, rt)))
		if res.status != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", rt, res.status)
		}
	}
	if n := stub.resetsCounted.Load(); n != 0 {
		t.Errorf("backend saw %d resets, want 0", n)
	}
	if res := f.do(asAdmin("POST", reset0, `{"ResetType":"On"}`)); res.status != http.StatusNoContent {
		t.Fatalf("allowed reset: status %d: %s", res.status, res.raw)
	}
	if n := stub.resetsCounted.Load(); n != 1 {
		t.Errorf("backend saw %d resets, want 1", n)
	}
}

// TestErrorMessageArguments checks that the message text carries the
// offending value and property, as the registry defines.
func TestErrorMessageArguments(t *testing.T) {
	f := newFixture(t, nil)
	res := f.do(asAdmin("PATCH", system0, `{"Boot":{"BootSourceOverrideTarget":"Floppy"}}`))
	info := lookup(res.json, "error", "@Message.ExtendedInfo").([]any)[0].(map[string]any)
	wantText := "The value 'Floppy' for the property '/Boot/BootSourceOverrideTarget' is not in the list of acceptable values."
	if info["Message"] != wantText {
		t.Errorf("Message = %q, want %q", info["Message"], wantText)
	}
	if args := fmt.Sprint(info["MessageArgs"]); args != "[Floppy /Boot/BootSourceOverrideTarget]" {
		t.Errorf("MessageArgs = %s", args)
	}
	if rel := fmt.Sprint(info["RelatedProperties"]); rel != "[#/Boot/BootSourceOverrideTarget]" {
		t.Errorf("RelatedProperties = %s", rel)
	}
	if info["MessageSeverity"] != "Warning" {
		t.Errorf("MessageSeverity = %v", info["MessageSeverity"])
	}

	res = f.do(asAdmin("POST", reset0, `{"ResetType":"%2"}`))
	info = lookup(res.json, "error", "@Message.ExtendedInfo").([]any)[0].(map[string]any)
	wantText = "The value '%2' for the parameter 'ResetType' in the action 'Reset' is not in the list of acceptable values."
	if info["Message"] != wantText {
		t.Errorf("Message = %q, want %q (arguments are substituted once)", info["Message"], wantText)
	}
}

// TestPanicIsContained: a panicking handler answers 500 InternalError and
// the server keeps serving.
func TestPanicIsContained(t *testing.T) {
	f := newFixture(t, func(_ *redfish.Config, b *stubBackend) {
		b.replaced["vm-0"] = &stubMachine{Machine: b.Get("vm-0"), panicOnRead: true}
	})
	res := f.do(asAdmin("GET", system0, ""))
	if res.status != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500", res.status)
	}
	if ids := messageIDs(t, res); !slices.Equal(ids, []string{"Base.1.19.InternalError"}) {
		t.Errorf("MessageIds = %v", ids)
	}
	if res := f.do(asAdmin("GET", "/redfish/v1/Systems/vm-1", "")); res.status != http.StatusOK {
		t.Errorf("next request: status %d, want 200", res.status)
	}
}

// TestOversizedChunkedBody: a body without Content-Length is cut off at
// the limit too.
func TestOversizedChunkedBody(t *testing.T) {
	f := newFixture(t, func(c *redfish.Config, _ *stubBackend) { c.MaxBodyBytes = 64 })
	req := asAdmin("POST", reset0, `{"ResetType":"On","Padding":"`+strings.Repeat("x", 200)+`"}`)
	req.unknownLength = true
	res := f.do(req)
	if res.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d, want 413: %s", res.status, res.raw)
	}
	if ids := messageIDs(t, res); !slices.Equal(ids, []string{"Base.1.19.PayloadTooLarge"}) {
		t.Errorf("MessageIds = %v", ids)
	}
	if p, _ := f.backend.Get("vm-0").PowerState(t.Context()); p != machine.PowerOff {
		t.Errorf("power = %s: the refused request changed state", p)
	}
}

// TestNotFound: the answer a front end gives when no service takes the
// request is the service's own 404 for an unknown URI.
func TestNotFound(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		t.Run(method, func(t *testing.T) {
			rec := httptest.NewRecorder()
			redfish.NotFound(rec, httptest.NewRequest(method, "/redfish/v1/Systems", nil))
			if rec.Code != http.StatusNotFound || !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") || rec.Header().Get("OData-Version") != "4.0" {
				t.Fatalf("%d %v, want a Redfish JSON 404", rec.Code, rec.Header())
			}
			if method == http.MethodHead {
				if rec.Body.Len() != 0 {
					t.Errorf("HEAD got a body: %s", rec.Body)
				}
				return
			}
			var body struct {
				Error struct {
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if body.Error.Code != "Base.1.19.ResourceNotFound" || !strings.Contains(body.Error.Message, "/redfish/v1/Systems") {
				t.Errorf("error %+v, want ResourceNotFound naming the path", body.Error)
			}
		})
	}
}
