// Package maasdriver replays MaaS's power drivers as clients of a BMC: the
// Redfish driver request for request and byte for byte, and the IPMI driver
// as the freeipmi commands it runs. It is no simulator: it is the client
// side, kept beside the conformance suite, which replays the Redfish driver
// against bmc-server and checks every request as it arrives; the lab's
// simulated MaaS (sim/maas) powers its machines with both. What MaaS does
// around a driver (its power-state polling schedule, queueing, the
// rack controller's RPC) is not replayed.
package maasdriver

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"
)

// What MaaS's Redfish power driver (provisioningserver/drivers/power/redfish.py)
// sends, and how often it tries.
const (
	RedfishBootBody  = `{"Boot": {"BootSourceOverrideEnabled": "Once", "BootSourceOverrideTarget": "Pxe"}}`
	RedfishResetBody = `{"ResetType": "%s"}`
	// RedfishRetries is how often redfish_request repeats a failed request.
	RedfishRetries = 5
	// RedfishStatusRetries is how often a "reset", "unknown" or "null"
	// PowerState is read again.
	RedfishStatusRetries = 7
)

// ErrPowerAuth is the driver's PowerAuthError (401 or 403): not retried.
var ErrPowerAuth = errors.New("PowerAuthError")

// RedfishDriver sends what MaaS's Redfish power driver sends, request for
// request and byte for byte as Twisted's Agent frames them (one TLS
// connection per request, Connection: close, the same four headers on every
// request, a Content-Type even on a bodiless GET, no OData-Version, bodies
// as Python's json.dumps writes them): GET the Systems collection unless a
// node ID is configured, ForceOff when on, PATCH Boot Once/Pxe with the ETag
// just read as If-Match, POST the reset, then poll PowerState.
type RedfishDriver struct {
	// Address is the BMC's power_address: host:port or an https URL.
	Address            string
	Username, Password string
	// NodeID is the node_id power parameter; empty: the first Systems
	// member.
	NodeID string
	// ContentType of every request; empty: application/json (older MaaS
	// releases sent "application/json; charset=utf-8").
	ContentType string
	// Dial opens the TCP connection to the BMC; nil: net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// RetryDelay is the wait before retry attempt (0-based); nil: MaaS's,
	// half a second doubling.
	RetryDelay func(attempt int) time.Duration
	// PollInterval is the wait between PowerState reads while a power
	// change settles (zero: 100 ms), and PowerTimeout how long it may take
	// (zero: 2 minutes). RequestTimeout bounds one request (zero: 30 s).
	PollInterval, PowerTimeout, RequestTimeout time.Duration
}

// Authorization is the header every request carries.
func (d *RedfishDriver) Authorization() string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(d.Username+":"+d.Password))
}

// SystemURI is the ComputerSystem of node.
func SystemURI(node string) string { return path.Join("/redfish/v1/Systems", node) }

// PowerOn is power_on: off first if on, then a PXE boot once and On.
func (d *RedfishDriver) PowerOn(ctx context.Context) error {
	node, err := d.node(ctx)
	if err != nil {
		return err
	}
	if state, err := d.PowerQuery(ctx, node); err != nil {
		return err
	} else if state == "on" {
		if err := d.power(ctx, node, "ForceOff"); err != nil {
			return err
		}
	}
	if err := d.SetPXEBoot(ctx, node); err != nil {
		return err
	}
	return d.power(ctx, node, "On")
}

// PowerOff is power_off: ForceOff unless off, then a PXE boot once for the
// next power-on.
func (d *RedfishDriver) PowerOff(ctx context.Context) error {
	node, err := d.node(ctx)
	if err != nil {
		return err
	}
	if state, err := d.PowerQuery(ctx, node); err != nil {
		return err
	} else if state != "off" {
		if err := d.power(ctx, node, "ForceOff"); err != nil {
			return err
		}
	}
	return d.SetPXEBoot(ctx, node)
}

