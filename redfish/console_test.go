package redfish_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stmcginnis/gofish"

	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
	"github.com/virtmetal/virtmetal/internal/poll"
	"github.com/virtmetal/virtmetal/internal/vhost"
	"github.com/virtmetal/virtmetal/machine"
	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
	"github.com/virtmetal/virtmetal/sim/console"
)

const (
	serialConsole0    = system0 + "/Oem/VirtMetal/SerialConsole"
	graphicalConsole0 = system0 + "/Oem/VirtMetal/GraphicalConsole"
	// consoleEnded is the close reason of a console whose machine stopped.
	consoleEnded = "the console ended: the machine stopped or restarted"
)

// consoleFixture is a fixture served over real HTTP, as WebSockets need.
type consoleFixture struct {
	*fixture
	ts       *httptest.Server
	audit    *auditlog.Log
	sessions *machine.ConsoleSessions
}

func newConsoleFixture(t *testing.T, tweak func(*redfish.Config, *stubBackend)) *consoleFixture {
	t.Helper()
	audit := auditlog.New(auditlog.Options{})
	sessions := &machine.ConsoleSessions{}
	f := newFixture(t, func(c *redfish.Config, b *stubBackend) {
		c.AuditLog = audit
		c.ConsoleSessions = sessions
		if tweak != nil {
			tweak(c, b)
		}
	})
	ts := httptest.NewServer(f.server)
	t.Cleanup(ts.Close)
	return &consoleFixture{fixture: f, ts: ts, audit: audit, sessions: sessions}
}

func (f *consoleFixture) powerOn(id string) {
	f.t.Helper()
	if res := f.do(asAdmin("POST", "/redfish/v1/Systems/"+id+"/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`)); res.status != http.StatusNoContent {
		f.t.Fatalf("power on %s: %d %s", id, res.status, res.raw)
	}
}

// dial opens a console WebSocket with HTTP Basic as user.
func (f *consoleFixture) dial(path, user, pass string) (*websocket.Conn, error) {
	header := http.Header{}
	if user != "" {
		r, _ := http.NewRequest("GET", "/", nil)
		r.SetBasicAuth(user, pass)
		header.Set("Authorization", r.Header.Get("Authorization"))
	}
	conn, res, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(f.ts.URL, "http")+path, header)
	if res != nil && res.Body != nil {
		res.Body.Close()
	}
	return conn, err
}

func (f *consoleFixture) mustDial(path string) *websocket.Conn {
	f.t.Helper()
	conn, err := f.dial(path, adminUser, adminPass)
	if err != nil {
		f.t.Fatalf("dial %s: %v", path, err)
	}
	f.t.Cleanup(func() { conn.Close() })
	return conn
}

// handshake is a WebSocket opening request as the fixture's do sends it,
// to see the whole Redfish error of a refused one.
func handshake(path, user, pass string) request {
	return request{method: "GET", path: path, user: user, pass: pass, headers: map[string]string{
		"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
	}}
}

// readUntil reads binary messages until their concatenation ends with
// want, and returns it.
func readUntil(t *testing.T, conn *websocket.Conn, want string) string {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var got bytes.Buffer
	for !strings.HasSuffix(got.String(), want) {
		kind, data, err := conn.ReadMessage()
		if err != nil {
			t.Fatalf("read %q so far, waiting for %q: %v", got.String(), want, err)
		}
		if kind != websocket.BinaryMessage {
			t.Fatalf("message of type %d, want binary", kind)
		}
		got.Write(data)
	}
	return got.String()
}

// TestSerialConsoleOverWebSocket: the client reads the boot lines and the
// login prompt, and what it types, in text or binary frames, is echoed.
func TestSerialConsoleOverWebSocket(t *testing.T) {
	for _, frame := range []struct {
		name string
		kind int
	}{{"text frames", websocket.TextMessage}, {"binary frames", websocket.BinaryMessage}} {
		t.Run(frame.name, func(t *testing.T) {
			f := newConsoleFixture(t, nil)
			f.powerOn("vm-0")
			conn := f.mustDial(serialConsole0)
			boot := readUntil(t, conn, console.Prompt("vm-0"))
			for _, line := range console.BootLines("vm-0") {
				if !strings.Contains(boot, line+"\r\n") {
					t.Errorf("boot output lacks %q:\n%s", line, boot)
				}
			}
			if err := conn.WriteMessage(frame.kind, []byte("root\r")); err != nil {
				t.Fatal(err)
			}
			if got := readUntil(t, conn, console.Prompt("vm-0")); got != "root\r\n"+console.Prompt("vm-0") {
				t.Errorf("echo %q", got)
			}
		})
	}
}

