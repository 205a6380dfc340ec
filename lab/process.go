package lab

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// process is a started child process.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
}

func startProcess(cmd *exec.Cmd) (*process, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// stop asks the process to stop, as the kubelet does, and kills it when it
// lingers.
func (p *process) stop() {
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.kill()
	}
}

// kill ends the process at once, as a crash or an OOM kill would.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// funcrLogger logs JSON lines, as the commands do.
func funcrLogger(out io.Writer) logr.Logger {
	return funcr.NewJSON(func(obj string) { fmt.Fprintln(out, obj) }, funcr.Options{})
}