// PowerReset is power_reset: a PXE boot once, then GracefulRestart, not
// waited for.
func (d *RedfishDriver) PowerReset(ctx context.Context) error {
	node, err := d.node(ctx)
	if err != nil {
		return err
	}
	if err := d.SetPXEBoot(ctx, node); err != nil {
		return err
	}
	return d.power(ctx, node, "GracefulRestart")
}

// PowerQuery is _power_query with the driver's mapping of PowerState: on,
// off or error.
func (d *RedfishDriver) PowerQuery(ctx context.Context, node string) (string, error) {
	for range RedfishStatusRetries + 1 {
		system, _, err := d.RedfishRequest(ctx, http.MethodGet, SystemURI(node), "", nil)
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

// SetPXEBoot is set_pxe_boot: find where Boot is written (the system, or
// its @Redfish.Settings object), then PATCH it with the ETag just read.
func (d *RedfishDriver) SetPXEBoot(ctx context.Context, node string) error {
	target := SystemURI(node)
	if system, _, err := d.RedfishRequest(ctx, http.MethodGet, target, "", nil); err == nil {
		if settings, ok := system["@Redfish.Settings"].(map[string]any); ok {
			if object, ok := settings["SettingsObject"].(map[string]any); ok {
				if id, _ := object["@odata.id"].(string); id != "" {
					target = "/" + strings.TrimLeft(id, "/")
				}
			}
		}
	}
	_, _, err := d.RedfishRequest(ctx, http.MethodPatch, target, RedfishBootBody, func() (string, error) { return d.etag(ctx, target) })
	return err
}

// RedfishRequest is redfish_request: a failed attempt is repeated after
// RetryDelay, the ETag (when etag is not nil) read afresh each time, up to
// RedfishRetries times; ErrPowerAuth ends it at once.
func (d *RedfishDriver) RedfishRequest(ctx context.Context, method, uri, body string, etag func() (string, error)) (map[string]any, http.Header, error) {
	var err error
	for attempt := range RedfishRetries + 1 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			case <-time.After(d.retryDelay(attempt - 1)):
			}
		}
		ifMatch := ""
		if etag != nil {
			if ifMatch, err = etag(); err != nil {
				continue
			}
		}
		var data map[string]any
		var header http.Header
		if data, header, err = d.Request(ctx, method, uri, ifMatch, body); err == nil || errors.Is(err, ErrPowerAuth) {
			return data, header, err
		}
	}
	return nil, nil, err
}

// Request is _redfish_request: a 404 on a URI without a trailing slash is
// sent again with one (and that answer taken whatever its status); 401 and
// 403 are ErrPowerAuth; other errors fail the attempt. A non-empty answer
// must be JSON.
func (d *RedfishDriver) Request(ctx context.Context, method, uri, ifMatch, body string) (map[string]any, http.Header, error) {
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
		return nil, nil, fmt.Errorf("%w: %s %s: %d", ErrPowerAuth, method, uri, res.StatusCode)
	case res.StatusCode >= 400:
		return nil, nil, fmt.Errorf("PowerActionError: %s %s: %d %s", method, uri, res.StatusCode, data)
	}
	if len(data) == 0 {
		return nil, res.Header, nil
	}
	var decoded map[string]any
	if err := json.Unmarshal(data, &decoded); err != nil {
		return nil, nil, fmt.Errorf("PowerActionError: %s %s: JSON parse error: %w", method, uri, err)
	}
	return decoded, res.Header, nil
}