// wsStream is a WebSocket as the byte stream RFB runs over.
type wsStream struct {
	conn   *websocket.Conn
	reader io.Reader
}

func (s *wsStream) Read(p []byte) (int, error) {
	for {
		if s.reader != nil {
			n, err := s.reader.Read(p)
			if !errors.Is(err, io.EOF) || n > 0 {
				return n, nil
			}
		}
		_, r, err := s.conn.NextReader()
		if err != nil {
			return 0, err
		}
		s.reader = r
	}
}

func (s *wsStream) Write(p []byte) (int, error) {
	return len(p), s.conn.WriteMessage(websocket.BinaryMessage, p)
}

// TestGraphicalConsoleSpeaksRFB: an RFB client completes its handshake
// and reads a screen update through the graphical console's WebSocket.
func TestGraphicalConsoleSpeaksRFB(t *testing.T) {
	f := newConsoleFixture(t, nil)
	f.powerOn("vm-0")
	conn := f.mustDial(graphicalConsole0)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	screen, err := console.Handshake(&wsStream{conn: conn})
	if err != nil {
		t.Fatal(err)
	}
	if want := (console.Screen{Width: console.ScreenWidth, Height: console.ScreenHeight, Name: "vm-0"}); screen != want {
		t.Errorf("screen %+v, want %+v", screen, want)
	}
	// Text is no RFB: the socket closes with 1003.
	if err := conn.WriteMessage(websocket.TextMessage, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	for {
		if _, _, err = conn.ReadMessage(); err != nil {
			break
		}
	}
	if !websocket.IsCloseError(err, websocket.CloseUnsupportedData) {
		t.Errorf("after a text frame: %v, want close 1003", err)
	}
}

// TestConsoleRefusals: each refused opening gets its Redfish error before
// any upgrade, and a refused one leaves the console free.
func TestConsoleRefusals(t *testing.T) {
	noConsoles := machine.Capabilities{}
	tests := []struct {
		name       string
		setup      func(*consoleFixture)
		req        request
		wantStatus int
		wantID     string
	}{
		{"machine off", nil, handshake(serialConsole0, adminUser, adminPass), http.StatusConflict, "Base.1.19.ResourceInStandby"},
		{"graphical, machine off", nil, handshake(graphicalConsole0, adminUser, adminPass), http.StatusConflict, "Base.1.19.ResourceInStandby"},
		{"in use", func(f *consoleFixture) {
			f.powerOn("vm-0")
			f.mustDial(serialConsole0)
		}, handshake(serialConsole0, operatorUser, operatorPass), http.StatusConflict, "Base.1.19.ResourceInUse"},
		{"no credentials", nil, handshake(serialConsole0, "", ""), http.StatusUnauthorized, "Base.1.19.NoValidSession"},
		{"wrong password", nil, handshake(serialConsole0, adminUser, "guess"), http.StatusUnauthorized, "Base.1.19.NoValidSession"},
		{"read-only account", func(f *consoleFixture) { f.powerOn("vm-0") },
			handshake(graphicalConsole0, readerUser, readerPass), http.StatusForbidden, "Base.1.19.InsufficientPrivilege"},
		{"unknown machine", nil, handshake("/redfish/v1/Systems/vm-9/Oem/VirtMetal/SerialConsole", adminUser, adminPass),
			http.StatusNotFound, "Base.1.19.ResourceNotFound"},
		{"unknown machine, no credentials", nil, handshake("/redfish/v1/Systems/vm-9/Oem/VirtMetal/SerialConsole", "", ""),
			http.StatusUnauthorized, "Base.1.19.NoValidSession"},
		{"machine without consoles", func(f *consoleFixture) {
			f.powerOn("vm-1")
			m, _ := f.backend.Backend.Machine(context.Background(), "vm-1")
			f.backend.replaced["vm-1"] = &stubMachine{Machine: m, caps: &noConsoles}
		}, handshake("/redfish/v1/Systems/vm-1/Oem/VirtMetal/SerialConsole", adminUser, adminPass), http.StatusNotFound, "Base.1.19.ResourceNotFound"},
		{"not a WebSocket", func(f *consoleFixture) { f.powerOn("vm-0") }, asAdmin("GET", serialConsole0, ""),
			http.StatusBadRequest, "Base.1.19.HeaderMissing"},
		{"token in the query", func(f *consoleFixture) { f.powerOn("vm-0") },
			handshake(serialConsole0+"?X-Auth-Token="+strings.Repeat("0", 64), "", ""), http.StatusUnauthorized, "Base.1.19.NoValidSession"},
		{"a POST", nil, asAdmin("POST", serialConsole0, `{}`), http.StatusMethodNotAllowed, "Base.1.19.OperationNotAllowed"},
		{"another origin", func(f *consoleFixture) { f.powerOn("vm-0") }, withHeader(handshake(serialConsole0, adminUser, adminPass), "Origin", "https://evil.example"),
			http.StatusForbidden, "Base.1.19.HeaderInvalid"},
		{"an old WebSocket version", func(f *consoleFixture) { f.powerOn("vm-0") }, withHeader(handshake(serialConsole0, adminUser, adminPass), "Sec-WebSocket-Version", "8"),
			http.StatusBadRequest, "Base.1.19.HeaderInvalid"},
		{"no WebSocket key", func(f *consoleFixture) { f.powerOn("vm-0") }, withHeader(handshake(serialConsole0, adminUser, adminPass), "Sec-WebSocket-Key", ""),
			http.StatusBadRequest, "Base.1.19.HeaderMissing"},
		{"a HEAD", func(f *consoleFixture) { f.powerOn("vm-0") }, func() request {
			r := handshake(serialConsole0, adminUser, adminPass)
			r.method = "HEAD"
			return r
		}(), http.StatusBadRequest, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newConsoleFixture(t, nil)
			if tt.setup != nil {
				tt.setup(f)
			}
			res := f.do(tt.req)
			if res.status != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", res.status, tt.wantStatus, res.raw)
			}
			if tt.wantID == "" { // a HEAD answer has no body
				return
			}
			if ids := messageIDs(t, res); len(ids) != 1 || ids[0] != tt.wantID {
				t.Errorf("MessageIds %v, want [%s]", ids, tt.wantID)
			}
			if strings.Contains(string(res.raw), "memory") || strings.Contains(string(res.raw), "Off") {
				t.Errorf("the error tells backend details: %s", res.raw)
			}
			// A refused opening leaves no console held and nothing logged.
			if f.sessions.InUse("vm-0", machine.ConsoleSerial) != (tt.name == "in use") {
				t.Error("the refusal left the console held")
			}
			for _, e := range f.audit.Entries("vm-0") {
				if e.Op == auditlog.OpCloseConsole && tt.name != "in use" {
					t.Errorf("a refused opening logged %+v", e)
				}
			}
		})
	}
}

