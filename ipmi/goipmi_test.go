package ipmi

import (
	"context"
	"strconv"
	"testing"

	goipmi "github.com/vmware/goipmi"

	"github.com/virtmetal/virtmetal/machine"
)

// TestGoIPMIClient drives an IPMI 1.5 MD5 session with vmware/goipmi, the
// design card's Go library: presence ping, session setup at ADMINISTRATOR,
// Get Device ID, boot device and power control, Close Session.
func TestGoIPMIClient(t *testing.T) {
	host, port, m := udpServer(t, nil)
	portNumber, _ := strconv.Atoi(port)
	c, err := goipmi.NewClient(&goipmi.Connection{Hostname: host, Port: portNumber, Username: testUser, Password: testPassword, Interface: "lan"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Open(); err != nil {
		t.Fatalf("Open: %v", err)
	}
	id, err := c.DeviceID()
	if err != nil || id.IPMIVersion != 0x02 || id.DeviceID != 0x20 {
		t.Fatalf("DeviceID: %+v, %v", id, err)
	}
	if err := c.SetBootDevice(goipmi.BootDeviceCdrom); err != nil {
		t.Fatalf("SetBootDevice: %v", err)
	}
	if err := c.Control(goipmi.ControlPowerUp); err != nil {
		t.Fatalf("Control: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if boots := m.Boots(); len(boots) != 1 || boots[0] != machine.BootCd {
		t.Fatalf("boots %v, want one CD boot", boots)
	}
	if st, _ := m.PowerState(context.Background()); st != machine.PowerOn {
		t.Fatalf("state %s", st)
	}
}