// send writes one request as Twisted's Agent frames it for the driver and
// reads the answer.
func (d *RedfishDriver) send(ctx context.Context, method, uri, ifMatch, body string) (*http.Response, []byte, error) {
	host, addr, err := d.hostAndAddr()
	if err != nil {
		return nil, nil, err
	}
	var req bytes.Buffer
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nConnection: close\r\nHost: %s\r\n", method, uri, host)
	fmt.Fprintf(&req, "User-Agent: MAAS\r\nAccept: application/json\r\nAuthorization: %s\r\nContent-Type: %s\r\n", d.Authorization(), d.contentType())
	if ifMatch != "" {
		fmt.Fprintf(&req, "If-Match: %s\r\n", ifMatch)
	}
	if body != "" {
		fmt.Fprintf(&req, "Content-Length: %d\r\n", len(body))
	}
	req.WriteString("\r\n" + body)

	ctx, cancel := context.WithTimeout(ctx, d.requestTimeout())
	defer cancel()
	dial := d.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	raw, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, uri, err)
	}
	serverName, _, _ := net.SplitHostPort(addr)
	// MaaS does not verify BMC certificates.
	conn := tls.Client(raw, &tls.Config{ServerName: serverName, InsecureSkipVerify: true}) //nolint:gosec // as MaaS
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	if _, err := conn.Write(req.Bytes()); err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, uri, err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: reading the answer: %w", method, uri, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: reading the body: %w", method, uri, err)
	}
	if res.StatusCode/100 == 3 {
		return nil, nil, fmt.Errorf("%s %s: %d redirect to %q: MaaS would follow it, a BMC should not need it", method, uri, res.StatusCode, res.Header.Get("Location"))
	}
	return res, data, nil
}

// node is process_redfish_context: the configured node ID, else the last
// segment of the first Systems member.
func (d *RedfishDriver) node(ctx context.Context) (string, error) {
	if d.NodeID != "" {
		return d.NodeID, nil
	}
	systems, _, err := d.RedfishRequest(ctx, http.MethodGet, "/redfish/v1/Systems", "", nil)
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

// power is power(): POST the reset, then wait for On or Off.
func (d *RedfishDriver) power(ctx context.Context, node, change string) error {
	if _, _, err := d.RedfishRequest(ctx, http.MethodPost, SystemURI(node)+"/Actions/ComputerSystem.Reset", fmt.Sprintf(RedfishResetBody, change), nil); err != nil {
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

func (d *RedfishDriver) waitFor(ctx context.Context, node, want string) error {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(d.PowerTimeout, 2*time.Minute))
	defer cancel()
	for {
		got, err := d.PowerQuery(ctx, node)
		if err != nil || got == want {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s never reached %s", node, want)
		case <-time.After(cmp.Or(d.PollInterval, 100*time.Millisecond)):
		}
	}
}

// etag is get_etag: @odata.etag from the body, else the ETag header.
func (d *RedfishDriver) etag(ctx context.Context, uri string) (string, error) {
	data, header, err := d.RedfishRequest(ctx, http.MethodGet, uri, "", nil)
	if err != nil {
		return "", err
	}
	if tag, ok := data["@odata.etag"].(string); ok {
		return tag, nil
	}
	return header.Get("ETag"), nil
}

// hostAndAddr are the Host header (no port when it is 443, as Twisted
// sends it) and the address to dial.
func (d *RedfishDriver) hostAndAddr() (host, addr string, err error) {
	address := d.Address
	if !strings.Contains(address, "://") {
		address = "https://" + address
	}
	u, err := url.Parse(address)
	if err != nil {
		return "", "", fmt.Errorf("power_address %q: %w", d.Address, err)
	}
	if u.Port() == "" || u.Port() == "443" {
		return u.Hostname(), net.JoinHostPort(u.Hostname(), "443"), nil
	}
	return u.Host, u.Host, nil
}

func (d *RedfishDriver) contentType() string { return cmp.Or(d.ContentType, "application/json") }

func (d *RedfishDriver) requestTimeout() time.Duration {
	return cmp.Or(d.RequestTimeout, 30*time.Second)
}

func (d *RedfishDriver) retryDelay(attempt int) time.Duration {
	if d.RetryDelay != nil {
		return d.RetryDelay(attempt)
	}
	return defaultRetryDelay(attempt)
}

// defaultRetryDelay is MaaS's wait before a retry: half a second,
// doubling.
func defaultRetryDelay(attempt int) time.Duration {
	return time.Duration(500*(1<<attempt)) * time.Millisecond
}
