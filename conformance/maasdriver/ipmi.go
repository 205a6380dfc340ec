package maasdriver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// IPMIDriver runs freeipmi as MaaS's ipmi power driver does
// (provisioningserver/drivers/power/ipmi.py, replayed in ipmi/tools_test.go):
// ipmi-chassis-config commits a one-time PXE boot, ipmipower --cycle
// --on-if-off powers on, --off powers off, all over LAN_2_0. A failed
// command is repeated as the Redfish driver repeats a request.
type IPMIDriver struct {
	// Address is where the BMC answers (host:port), asked before every
	// command; false while it does not resolve.
	Address            func() (string, bool)
	Username, Password string
	// Dir is the folder of the chassis config file.
	Dir string
}

const ipmiBootConfig = "Section Chassis_Boot_Flags\n" +
	"        Boot_Flags_Persistent                         No\n" +
	"        Boot_Device                                   PXE\n" +
	"EndSection\n"

// retry runs f until it succeeds or the retries run out.
func retry(ctx context.Context, f func() error) error {
	var err error
	for attempt := range RedfishRetries + 1 {
		if err = f(); err == nil {
			return err
		}
		if attempt == RedfishRetries {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(defaultRetryDelay(attempt)):
		}
	}
	return err
}

func (d *IPMIDriver) common() ([]string, error) {
	addr, ok := d.Address()
	if !ok {
		return nil, errors.New("BMC address does not resolve")
	}
	return []string{"-W", "opensesspriv", "--driver-type", "LAN_2_0", "-h", addr,
		"-u", d.Username, "-p", d.Password, "-l", "OPERATOR"}, nil
}

func (d *IPMIDriver) run(ctx context.Context, tool string, args ...string) (string, error) {
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
func (d *IPMIDriver) ipmipower(ctx context.Context, op ...string) (string, error) {
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

// PowerOn is power_on: a PXE boot once, then a cycle, or on if off.
func (d *IPMIDriver) PowerOn(ctx context.Context) error {
	file, err := os.CreateTemp(d.Dir, "ipmi-chassis-*.conf")
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

// PowerOff is power_off: off, with no boot override for the next power-on.
func (d *IPMIDriver) PowerOff(ctx context.Context) error {
	return retry(ctx, func() error {
		_, err := d.ipmipower(ctx, "--off")
		return err
	})
}
