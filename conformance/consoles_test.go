package conformance_test

import (
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/internal/termtest"
	"github.com/virtmetal/virtmetal/sim/console"
)

// TestConsolesThroughBMCServer: a BMC's consoles end to end, through the
// bmc-server binary, on both backends. On the kubevirt backend the stream
// is KubeVirt's real virt-api's console and vnc subresources, whose
// virt-handler side the node stand-in answers with the simulated guest.
// ipmitool's Serial-over-LAN shows the boot lines and echoes a typed line;
// while it holds the serial console a second SOL client and Redfish's
// serial WebSocket are refused, and the graphical WebSocket carries RFB;
// a restart of the machine ends the SOL session, after which Redfish's
// serial WebSocket shows the new boot, then freeipmi's ipmiconsole takes
// the console (and leaves with &.), then ipmitool again (leaving with ~.).
func TestConsolesThroughBMCServer(t *testing.T) {
	bin := buildBMCServer(t)
	ipmitool := termtest.RequireTool(t, "ipmitool", "apt-get install ipmitool")
	ipmiconsole := termtest.RequireTool(t, "ipmiconsole", "apt-get install freeipmi-tools")
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			b := startConsoleBMC(t, bin, backend)
			sol := []string{"-I", "lanplus", "-C", "17", "-H", "127.0.0.1", "-p", b.ipmiPort, "-U", ironicBMCUser, "-P", ironicBMCPass}

			tm := termtest.Start(t, ipmitool, append(sol, "sol", "activate")...)
			at := tm.WaitFor(0, "[SOL Session operational.")
			for _, l := range console.BootLines(b.hostname) {
				at = tm.WaitFor(at, l)
			}
			at = tm.WaitFor(at, console.Prompt(b.hostname))
			tm.Type("root\r")
			tm.WaitFor(at, "root\r\n"+console.Prompt(b.hostname))

			second := termtest.Start(t, ipmitool, append(sol, "sol", "activate")...)
			second.WaitFor(0, "SOL payload already active on another session")
			if _, res, err := b.dial(machineSerial); err == nil || res == nil || res.StatusCode != http.StatusConflict {
				t.Errorf("Redfish's serial console while SOL holds it: %v, %v; want 409", res, err)
			}
			screen, _, err := b.dial(machineGraphical)
			if err != nil {
				t.Fatalf("the graphical console: %v", err)
			}
			if got, err := console.Handshake(&wsStream{conn: screen}); err != nil || got.Name != b.hostname {
				t.Errorf("RFB over the graphical WebSocket: %+v, %v", got, err)
			}
			screen.Close()

			b.reset(t, "ForceRestart")
			// ipmitool learns of a deactivated payload at its next
			// keystroke; the BMC let the console go at once.
			serial := b.dialWhenFree(t)
			if seen := readWS(t, serial, console.Prompt(b.hostname)); !strings.Contains(seen, console.BootLines(b.hostname)[0]) {
				t.Errorf("the serial console after the restart shows no boot: %q", seen)
			}
			tm.Type("x")
			if err := tm.Exited(); err == nil || !strings.Contains(tm.Output(), "SOL session closed by BMC") {
				t.Errorf("ipmitool after the restart: %v\n%s", err, tm.Output())
			}
			serial.Close()

			ic := termtest.Start(t, ipmiconsole, "-h", "127.0.0.1:"+b.ipmiPort, "-u", ironicBMCUser, "-p", ironicBMCPass, "-I", "17")
			at = ic.WaitFor(0, "[SOL established]")
			at = ic.WaitFor(at, console.Prompt(b.hostname))
			ic.Type("admin\r")
			ic.WaitFor(at, "admin\r\n"+console.Prompt(b.hostname))
			ic.Type("&.")
			if err := ic.Exited(); err != nil {
				t.Errorf("ipmiconsole after &.: %v\n%s", err, ic.Output())
			}

			tm = termtest.Start(t, ipmitool, append(sol, "sol", "activate")...)
			tm.WaitFor(0, console.Prompt(b.hostname))
			tm.Type("~.")
			if err := tm.Exited(); err != nil {
				t.Errorf("ipmitool after ~.: %v\n%s", err, tm.Output())
			}
		})
	}
}

const (
	machineSerial    = "SerialConsole"
	machineGraphical = "GraphicalConsole"
)

// consoleBMC is a bmc-server process serving one machine over Redfish and
// IPMI.
type consoleBMC struct {
	*bmcProcess
	ipmiPort  string
	hostname  string // the guest's, which its console prints
	namespace string // the VM's, on the kubevirt backend
}

