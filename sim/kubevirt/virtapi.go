package kubevirt

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"slices"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/internal/kubescheme"
)

// VirtAPI stands in for the part of KubeVirt's virt-api a BMC uses: the
// start, stop and restart subresources of the API group subresources.kubevirt.io,
// which envtest does not serve. It is an HTTPS reverse proxy in front of the
// API server: it answers PUTs to those subresources itself, as virt-api
// does, and passes everything else on with the credentials it was given.
// Clients configured with Config see one API server that serves both. It
// records every request that is not a read.
//
// It does no authorization of its own: every request reaches the API
// server with the proxy's credentials.
//
// In front of a cluster whose virt-api is KubeVirt's own
// (internal/kubetest/realkubevirt), NewFaultProxy makes the same proxy pass
// the subresource calls on, to be recorded and, when told, failed.
type VirtAPI struct {
	server *httptest.Server
	api    client.Client
	// forward passes subresource calls to the API server (a real virt-api
	// behind it) rather than answering them.
	forward bool

	mu       sync.Mutex
	answer   int
	requests []Request
}

// Request is a request the proxy saw that was not a read.
type Request struct {
	Method string
	Path   string
	// GracePeriod is the body's gracePeriod (stop) or gracePeriodSeconds
	// (restart, DeleteOptions); nil when it has none.
	GracePeriod *int64
}

// NewVirtAPI starts the proxy in front of the API server cfg reaches; it
// acts with cfg's credentials, which must allow reading and writing every
// VirtualMachine and VMI.
func NewVirtAPI(cfg *rest.Config) (*VirtAPI, error) { return newProxy(cfg, false) }

// NewFaultProxy starts the proxy in front of a cluster that runs KubeVirt's
// virt-api: subresource calls reach it unless Answer says otherwise.
func NewFaultProxy(cfg *rest.Config) (*VirtAPI, error) { return newProxy(cfg, true) }

func newProxy(cfg *rest.Config, forward bool) (*VirtAPI, error) {
	target, _, err := rest.DefaultServerURL(cfg.Host, cfg.APIPath, schema.GroupVersion{}, true)
	if err != nil {
		return nil, fmt.Errorf("virt-api proxy: %w", err)
	}
	transport, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("virt-api proxy: %w", err)
	}
	api, err := client.New(cfg, client.Options{Scheme: kubescheme.New()})
	if err != nil {
		return nil, fmt.Errorf("virt-api proxy: %w", err)
	}
	a := &VirtAPI{api: api, forward: forward}
	apiServer := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Header.Del("Authorization")
		},
		Transport:     transport,
		FlushInterval: -1, // watches stream
		// A watch ends with its client; that is no error worth a log line.
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) },
	}
	a.server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := a.record(r); err != nil {
			writeStatus(w, apierrors.NewBadRequest(err.Error()))
			return
		}
		key, subresource, ok := subresourceCall(r)
		if !ok {
			apiServer.ServeHTTP(w, r)
			return
		}
		switch answer := a.answerFor(); {
		case answer == 0 && a.forward:
			apiServer.ServeHTTP(w, r)
		case answer == 0:
			a.serve(w, r, key, subresource)
		case answer == http.StatusNotFound && a.forward:
			// What the API server answers for a group nobody serves.
			writeStatus(w, apierrors.NewGenericServerResponse(answer, "update",
				schema.GroupResource{Group: kubevirtv1.SubresourceGroupName, Resource: "virtualmachines/" + subresource}, key.Name, "", 0, true))
		case answer == http.StatusNotFound:
			apiServer.ServeHTTP(w, r) // the API server does not serve the group: its own 404
		default:
			writeStatus(w, apierrors.NewGenericServerResponse(answer, "update",
				schema.GroupResource{Group: kubevirtv1.SubresourceGroupName, Resource: "virtualmachines/" + subresource}, key.Name, "the test told the proxy to fail", 0, true))
		}
	}))
	a.server.EnableHTTP2 = true
	a.server.StartTLS()
	return a, nil
}

// Config reaches the API server through the proxy, with no credentials and
// no client-side rate limit, as bmc-server configures its client.
func (a *VirtAPI) Config() *rest.Config {
	return &rest.Config{
		Host:            a.server.URL,
		QPS:             -1,
		TLSClientConfig: rest.TLSClientConfig{CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.server.Certificate().Raw})},
	}
}

// Close stops the proxy, ending the watches through it.
func (a *VirtAPI) Close() {
	a.server.CloseClientConnections()
	a.server.Close()
}

