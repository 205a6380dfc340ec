package maas

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Sentinel errors of this package. MaaS's HTTP statuses become these in
// APIError.Unwrap; the Kubernetes side (KubeCluster) uses them too.
var (
	// ErrUnauthorized: MaaS rejected the API key (HTTP 401 or 403).
	ErrUnauthorized = errors.New("maas rejected the API key")
	// ErrInvalidArgument: a request or a configuration value is not
	// acceptable (MaaS answers 400).
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrNotFound: the object does not exist (MaaS answers 404, or the VM or
	// its BMC Secret is missing).
	ErrNotFound = errors.New("not found")
	// ErrConflict: the object's state forbids the request (MaaS answers 409).
	ErrConflict = errors.New("conflicts with current state")
	// ErrForbidden: Kubernetes refused the reconciler's identity an object
	// (RBAC or admission said no).
	ErrForbidden = errors.New("forbidden")
	// ErrUnavailable: MaaS or Kubernetes is unreachable, failing (5xx) or
	// answering nonsense; the next cycle retries.
	ErrUnavailable = errors.New("unavailable")
)

// NodeStatus is MaaS's status code of a machine (maasserver NODE_STATUS);
// Machine.StatusName carries MaaS's name for it.
type NodeStatus int

// The statuses the reconciler acts on.
const (
	// StatusNew: enlisted, never commissioned; the only status the
	// reconciler commissions.
	StatusNew NodeStatus = 0
	// StatusReady: commissioned and not allocated; still the reconciler's to
	// name and pool.
	StatusReady NodeStatus = 4
)

// PowerTypeRedfish is MaaS's power driver name for Redfish BMCs.
const PowerTypeRedfish = "redfish"

// PowerTypeManual is MaaS's power type for machines it cannot power; a
// machine set to it gets a BMC row of its own.
const PowerTypeManual = "manual"

// Redfish power parameter names, as the MaaS redfish driver and the
// BMC_CONFIG_PATH YAML spell them.
const (
	PowerAddress = "power_address"
	PowerUser    = "power_user"
	PowerPass    = "power_pass"
	PowerNodeID  = "node_id"
)

// PlaceholderUser is the Redfish user of a machine that holds no VM's BMC
// credentials: deploy/maas's commissioning script writes it at enlistment,
// with a random password, and the reconciler writes it (and a random
// password, placeholderPassword) where it takes a VM's credentials away.
// MaaS refuses empty Redfish credentials (docs/maas-region.md, 4).
const PlaceholderUser = "virtmetal-placeholder"

// placeholderPassword is a fresh random password that no BMC has.
func placeholderPassword() string {
	b := make([]byte, 18)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24 and later)
	return base64.RawURLEncoding.EncodeToString(b)
}

// APIKey is a MaaS API key, "consumer:token:secret" as MaaS shows it.
type APIKey struct {
	Consumer, Token, Secret string
}

// ParseAPIKey splits a MaaS API key. The error never contains the key.
func ParseAPIKey(s string) (APIKey, error) {
	parts := strings.Split(strings.TrimSpace(s), ":")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return APIKey{}, fmt.Errorf("maas API key must have the form consumer:token:secret: %w", ErrInvalidArgument)
	}
	return APIKey{Consumer: parts[0], Token: parts[1], Secret: parts[2]}, nil
}

// String hides the secret so a key that reaches a log line leaks nothing.
func (k APIKey) String() string { return k.Consumer + ":" + k.Token + ":<redacted>" }

// GoString hides the secret from %#v as well.
func (k APIKey) GoString() string { return "maas.APIKey{" + k.String() + "}" }

// Machine is the part of a MaaS machine the reconciler reads.
type Machine struct {
	SystemID   string     `json:"system_id"`
	Hostname   string     `json:"hostname"`
	Status     NodeStatus `json:"status"`
	StatusName string     `json:"status_name"`
	PowerType  string     `json:"power_type"`
	Pool       PoolRef    `json:"pool"`
	// HardwareUUID is the SMBIOS system UUID commissioning found; "" when
	// MaaS shows null (not commissioned yet, or cleared as a duplicate).
	HardwareUUID  string      `json:"hardware_uuid"`
	Interfaces    []Interface `json:"interface_set"`
	BootInterface *Interface  `json:"boot_interface"`
}

