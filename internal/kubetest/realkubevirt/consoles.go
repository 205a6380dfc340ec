package realkubevirt

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/sim/console"
)

// The node stand-in's share of virt-handler's console server: virt-api
// answers a VMI's console and vnc subresources by finding the virt-handler
// pod on the VMI's node (label kubevirt.io=virt-handler in its own
// namespace), dialing that pod's IP on its --console-server-port (8186)
// over TLS, presenting its handler certificate and accepting only a server
// certificate of KubeVirt's CA named kubevirt.io:system:node:virt-handler,
// and opening the WebSocket wss://IP:8186/v1/namespaces/NS/
// virtualmachineinstances/NAME/{console,vnc}. It then copies the raw bytes
// of the client's socket to this one and back. virt-handler, on its side,
// connects the socket to virt-launcher's serial or VNC unix socket, ends
// an older stream of the same kind when a new one opens, and closes the
// socket (no close frame) when the domain goes.
//
// Here every virt-handler pod of the cluster has the host end of the veth
// pair as its IP, where one server of the test process listens; it answers
// with sim/console's guest (a serial console, an RFB screen) for each VMI a
// node stand-in runs, and ends every stream of a boot when it ends.

// consoleServerPort is virt-api's default --console-server-port.
const consoleServerPort = 8186

// handlerCommonName is the name virt-api requires of virt-handler's
// certificate.
const handlerCommonName = "kubevirt.io:system:node:virt-handler"

// guestBoot is one boot of a VMI on a node: its consoles live as long.
type guestBoot struct {
	node     string
	uid      types.UID
	hostname string
	ended    chan struct{}

	mu      sync.Mutex
	streams map[string]chan struct{} // open stream of each kind: closed to end it
}

// consoles are the running guests' consoles of a cluster, by VMI.
type consoles struct {
	mu     sync.Mutex
	boots  map[types.NamespacedName]*guestBoot
	server *http.Server
}

// startConsoles starts the console server, once per cluster.
func (c *Cluster) startConsoles() error {
	if c.consoles.server != nil {
		return nil
	}
	leaf, err := c.servingCA.issue(handlerCommonName, nil, []string{c.ns.HostIP}, true, false)
	if err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(leaf.certPEM, leaf.keyPEM)
	if err != nil {
		return err
	}
	clients := x509.NewCertPool()
	clients.AddCert(c.servingCA.cert)
	ln, err := net.Listen("tcp", net.JoinHostPort(c.ns.HostIP, strconv.Itoa(consoleServerPort)))
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	for _, kind := range []string{"console", "vnc"} {
		mux.HandleFunc("GET /v1/namespaces/{namespace}/virtualmachineinstances/{name}/"+kind, func(w http.ResponseWriter, r *http.Request) {
			c.serveConsole(w, r, kind)
		})
	}
	c.consoles.boots = map[types.NamespacedName]*guestBoot{}
	c.consoles.server = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientAuth:   tls.RequireAndVerifyClientCert, // virt-api's handler certificate
			ClientCAs:    clients,
			MinVersion:   tls.VersionTLS12,
		},
	}
	go func() { _ = c.consoles.server.ServeTLS(ln, "", "") }()
	return nil
}

// stopConsoles ends every stream and the server.
func (c *Cluster) stopConsoles() {
	if c.consoles.server == nil {
		return
	}
	_ = c.consoles.server.Close() // hijacked sockets stay: end them
	c.consoles.mu.Lock()
	for key, b := range c.consoles.boots {
		close(b.ended)
		delete(c.consoles.boots, key)
	}
	c.consoles.mu.Unlock()
	c.consoles.server = nil
}

// bootConsoles gives a VMI's new boot on node its consoles; the streams of
// an earlier boot end.
func (c *Cluster) bootConsoles(node string, vmi *kubevirtv1.VirtualMachineInstance) {
	key := types.NamespacedName{Namespace: vmi.Namespace, Name: vmi.Name}
	hostname := vmi.Spec.Hostname
	if hostname == "" {
		hostname = vmi.Name
	}
	c.consoles.mu.Lock()
	defer c.consoles.mu.Unlock()
	if c.consoles.boots == nil {
		return // no server
	}
	if old := c.consoles.boots[key]; old != nil {
		close(old.ended)
	}
	c.consoles.boots[key] = &guestBoot{node: node, uid: vmi.UID, hostname: hostname, ended: make(chan struct{}), streams: map[string]chan struct{}{}}
}

