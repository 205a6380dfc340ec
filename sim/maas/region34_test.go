package maas_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

// The rules of this file are what a real MaaS 3.4 region did, as
// docs/maas-region.md records; each test names its section.

// TestResultsQuery: include_output with any value includes the outputs,
// without it none; filters match a result's name, a tag of its script or
// its id; no match is an empty list, still 200 (docs/maas-region.md, 2).
func TestResultsQuery(t *testing.T) {
	s := maassim.New(t).WithMachine(maassim.Machine{SystemID: "a", Hostname: "a"})
	if _, err := s.Client(t).Commission(context.Background(), "a", maas.CommissionOptions{SkipBMCConfig: true}); err != nil {
		t.Fatal(err)
	}
	for _, value := range []string{"1", "0", "false", ""} {
		if r := results(t, s, "a", "include_output="+value); len(r) != 2 || r[0]["stdout"] == nil {
			t.Errorf("include_output=%q: %+v, want the outputs", value, r)
		}
	}
	if r := results(t, s, "a", ""); len(r) != 2 || r[0]["stdout"] != nil {
		t.Errorf("without include_output: %+v, want no outputs", r)
	}
	names := func(query string) []string {
		var out []string
		for _, r := range results(t, s, "a", query) {
			out = append(out, r["name"].(string))
		}
		return out
	}
	for query, want := range map[string]string{
		"filters=bmc-config":                   "30-maas-01-bmc-config 50-virtmetal-bmc-config",
		"filters=enlisting":                    "50-virtmetal-bmc-config",
		"filters=" + maas.BMCConfigScript:      "50-virtmetal-bmc-config",
		"filters=1":                            "30-maas-01-bmc-config",
		"filters=nosuch":                       "",
		"filters=nosuch,30-maas-01-bmc-config": "30-maas-01-bmc-config",
	} {
		if got := strings.Join(names(query), " "); got != want {
			t.Errorf("%s: %q, want %q", query, got, want)
		}
	}
}