// Interface is a machine's network interface as MaaS embeds it.
type Interface struct {
	ID         int    `json:"id"`
	Name       string `json:"name"`
	MACAddress string `json:"mac_address"`
}

// MACs are the machine's interface MACs, boot interface included, as MaaS
// spells them.
func (m Machine) MACs() []string {
	var macs []string
	for _, iface := range m.Interfaces {
		macs = append(macs, iface.MACAddress)
	}
	if m.BootInterface != nil {
		macs = append(macs, m.BootInterface.MACAddress)
	}
	return macs
}

// PoolRef is a machine's resource pool as MaaS embeds it in a machine.
type PoolRef struct {
	ID   int    `json:"id"`
	Name string `json:"name"`
}

// Pool is a MaaS resource pool.
type Pool struct {
	ID          int    `json:"id"`
	Name        string `json:"name"`
	Description string `json:"description"`
}

// PowerParameters are one machine's power parameters. Values are mostly
// strings, but some drivers use numbers or booleans.
type PowerParameters map[string]any

// String returns the parameter as a string, "" when absent or not a string.
func (p PowerParameters) String(key string) string {
	s, _ := p[key].(string)
	return s
}

// MachineUpdate is a PUT machines/<id>/; empty fields are left unchanged.
type MachineUpdate struct {
	Hostname        string
	Pool            string
	PowerType       string
	PowerParameters map[string]string
}

func (u MachineUpdate) form() url.Values {
	form := url.Values{}
	if u.Hostname != "" {
		form.Set("hostname", u.Hostname)
	}
	if u.Pool != "" {
		form.Set("pool", u.Pool)
	}
	if u.PowerType != "" {
		form.Set("power_type", u.PowerType)
	}
	for key, value := range u.PowerParameters {
		form.Set("power_parameters_"+key, value)
	}
	return form
}

// CommissionOptions are the commission operation's switches the reconciler
// uses.
type CommissionOptions struct {
	// SkipBMCConfig keeps MaaS from rerunning the bmc-config scripts, which
	// would replace the power parameters (the password with a placeholder).
	SkipBMCConfig bool
}

// Client speaks MaaS REST API 2.0 with an API key (OAuth 1.0 PLAINTEXT).
type Client struct {
	api  *url.URL
	key  APIKey
	http *http.Client
}

// NewClient returns a client for the MaaS at baseURL, e.g.
// "http://maas.example:5240/MAAS" (a URL ending in /api/2.0 works too).
// httpClient may be nil for a default with a 2 min timeout (listing a large
// MaaS is slow).
func NewClient(baseURL string, key APIKey, httpClient *http.Client) (*Client, error) {
	u, err := url.Parse(strings.TrimSpace(baseURL))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("maas URL %q must be an absolute http(s) URL: %w", baseURL, ErrInvalidArgument)
	}
	path := strings.TrimSuffix(u.Path, "/")
	if !strings.HasSuffix(path, "/api/2.0") {
		path += "/api/2.0"
	}
	u.Path = path + "/"
	u.RawQuery, u.Fragment = "", ""
	if httpClient == nil {
		httpClient = &http.Client{Timeout: 2 * time.Minute}
	}
	return &Client{api: u, key: key, http: httpClient}, nil
}

// Machines lists all machines (GET machines/). The list carries no power
// parameters; see PowerParameters.
func (c *Client) Machines(ctx context.Context) ([]Machine, error) {
	var machines []Machine
	err := c.do(ctx, http.MethodGet, "machines/", url.Values{}, nil, &machines)
	return machines, err
}

