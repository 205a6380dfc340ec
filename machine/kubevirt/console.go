package kubevirt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/machine"
)

// Consoles are virt-api's console and vnc subresources of the VMI, as
// `virtctl console` and `virtctl vnc` reach them: a WebSocket through the
// API server's aggregation layer, authorized as `get` on
// virtualmachineinstances/console (or /vnc) of the VMI's name, carried by
// virt-api to virt-handler on the VMI's node. The socket carries the raw
// bytes in binary messages (subprotocol plain.kubevirt.io).

// plainStreamProtocol is KubeVirt's WebSocket subprotocol for a raw stream.
const plainStreamProtocol = "plain.kubevirt.io"

// consoleBufferSize is the WebSocket buffers' size, KubeVirt's own: the
// stream holds at most this much of the guest's output at a time.
const consoleBufferSize = 10 << 10

// consoleSubresources maps a console onto its subresource.
var consoleSubresources = map[machine.ConsoleKind]string{
	machine.ConsoleSerial:    "console",
	machine.ConsoleGraphical: "vnc",
}

// consoleDialer opens WebSockets to virt-api with the credentials of the
// backend's rest.Config (bearer token or its file, client certificate,
// exec plugin), as client-go's transports present them.
type consoleDialer struct {
	host   *url.URL
	dialer *websocket.Dialer
	// wrap adds the config's authentication and headers to a round
	// tripper that performs the upgrade.
	wrap func(http.RoundTripper) (http.RoundTripper, error)
}

func newConsoleDialer(cfg *rest.Config) (*consoleDialer, error) {
	host, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return nil, err
	}
	switch host.Scheme {
	case "https":
		host.Scheme = "wss"
	case "http":
		host.Scheme = "ws"
	default:
		return nil, fmt.Errorf("API server scheme %q", host.Scheme)
	}
	tc, err := cfg.TransportConfig()
	if err != nil {
		return nil, err
	}
	tlsConfig, err := transport.TLSConfigFor(tc)
	if err != nil {
		return nil, err
	}
	proxy := http.ProxyFromEnvironment
	if cfg.Proxy != nil {
		proxy = cfg.Proxy
	}
	return &consoleDialer{
		host: host,
		dialer: &websocket.Dialer{
			Proxy:           proxy,
			TLSClientConfig: tlsConfig,
			ReadBufferSize:  consoleBufferSize,
			WriteBufferSize: consoleBufferSize,
			Subprotocols:    []string{plainStreamProtocol},
		},
		wrap: func(rt http.RoundTripper) (http.RoundTripper, error) {
			rt, err := transport.HTTPWrappersForConfig(tc, rt)
			if err == nil && tc.WrapTransport != nil {
				rt = tc.WrapTransport(rt) // an exec plugin's credentials
			}
			return rt, err
		},
	}, nil
}

// upgrade is the innermost round tripper: it dials the WebSocket with the
// request's headers, which the wrappers have filled in.
type upgrade struct {
	dialer *websocket.Dialer
	conn   *websocket.Conn
}

func (u *upgrade) RoundTrip(req *http.Request) (*http.Response, error) {
	conn, resp, err := u.dialer.DialContext(req.Context(), req.URL.String(), req.Header)
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return resp, nil // a refusal: its status and body say why
		}
		return nil, err
	}
	u.conn = conn
	return resp, nil
}

// dial opens the subresource of the VMI namespace/name.
func (d *consoleDialer) dial(ctx context.Context, namespace, name, subresource string) (*websocket.Conn, *http.Response, error) {
	u := *d.host
	u.Path = path.Join(u.Path, "/apis", kubevirtv1.SubresourceGroupName, kubevirtv1.ApiLatestVersion,
		"namespaces", namespace, vmiResource, name, subresource)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, nil, err
	}
	up := &upgrade{dialer: d.dialer}
	rt, err := d.wrap(up)
	if err != nil {
		return nil, nil, err
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, nil, err
	}
	if up.conn == nil {
		return nil, resp, nil
	}
	return up.conn, resp, nil
}

// consoleKinds are the consoles a VM's devices give it: the serial one
// unless autoattachSerialConsole is false, the screen unless
// autoattachGraphicsDevice is. A running VMI's spec counts as well as the
// VM's template: a change to the VM reaches the VMI at its next start.
func consoleKinds(specs ...*kubevirtv1.VirtualMachineInstanceSpec) []machine.ConsoleKind {
	serial, graphical := true, true
	for _, s := range specs {
		if s == nil {
			continue
		}
		if v := s.Domain.Devices.AutoattachSerialConsole; v != nil && !*v {
			serial = false
		}
		if v := s.Domain.Devices.AutoattachGraphicsDevice; v != nil && !*v {
			graphical = false
		}
	}
	var kinds []machine.ConsoleKind
	if serial {
		kinds = append(kinds, machine.ConsoleSerial)
	}
	if graphical {
		kinds = append(kinds, machine.ConsoleGraphical)
	}
	return kinds
}