func withHeader(r request, name, value string) request {
	r.headers[name] = value
	return r
}

// TestConsoleGuessesAreThrottled: password guesses at a console count
// with the logins' (one limiter), so a guessing source is refused at the
// console and everywhere else, while the owner from another address is
// not.
func TestConsoleGuessesAreThrottled(t *testing.T) {
	const guesser, owner = "198.51.100.66:4000", "192.0.2.10:5000"
	f := newConsoleFixture(t, nil)
	from := func(req request, remote string) int {
		req.remote = remote
		return f.do(req).status
	}
	for i := range 4 {
		if got := from(handshake(serialConsole0, adminUser, "guess"), guesser); got != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d, want 401", i+1, got)
		}
	}
	tests := []struct {
		name   string
		req    request
		remote string
		want   int
	}{
		{"the right password at the console from the guesser", handshake(serialConsole0, adminUser, adminPass), guesser, http.StatusUnauthorized},
		{"the right password elsewhere from the guesser", asAdmin("GET", system0, ""), guesser, http.StatusUnauthorized},
		// The machine is off: the credentials passed.
		{"the owner at the console", handshake(serialConsole0, adminUser, adminPass), owner, http.StatusConflict},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := from(tt.req, tt.remote); got != tt.want {
				t.Errorf("status %d, want %d", got, tt.want)
			}
		})
	}
}