// PowerParameters returns every machine's power parameters keyed by
// system_id in one request (GET machines/?op=power_parameters; admin only).
func (c *Client) PowerParameters(ctx context.Context) (map[string]PowerParameters, error) {
	params := map[string]PowerParameters{}
	err := c.do(ctx, http.MethodGet, "machines/", url.Values{"op": {"power_parameters"}}, nil, &params)
	return params, err
}

// Pools lists the resource pools (GET resourcepools/).
func (c *Client) Pools(ctx context.Context) ([]Pool, error) {
	var pools []Pool
	err := c.do(ctx, http.MethodGet, "resourcepools/", url.Values{}, nil, &pools)
	return pools, err
}

// CreatePool creates a resource pool (POST resourcepools/). MaaS refuses a
// name that exists already with 400 (ErrInvalidArgument).
func (c *Client) CreatePool(ctx context.Context, name, description string) (Pool, error) {
	var pool Pool
	form := url.Values{"name": {name}, "description": {description}}
	err := c.do(ctx, http.MethodPost, "resourcepools/", url.Values{}, form, &pool)
	return pool, err
}

// UpdateMachine changes a machine (PUT machines/<id>/). MaaS merges the given
// power parameters into the machine's current ones.
func (c *Client) UpdateMachine(ctx context.Context, systemID string, update MachineUpdate) (Machine, error) {
	var m Machine
	err := c.do(ctx, http.MethodPut, machinePath(systemID), url.Values{}, update.form(), &m)
	return m, err
}

// Commission starts commissioning (POST machines/<id>/?op=commission). MaaS
// refuses it with 400 unless the machine is New, Ready, Failed commissioning
// or Broken.
func (c *Client) Commission(ctx context.Context, systemID string, opts CommissionOptions) (Machine, error) {
	var m Machine
	form := url.Values{}
	if opts.SkipBMCConfig {
		form.Set("skip_bmc_config", "1")
	}
	err := c.do(ctx, http.MethodPost, machinePath(systemID), url.Values{"op": {"commission"}}, form, &m)
	return m, err
}

// BMCConfigScript is the name of virtmetal's commissioning script in MaaS
// (deploy/maas/virtmetal-bmc-config.py's metadata).
const BMCConfigScript = "50-virtmetal-bmc-config"

// BMCConfigOutput is what MaaS stored as the standard output of the
// bmc-config script in the machine's current commissioning script set
// (GET nodes/<id>/results/current-commissioning/), where the guest
// reported its machine proof. It is "" when the set has no such result or
// the result has no output (a pending run); a skipped run's is MaaS's
// line saying so. The error wraps ErrNotFound when the machine has no
// current commissioning set (enlisted without commission=true): nothing
// stored yet, which MaaS 3.4 answers with 400 "Unknown id"
// (docs/maas-region.md, 1). The one place that knows where MaaS keeps it.
func (c *Client) BMCConfigOutput(ctx context.Context, systemID string) (string, error) {
	var set struct {
		Results []struct {
			Name   string `json:"name"`
			Stdout []byte `json:"stdout"` // base64 in the JSON
		} `json:"results"`
	}
	query := url.Values{"include_output": {"1"}, "filters": {BMCConfigScript}}
	if err := c.do(ctx, http.MethodGet, "nodes/"+url.PathEscape(systemID)+"/results/current-commissioning/", query, nil, &set); err != nil {
		if apiErr, ok := errors.AsType[*APIError](err); ok && apiErr.StatusCode == http.StatusBadRequest && strings.Contains(apiErr.Message, noScriptSet) {
			return "", fmt.Errorf("machine %s has no current commissioning script set: %w (%v)", systemID, ErrNotFound, err)
		}
		return "", err
	}
	output := ""
	for _, result := range set.Results {
		if result.Name == BMCConfigScript {
			output = string(result.Stdout)
		}
	}
	return output, nil
}

// noScriptSet starts MaaS's 400 text for a script set it does not know,
// which it answers for current-commissioning when the machine has none.
const noScriptSet = `Unknown id "`

func machinePath(systemID string) string {
	return "machines/" + systemID + "/"
}

