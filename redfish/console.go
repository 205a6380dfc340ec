package redfish

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/machine"
)

// The consoles are WebSockets at URIs under the system's Oem segment, so
// no future DMTF property or navigation link can collide with them; a
// client finds the serial one in SerialConsole.WebSocket.ConsoleURI.
// GraphicalConsole has no property for a URI (ComputerSystem v1_27), so
// the graphical one is documented (conformance/README.md).
func serialConsolePath(systemID string) string {
	return systemPath(systemID) + "/Oem/VirtMetal/SerialConsole"
}

func graphicalConsolePath(systemID string) string {
	return systemPath(systemID) + "/Oem/VirtMetal/GraphicalConsole"
}

const (
	defaultConsoleWriteTimeout = 10 * time.Second
	defaultConsoleKeepAlive    = 30 * time.Second
	// consoleChunk is the most console output read ahead of a client: the
	// next read waits until this one is written, so a client that does
	// not read holds the machine's output back instead of filling memory.
	consoleChunk = 32 << 10
	// maxConsoleMessage bounds one message from the client (a paste, a
	// burst of RFB events).
	maxConsoleMessage = 64 << 10
	// consoleCloseGrace is how long a closing stream waits for the
	// client's close frame.
	consoleCloseGrace = time.Second
	// tokenSubprotocol prefixes a session token offered as a WebSocket
	// subprotocol, the one credential a browser can send on a WebSocket.
	tokenSubprotocol = "x-auth-token."
)

// sessionToken is the X-Auth-Token of r: its header, or, on a WebSocket
// handshake only, a subprotocol "x-auth-token.<token>" (browsers cannot set
// headers there). Tokens are never taken from the query, which proxies log.
func sessionToken(r *http.Request) string {
	if token := r.Header.Get("X-Auth-Token"); token != "" {
		return token
	}
	if !websocket.IsWebSocketUpgrade(r) {
		return ""
	}
	for _, p := range websocket.Subprotocols(r) {
		if token, ok := strings.CutPrefix(p, tokenSubprotocol); ok && token != "" {
			return token
		}
	}
	return ""
}

// checkHandshake refuses, before the console is opened, what the
// upgrader would: a request that is no WebSocket opening, of a version
// other than RFC 6455's, or from a page of another origin.
func checkHandshake(r *http.Request) *apiError {
	switch {
	case r.Method != http.MethodGet || !websocket.IsWebSocketUpgrade(r):
		e := newError(http.StatusBadRequest, msgHeaderMissing, "Upgrade: websocket")
		// HTTP/2 forbids the Upgrade header (RFC 9113 8.2.2), and its
		// clients drop a response that carries one: only HTTP/1.1 is told.
		if r.ProtoMajor == 1 {
			e.header = http.Header{"Upgrade": {"websocket"}}
		}
		return e
	case r.Header.Get("Sec-WebSocket-Version") != "13":
		e := newError(http.StatusBadRequest, msgHeaderInvalid, "Sec-WebSocket-Version")
		e.header = http.Header{"Sec-WebSocket-Version": {"13"}}
		return e
	case r.Header.Get("Sec-WebSocket-Key") == "":
		return newError(http.StatusBadRequest, msgHeaderMissing, "Sec-WebSocket-Key")
	case !sameOrigin(r):
		return newError(http.StatusForbidden, msgHeaderInvalid, "Origin")
	}
	return nil
}

// sameOrigin is true without an Origin (not a browser) or when Origin
// names the host the request was sent to.
func sameOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	return err == nil && strings.EqualFold(u.Host, r.Host)
}

// consoleUpgrader accepts same-origin browsers only (a page elsewhere
// must not ride a browser's cached Basic credentials), answers its
// refusals as Redfish errors, and never selects the token subprotocol, so
// the token is not echoed back.
func (s *Server) consoleUpgrader() *websocket.Upgrader {
	return &websocket.Upgrader{
		HandshakeTimeout: 10 * time.Second,
		ReadBufferSize:   4 << 10,
		WriteBufferSize:  4 << 10,
		Subprotocols:     []string{"binary"}, // what noVNC and websockify offer
		CheckOrigin:      sameOrigin,
		Error: func(w http.ResponseWriter, r *http.Request, status int, reason error) {
			s.writeError(w, r, &apiError{status: status, messages: []message{{key: msgGeneralError, resolution: reason.Error()}}})
		},
	}
}

