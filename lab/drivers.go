package lab

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/virtmetal/virtmetal/maas/maastest"
)

// driverRetries is how often MaaS's drivers repeat a failed request; the
// waits between grow from half a second.
const driverRetries = maastest.RedfishRetries

func retryDelay(attempt int) time.Duration {
	return time.Duration(500*(1<<attempt)) * time.Millisecond
}

// retry runs f until it succeeds or the retries run out.
func retry(ctx context.Context, f func() error) error {
	var err error
	for attempt := range driverRetries + 1 {
		if err = f(); err == nil {
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

// newRedfishDriver is MaaS's Redfish power driver for a machine's power
// parameters, reaching BMC host names through dial.
func newRedfishDriver(address, username, password, nodeID string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *maastest.RedfishDriver {
	return &maastest.RedfishDriver{
		Address: address, Username: username, Password: password, NodeID: nodeID,
		Dial: dial, PowerTimeout: powerTimeout,
	}
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

func (d *ipmiDriver) PowerOn(ctx context.Context) error {
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

func (d *ipmiDriver) PowerOff(ctx context.Context) error {
	return retry(ctx, func() error {
		_, err := d.ipmipower(ctx, "--off")
		return err
	})
}