// OpenConsole opens the VMI's console or vnc subresource through virt-api;
// see machine.ConsoleController. virt-handler keeps one stream of each
// kind per VMI: opening one ends the older.
func (m *Machine) OpenConsole(ctx context.Context, k machine.ConsoleKind) (io.ReadWriteCloser, error) {
	if err := m.Capabilities().CheckConsole(k); err != nil {
		return nil, err
	}
	b := m.b
	vm, vmi, err := b.read(ctx)
	if err != nil {
		return nil, err
	}
	if vmi == nil || vmi.Status.Phase != kubevirtv1.Running {
		return nil, machine.Errorf(machine.ErrConflict, "the %s console needs a running VM; %s/%s has %s", k, b.namespace, b.vmName, vmiPhase(vmi))
	}
	if !(machine.Capabilities{Consoles: consoleKinds(&vm.Spec.Template.Spec, &vmi.Spec)}).SupportsConsole(k) {
		return nil, machine.Errorf(machine.ErrNotSupported, "the %s console: the devices of %s/%s leave it out", k, b.namespace, b.vmName)
	}
	dialCtx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	conn, resp, err := b.api.consoles.dial(dialCtx, b.namespace, b.vmName, consoleSubresources[k])
	switch {
	case err != nil:
		return nil, machine.Errorf(machine.ErrUnavailable, "opening the %s console of %s/%s: virt-api unreachable: %v", k, b.namespace, b.vmName, err)
	case conn == nil:
		return nil, b.consoleRefused(k, resp)
	}
	b.log.V(1).Info("console opened", "console", string(k))
	return &consoleStream{conn: conn}, nil
}

func vmiPhase(vmi *kubevirtv1.VirtualMachineInstance) string {
	if vmi == nil {
		return "no VMI"
	}
	return fmt.Sprintf("its VMI %s", vmi.Status.Phase)
}

// consoleRefused maps the API server's or virt-api's refusal of the
// upgrade onto the machine sentinels.
func (b *Backend) consoleRefused(k machine.ConsoleKind, resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	_ = resp.Body.Close()
	status := &metav1.Status{}
	if json.Unmarshal(body, status) != nil || status.Code == 0 {
		status = &metav1.Status{Code: int32(resp.StatusCode), Message: strings.TrimSpace(string(body))}
	}
	apiErr := &apierrors.StatusError{ErrStatus: *status}
	doing := fmt.Sprintf("opening the %s console of %s/%s", k, b.namespace, b.vmName)
	notRunning := strings.Contains(status.Message, "not running")
	switch code := resp.StatusCode; {
	case code == http.StatusForbidden || code == http.StatusUnauthorized:
		return fmt.Errorf("%s: the BMC's ServiceAccount may not get %s/%s of that VM: %w", doing, vmiResource, consoleSubresources[k], apiErr)
	case code == http.StatusConflict, code == http.StatusBadRequest && notRunning:
		return machine.Errorf(machine.ErrConflict, "%s: %v", doing, apiErr)
	case code == http.StatusNotFound && status.Details != nil && status.Details.Group == kubevirtv1.SchemeGroupVersion.Group:
		// virt-api's own 404: the VMI is gone (stopped since read).
		return machine.Errorf(machine.ErrConflict, "%s: %v", doing, apiErr)
	case code == http.StatusNotFound, code == http.StatusTooManyRequests, code >= 500:
		// The API server does not serve virt-api's group, or virt-api
		// cannot reach virt-handler.
		return machine.Errorf(machine.ErrUnavailable, "%s: %v", doing, apiErr)
	default:
		return fmt.Errorf("%s: %w", doing, apiErr)
	}
}

// consoleStream is a console's WebSocket as a byte stream. Reads come
// message by message through gorilla's reader, which holds at most its
// buffer: a reader that stops reading leaves the guest's output in the
// network, holding virt-api and virt-handler back.
type consoleStream struct {
	conn *websocket.Conn

	readMu  sync.Mutex
	message io.Reader
	readErr error // sticky: gorilla panics on reads of a failed connection

	writeMu sync.Mutex
	closing sync.Once
}

// Read returns the guest's output; io.EOF once the stream ended, as it
// does when the VMI stops (virt-handler then closes the socket, without a
// close frame) or a newer stream took the console.
func (s *consoleStream) Read(p []byte) (int, error) {
	s.readMu.Lock()
	defer s.readMu.Unlock()
	for s.readErr == nil {
		if s.message == nil {
			kind, r, err := s.conn.NextReader()
			if err != nil {
				s.readErr = streamEnd(err)
				break
			}
			if kind != websocket.BinaryMessage && kind != websocket.TextMessage {
				continue
			}
			s.message = r
		}
		n, err := s.message.Read(p)
		if err == io.EOF {
			s.message = nil
			if n == 0 {
				continue
			}
			err = nil
		}
		if err != nil {
			s.readErr = streamEnd(err)
		}
		return n, err
	}
	return 0, s.readErr
}

// streamEnd is io.EOF for a socket the other side ended, cleanly or not;
// other errors (a local Close) stay.
func streamEnd(err error) error {
	var closeErr *websocket.CloseError
	if errors.As(err, &closeErr) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return io.EOF
	}
	return err
}

// Write sends p as one binary message.
func (s *consoleStream) Write(p []byte) (int, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.conn.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// closeGrace bounds the close frame's write to a peer that stopped
// reading.
const closeGrace = time.Second

// Close says goodbye and closes the socket.
func (s *consoleStream) Close() error {
	var err error
	s.closing.Do(func() {
		_ = s.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(closeGrace))
		err = s.conn.Close()
	})
	return err
}