// endConsoles ends the consoles of node's boots for which running says
// no: the VMI stopped, went, or was replaced.
func (c *Cluster) endConsoles(node string, running func(key types.NamespacedName, uid types.UID) bool) {
	c.consoles.mu.Lock()
	defer c.consoles.mu.Unlock()
	for key, b := range c.consoles.boots {
		if b.node == node && !running(key, b.uid) {
			close(b.ended)
			delete(c.consoles.boots, key)
		}
	}
}

func (c *Cluster) boot(key types.NamespacedName) *guestBoot {
	c.consoles.mu.Lock()
	defer c.consoles.mu.Unlock()
	return c.consoles.boots[key]
}

// open makes kind's stream the boot's only one, ending an older one (as
// virt-handler does), unless preserve asks to keep an older one (false).
func (b *guestBoot) open(kind string, preserve bool) (chan struct{}, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.streams[kind]; ok {
		if preserve {
			return nil, false
		}
		close(old)
	}
	stop := make(chan struct{})
	b.streams[kind] = stop
	return stop, true
}

func (b *guestBoot) release(kind string, stop chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.streams[kind] == stop {
		delete(b.streams, kind)
	}
}

var handlerUpgrader = websocket.Upgrader{
	ReadBufferSize:  10 << 10,
	WriteBufferSize: 10 << 10,
	Subprotocols:    []string{"plain.kubevirt.io"},
	CheckOrigin:     func(*http.Request) bool { return true },
}

func (c *Cluster) serveConsole(w http.ResponseWriter, r *http.Request, kind string) {
	key := types.NamespacedName{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}
	b := c.boot(key)
	if b == nil {
		http.Error(w, "VMI "+key.String()+" does not run on this node", http.StatusNotFound)
		return
	}
	stop, ok := b.open(kind, kind == "vnc" && r.URL.Query().Get("preserveSession") == "true")
	if !ok {
		http.Error(w, "Active VNC connection. Request denied.", http.StatusServiceUnavailable)
		return
	}
	defer b.release(kind, stop)
	conn, err := handlerUpgrader.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader answered
	}
	var guest io.ReadWriteCloser
	if kind == "console" {
		guest = console.NewSerial(b.hostname)
	} else {
		screen, client := net.Pipe()
		go func() {
			_ = console.ServeRFB(screen, b.hostname)
			screen.Close()
		}()
		guest = client
	}
	done := make(chan struct{}, 2)
	go func() { // the guest's output, a binary message per read
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 10<<10)
		for {
			n, err := guest.Read(buf)
			if n > 0 && conn.WriteMessage(websocket.BinaryMessage, buf[:n]) != nil {
				return
			}
			if err != nil {
				return
			}
		}
	}()
	go func() { // what the client types
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 10<<10)
		for {
			_, msg, err := conn.NextReader()
			if err != nil {
				return
			}
			if _, err := io.CopyBuffer(guest, msg, buf); err != nil && !errors.Is(err, io.EOF) {
				return
			}
		}
	}()
	select {
	case <-done:
	case <-stop:
	case <-b.ended:
	}
	// As virt-handler: the socket closes, no close frame.
	_ = conn.Close()
	_ = guest.Close()
}

// DialSubresource opens a VMI's console or vnc WebSocket on virt-api
// directly, as virtctl does, with cfg's credentials.
func DialSubresource(cfg *rest.Config, namespace, vmi, subresource string) (*websocket.Conn, *http.Response, error) {
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, nil, err
	}
	header := http.Header{}
	if cfg.BearerToken != "" {
		header.Set("Authorization", "Bearer "+cfg.BearerToken)
	}
	d := websocket.Dialer{TLSClientConfig: tlsCfg, Subprotocols: []string{"plain.kubevirt.io"}, ReadBufferSize: 10 << 10, WriteBufferSize: 10 << 10, HandshakeTimeout: 10 * time.Second}
	url := strings.Replace(cfg.Host, "https://", "wss://", 1) +
		fmt.Sprintf("/apis/subresources.kubevirt.io/v1/namespaces/%s/virtualmachineinstances/%s/%s", namespace, vmi, subresource)
	return d.Dial(url, header)
}