// Answer makes later stop and restart calls answer with the HTTP status
// code instead of acting. http.StatusNotFound passes them to the API server,
// which does not serve the group: a cluster without virt-api. Other codes
// are what virt-api (409) or the API aggregator (503: virt-api down) may
// answer, and change nothing. 0 restores virt-api's behaviour.
func (a *VirtAPI) Answer(code int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.answer = code
}

func (a *VirtAPI) answerFor() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.answer
}

// Requests returns every request so far that was not a read, oldest first.
func (a *VirtAPI) Requests() []Request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.requests)
}

func (a *VirtAPI) record(r *http.Request) error {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return nil
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var grace struct {
		GracePeriod        *int64 `json:"gracePeriod"`
		GracePeriodSeconds *int64 `json:"gracePeriodSeconds"`
	}
	// Bodies that are not JSON objects (patches, protobuf) carry no grace period.
	_ = json.Unmarshal(body, &grace)
	if grace.GracePeriod == nil {
		grace.GracePeriod = grace.GracePeriodSeconds
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.requests = append(a.requests, Request{Method: r.Method, Path: r.URL.Path, GracePeriod: grace.GracePeriod})
	return nil
}

// subresourceCall recognises PUT
// /apis/subresources.kubevirt.io/v1/namespaces/NS/virtualmachines/NAME/{start,stop,restart}.
func subresourceCall(r *http.Request) (types.NamespacedName, string, bool) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if r.Method != http.MethodPut || len(parts) != 8 || parts[0] != "apis" || parts[1] != kubevirtv1.SubresourceGroupName ||
		parts[2] != kubevirtv1.ApiLatestVersion || parts[3] != "namespaces" || parts[5] != "virtualmachines" ||
		(parts[7] != "start" && parts[7] != "stop" && parts[7] != "restart") {
		return types.NamespacedName{}, "", false
	}
	return types.NamespacedName{Namespace: parts[4], Name: parts[6]}, parts[7], true
}

