package lab

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"strings"
	"time"
)

// errPowerAuth is MaaS's PowerAuthError: not retried.
var errPowerAuth = errors.New("PowerAuthError")

// driverRetries is how often MaaS's drivers repeat a failed request; the
// waits between grow from half a second.
const driverRetries = 5

func retryDelay(attempt int) time.Duration {
	return time.Duration(500*(1<<attempt)) * time.Millisecond
}

// retry runs f until it succeeds, fails for good, or the retries run out.
func retry(ctx context.Context, f func() error) error {
	var err error
	for attempt := range driverRetries + 1 {
		if err = f(); err == nil || errors.Is(err, errPowerAuth) {
			return err
		}
		if attempt == driverRetries {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(retryDelay(attempt)):
		}
	}
	return err
}

func insecureTransport(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Transport {
	return &http.Transport{
		DialContext: dial,
		// MaaS does not verify BMC certificates.
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // as MaaS
		DisableKeepAlives: true,                                  // Twisted's Agent sends Connection: close
	}
}

// redfishDriver sends what MaaS's redfish power driver sends
// (provisioningserver/drivers/power/redfish.py; conformance/maas_driver_test.go
// replays it byte for byte): the same headers on every request, PATCH Boot
// Once/Pxe with the ETag just read as If-Match, ForceOff when on, POST On,
// then polling PowerState.
type redfishDriver struct {
	http   *http.Client
	base   string
	auth   string
	nodeID string
}

func newRedfishDriver(address, username, password, nodeID string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *redfishDriver {
	if !strings.Contains(address, "://") {
		address = "https://" + address
	}
	return &redfishDriver{
		http:   &http.Client{Transport: insecureTransport(dial), Timeout: 30 * time.Second},
		base:   strings.TrimRight(address, "/"),
		auth:   "Basic " + base64.StdEncoding.EncodeToString([]byte(username+":"+password)),
		nodeID: nodeID,
	}
}

// request is _redfish_request: 404 without a trailing slash is tried again
// with one; 401 and 403 are fatal.
func (d *redfishDriver) request(ctx context.Context, method, uri, ifMatch, body string) (map[string]any, http.Header, error) {
	res, data, err := d.send(ctx, method, uri, ifMatch, body)
	if err != nil {
		return nil, nil, err
	}
	switch {
	case res.StatusCode == http.StatusNotFound && !strings.HasSuffix(uri, "/"):
		if res, data, err = d.send(ctx, method, uri+"/", ifMatch, body); err != nil {
			return nil, nil, err
		}
	case res.StatusCode == http.StatusUnauthorized || res.StatusCode == http.StatusForbidden:
		return nil, nil, fmt.Errorf("%w: %s %s: %d", errPowerAuth, method, uri, res.StatusCode)
	case res.StatusCode >= 400:
		return nil, nil, fmt.Errorf("PowerActionError: %s %s: %d %s", method, uri, res.StatusCode, data)
	}
	if len(data) == 0 {
		return nil, res.Header, nil
	}
	var decoded map[string]any
	if err := json.Unmarshal(data, &decoded); err != nil {
		return nil, nil, fmt.Errorf("PowerActionError: %s %s: %w", method, uri, err)
	}
	return decoded, res.Header, nil
}

func (d *redfishDriver) send(ctx context.Context, method, uri, ifMatch, body string) (*http.Response, []byte, error) {
	var reader io.Reader
	if body != "" {
		reader = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, d.base+uri, reader)
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("User-Agent", "MAAS")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Authorization", d.auth)
	req.Header.Set("Content-Type", "application/json")
	if ifMatch != "" {
		req.Header.Set("If-Match", ifMatch)
	}
	res, err := d.http.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	return res, data, err
}

// retrying is redfish_request: failed attempts repeated, the ETag read
// afresh each time.
func (d *redfishDriver) retrying(ctx context.Context, method, uri, body string, etag func() (string, error)) (data map[string]any, header http.Header, err error) {
	err = retry(ctx, func() error {
		ifMatch := ""
		if etag != nil {
			var err error
			if ifMatch, err = etag(); err != nil {
				return err
			}
		}
		var err error
		data, header, err = d.request(ctx, method, uri, ifMatch, body)
		return err
	})
	return data, header, err
}

func (d *redfishDriver) systemURI(node string) string { return path.Join("/redfish/v1/Systems", node) }

// node is the configured node_id, else the first Systems member.
func (d *redfishDriver) node(ctx context.Context) (string, error) {
	if d.nodeID != "" {
		return d.nodeID, nil
	}
	systems, _, err := d.retrying(ctx, http.MethodGet, "/redfish/v1/Systems", "", nil)
	if err != nil {
		return "", err
	}
	members, _ := systems["Members"].([]any)
	if len(members) == 0 {
		return "", errors.New("no Systems members")
	}
	member, _ := members[0].(map[string]any)
	id, _ := member["@odata.id"].(string)
	return path.Base(strings.TrimRight(id, "/")), nil
}

// powerQuery is _power_query with the driver's mapping of PowerState.
func (d *redfishDriver) powerQuery(ctx context.Context, node string) (string, error) {
	for range 8 {
		system, _, err := d.retrying(ctx, http.MethodGet, d.systemURI(node), "", nil)
		if err != nil {
			return "", err
		}
		state, _ := system["PowerState"].(string)
		switch strings.ToLower(state) {
		case "off", "poweringon":
			return "off", nil
		case "on", "paused", "poweringoff":
			return "on", nil
		case "reset", "unknown", "null", "":
			continue
		default:
			return "error", nil
		}
	}
	return "error", nil
}

func (d *redfishDriver) waitFor(ctx context.Context, node, want string) error {
	ctx, cancel := context.WithTimeout(ctx, powerTimeout)
	defer cancel()
	for {
		got, err := d.powerQuery(ctx, node)
		if err != nil || got == want {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s never reached %s", node, want)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// etag is get_etag: @odata.etag from the body, else the ETag header.
func (d *redfishDriver) etag(ctx context.Context, uri string) (string, error) {
	data, header, err := d.retrying(ctx, http.MethodGet, uri, "", nil)
	if err != nil {
		return "", err
	}
	if tag, ok := data["@odata.etag"].(string); ok {
		return tag, nil
	}
	return header.Get("ETag"), nil
}

const redfishBootBody = `{"Boot": {"BootSourceOverrideEnabled": "Once", "BootSourceOverrideTarget": "Pxe"}}`

// setPXEBoot is set_pxe_boot: the system, or its @Redfish.Settings object,
// PATCHed with the ETag just read.
func (d *redfishDriver) setPXEBoot(ctx context.Context, node string) error {
	target := d.systemURI(node)
	if system, _, err := d.retrying(ctx, http.MethodGet, target, "", nil); err == nil {
		if settings, ok := system["@Redfish.Settings"].(map[string]any); ok {
			if object, ok := settings["SettingsObject"].(map[string]any); ok {
				if id, _ := object["@odata.id"].(string); id != "" {
					target = "/" + strings.TrimLeft(id, "/")
				}
			}
		}
	}
	_, _, err := d.retrying(ctx, http.MethodPatch, target, redfishBootBody, func() (string, error) { return d.etag(ctx, target) })
	return err
}

func (d *redfishDriver) power(ctx context.Context, node, change string) error {
	body := fmt.Sprintf(`{"ResetType": "%s"}`, change)
	if _, _, err := d.retrying(ctx, http.MethodPost, d.systemURI(node)+"/Actions/ComputerSystem.Reset", body, nil); err != nil {
		return err
	}
	switch change {
	case "ForceOff":
		return d.waitFor(ctx, node, "off")
	case "On":
		return d.waitFor(ctx, node, "on")
	}
	return nil
}

func (d *redfishDriver) powerOn(ctx context.Context) error {
	node, err := d.node(ctx)
	if err != nil {
		return err
	}
	if state, err := d.powerQuery(ctx, node); err != nil {
		return err
	} else if state == "on" {
		if err := d.power(ctx, node, "ForceOff"); err != nil {
			return err
		}
	}
	if err := d.setPXEBoot(ctx, node); err != nil {
		return err
	}
	return d.power(ctx, node, "On")
}

func (d *redfishDriver) powerOff(ctx context.Context) error {
	node, err := d.node(ctx)
	if err != nil {
		return err
	}
	if state, err := d.powerQuery(ctx, node); err != nil {
		return err
	} else if state != "off" {
		if err := d.power(ctx, node, "ForceOff"); err != nil {
			return err
		}
	}
	return d.setPXEBoot(ctx, node)
}

// ipmiDriver runs freeipmi as MaaS's ipmi power driver does
// (provisioningserver/drivers/power/ipmi.py, replayed in ipmi/tools_test.go):
// ipmi-chassis-config commits a one-time PXE boot, ipmipower --cycle
// --on-if-off powers on, --off powers off, all over LAN_2_0.
type ipmiDriver struct {
	address            func() (string, bool) // 127.0.0.1:port while the BMC is ready
	username, password string
	dir                string // for the chassis config file
}

const ipmiBootConfig = "Section Chassis_Boot_Flags\n" +
	"        Boot_Flags_Persistent                         No\n" +
	"        Boot_Device                                   PXE\n" +
	"EndSection\n"

func (d *ipmiDriver) common() ([]string, error) {
	addr, ok := d.address()
	if !ok {
		return nil, errors.New("BMC address does not resolve")
	}
	return []string{"-W", "opensesspriv", "--driver-type", "LAN_2_0", "-h", addr,
		"-u", d.username, "-p", d.password, "-l", "OPERATOR"}, nil
}

func (d *ipmiDriver) run(ctx context.Context, tool string, args ...string) (string, error) {
	common, err := d.common()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, tool, append(common, args...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", tool, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// ipmipower runs one power operation; ipmipower reports per-host failures
// on stdout with exit status 0, as MaaS's driver expects.
func (d *ipmiDriver) ipmipower(ctx context.Context, op ...string) (string, error) {
	out, err := d.run(ctx, "ipmipower", op...)
	if err != nil {
		return "", err
	}
	for _, want := range []string{": ok", ": on", ": off"} {
		if strings.Contains(out, want) {
			return out, nil
		}
	}
	return "", fmt.Errorf("ipmipower %s: %s", strings.Join(op, " "), strings.TrimSpace(out))
}

func (d *ipmiDriver) powerOn(ctx context.Context) error {
	file, err := os.CreateTemp(d.dir, "ipmi-chassis-*.conf")
	if err != nil {
		return err
	}
	defer os.Remove(file.Name())
	if _, err := io.Copy(file, bytes.NewBufferString(ipmiBootConfig)); err != nil {
		file.Close()
		return err
	}
	if err := file.Close(); err != nil {
		return err
	}
	if err := retry(ctx, func() error {
		_, err := d.run(ctx, "ipmi-chassis-config", "--commit", "--filename", file.Name())
		return err
	}); err != nil {
		return err
	}
	return retry(ctx, func() error {
		_, err := d.ipmipower(ctx, "--cycle", "--on-if-off")
		return err
	})
}

func (d *ipmiDriver) powerOff(ctx context.Context) error {
	return retry(ctx, func() error {
		_, err := d.ipmipower(ctx, "--off")
		return err
	})
}
