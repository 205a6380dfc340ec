package conformance_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/schemas"

	"github.com/virtmetal/virtmetal/conformance"
	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/machine"
)

// TestMetal3VirtualMediaBoot is Ironic's redfish-virtualmedia deploy as
// Metal3 runs it through gofish: find the system's virtual CD, insert the
// deploy ISO, set a one-time Cd boot, power on, and eject afterwards.
func TestMetal3VirtualMediaBoot(t *testing.T) {
	ts, backend, _ := startMaaSBMC(t)
	client, err := gofish.Connect(gofish.ClientConfig{Endpoint: ts.URL, Username: maasUser, Password: maasPass, Insecure: true, HTTPClient: ts.Client()})
	if err != nil {
		t.Fatalf("connect (session auth): %v", err)
	}
	defer client.Logout()
	systems, err := client.Service.Systems()
	if err != nil || len(systems) == 0 {
		t.Fatalf("systems: %v %d", err, len(systems))
	}
	system := systems[slices.IndexFunc(systems, func(s *schemas.ComputerSystem) bool { return s.ID == "vm-0" })]
	media, err := system.VirtualMedia()
	if err != nil || len(media) != 1 {
		t.Fatalf("the system's virtual media: %v, %d drives, want 1", err, len(media))
	}
	cd := media[0]
	if !slices.Contains(cd.MediaTypes, schemas.CDVirtualMediaType) {
		t.Fatalf("MediaTypes = %v, want CD among them", cd.MediaTypes)
	}
	const iso = "http://127.0.0.1:8080/deploy.iso"
	inserted := true
	if _, err := cd.InsertMedia(&schemas.VirtualMediaInsertMediaParameters{Image: iso, Inserted: &inserted}); err != nil {
		t.Fatalf("InsertMedia: %v", err)
	}
	if err := system.SetBoot(&schemas.Boot{BootSourceOverrideTarget: schemas.CdBootSource, BootSourceOverrideEnabled: schemas.OnceBootSourceOverrideEnabled}); err != nil {
		t.Fatalf("PATCH Boot Cd/Once: %v", err)
	}
	if _, err := system.Reset(schemas.ForceRestartResetType); err != nil {
		t.Fatalf("ForceRestart: %v", err)
	}
	vm := backend.Get("vm-0")
	poll.Until(t, "the restart booting Cd", func() error {
		if boots := vm.Boots(); len(boots) < 2 || boots[len(boots)-1] != machine.BootCd {
			return fmt.Errorf("boots = %v", boots)
		}
		return nil
	})
	if got, _ := vm.VirtualMedia(t.Context()); got.Image != iso || !got.Inserted {
		t.Fatalf("backend media = %+v", got)
	}
	media, err = system.VirtualMedia()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := media[0].EjectMedia(); err != nil {
		t.Fatalf("EjectMedia: %v", err)
	}
	if got, _ := vm.VirtualMedia(t.Context()); got.Inserted {
		t.Errorf("media still inserted after EjectMedia: %+v", got)
	}
}

// TestSushyBehaviour: Ironic's sushy sends Connection: close on every
// request, PATCHes with the strong ETag it read and, on 412, reads the
// resource again and retries; it maps ResetType and
// BootSourceOverrideTarget from the allowable values.
func TestSushyBehaviour(t *testing.T) {
	ts, backend, _ := startMaaSBMC(t)
	sushy := func(method, path, body string, headers map[string]string) (*http.Response, map[string]any) {
		t.Helper()
		all := map[string]string{"Connection": "close", "OData-Version": "4.0"}
		for k, v := range headers {
			all[k] = v
		}
		res, decoded := maasRequest(t, ts, method, path, body, all)
		if !res.Close {
			t.Errorf("%s %s: the answer keeps the connection open after Connection: close", method, path)
		}
		return res, decoded
	}
	const system = "/redfish/v1/Systems/vm-0"
	res, body := sushy("GET", system, "", nil)
	etag := res.Header.Get("ETag")
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(etag, `"`) {
		t.Fatalf("GET: %d, ETag %q; sushy wants a strong ETag", res.StatusCode, etag)
	}
	resetTypes, _ := conformance.Lookup(body, "Actions", "#ComputerSystem.Reset", "ResetType@Redfish.AllowableValues").([]any)
	for _, want := range []string{"On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart"} {
		if !slices.Contains(resetTypes, any(want)) {
			t.Errorf("ResetType allowable values %v lack %s, which sushy maps", resetTypes, want)
		}
	}
	targets, _ := conformance.Lookup(body, "Boot", "BootSourceOverrideTarget@Redfish.AllowableValues").([]any)
	for _, want := range []string{"None", "Pxe", "Hdd", "Cd"} {
		if !slices.Contains(targets, any(want)) {
			t.Errorf("BootSourceOverrideTarget allowable values %v lack %s", targets, want)
		}
	}

	// A change behind sushy's back makes its tag stale: 412, then a fresh
	// read and a retry that succeeds.
	if err := backend.Get("vm-0").SetBootOverride(t.Context(), machine.BootOverride{Target: machine.BootHdd, Enabled: machine.BootContinuous, Mode: machine.BootModeUEFI}); err != nil {
		t.Fatal(err)
	}
	pxe := `{"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}}`
	if res, body := sushy("PATCH", system, pxe, map[string]string{"If-Match": etag}); res.StatusCode != http.StatusPreconditionFailed {
		t.Fatalf("PATCH with a stale ETag: %d %v, want 412", res.StatusCode, body)
	}
	res, _ = sushy("GET", system, "", nil)
	if res, body := sushy("PATCH", system, pxe, map[string]string{"If-Match": res.Header.Get("ETag")}); res.StatusCode != http.StatusOK {
		t.Fatalf("retried PATCH: %d %v", res.StatusCode, body)
	}
	if o, _ := backend.Get("vm-0").BootOverride(t.Context()); o.Target != machine.BootPxe || o.Enabled != machine.BootOnce {
		t.Errorf("override after the retry = %+v, want Pxe/Once", o)
	}
	if res, _ := sushy("POST", system+"/Actions/ComputerSystem.Reset", `{"ResetType": "ForceOff"}`, nil); res.StatusCode != http.StatusNoContent {
		t.Errorf("ForceOff: %d", res.StatusCode)
	}
}