func startConsoleBMC(t testing.TB, bin, backend string) consoleBMC {
	t.Helper()
	// freeipmi's ipmiconsole takes no port above 32767.
	ipmiPort := strconv.Itoa(freeUDPPortBelow32768(t))
	ipmi := []string{"--ipmi-listen", "127.0.0.1:" + ipmiPort}
	if backend == "memory" {
		p := startBMCProcess(t, bin, "vm-0", os.Environ(), append(ipmi, "--backend", "memory", "--machines", "1")...)
		b := consoleBMC{bmcProcess: p, ipmiPort: ipmiPort, hostname: "vm-0"}
		b.reset(t, "On")
		return b
	}
	ns, name := cluster.NewNamespace(t), "console-node"
	vm := pxeVM(ns, name, "02:00:00:00:37:01")
	vm.Spec.RunStrategy = ptr.To(kubevirtv1.RunStrategyAlways)
	createRunning(t, vm)
	kubeconfig, err := cluster.Real.KubeConfigFor("console-bmc-server", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	p := startBMCProcess(t, bin, name, append(os.Environ(), "KUBECONFIG="+path), append(ipmi, "--backend", "kubevirt", "--namespace", ns, "--vm", name)...)
	return consoleBMC{bmcProcess: p, ipmiPort: ipmiPort, hostname: name, namespace: ns}
}

func (b consoleBMC) reset(t testing.TB, resetType string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, b.url+b.system+"/Actions/ComputerSystem.Reset", strings.NewReader(`{"ResetType":"`+resetType+`"}`))
	req.SetBasicAuth(ironicBMCUser, ironicBMCPass)
	req.Header.Set("Content-Type", "application/json")
	res, err := b.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode >= 300 {
		t.Fatalf("Reset %s: %d", resetType, res.StatusCode)
	}
}

// dial opens the machine's console (SerialConsole or GraphicalConsole)
// WebSocket with the BMC's credentials.
func (b consoleBMC) dial(kind string) (*websocket.Conn, *http.Response, error) {
	dialer := websocket.Dialer{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, HandshakeTimeout: 30 * time.Second} //nolint:gosec // the BMC's generated certificate
	header := http.Header{"Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte(ironicBMCUser+":"+ironicBMCPass))}}
	return dialer.Dial("wss"+strings.TrimPrefix(b.url, "https")+b.system+"/Oem/VirtMetal/"+kind, header)
}

// dialWhenFree opens the serial console once it is free and the machine
// runs again.
func (b consoleBMC) dialWhenFree(t *testing.T) *websocket.Conn {
	t.Helper()
	var conn *websocket.Conn
	waitFor(t, 2*time.Minute, "the serial console free and the machine running", func() error {
		c, res, err := b.dial(machineSerial)
		if err != nil {
			if res != nil {
				return fmt.Errorf("%d: %w", res.StatusCode, err)
			}
			return err
		}
		conn = c
		return nil
	})
	return conn
}

// readWS reads the console's frames until want went by, and returns what
// it read.
func readWS(t *testing.T, conn *websocket.Conn, want string) string {
	t.Helper()
	var seen strings.Builder
	_ = conn.SetReadDeadline(time.Now().Add(termtest.Wait))
	for !strings.Contains(seen.String(), want) {
		_, data, err := conn.ReadMessage()
		if err != nil {
			t.Fatalf("reading the console for %q: %v; read %q", want, err, seen.String())
		}
		seen.Write(data)
	}
	return seen.String()
}

// wsStream is a WebSocket's binary messages as a byte stream.
type wsStream struct {
	conn *websocket.Conn
	rest []byte
}

func (s *wsStream) Write(p []byte) (int, error) {
	return len(p), s.conn.WriteMessage(websocket.BinaryMessage, p)
}

func (s *wsStream) Read(p []byte) (int, error) {
	for len(s.rest) == 0 {
		_, data, err := s.conn.ReadMessage()
		if err != nil {
			return 0, err
		}
		s.rest = data
	}
	n := copy(p, s.rest)
	s.rest = s.rest[n:]
	return n, nil
}

// freeUDPPortBelow32768 is a loopback UDP port free now, below 32768.
func freeUDPPortBelow32768(t testing.TB) int {
	t.Helper()
	for range 100 {
		port := 20000 + rand.IntN(12000)
		c, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
			return port
		}
	}
	t.Fatal("no free UDP port below 32768")
	return 0
}