// TestResultsWriteOnce: a node's result is stored once per set (a second
// post is 500 and the first stays); a New machine's posts are dropped; a
// commissioning makes a new current set, whose bmc-config rows are
// Skipped with skip_bmc_config, so nothing can be posted for them
// (docs/maas-region.md, 1 and 2).
func TestResultsWriteOnce(t *testing.T) {
	ctx := context.Background()
	s := maassim.New(t)
	id, err := s.EnlistAnonymously(url.Values{"mac_addresses": {"02:00:00:00:00:01"}, "commission": {"true"}})
	if err != nil {
		t.Fatal(err)
	}
	post := func(stdout string) error {
		return s.Signal(id, maassim.NodeSignal{Status: maassim.SignalWorking,
			Results: []maassim.ScriptResult{{Name: maas.BMCConfigScript, Status: maassim.ScriptPassed, Stdout: stdout}}})
	}
	output := func() string {
		out, err := s.Client(t).BMCConfigOutput(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if err := post("first"); err != nil {
		t.Fatal(err)
	}
	var signalErr *maassim.SignalError
	if err := post("second"); !errors.As(err, &signalErr) || signalErr.StatusCode != http.StatusInternalServerError {
		t.Errorf("second post: %v, want 500", err)
	}
	if got := output(); got != "first" {
		t.Errorf("stored %q, want the first post's", got)
	}
	if err := s.Signal(id, maassim.NodeSignal{Status: maassim.SignalOK}); err != nil {
		t.Fatal(err)
	}
	if m, _ := s.Machine(id); m.Status != maassim.StatusNew {
		t.Fatalf("status %d after the enlistment's OK, want New", m.Status)
	}
	if err := post("while New"); err != nil || output() != "first" {
		t.Errorf("a New machine's post: %v, stored %q; want accepted and dropped", err, output())
	}

	if _, err := s.Client(t).Commission(ctx, id, maas.CommissionOptions{SkipBMCConfig: true}); err != nil {
		t.Fatal(err)
	}
	if got := output(); got != maassim.SkippedBMCConfigOutput {
		t.Errorf("after a commission with skip_bmc_config: %q", got)
	}
	if r := results(t, s, id, "include_output=1&filters=bmc-config"); len(r) != 2 || r[0]["status_name"] != "Skipped" || r[1]["status_name"] != "Skipped" {
		t.Errorf("bmc-config rows %+v, want Skipped", r)
	}
	if err := post("forged"); !errors.As(err, &signalErr) || signalErr.StatusCode != http.StatusInternalServerError || output() != maassim.SkippedBMCConfigOutput {
		t.Errorf("post over a Skipped row: %v, stored %q; want 500 and the skip line", err, output())
	}
}

// TestNodeSignalForgesACommissioning: anyone with a machine's system_id
// gets its node token, so a stranger moves a New machine to
// Commissioning, posts a result its set did not hold, and ends it Ready:
// the forged output is what current-commissioning shows
// (docs/maas-region.md, "The node's token is anonymous").
func TestNodeSignalForgesACommissioning(t *testing.T) {
	s := maassim.New(t).WithMachine(maassim.Machine{SystemID: "a", Hostname: "a", Status: maassim.StatusNew,
		Commissioning: []maassim.ScriptResult{{Name: maas.BMCConfigScript, Status: maassim.ScriptPassed, Stdout: "genuine"}}})
	for _, sig := range []maassim.NodeSignal{
		{Status: maassim.SignalCommissioning},
		{Status: maassim.SignalWorking, Results: []maassim.ScriptResult{{Name: maas.BMCConfigScript, Status: maassim.ScriptPassed, Stdout: "forged"}}},
		{Status: maassim.SignalOK},
	} {
		if err := s.Signal("a", sig); err != nil {
			t.Fatalf("%s: %v", sig.Status, err)
		}
	}
	m, _ := s.Machine("a")
	if out, err := s.Client(t).BMCConfigOutput(context.Background(), "a"); m.Status != maassim.StatusReady || err != nil || out != "forged" {
		t.Errorf("status %d, output %q (%v); want Ready with the forged set current", m.Status, out, err)
	}
}

// TestAnonymousPostByKnownMAC: an anonymous POST with the MAC of a New or
// Commissioning machine updates that machine's power settings (those not
// given kept) and answers its system_id; for a machine in another status
// it is 400 (docs/maas-region.md, 1).
func TestAnonymousPostByKnownMAC(t *testing.T) {
	for status, wantUpdated := range map[int]bool{maassim.StatusNew: true, maassim.StatusCommissioning: true, maassim.StatusReady: false, maassim.StatusDeployed: false} {
		t.Run(fmt.Sprint("status ", status), func(t *testing.T) {
			s := maassim.New(t).WithMachine(maassim.Machine{SystemID: "a", Hostname: "victim", Status: status, MACs: []string{"02:00:00:00:00:01"},
				PowerType: "redfish", PowerParameters: map[string]string{"power_address": "vm.ns.bmc.test", "power_user": "u", "power_pass": "p"}})
			code, body := enlist(t, s, url.Values{"mac_addresses": {"02:00:00:00:00:01"}, "power_type": {"redfish"},
				"power_parameters": {`{"power_address":"evil.example.test","power_user":"eu"}`}})
			m, _ := s.Machine("a")
			var answer struct {
				SystemID string `json:"system_id"`
			}
			_ = json.Unmarshal([]byte(body), &answer)
			if wantUpdated {
				if code != http.StatusOK || answer.SystemID != "a" || m.PowerParameters["power_address"] != "evil.example.test" ||
					m.PowerParameters["power_user"] != "eu" || m.PowerParameters["power_pass"] != "p" || len(s.Machines()) != 1 {
					t.Errorf("HTTP %d %q, machine %+v; want a updated", code, body, m)
				}
				return
			}
			if code != http.StatusBadRequest || !strings.Contains(body, "already in use on victim") || m.PowerParameters["power_address"] != "vm.ns.bmc.test" || len(s.Machines()) != 1 {
				t.Errorf("HTTP %d %q, machine %+v; want 400 and nothing changed", code, body, m)
			}
		})
	}
}

// TestRedfishCredentialsRequired: empty Redfish user or password is 400
// on PUT (validated merged with what is stored) and on anonymous POST;
// user and password together are stored (docs/maas-region.md, 4).
func TestRedfishCredentialsRequired(t *testing.T) {
	ctx := context.Background()
	s := maassim.New(t).WithMachine(maassim.Machine{SystemID: "a", Hostname: "a", PowerType: "redfish",
		PowerParameters: map[string]string{"power_address": "vm.ns.bmc.test", "power_user": "", "power_pass": ""}})
	c := s.Client(t)
	for name, params := range map[string]map[string]string{
		"both empty":                  {"power_user": "", "power_pass": ""},
		"password over an empty user": {"power_pass": "p"},
	} {
		_, err := c.UpdateMachine(ctx, "a", maas.MachineUpdate{PowerType: "redfish", PowerParameters: params})
		if apiErr, ok := errors.AsType[*maas.APIError](err); !ok || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(apiErr.Message, maassim.RedfishUserRequired) {
			t.Errorf("PUT %s: %v, want 400", name, err)
		}
	}
	if _, err := c.UpdateMachine(ctx, "a", maas.MachineUpdate{PowerType: "redfish", PowerParameters: map[string]string{"power_user": "u", "power_pass": "p"}}); err != nil {
		t.Errorf("PUT user and password: %v", err)
	}
	code, body := enlist(t, s, url.Values{"mac_addresses": {"02:00:00:00:00:02"}, "power_type": {"redfish"},
		"power_parameters": {`{"power_address":"vm2.ns.bmc.test","power_user":"","power_pass":""}`}})
	if code != http.StatusBadRequest || !strings.Contains(body, maassim.RedfishPasswordRequired) || len(s.Machines()) != 1 {
		t.Errorf("anonymous POST with empty credentials: HTTP %d %q, want 400 and no machine", code, body)
	}
}

// TestEnlistmentWithCommission: commission=true makes the machine
// Commissioning with a current (empty) set, and the end of the enlistment
// returns it to New with that set still current; without it, New and no
// set (docs/maas-region.md, 1 and 2).
func TestEnlistmentWithCommission(t *testing.T) {
	s := maassim.New(t)
	id, err := s.EnlistAnonymously(url.Values{"mac_addresses": {"02:00:00:00:00:01"}, "commission": {"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if m, _ := s.Machine(id); m.Status != maassim.StatusCommissioning || m.Commissioning == nil {
		t.Fatalf("after POST: %+v, want Commissioning with a set", m)
	}
	result := maassim.ScriptResult{Name: maas.BMCConfigScript, Status: maassim.ScriptPassed, Stdout: "proof"}
	if err := s.Signal(id, maassim.NodeSignal{Status: maassim.SignalOK, Results: []maassim.ScriptResult{result}}); err != nil {
		t.Fatal(err)
	}
	if m, _ := s.Machine(id); m.Status != maassim.StatusNew || len(m.Commissioning) != 1 || m.Commissioning[0].Stdout != "proof" {
		t.Errorf("after the enlistment: %+v, want New with its set current", m)
	}
	plain, err := s.EnlistAnonymously(url.Values{"mac_addresses": {"02:00:00:00:00:02"}})
	if err != nil {
		t.Fatal(err)
	}
	if m, _ := s.Machine(plain); m.Status != maassim.StatusNew || m.Commissioning != nil {
		t.Errorf("without commission: %+v, want New without a set", m)
	}
}