func (s *Server) openSerialConsole(c *call) (result, error) {
	return s.openConsole(c, machine.ConsoleSerial)
}

func (s *Server) openGraphicalConsole(c *call) (result, error) {
	return s.openConsole(c, machine.ConsoleGraphical)
}

// openConsole answers a WebSocket handshake with the machine's console of
// kind: the console is opened first, so that a machine that is off or a
// console in use is a Redfish error rather than a socket that closes.
func (s *Server) openConsole(c *call, kind machine.ConsoleKind) (result, error) {
	m, err := s.machineFor(c, "systemID", "ComputerSystem")
	if err != nil {
		return result{}, err
	}
	if !m.Capabilities().SupportsConsole(kind) {
		return result{}, newError(http.StatusNotFound, msgResourceNotFound, string(kind)+"Console", m.ID())
	}
	if err := checkHandshake(c.r); err != nil {
		return result{}, err
	}
	ctx := s.actorContext(c)
	stream, err := s.consoles.Open(ctx, m, kind)
	if err != nil {
		return result{}, s.mapBackendError(err, operation{resourceType: "ComputerSystem", resourceID: m.ID(), console: true})
	}
	id := m.ID()
	// The end is logged before the console is free, so that the log
	// never shows the next client's opening first.
	ended := func(why string) {
		s.audit.ConsoleClosed(ctx, id, kind, why)
		s.log.V(1).Info("console closed", "machine", id, "console", kind, "why", why)
	}
	return result{stream: func(w http.ResponseWriter, r *http.Request) {
		conn, err := s.consoleUpgrader().Upgrade(w, r, nil)
		if err != nil {
			ended("the WebSocket handshake failed")
			_ = stream.Close()
			return
		}
		s.serveConsole(r, &consoleSession{kind: kind, stream: stream, conn: conn, ended: ended})
	}}, nil
}

// actorContext is the request's context carrying who made it, for the
// audit log.
func (s *Server) actorContext(c *call) context.Context {
	return auditlog.WithActor(c.ctx(), auditlog.Actor{Protocol: auditlog.Redfish, Account: c.user.username, Source: s.auth.clients.source(c.r)})
}

// consoleSession is one console carried over one WebSocket.
type consoleSession struct {
	kind   machine.ConsoleKind
	stream io.ReadWriteCloser
	conn   *websocket.Conn
	// ended is told why the session ended ("" when the client ended it).
	ended func(why string)
	once  sync.Once
}

// finish ends the session once: a close frame with code and why, the end
// told, the console released, and the client given consoleCloseGrace to
// answer the close before the connection goes.
func (cs *consoleSession) finish(code int, why string) {
	cs.once.Do(func() {
		cs.ended(why)
		deadline := time.Now().Add(consoleCloseGrace)
		_ = cs.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, why), deadline)
		_ = cs.stream.Close()
		_ = cs.conn.SetReadDeadline(deadline)
	})
}

// serveConsole carries the console both ways until either side ends it,
// the credentials it was opened with stop working, or the service stops.
func (s *Server) serveConsole(r *http.Request, cs *consoleSession) {
	conn := cs.conn
	conn.SetReadLimit(maxConsoleMessage)
	// A client has the write timeout to answer a ping.
	alive := func() error { return conn.SetReadDeadline(time.Now().Add(s.consoleKeepAlive + s.consoleWriteTimeout)) }
	_ = alive()
	conn.SetPongHandler(func(string) error { return alive() })

	inbound := make(chan struct{})
	go func() {
		defer close(inbound)
		s.consoleInbound(cs, alive)
	}()
	outbound := make(chan struct{})
	go func() {
		defer close(outbound)
		s.consoleOutbound(cs)
	}()

	ticker := time.NewTicker(s.consoleKeepAlive)
	defer ticker.Stop()
	for open := true; open; {
		select {
		case <-inbound:
			open = false
		case <-s.streams.stopped:
			cs.finish(websocket.CloseGoingAway, "the service is shutting down")
		case <-ticker.C:
			if !s.auth.stillAuthorized(r) {
				cs.finish(websocket.ClosePolicyViolation, "the credentials the console was opened with are no longer valid")
				continue
			}
			_ = conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(s.consoleWriteTimeout))
		}
	}
	_ = conn.Close()
	<-outbound
}