// APIError is a reply MaaS gave with an error status. It unwraps to the
// sentinel error that status means.
type APIError struct {
	Method     string
	Path       string
	Op         string
	StatusCode int
	// Message is the start of MaaS's reply body, which names the problem
	// (e.g. {"hostname": ["Node with this Hostname already exists."]}).
	Message string
}

func (e *APIError) Error() string {
	op := ""
	if e.Op != "" {
		op = "?op=" + e.Op
	}
	return fmt.Sprintf("maas %s %s%s: HTTP %d: %s", e.Method, e.Path, op, e.StatusCode, e.Message)
}

// Unwrap is the one place MaaS HTTP statuses become sentinel errors.
func (e *APIError) Unwrap() error {
	switch {
	case e.StatusCode == http.StatusBadRequest:
		return ErrInvalidArgument
	case e.StatusCode == http.StatusUnauthorized || e.StatusCode == http.StatusForbidden:
		return ErrUnauthorized
	case e.StatusCode == http.StatusNotFound:
		return ErrNotFound
	case e.StatusCode == http.StatusConflict:
		return ErrConflict
	default:
		return ErrUnavailable
	}
}

// maxErrorBody bounds how much of an error reply ends up in an error.
const maxErrorBody = 512

// maxReplyBody bounds a successful reply; a thousand machines fit easily.
const maxReplyBody = 256 << 20

func (c *Client) do(ctx context.Context, method, path string, query, form url.Values, out any) error {
	target := *c.api
	target.Path += path
	target.RawQuery = query.Encode()
	op := query.Get("op")

	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, method, target.String(), body)
	if err != nil {
		return fmt.Errorf("maas %s %s: %w", method, path, err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	req.Header.Set("Accept", "application/json")
	authorization, err := c.authorization()
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", authorization)

	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("maas %s %s: %w", method, path, ctx.Err())
		}
		return fmt.Errorf("maas %s %s: %w: %w", method, path, ErrUnavailable, err)
	}
	defer resp.Body.Close()

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		text, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return &APIError{Method: method, Path: path, Op: op, StatusCode: resp.StatusCode, Message: strings.TrimSpace(string(text))}
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxReplyBody)).Decode(out); err != nil {
		// A reply MaaS did not mean (a proxy's page, a cut connection) is an
		// outage, not a fact about the machines.
		return fmt.Errorf("maas %s %s: malformed reply: %w: %w", method, path, ErrUnavailable, err)
	}
	return nil
}

// authorization builds the OAuth 1.0 PLAINTEXT header MaaS expects: the
// signature is the empty consumer secret and the token secret joined by "&".
// Values are percent-encoded as RFC 5849 asks; MaaS decodes them.
func (c *Client) authorization() (string, error) {
	nonce := make([]byte, 16)
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("maas OAuth nonce: %w", err)
	}
	params := []struct{ key, value string }{
		{"oauth_version", "1.0"},
		{"oauth_signature_method", "PLAINTEXT"},
		{"oauth_consumer_key", c.key.Consumer},
		{"oauth_token", c.key.Token},
		{"oauth_signature", "&" + percentEncode(c.key.Secret)},
		{"oauth_nonce", fmt.Sprintf("%x", nonce)},
		{"oauth_timestamp", strconv.FormatInt(time.Now().Unix(), 10)},
	}
	parts := make([]string, len(params))
	for i, p := range params {
		parts[i] = p.key + `="` + percentEncode(p.value) + `"`
	}
	return "OAuth " + strings.Join(parts, ", "), nil
}

// percentEncode is RFC 5849's encoding: everything but unreserved characters
// as %XX (url.QueryEscape would write a space as "+").
func percentEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case 'a' <= ch && ch <= 'z', 'A' <= ch && ch <= 'Z', '0' <= ch && ch <= '9',
			ch == '-', ch == '.', ch == '_', ch == '~':
			b.WriteByte(ch)
		default:
			fmt.Fprintf(&b, "%%%02X", ch)
		}
	}
	return b.String()
}
