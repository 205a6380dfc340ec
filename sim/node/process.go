package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"time"
)

// Process is a started child process.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
	// kill ends it at once when a SIGKILL to cmd would not (runc's
	// container outlives runc); nil: the SIGKILL does.
	kill func()
}

// StartProcess starts cmd, as the kubelet starts a container.
func StartProcess(cmd *exec.Cmd) (*Process, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Stop asks the process to stop, as the kubelet does, and kills it when it
// lingers.
func (p *Process) Stop() {
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.Kill()
	}
}

// Kill ends the process at once, as a crash or an OOM kill would.
func (p *Process) Kill() {
	if p.kill != nil {
		p.kill()
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Exited tells whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// FreePort asks the kernel for an unused loopback port ("tcp" or "udp"),
// for a container port.
func FreePort(network string) (int, error) {
	if network == "udp" {
		conn, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		defer conn.Close()
		return conn.LocalAddr().(*net.UDPAddr).Port, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// WaitHTTP is a readiness probe: it polls url until it answers 200,
// trusting any certificate, as the kubelet's probes do.
func WaitHTTP(ctx context.Context, url string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	httpClient := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // as the kubelet's probes
		DisableKeepAlives: true,
	}}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		res, err := httpClient.Do(req)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last error %v)", url, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