// consoleInbound writes the client's messages to the console: binary, or
// text on the serial console (a terminal's keys).
func (s *Server) consoleInbound(cs *consoleSession, alive func() error) {
	buf := make([]byte, consoleChunk)
	for {
		kind, msg, err := cs.conn.NextReader()
		if err != nil {
			var closed *websocket.CloseError
			var timeout net.Error
			switch {
			case errors.As(err, &closed):
				cs.finish(websocket.CloseNormalClosure, "")
			case errors.Is(err, websocket.ErrReadLimit):
				cs.finish(websocket.CloseMessageTooBig, fmt.Sprintf("a message over %d bytes", maxConsoleMessage))
			case errors.As(err, &timeout) && timeout.Timeout():
				cs.finish(websocket.CloseGoingAway, "the client stopped answering pings")
			default:
				cs.finish(websocket.CloseAbnormalClosure, "the connection to the client was lost")
			}
			return
		}
		_ = alive()
		if kind == websocket.TextMessage && cs.kind != machine.ConsoleSerial {
			cs.finish(websocket.CloseUnsupportedData, "the graphical console takes binary RFB messages only")
			return
		}
		if _, err := io.CopyBuffer(cs.stream, msg, buf); err != nil {
			if errors.Is(err, websocket.ErrReadLimit) {
				cs.finish(websocket.CloseMessageTooBig, fmt.Sprintf("a message over %d bytes", maxConsoleMessage))
			} else {
				cs.finish(websocket.CloseGoingAway, consoleEnded)
			}
			return
		}
	}
}

// consoleEnded is why a session ends when the machine's side does.
const consoleEnded = "the console ended: the machine stopped or restarted"

// consoleOutbound sends the console's output as binary messages. It reads
// the next chunk only once the last is written, and gives up on a client
// that has not taken a chunk within the write timeout.
func (s *Server) consoleOutbound(cs *consoleSession) {
	buf := make([]byte, consoleChunk)
	for {
		n, readErr := cs.stream.Read(buf)
		if n > 0 {
			_ = cs.conn.SetWriteDeadline(time.Now().Add(s.consoleWriteTimeout))
			if err := cs.conn.WriteMessage(websocket.BinaryMessage, buf[:n]); err != nil {
				var timeout net.Error
				if errors.As(err, &timeout) && timeout.Timeout() {
					cs.finish(websocket.ClosePolicyViolation, fmt.Sprintf("the client read none of the console's output for %v", s.consoleWriteTimeout))
				} else {
					cs.finish(websocket.CloseAbnormalClosure, "the connection to the client was lost")
				}
				return
			}
		}
		if readErr != nil {
			if errors.Is(readErr, io.EOF) {
				cs.finish(websocket.CloseGoingAway, consoleEnded)
			} else {
				cs.finish(websocket.CloseInternalServerErr, "the console failed")
			}
			return
		}
	}
}

// consoleProperties are the ComputerSystem's SerialConsole and
// GraphicalConsole for the consoles m has (nil for one it lacks).
func (s *Server) consoleProperties(id string, caps machine.Capabilities) (serial, graphical map[string]any) {
	if caps.SupportsConsole(machine.ConsoleSerial) {
		// One stream at a time, whichever protocol holds it.
		serial = map[string]any{
			"MaxConcurrentSessions": 1,
			"WebSocket":             map[string]any{"ServiceEnabled": true, "ConsoleURI": serialConsolePath(id), "Interactive": true},
		}
		if s.protocols.IPMIPort > 0 && s.protocols.IPMIMachine == id {
			serial["IPMI"] = map[string]any{"ServiceEnabled": true, "Port": s.protocols.IPMIPort}
		}
	}
	if caps.SupportsConsole(machine.ConsoleGraphical) {
		// KVMIP: keyboard, video and mouse over IP, here RFB in a WebSocket.
		graphical = map[string]any{"ServiceEnabled": true, "MaxConcurrentSessions": 1, "ConnectTypesSupported": []string{"KVMIP"}}
	}
	return serial, graphical
}
