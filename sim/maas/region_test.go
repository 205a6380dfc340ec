package maas_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

// rawGet sends GET machines/ with the given Authorization header.
func rawGet(t *testing.T, s *maassim.Server, authorization string) (int, string) {
	t.Helper()
	return rawGetPath(t, s, "/api/2.0/machines/", authorization)
}

// rawGetPath sends GET path with the given Authorization header (none when
// empty) and returns the status and body.
func rawGetPath(t *testing.T, s *maassim.Server, path, authorization string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.URL()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func oauthHeader(fields map[string]string) string {
	parts := []string{}
	for _, k := range []string{"oauth_version", "oauth_signature_method", "oauth_consumer_key", "oauth_token", "oauth_signature", "oauth_nonce", "oauth_timestamp"} {
		if v, ok := fields[k]; ok {
			parts = append(parts, fmt.Sprintf(`%s="%s"`, k, v))
		}
	}
	return "OAuth " + strings.Join(parts, ", ")
}

func validOAuth(nonce string) map[string]string {
	return map[string]string{
		"oauth_version":          "1.0",
		"oauth_signature_method": "PLAINTEXT",
		"oauth_consumer_key":     "consumerkey",
		"oauth_token":            "tokenkey",
		"oauth_signature":        "&tokensecret",
		"oauth_nonce":            nonce,
		"oauth_timestamp":        fmt.Sprint(time.Now().Unix()),
	}
}

func TestOAuth(t *testing.T) {
	tests := []struct {
		name   string
		change func(map[string]string)
		header string // used instead of the fields when set
		want   int
	}{
		{name: "valid", change: func(map[string]string) {}, want: http.StatusOK},
		{name: "percent-encoded signature", change: func(f map[string]string) { f["oauth_signature"] = "%26tokensecret" }, want: http.StatusOK},
		{name: "no header", header: "-", want: http.StatusUnauthorized},
		{name: "not OAuth", header: "Basic dXNlcjpwYXNz", want: http.StatusUnauthorized},
		{name: "unknown consumer", change: func(f map[string]string) { f["oauth_consumer_key"] = "other" }, want: http.StatusUnauthorized},
		{name: "unknown token", change: func(f map[string]string) { f["oauth_token"] = "other" }, want: http.StatusUnauthorized},
		{name: "wrong secret", change: func(f map[string]string) { f["oauth_signature"] = "&wrong" }, want: http.StatusUnauthorized},
		{name: "HMAC method", change: func(f map[string]string) { f["oauth_signature_method"] = "HMAC-SHA1" }, want: http.StatusUnauthorized},
		{name: "no nonce", change: func(f map[string]string) { delete(f, "oauth_nonce") }, want: http.StatusUnauthorized},
		{name: "no timestamp", change: func(f map[string]string) { delete(f, "oauth_timestamp") }, want: http.StatusUnauthorized},
		{name: "non-integer timestamp", change: func(f map[string]string) { f["oauth_timestamp"] = "soon" }, want: http.StatusBadRequest},
		{name: "wrong version", change: func(f map[string]string) { f["oauth_version"] = "2.0" }, want: http.StatusUnauthorized},
		{name: "timestamp at the window's edge", change: func(f map[string]string) { f["oauth_timestamp"] = unixIn(-maassim.TimestampWindow + 5*time.Second) }, want: http.StatusOK},
		{name: "timestamp too old", change: func(f map[string]string) { f["oauth_timestamp"] = unixIn(-maassim.TimestampWindow - 10*time.Second) }, want: http.StatusUnauthorized},
		{name: "timestamp too far ahead", change: func(f map[string]string) { f["oauth_timestamp"] = unixIn(maassim.TimestampWindow + 10*time.Second) }, want: http.StatusUnauthorized},
		{name: "non-admin key", change: func(f map[string]string) {
			f["oauth_consumer_key"], f["oauth_token"], f["oauth_signature"] = "userconsumer", "usertoken", "&usersecret"
		}, want: http.StatusOK},
		{name: "non-admin consumer with admin secret", change: func(f map[string]string) {
			f["oauth_consumer_key"], f["oauth_token"] = "userconsumer", "usertoken"
		}, want: http.StatusUnauthorized},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := maassim.New(t)
			header := tt.header
			if header == "" {
				fields := validOAuth(fmt.Sprintf("nonce-%d", i))
				tt.change(fields)
				header = oauthHeader(fields)
			}
			if header == "-" {
				header = ""
			}
			got, body := rawGet(t, s, header)
			if got != tt.want {
				t.Fatalf("status = %d (%s), want %d", got, body, tt.want)
			}
			if got := s.Count(maassim.Match{Path: "machines/"}); got != 1 {
				t.Errorf("recorded %d requests, want 1", got)
			}
		})
	}
}

