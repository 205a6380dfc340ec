// Command lab runs virtmetal's whole flow on this machine and shows it:
// KubeVirt's real control plane (kube-apiserver, etcd, virt-api,
// virt-controller) with a stand-in for its node, the real bmc-controller,
// bmc-server and MaaS reconciler, simulated guests and a simulated MaaS. It
// creates a VM, prints each step on its way to a Ready MaaS machine with
// timings, then keeps the lab running with the BMCs' URLs and credentials
// until Ctrl-C. It needs root (the control plane runs in a network
// namespace of its own) and the binaries of hack/setup-kubevirt.sh.
//
//	sudo -E go run ./cmd/lab [--namespace demo] [--vm web1] [--ipmi] [--workload shared] [--exit-when-ready]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/virtmetal/virtmetal/lab"
	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	namespace := fs.String("namespace", "demo", "namespace of the VM (opted in to virtmetal)")
	name := fs.String("vm", "web1", "name of the VM")
	ipmi := fs.Bool("ipmi", false, "give the VM's BMC IPMI too (MaaS then powers it through IPMI)")
	workload := fs.String("workload", "", "bmc-controller's --workload (shared: one bmc-server per namespace); its default when empty")
	exitWhenReady := fs.Bool("exit-when-ready", false, "stop the lab once the machine is Ready")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up when the machine is not Ready by then")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	vm := maas.VMRef{Namespace: *namespace, Name: *name}

	start := time.Now()
	var created time.Time
	events := make(chan lab.Event, 64)
	fmt.Fprintln(stdout, "starting the lab: building bmc-server and bmc-controller, starting kube-apiserver, etcd, virt-api and virt-controller...")
	l, err := lab.Start(ctx, lab.Options{Workload: *workload, OnEvent: func(e lab.Event) {
		if e.VM == vm {
			events <- e
		}
	}})
	if err != nil {
		return err
	}
	defer l.Close()
	if err := l.StartController(ctx); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "lab up in %v (folder %s)\n\n", time.Since(start).Round(time.Millisecond), l.Dir())

	if err := l.CreateNamespace(ctx, vm.Namespace); err != nil {
		return err
	}
	if err := l.CreateVM(ctx, vm, lab.VMOptions{IPMI: *ipmi}); err != nil {
		return err
	}
	deadline := time.After(*timeout)
	last := time.Time{}
	for ready := false; !ready; {
		select {
		case e := <-events:
			if e.Step == lab.StepVMCreated {
				created, last = e.At, e.At
			}
			fmt.Fprintf(stdout, "%9s %10s  %-15s %s\n", e.At.Sub(created).Round(time.Millisecond), "(+"+e.At.Sub(last).Round(time.Millisecond).String()+")", e.Step, e.Detail)
			last = e.At
			ready = e.Step == lab.StepReady
		case <-deadline:
			return fmt.Errorf("%s not Ready after %v (logs in %s)", vm, *timeout, l.Dir())
		case <-ctx.Done():
			return nil
		}
	}
	took, _ := l.TimeToReady(vm)
	fmt.Fprintf(stdout, "\n%s is Ready in MaaS %v after its creation\n\n", vm, took.Round(time.Millisecond))
	printAccess(stdout, l)
	if *exitWhenReady {
		return nil
	}
	fmt.Fprintln(stdout, "\nthe lab keeps running; Ctrl-C stops it")
	<-ctx.Done()
	return nil
}

// printAccess tells how to drive the lab's BMCs and MaaS by hand.
func printAccess(out io.Writer, l *lab.Lab) {
	fmt.Fprintf(out, "MaaS API: %s (API key %s)\n", l.MaaS.URL(), maassim.APIKey)
	for _, m := range l.MaaS.Machines() {
		fmt.Fprintf(out, "  machine %s %-20s status %d, pool %s, power %s %s\n", m.SystemID, m.Hostname, m.Status, m.Pool, m.PowerType, m.PowerParameters["power_address"])
	}
	for _, b := range l.BMCs() {
		// Requests carry the BMC's host, which a shared bmc-server routes
		// by: curl connects to the process under that name.
		redfish, _ := url.Parse(b.Redfish)
		curl := fmt.Sprintf("curl -k -u '%s:%s' --connect-to %s:443:%s", b.Username, b.Password, b.Host, redfish.Host)
		fmt.Fprintf(out, "\nBMC of %s (MaaS knows it as https://%s), served by bmc-server %s\n", b.VM, b.Host, b.Server)
		fmt.Fprintf(out, "  Redfish:  https://%s/redfish/v1/ at %s   user %s password %s\n", b.Host, redfish.Host, b.Username, b.Password)
		fmt.Fprintf(out, "    %s https://%s/redfish/v1/Systems/%s\n", curl, b.Host, b.VM.Name)
		fmt.Fprintf(out, "    %s -H 'Content-Type: application/json' -d '{\"ResetType\": \"On\"}' https://%s/redfish/v1/Systems/%s/Actions/ComputerSystem.Reset\n", curl, b.Host, b.VM.Name)
		fmt.Fprintf(out, "    gofish: ClientConfig{Endpoint: %q, Username: %q, Password: %q, Insecure: true} with an HTTPClient that dials %s\n", "https://"+b.Host, b.Username, b.Password, redfish.Host)
		if b.IPMI != "" {
			host, port, _ := net.SplitHostPort(b.IPMI)
			fmt.Fprintf(out, "  IPMI:     udp %s\n", b.IPMI)
			fmt.Fprintf(out, "    ipmitool -I lanplus -H %s -p %s -U '%s' -P '%s' power status\n", host, port, b.Username, b.Password)
		}
	}
}