// TestConsoleTokenAsSubprotocol: a session token offered as a subprotocol
// (all a browser can send) opens the console, and is not echoed back.
func TestConsoleTokenAsSubprotocol(t *testing.T) {
	f := newConsoleFixture(t, func(c *redfish.Config, _ *stubBackend) { c.ConsoleKeepAlive = 50 * time.Millisecond })
	f.powerOn("vm-0")
	login := f.do(request{method: "POST", path: "/redfish/v1/SessionService/Sessions", body: `{"UserName":"operator","Password":"operator-secret"}`})
	token := login.header.Get("X-Auth-Token")
	if login.status != http.StatusCreated || token == "" {
		t.Fatalf("login: %d %s", login.status, login.raw)
	}
	url := "ws" + strings.TrimPrefix(f.ts.URL, "http") + serialConsole0
	for _, tt := range []struct {
		name      string
		protocols []string
		wantOpen  bool
	}{
		{"the session's token", []string{"binary", "x-auth-token." + token}, true},
		{"another token", []string{"x-auth-token." + strings.Repeat("0", len(token))}, false},
		{"the token without the prefix", []string{token}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dialer := websocket.Dialer{Subprotocols: tt.protocols}
			conn, res, err := dialer.Dial(url, nil)
			if !tt.wantOpen {
				if err == nil || res == nil || res.StatusCode != http.StatusUnauthorized {
					t.Fatalf("opened or not 401: %v %v", res, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if got := res.Header.Get("Sec-WebSocket-Protocol"); strings.Contains(got, token) {
				t.Errorf("the token came back as the subprotocol %q", got)
			}
			readUntil(t, conn, console.Prompt("vm-0"))
		})
	}
	t.Run("the session ends", func(t *testing.T) {
		// The first subtest's client hung up: its console is let go.
		poll.True(t, "the console to be free", func() bool { return !f.sessions.InUse("vm-0", machine.ConsoleSerial) })
		conn, _, err := (&websocket.Dialer{Subprotocols: []string{"x-auth-token." + token}}).Dial(url, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		readUntil(t, conn, console.Prompt("vm-0"))
		if res := f.do(asAdmin("DELETE", "/redfish/v1/SessionService/Sessions/"+login.json["Id"].(string), "")); res.status != http.StatusNoContent {
			t.Fatalf("DELETE session: %d", res.status)
		}
		for err == nil {
			_, _, err = conn.ReadMessage()
		}
		if !websocket.IsCloseError(err, websocket.ClosePolicyViolation) {
			t.Errorf("after the session ended: %v, want close 1008", err)
		}
	})
}

// TestConsoleSharedModeKeepsTenantsApart: in shared mode (internal/vhost)
// each VM has a service of its own behind its host name, with its own
// accounts; one VM's credentials open nothing of another's, though both
// consoles have the same path.
func TestConsoleSharedModeKeepsTenantsApart(t *testing.T) {
	const hostA, hostB = "web1.team-a.bmc.example.com", "web2.team-b.bmc.example.com"
	dir := t.TempDir()
	for name, spec := range map[string]bmcspec.SharedVM{
		"web1": {Username: "team-a", Password: "a-secret", Hosts: []string{hostA}},
		"web2": {Username: "team-b", Password: "b-secret", Hosts: []string{hostB}},
	} {
		data, _ := json.Marshal(spec)
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	router, err := vhost.New(vhost.Config{Dir: dir, StartBackend: func(context.Context, string, bmcspec.SharedVM) (machine.Backend, error) {
		return memory.New(memory.Options{}), nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if n, err := router.Reload(ctx); n != 2 || err != nil {
		t.Fatalf("Reload: %d VMs, %v", n, err)
	}
	ts := httptest.NewServer(router)
	defer ts.Close()
	as := func(host, user, pass string) http.Header {
		r, _ := http.NewRequest("GET", "/", nil)
		r.SetBasicAuth(user, pass)
		r.Header.Set("Host", host)
		return r.Header
	}
	for _, vm := range []struct{ host, user, pass string }{{hostA, "team-a", "a-secret"}, {hostB, "team-b", "b-secret"}} {
		req, _ := http.NewRequest("POST", ts.URL+system0+"/Actions/ComputerSystem.Reset", strings.NewReader(`{"ResetType":"On"}`))
		req.Host = vm.host
		req.SetBasicAuth(vm.user, vm.pass)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil || res.StatusCode != http.StatusNoContent {
			t.Fatalf("power on at %s: %v %v", vm.host, res, err)
		}
		res.Body.Close()
	}
	url := "ws" + strings.TrimPrefix(ts.URL, "http") + serialConsole0
	for _, tt := range []struct {
		name     string
		header   http.Header
		wantOpen bool
	}{
		{"B's credentials at A's console", as(hostA, "team-b", "b-secret"), false},
		{"A's credentials at B's console", as(hostB, "team-a", "a-secret"), false},
		{"A at its own console", as(hostA, "team-a", "a-secret"), true},
		{"B at its own, while A holds its", as(hostB, "team-b", "b-secret"), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conn, res, err := websocket.DefaultDialer.Dial(url, tt.header)
			if !tt.wantOpen {
				if err == nil || res == nil || res.StatusCode != http.StatusUnauthorized {
					t.Fatalf("opened or not 401: %v %v", res, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			readUntil(t, conn, console.Prompt("vm-0"))
		})
	}
}

// TestConsoleClosesWithTheMachine: a ForceRestart ends the boot and with
// it the console: the socket closes with 1001 and a reason, the console is
// free again, and the audit log has who opened it and why it closed.
func TestConsoleClosesWithTheMachine(t *testing.T) {
	f := newConsoleFixture(t, nil)
	f.powerOn("vm-0")
	conn := f.mustDial(serialConsole0)
	readUntil(t, conn, console.Prompt("vm-0"))
	if res := f.do(asAdmin("POST", system0+"/Actions/ComputerSystem.Reset", `{"ResetType":"ForceRestart"}`)); res.status != http.StatusNoContent {
		t.Fatalf("ForceRestart: %d %s", res.status, res.raw)
	}
	var err error
	for err == nil {
		_, _, err = conn.ReadMessage()
	}
	var closed *websocket.CloseError
	if !errors.As(err, &closed) || closed.Code != websocket.CloseGoingAway || closed.Text != consoleEnded {
		t.Fatalf("read after ForceRestart: %v, want close 1001 %q", err, consoleEnded)
	}
	poll.True(t, "the console to be free", func() bool { return !f.sessions.InUse("vm-0", machine.ConsoleSerial) })

	// A new boot is a new console, opened by another account that then
	// hangs up itself.
	second, err := f.dial(serialConsole0, operatorUser, operatorPass)
	if err != nil {
		t.Fatal(err)
	}
	readUntil(t, second, console.Prompt("vm-0"))
	_ = second.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	for err == nil {
		_, _, err = second.ReadMessage()
	}
	second.Close()
	poll.True(t, "the console to be free", func() bool { return !f.sessions.InUse("vm-0", machine.ConsoleSerial) })

	var got []string
	for _, e := range f.audit.Entries("vm-0") {
		if e.Op == machine.OpOpenConsole || e.Op == auditlog.OpCloseConsole {
			got = append(got, string(e.Op)+" "+e.Arg+" by "+e.Actor.Account+" via "+string(e.Actor.Protocol)+" "+e.Err)
		}
	}
	want := []string{ // newest first
		"CloseConsole Serial by operator via Redfish ",
		"OpenConsole Serial by operator via Redfish ",
		"CloseConsole Serial (" + consoleEnded + ") by admin via Redfish ",
		"OpenConsole Serial by admin via Redfish ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("audit entries:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestConsoleClosesOnShutdown: a graceful shutdown (StopEventStreams)
// closes open consoles with 1001, as hijacked connections are not the
// HTTP server's to wait for.
func TestConsoleClosesOnShutdown(t *testing.T) {
	f := newConsoleFixture(t, nil)
	f.powerOn("vm-0")
	conn := f.mustDial(graphicalConsole0)
	poll.True(t, "the console to open", func() bool { return f.sessions.InUse("vm-0", machine.ConsoleGraphical) })
	f.server.StopEventStreams()
	var err error
	for err == nil {
		_, _, err = conn.ReadMessage()
	}
	var closed *websocket.CloseError
	if !errors.As(err, &closed) || closed.Code != websocket.CloseGoingAway || closed.Text != "the service is shutting down" {
		t.Errorf("read after shutdown: %v, want close 1001", err)
	}
	poll.True(t, "the console to be free", func() bool { return !f.sessions.InUse("vm-0", machine.ConsoleGraphical) })
}

// endlessConsole is a console that always has output, and counts what is
// read of it.
type endlessConsole struct {
	read   atomic.Int64
	closed chan struct{}
	once   sync.Once
}

func (c *endlessConsole) Read(p []byte) (int, error) {
	select {
	case <-c.closed:
		return 0, io.EOF
	default:
	}
	c.read.Add(int64(len(p)))
	return len(p), nil
}

func (c *endlessConsole) Write(p []byte) (int, error) { return len(p), nil }

func (c *endlessConsole) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

type endlessMachine struct {
	machine.Machine
	console *endlessConsole
}

func (m *endlessMachine) OpenConsole(context.Context, machine.ConsoleKind) (io.ReadWriteCloser, error) {
	return m.console, nil
}

// TestConsoleBackPressure: a client that reads nothing stops the console
// from being read past what the socket buffers hold, and is closed after
// the write timeout.
func TestConsoleBackPressure(t *testing.T) {
	endless := &endlessConsole{closed: make(chan struct{})}
	f := newConsoleFixture(t, func(c *redfish.Config, b *stubBackend) {
		c.ConsoleWriteTimeout = 500 * time.Millisecond
		m, _ := b.Backend.Machine(context.Background(), "vm-0")
		b.replaced["vm-0"] = &endlessMachine{Machine: m, console: endless}
	})
	// Small socket buffers on both ends, so the bound is the server's.
	ts := httptest.NewUnstartedServer(f.server)
	ts.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		_ = c.(*net.TCPConn).SetWriteBuffer(4 << 10)
		return ctx
	}
	ts.Start()
	defer ts.Close()
	dialer := websocket.Dialer{NetDial: func(network, addr string) (net.Conn, error) {
		c, err := net.Dial(network, addr)
		if err == nil {
			_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
		}
		return c, err
	}}
	r, _ := http.NewRequest("GET", "/", nil)
	r.SetBasicAuth(adminUser, adminPass)
	conn, _, err := dialer.Dial("ws"+strings.TrimPrefix(ts.URL, "http")+serialConsole0, r.Header)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	// The reading stalls...
	var last int64 = -1
	poll.True(t, "the console reads to stall", func() bool {
		n := endless.read.Load()
		stalled := n == last && n > 0
		last = n
		time.Sleep(50 * time.Millisecond)
		return stalled
	})
	const bound = 256 << 10 // a few chunks and socket buffers
	if n := endless.read.Load(); n > bound {
		t.Errorf("read %d bytes of console for a client that reads nothing, over %d", n, bound)
	}
	// ...and the client is given up on.
	select {
	case <-endless.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the console of a client that reads nothing is still open")
	}
	poll.True(t, "the console to be free", func() bool { return !f.sessions.InUse("vm-0", machine.ConsoleSerial) })
	t.Logf("read %d bytes before stalling", endless.read.Load())
}

// TestConsoleKeepAlive: an idle console is pinged, and a client that
// stops answering is closed.
func TestConsoleKeepAlive(t *testing.T) {
	f := newConsoleFixture(t, func(c *redfish.Config, _ *stubBackend) { c.ConsoleKeepAlive = 50 * time.Millisecond })
	f.powerOn("vm-0")
	conn := f.mustDial(serialConsole0)
	var pings atomic.Int32
	conn.SetPingHandler(func(data string) error {
		pings.Add(1)
		return conn.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(time.Second))
	})
	readUntil(t, conn, console.Prompt("vm-0"))
	_ = conn.SetReadDeadline(time.Time{})
	go func() {
		for {
			if _, _, err := conn.ReadMessage(); err != nil {
				return
			}
		}
	}()
	poll.True(t, "three pings", func() bool { return pings.Load() >= 3 })
	if !f.sessions.InUse("vm-0", machine.ConsoleSerial) {
		t.Error("a client answering pings was closed")
	}

	// A client that never reads answers no ping.
	silent := newConsoleFixture(t, func(c *redfish.Config, _ *stubBackend) {
		c.ConsoleKeepAlive = 50 * time.Millisecond
		c.ConsoleWriteTimeout = 200 * time.Millisecond
	})
	silent.powerOn("vm-0")
	silent.mustDial(serialConsole0)
	poll.True(t, "the console to open", func() bool { return silent.sessions.InUse("vm-0", machine.ConsoleSerial) })
	poll.True(t, "a silent client to be closed", func() bool { return !silent.sessions.InUse("vm-0", machine.ConsoleSerial) })
}

// TestGofishReadsConsoles: gofish models SerialConsole (with its
// WebSocket) and GraphicalConsole, and reads ours.
func TestGofishReadsConsoles(t *testing.T) {
	f := newConsoleFixture(t, func(c *redfish.Config, _ *stubBackend) {
		c.NetworkProtocol = redfish.NetworkProtocol{IPMIPort: 623, IPMIMachine: "vm-0"}
	})
	client, err := gofish.Connect(gofish.ClientConfig{Endpoint: f.ts.URL, Username: adminUser, Password: adminPass, HTTPClient: f.ts.Client(), BasicAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Logout()
	systems, err := client.Service.Systems()
	if err != nil {
		t.Fatal(err)
	}
	for _, sys := range systems {
		t.Run(sys.ID, func(t *testing.T) {
			serial := sys.SerialConsole
			if ws := serial.WebSocket; !ws.ServiceEnabled || !ws.Interactive || ws.ConsoleURI != "/redfish/v1/Systems/"+sys.ID+"/Oem/VirtMetal/SerialConsole" {
				t.Errorf("SerialConsole.WebSocket %+v", ws)
			}
			if serial.MaxConcurrentSessions != 1 {
				t.Errorf("SerialConsole.MaxConcurrentSessions %d", serial.MaxConcurrentSessions)
			}
			if wantIPMI := sys.ID == "vm-0"; serial.IPMI.ServiceEnabled != wantIPMI || wantIPMI && (serial.IPMI.Port == nil || *serial.IPMI.Port != 623) {
				t.Errorf("SerialConsole.IPMI %+v", serial.IPMI)
			}
			graphical := sys.GraphicalConsole
			if !graphical.ServiceEnabled || graphical.MaxConcurrentSessions != 1 || len(graphical.ConnectTypesSupported) != 1 || graphical.ConnectTypesSupported[0] != "KVMIP" {
				t.Errorf("GraphicalConsole %+v", graphical)
			}
		})
	}
}

// TestConsoleRefusedOverHTTP2: a plain GET of a console over HTTP/2, as
// curl sends it by default, gets its 400 and Base message; HTTP/2 forbids
// the Upgrade header that HTTP/1.1 is told, and its clients drop a
// response carrying one.
func TestConsoleRefusedOverHTTP2(t *testing.T) {
	f := newFixture(t, nil)
	ts := httptest.NewUnstartedServer(f.server)
	ts.EnableHTTP2 = true
	ts.StartTLS()
	t.Cleanup(ts.Close)
	req, _ := http.NewRequest(http.MethodGet, ts.URL+serialConsole0, nil)
	req.SetBasicAuth(adminUser, adminPass)
	res, err := ts.Client().Do(req)
	if err != nil {
		t.Fatalf("GET over HTTP/2: %v", err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.ProtoMajor != 2 || res.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "HeaderMissing") || res.Header.Get("Upgrade") != "" {
		t.Errorf("HTTP/%d %d, Upgrade %q: %s", res.ProtoMajor, res.StatusCode, res.Header.Get("Upgrade"), body)
	}
}