func unixIn(d time.Duration) string { return fmt.Sprint(time.Now().Add(d).Unix()) }

// TestPowerParametersAreAdminOnly: an ordinary user's key lists machines but
// MaaS keeps power parameters (passwords) to admins.
func TestPowerParametersAreAdminOnly(t *testing.T) {
	s := maassim.New(t).WithMachine(maassim.Machine{SystemID: "a", Hostname: "alpha", PowerType: "redfish", PowerParameters: map[string]string{"power_pass": "p"}})
	key, err := maas.ParseAPIKey(maassim.NonAdminAPIKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := maas.NewClient(s.URL(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if machines, err := c.Machines(ctx); err != nil || len(machines) != 1 {
		t.Fatalf("non-admin machine list = %v, %v", machines, err)
	}
	var apiErr *maas.APIError
	if _, err := c.PowerParameters(ctx); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusForbidden || !errors.Is(err, maas.ErrUnauthorized) {
		t.Fatalf("non-admin bulk power parameters: err = %v, want 403", err)
	}
	if params, err := s.Client(t).PowerParameters(ctx); err != nil || params["a"].String("power_pass") != "p" {
		t.Fatalf("admin bulk power parameters = %v, %v", params, err)
	}
}

// TestMachineHardwareJSON: hardware_uuid, interface_set and boot_interface
// as MaaS 3.x shows them, null when unknown.
func TestMachineHardwareJSON(t *testing.T) {
	s := maassim.New(t).
		WithMachine(maassim.Machine{SystemID: "a", Hostname: "alpha", HardwareUUID: "6f1e2a9c-0000-4000-8000-000000000001", MACs: []string{"52:54:00:00:00:01", "52:54:00:00:00:02"}}).
		WithMachine(maassim.Machine{SystemID: "b", Hostname: "beta"})
	req, err := http.NewRequest(http.MethodGet, s.URL()+"/api/2.0/machines/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", oauthHeader(validOAuth("hardware")))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw []map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		t.Fatal(err)
	}
	if len(raw) != 2 {
		t.Fatalf("machines = %v", raw)
	}
	a, b := raw[0], raw[1]
	if a["hardware_uuid"] != "6f1e2a9c-0000-4000-8000-000000000001" || b["hardware_uuid"] != nil || b["boot_interface"] != nil {
		t.Errorf("hardware_uuid/boot_interface: a %v, b %v / %v", a["hardware_uuid"], b["hardware_uuid"], b["boot_interface"])
	}
	interfaces, _ := a["interface_set"].([]any)
	boot, _ := a["boot_interface"].(map[string]any)
	if len(interfaces) != 2 || boot["mac_address"] != "52:54:00:00:00:01" || boot["type"] != "physical" {
		t.Errorf("interface_set %v, boot_interface %v", interfaces, boot)
	}
	if list, _ := b["interface_set"].([]any); list == nil || len(list) != 0 {
		t.Errorf("machine without interfaces: interface_set = %#v, want []", b["interface_set"])
	}

	machines, err := s.Client(t).Machines(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := machines[0]
	if got.HardwareUUID != "6f1e2a9c-0000-4000-8000-000000000001" || got.BootInterface == nil ||
		fmt.Sprint(got.MACs()) != "[52:54:00:00:00:01 52:54:00:00:00:02 52:54:00:00:00:01]" {
		t.Errorf("client reads %+v, MACs %v", got, got.MACs())
	}
	if machines[1].HardwareUUID != "" || machines[1].BootInterface != nil || len(machines[1].MACs()) != 0 {
		t.Errorf("client reads %+v for a machine without hardware", machines[1])
	}
}

func TestOAuthRejectsReusedNonce(t *testing.T) {
	s := maassim.New(t)
	header := oauthHeader(validOAuth("same"))
	if got, body := rawGet(t, s, header); got != http.StatusOK {
		t.Fatalf("first use: %d %s", got, body)
	}
	if got, _ := rawGet(t, s, header); got != http.StatusUnauthorized {
		t.Fatalf("replayed nonce: status %d, want 401", got)
	}
}

func TestMachinesAndPowerParameters(t *testing.T) {
	s := maassim.New(t).
		WithMachine(maassim.Machine{SystemID: "a", Hostname: "alpha", PowerType: "redfish", PowerParameters: map[string]string{"power_address": "https://x", "power_pass": "p"}}).
		WithMachine(maassim.Machine{SystemID: "b", Hostname: "beta", PowerType: "ipmi", PowerParameters: map[string]string{"power_address": "10.0.0.1"}})
	c := s.Client(t)
	ctx := context.Background()

	machines, err := c.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(machines) != 2 || machines[0].SystemID != "a" || machines[0].Hostname != "alpha" ||
		machines[0].StatusName != "New" || machines[0].Pool.Name != maassim.DefaultPool || machines[0].PowerType != "redfish" {
		t.Fatalf("machines = %+v", machines)
	}
	params, err := c.PowerParameters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(params) != 2 || params["a"].String("power_pass") != "p" || params["b"].String("power_address") != "10.0.0.1" {
		t.Fatalf("bulk power parameters = %v", params)
	}
	if n := s.Count(maassim.Match{Method: http.MethodGet, Path: "machines/", Op: "power_parameters"}); n != 1 {
		t.Errorf("bulk requests = %d, want 1", n)
	}
}

func TestUpdateMachine(t *testing.T) {
	tests := []struct {
		name    string
		update  maas.MachineUpdate
		wantErr error
		check   func(t *testing.T, m maassim.Machine)
	}{
		{
			name:   "hostname, pool and merged power parameters",
			update: maas.MachineUpdate{Hostname: "new-name", Pool: "tenant", PowerType: "redfish", PowerParameters: map[string]string{"power_pass": "secret"}},
			check: func(t *testing.T, m maassim.Machine) {
				if m.Hostname != "new-name" || m.Pool != "tenant" || m.PowerParameters["power_pass"] != "secret" || m.PowerParameters["power_address"] != "https://x" {
					t.Errorf("machine = %+v", m)
				}
			},
		},
		{name: "duplicate hostname", update: maas.MachineUpdate{Hostname: "taken", Pool: "tenant"}, wantErr: maas.ErrInvalidArgument},
		{name: "invalid hostname", update: maas.MachineUpdate{Hostname: "bad_name"}, wantErr: maas.ErrInvalidArgument},
		{name: "label too long", update: maas.MachineUpdate{Hostname: strings.Repeat("a", 64)}, wantErr: maas.ErrInvalidArgument},
		{name: "unknown pool", update: maas.MachineUpdate{Hostname: "new-name", Pool: "nope"}, wantErr: maas.ErrInvalidArgument},
		{name: "unknown power type", update: maas.MachineUpdate{PowerType: "telepathy"}, wantErr: maas.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := maassim.New(t).WithPool("tenant").
				WithMachine(maassim.Machine{SystemID: "a", Hostname: "alpha", PowerType: "redfish", PowerParameters: map[string]string{"power_address": "https://x", "power_user": "u"}}).
				WithMachine(maassim.Machine{SystemID: "b", Hostname: "taken"})
			_, err := s.Client(t).UpdateMachine(context.Background(), "a", tt.update)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			m, _ := s.Machine("a")
			if tt.wantErr != nil {
				// A refused form changes nothing.
				if m.Hostname != "alpha" || m.Pool != maassim.DefaultPool || len(m.PowerParameters) != 2 {
					t.Errorf("refused update changed the machine: %+v", m)
				}
				return
			}
			tt.check(t, m)
		})
	}
}

func TestUpdateUnknownMachine(t *testing.T) {
	s := maassim.New(t)
	_, err := s.Client(t).UpdateMachine(context.Background(), "nope", maas.MachineUpdate{Hostname: "x"})
	if !errors.Is(err, maas.ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
}

func TestCommission(t *testing.T) {
	tests := []struct {
		status  int
		wantErr error
	}{
		{maassim.StatusNew, nil},
		{maassim.StatusReady, nil},
		{maassim.StatusFailedCommissioning, nil},
		{maassim.StatusBroken, nil},
		{maassim.StatusCommissioning, maas.ErrInvalidArgument},
		{maassim.StatusDeployed, maas.ErrInvalidArgument},
		{maassim.StatusTesting, maas.ErrInvalidArgument},
		{maassim.StatusFailedTesting, maas.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint("status ", tt.status), func(t *testing.T) {
			s := maassim.New(t).WithMachine(maassim.Machine{SystemID: "a", Hostname: "a", Status: tt.status})
			m, err := s.Client(t).Commission(context.Background(), "a", maas.CommissionOptions{})
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			got, _ := s.Machine("a")
			if tt.wantErr != nil {
				if got.Status != tt.status {
					t.Errorf("refused commission moved status to %d", got.Status)
				}
				return
			}
			if m.Status != maassim.StatusCommissioning || got.Status != maassim.StatusCommissioning {
				t.Fatalf("status after commission: reply %d, server %d", m.Status, got.Status)
			}
			if got.PreviousStatus != tt.status {
				t.Errorf("previous status %d, want %d: a failed power-on returns the machine to it", got.PreviousStatus, tt.status)
			}
			s.Step()
			if got, _ := s.Machine("a"); got.Status != maassim.StatusReady {
				t.Errorf("status after Step = %d, want Ready", got.Status)
			}
		})
	}
}

func TestStepAppliesBMCConfigUnlessSkipped(t *testing.T) {
	for _, skip := range []bool{false, true} {
		t.Run(fmt.Sprint("skip=", skip), func(t *testing.T) {
			s := maassim.New(t).WithMachine(maassim.Machine{
				SystemID: "a", Hostname: "a", PowerType: "redfish",
				PowerParameters: map[string]string{"power_address": "https://x", "power_pass": "real"},
				BMCConfig:       map[string]string{"power_type": "redfish", "power_address": "https://x", "power_pass": ""},
			})
			if _, err := s.Client(t).Commission(context.Background(), "a", maas.CommissionOptions{SkipBMCConfig: skip}); err != nil {
				t.Fatal(err)
			}
			s.Step()
			m, _ := s.Machine("a")
			want := ""
			if skip {
				want = "real"
			}
			if m.PowerParameters["power_pass"] != want {
				t.Errorf("power_pass = %q, want %q", m.PowerParameters["power_pass"], want)
			}
		})
	}
}

func TestPools(t *testing.T) {
	s := maassim.New(t).WithPool("existing")
	c := s.Client(t)
	ctx := context.Background()
	if _, err := c.CreatePool(ctx, "existing", ""); !errors.Is(err, maas.ErrInvalidArgument) {
		t.Fatalf("duplicate pool: err = %v, want ErrInvalidArgument", err)
	}
	created, err := c.CreatePool(ctx, "fresh", "d")
	if err != nil || created.Name != "fresh" || created.ID == 0 {
		t.Fatalf("create: %+v, %v", created, err)
	}
	pools, err := c.Pools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pools {
		names = append(names, p.Name)
	}
	if strings.Join(names, ",") != "default,existing,fresh" {
		t.Fatalf("pools = %v", names)
	}
}

func TestFaults(t *testing.T) {
	tests := []struct {
		name    string
		fault   maassim.Fault
		wantErr error
		status  int
	}{
		{"server error", maassim.FaultServerError, maas.ErrUnavailable, http.StatusServiceUnavailable},
		{"conflict", maassim.FaultConflict, maas.ErrConflict, http.StatusConflict},
		{"malformed JSON", maassim.FaultMalformedJSON, maas.ErrUnavailable, http.StatusOK},
		{"dropped connection", maassim.FaultDropConnection, maas.ErrUnavailable, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := maassim.New(t).WithMachine(maassim.Machine{SystemID: "a", Hostname: "a"})
			c := s.Client(t)
			// A POST is never retried by net/http, so one fault is one failure.
			s.FailNext(1, tt.fault)
			_, err := c.Commission(context.Background(), "a", maas.CommissionOptions{})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if m, _ := s.Machine("a"); m.Status != maassim.StatusNew {
				t.Errorf("faulted request was applied: status %d", m.Status)
			}
			reqs := s.Requests()
			if len(reqs) != 1 || reqs[0].StatusCode != tt.status {
				t.Errorf("requests = %+v, want one with status %d", reqs, tt.status)
			}
			if _, err := c.Commission(context.Background(), "a", maas.CommissionOptions{}); err != nil {
				t.Errorf("fault outlived its count: %v", err)
			}
		})
	}
}

func TestFaultDropResponseAppliesTheChange(t *testing.T) {
	s := maassim.New(t).WithMachine(maassim.Machine{SystemID: "a", Hostname: "a"})
	s.FailNext(1, maassim.FaultDropResponse)
	_, err := s.Client(t).Commission(context.Background(), "a", maas.CommissionOptions{})
	if !errors.Is(err, maas.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
	if m, _ := s.Machine("a"); m.Status != maassim.StatusCommissioning {
		t.Fatalf("status = %d, want Commissioning", m.Status)
	}
}

func TestFailMatchingUntilCleared(t *testing.T) {
	s := maassim.New(t).WithMachine(maassim.Machine{SystemID: "a", Hostname: "a"})
	c := s.Client(t)
	ctx := context.Background()
	s.FailMatching(maassim.Match{Path: "resourcepools/"}, -1, maassim.FaultServerError)
	for range 3 {
		if _, err := c.Pools(ctx); !errors.Is(err, maas.ErrUnavailable) {
			t.Fatalf("pools: err = %v, want ErrUnavailable", err)
		}
	}
	if _, err := c.Machines(ctx); err != nil {
		t.Fatalf("unmatched path failed: %v", err)
	}
	s.ClearFaults()
	if _, err := c.Pools(ctx); err != nil {
		t.Fatalf("after ClearFaults: %v", err)
	}
}

func TestUnrecognisedOperation(t *testing.T) {
	s := maassim.New(t)
	req, _ := http.NewRequest(http.MethodGet, s.URL()+"/api/2.0/machines/?"+url.Values{"op": {"nonsense"}}.Encode(), nil)
	req.Header.Set("Authorization", oauthHeader(validOAuth("n1")))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "Unrecognised signature: method=GET op=nonsense") {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
}

// TestCommissioningResults: the client reads the bmc-config output of a
// machine's current commissioning set; a commission replaces the set (the
// script skipped with skip_bmc_config: MaaS's line, no proof); a machine
// without a set is the region's 400 "Unknown id", which the client takes
// for nothing stored (ErrNotFound); the raw answer has MaaS's fields,
// output base64 (docs/maas-region.md, 2).
func TestCommissioningResults(t *testing.T) {
	ctx := context.Background()
	const stdout = "virtmetal-machine-proof: vmp1-00112233445566778899aabbccddeeff\n"
	s := maassim.New(t).
		WithMachine(maassim.Machine{SystemID: "a", Hostname: "a", Commissioning: []maassim.ScriptResult{
			{Name: "20-maas-01-install-lldpd", Status: maassim.ScriptPassed, Stdout: "other"},
			{Name: maas.BMCConfigScript, Status: maassim.ScriptPassed, Stdout: stdout, Stderr: "warning"},
		}}).
		WithMachine(maassim.Machine{SystemID: "b", Hostname: "b"})
	c := s.Client(t)
	if got, err := c.BMCConfigOutput(ctx, "a"); err != nil || got != stdout {
		t.Fatalf("output %q, %v", got, err)
	}
	if _, err := c.BMCConfigOutput(ctx, "b"); !errors.Is(err, maas.ErrNotFound) {
		t.Errorf("machine without a set: %v, want ErrNotFound", err)
	}
	if code, body := rawResults(t, s, "b", ""); code != http.StatusBadRequest || !strings.Contains(body, `Unknown id "current-commissioning"`) {
		t.Errorf("machine without a set: HTTP %d %q, want the region's 400", code, body)
	}
	if _, err := c.Commission(ctx, "a", maas.CommissionOptions{SkipBMCConfig: true}); err != nil {
		t.Fatal(err)
	}
	if got, err := c.BMCConfigOutput(ctx, "a"); err != nil || got != maassim.SkippedBMCConfigOutput {
		t.Errorf("after a commission with skip_bmc_config: %q, %v; want MaaS's skip line", got, err)
	}

	s.Update("b", func(m *maassim.Machine) {
		m.Commissioning = []maassim.ScriptResult{{Name: maas.BMCConfigScript, Status: maassim.ScriptPassed, Stdout: "out", Stderr: "err"}}
	})
	r := results(t, s, "b", "include_output=1&filters="+maas.BMCConfigScript)[0]
	if r["name"] != maas.BMCConfigScript || r["status_name"] != "Passed" || r["exit_status"] != 0.0 ||
		r["stdout"] != "b3V0" || r["stderr"] != "ZXJy" || r["output"] != "b3V0ZXJy" || r["result"] != "" {
		t.Errorf("result %+v", r)
	}
}

// rawResults is GET nodes/{id}/results/current-commissioning/?query as
// the admin: the status and the body.
func rawResults(t *testing.T, s *maassim.Server, systemID, query string) (int, string) {
	t.Helper()
	return rawGetPath(t, s, "/api/2.0/nodes/"+systemID+"/results/current-commissioning/?"+query,
		oauthHeader(validOAuth(fmt.Sprint("results-", time.Now().UnixNano()))))
}

// results are the results rawResults answers, which must be 200.
func results(t *testing.T, s *maassim.Server, systemID, query string) []map[string]any {
	t.Helper()
	code, body := rawResults(t, s, systemID, query)
	var set struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal([]byte(body), &set); err != nil || code != http.StatusOK {
		t.Fatalf("HTTP %d %q: %v", code, body, err)
	}
	return set.Results
}

// enlist is an anonymous POST machines/ with the form.
func enlist(t *testing.T, s *maassim.Server, form url.Values) (int, string) {
	t.Helper()
	resp, err := http.PostForm(s.URL()+"/api/2.0/machines/", form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestAnonymousEnlistment: POST machines/ without a key makes a New
// machine with the caller's hostname, MACs and power settings, and no
// commissioning results; a taken hostname is refused; the hardware UUID
// sent is ignored (docs/maas-region.md, 1).
func TestAnonymousEnlistment(t *testing.T) {
	s := maassim.New(t).WithMachine(maassim.Machine{SystemID: "taken", Hostname: "web1-tenant-a"})
	form := func(hostname string) url.Values {
		return url.Values{"hostname": {hostname}, "architecture": {"amd64/generic"}, "mac_addresses": {"02:00:00:00:00:01"}, "hardware_uuid": {"6a1f0b8e-2d6c-4f1e-9a53-0c2b7e4d9f10"},
			"power_type": {"redfish"}, "power_parameters": {`{"power_address":"web1.tenant-a.bmc.example.org","power_user":"u","power_pass":"p"}`}}
	}
	if code, _ := enlist(t, s, form("web1-tenant-a")); code != http.StatusBadRequest {
		t.Errorf("taken hostname: HTTP %d", code)
	}
	code, body := enlist(t, s, form("squatter"))
	var m maas.Machine
	if err := json.Unmarshal([]byte(body), &m); err != nil || code != http.StatusOK {
		t.Fatalf("HTTP %d %q, %v", code, body, err)
	}
	got, _ := s.Machine(m.SystemID)
	if got.Hostname != "squatter" || got.Status != maassim.StatusNew || got.PowerType != "redfish" ||
		got.PowerParameters["power_address"] != "web1.tenant-a.bmc.example.org" || got.Commissioning != nil || got.HardwareUUID != "" {
		t.Errorf("enlisted %+v", got)
	}
	if _, err := s.Client(t).BMCConfigOutput(context.Background(), m.SystemID); !errors.Is(err, maas.ErrNotFound) {
		t.Errorf("results of an anonymous enlistment: %v, want ErrNotFound", err)
	}
}