func (a *VirtAPI) serve(w http.ResponseWriter, r *http.Request, key types.NamespacedName, subresource string) {
	var err error
	switch subresource {
	case "start":
		opts := kubevirtv1.StartOptions{}
		if err = decode(r, &opts); err == nil {
			err = a.start(r.Context(), key)
		}
	case "stop":
		opts := kubevirtv1.StopOptions{}
		if err = decode(r, &opts); err == nil {
			err = a.stop(r.Context(), key, opts)
		}
	default:
		opts := kubevirtv1.RestartOptions{}
		if err = decode(r, &opts); err == nil {
			err = a.restart(r.Context(), key, opts)
		}
	}
	if err != nil {
		writeStatus(w, err)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

func decode(r *http.Request, into any) error {
	body, err := io.ReadAll(r.Body)
	if err != nil || len(body) == 0 {
		return err
	}
	if err := json.Unmarshal(body, into); err != nil {
		return apierrors.NewBadRequest("cannot decode the request body: " + err.Error())
	}
	return nil
}

// readWithStrategy reads the VM, its VMI (nil when none) and its run
// strategy.
func (a *VirtAPI) readWithStrategy(ctx context.Context, key types.NamespacedName) (*kubevirtv1.VirtualMachine, *kubevirtv1.VirtualMachineInstance, kubevirtv1.VirtualMachineRunStrategy, error) {
	vm, vmi, err := a.read(ctx, key)
	if err != nil {
		return nil, nil, "", err
	}
	strategy, err := vm.RunStrategy()
	if err != nil {
		return nil, nil, "", apierrors.NewInternalError(err)
	}
	return vm, vmi, strategy, nil
}

// start acts as virt-api does: a VM whose VMI runs is a conflict; Halted
// becomes Always; RerunOnFailure and Manual get a start request for
// virt-controller (with a stop request for an ended VMI it must remove
// first), except RerunOnFailure after a failure, which restarts by itself;
// Always and Once take no start requests.
func (a *VirtAPI) start(ctx context.Context, key types.NamespacedName) error {
	vm, vmi, strategy, err := a.readWithStrategy(ctx, key)
	if err != nil {
		return err
	}
	if vmi != nil && !vmi.IsFinal() && vmi.Status.Phase != kubevirtv1.Unknown && vmi.Status.Phase != kubevirtv1.VmPhaseUnset {
		return apierrors.NewConflict(kubevirtv1.Resource("virtualmachine"), key.Name, errors.New("VM is already running"))
	}
	switch strategy {
	case kubevirtv1.RunStrategyHalted:
		return a.setStrategy(ctx, vm, kubevirtv1.RunStrategyAlways)
	case kubevirtv1.RunStrategyRerunOnFailure, kubevirtv1.RunStrategyManual:
		if strategy == kubevirtv1.RunStrategyRerunOnFailure && vmi != nil && vmi.Status.Phase == kubevirtv1.Failed {
			return apierrors.NewConflict(kubevirtv1.Resource("virtualmachine"), key.Name, errors.New("RerunOnFailure does not support starting VM from failed state"))
		}
		requests := []kubevirtv1.VirtualMachineStateChangeRequest{{Action: kubevirtv1.StartRequest}}
		if vmi != nil {
			requests = append([]kubevirtv1.VirtualMachineStateChangeRequest{{Action: kubevirtv1.StopRequest, UID: &vmi.UID}}, requests...)
		}
		return a.request(ctx, key, requests)
	}
	return apierrors.NewConflict(kubevirtv1.Resource("virtualmachine"), key.Name, fmt.Errorf("%s does not support manual start requests", strategy))
}

// request hands state change requests to virt-controller in the VM's
// status. As virt-api's patch (guarded by a test of the requests alone), it
// waits for no other write of the VM, and a VM with requests pending
// refuses more.
func (a *VirtAPI) request(ctx context.Context, key types.NamespacedName, requests []kubevirtv1.VirtualMachineStateChangeRequest) error {
	for {
		vm := &kubevirtv1.VirtualMachine{}
		if err := a.api.Get(ctx, key, vm); err != nil {
			return apierrors.NewInternalError(err)
		}
		if len(vm.Status.StateChangeRequests) > 0 {
			return apierrors.NewInternalError(errors.New("unable to complete request: stop/start already underway"))
		}
		vm.Status.StateChangeRequests = requests
		err := a.api.Status().Update(ctx, vm)
		switch {
		case apierrors.IsConflict(err):
			continue // another write of the VM, not of its requests
		case err != nil:
			return apierrors.NewInternalError(err)
		}
		return nil
	}
}

// stop acts as virt-api does: a running VMI first gets the requested grace
// period (virt-handler gives a shutting-down VMI that long); then Always
// and Once become Halted, while Halted (only with a shorter grace period),
// Manual and RerunOnFailure need a running VMI, which is stopped. A VM
// with nothing to stop is a conflict.
func (a *VirtAPI) stop(ctx context.Context, key types.NamespacedName, opts kubevirtv1.StopOptions) error {
	vm, vmi, strategy, err := a.readWithStrategy(ctx, key)
	if err != nil {
		return err
	}
	running := vmi != nil && !vmi.IsFinal()
	var previousGrace *int64
	if running && opts.GracePeriod != nil {
		previousGrace = vmi.Spec.TerminationGracePeriodSeconds
		if err := a.setGracePeriod(ctx, vmi, *opts.GracePeriod); err != nil {
			return err
		}
	}
	switch strategy {
	case kubevirtv1.RunStrategyAlways, kubevirtv1.RunStrategyOnce:
		if err := a.setStrategy(ctx, vm, kubevirtv1.RunStrategyHalted); err != nil {
			return err
		}
	case kubevirtv1.RunStrategyHalted:
		if !running {
			return apierrors.NewConflict(kubevirtv1.Resource("virtualmachine"), key.Name, errors.New("VM is not running"))
		}
		if opts.GracePeriod == nil || previousGrace != nil && *opts.GracePeriod >= *previousGrace {
			return apierrors.NewConflict(kubevirtv1.Resource("virtualmachine"), key.Name, errors.New("Halted only supports stop requests with a shorter grace period"))
		}
	default:
		if !running {
			return apierrors.NewConflict(kubevirtv1.Resource("virtualmachine"), key.Name, errors.New("VM is not running"))
		}
	}
	if !running {
		return nil
	}
	// virt-controller's part (acting on the new strategy or the stop request).
	return a.deleteVMI(ctx, vmi)
}

// restart acts as virt-api does: only a VM with a VMI and a strategy that
// restarts (not Halted, not Once) restarts, and only grace period 0 (kill
// at once) or none (the VMI's own) is allowed. It asks virt-controller to
// stop the VMI and start a new one, whatever the strategy.
func (a *VirtAPI) restart(ctx context.Context, key types.NamespacedName, opts kubevirtv1.RestartOptions) error {
	if g := opts.GracePeriodSeconds; g != nil && *g != 0 {
		return apierrors.NewBadRequest(fmt.Sprintf("gracePeriodSeconds %d: only 0 is supported for a forced restart", *g))
	}
	_, vmi, strategy, err := a.readWithStrategy(ctx, key)
	if err != nil {
		return err
	}
	if strategy == kubevirtv1.RunStrategyHalted || strategy == kubevirtv1.RunStrategyOnce {
		return apierrors.NewConflict(kubevirtv1.Resource("virtualmachine"), key.Name, fmt.Errorf("runStrategy %s does not support restart requests", strategy))
	}
	if vmi == nil {
		return apierrors.NewConflict(kubevirtv1.Resource("virtualmachine"), key.Name, errors.New("VM is not running"))
	}
	// virt-api kills the launcher pod at once; here the VMI's grace period
	// 0 has the simulated virt-handler do the same.
	if opts.GracePeriodSeconds != nil {
		if err := a.setGracePeriod(ctx, vmi, 0); err != nil {
			return err
		}
	}
	if err := a.request(ctx, key, []kubevirtv1.VirtualMachineStateChangeRequest{
		{Action: kubevirtv1.StopRequest, UID: &vmi.UID}, {Action: kubevirtv1.StartRequest},
	}); err != nil {
		return err
	}
	return a.deleteVMI(ctx, vmi)
}

// read returns the VM (virt-api's NotFound, naming the kubevirt.io group,
// if there is none) and its VMI (nil if none).
func (a *VirtAPI) read(ctx context.Context, key types.NamespacedName) (*kubevirtv1.VirtualMachine, *kubevirtv1.VirtualMachineInstance, error) {
	vm := &kubevirtv1.VirtualMachine{}
	if err := a.api.Get(ctx, key, vm); apierrors.IsNotFound(err) {
		return nil, nil, apierrors.NewNotFound(kubevirtv1.Resource("virtualmachine"), key.Name)
	} else if err != nil {
		return nil, nil, apierrors.NewInternalError(err)
	}
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := a.api.Get(ctx, key, vmi); apierrors.IsNotFound(err) {
		return vm, nil, nil
	} else if err != nil {
		return nil, nil, apierrors.NewInternalError(err)
	}
	return vm, vmi, nil
}

// setStrategy sets the VM's run strategy (spec.running false or true where
// the VM uses that) with a patch guarded by a test of the field it
// replaces, so only a concurrent power change makes it a conflict.
func (a *VirtAPI) setStrategy(ctx context.Context, vm *kubevirtv1.VirtualMachine, strategy kubevirtv1.VirtualMachineRunStrategy) error {
	type op struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value"`
	}
	ops := []op{{"test", "/spec/running", vm.Spec.Running}, {"replace", "/spec/running", strategy == kubevirtv1.RunStrategyAlways}}
	if vm.Spec.RunStrategy != nil {
		ops = []op{{"test", "/spec/runStrategy", *vm.Spec.RunStrategy}, {"replace", "/spec/runStrategy", strategy}}
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return apierrors.NewInternalError(err)
	}
	err = a.api.Patch(ctx, vm, client.RawPatch(types.JSONPatchType, patch))
	if apierrors.IsInvalid(err) { // the API server's answer to a failed test
		return apierrors.NewConflict(kubevirtv1.Resource("virtualmachine"), vm.Name, err)
	}
	if err != nil {
		return apierrors.NewInternalError(err)
	}
	return nil
}

// setGracePeriod merges the grace period into the VMI, which a concurrent
// status update cannot make a conflict.
func (a *VirtAPI) setGracePeriod(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, seconds int64) error {
	original := vmi.DeepCopy()
	vmi.Spec.TerminationGracePeriodSeconds = &seconds
	if err := a.api.Patch(ctx, vmi, client.MergeFrom(original)); err != nil {
		return apierrors.NewInternalError(err)
	}
	return nil
}

// deleteVMI deletes that VMI; one already replaced (UID precondition) or
// gone has stopped anyway.
func (a *VirtAPI) deleteVMI(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) error {
	err := a.api.Delete(ctx, vmi, client.Preconditions{UID: &vmi.UID})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return apierrors.NewInternalError(err)
	}
	return nil
}

func writeStatus(w http.ResponseWriter, err error) {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		status = apierrors.NewInternalError(err)
	}
	s := status.Status()
	s.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(int(s.Code))
	_ = json.NewEncoder(w).Encode(s)
}
