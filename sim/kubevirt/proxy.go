// Package kubevirt stands between a client and KubeVirt's real control
// plane (internal/kubetest/realkubevirt) for what that cannot do by
// itself: fail virt-api's subresource calls on a test's word, as a virt-api
// that is down, refuses or is missing would, and record the requests a
// client sent. Everything else KubeVirt does, the real one does. Importers
// name it virtsim, as machine/kubevirt is the real backend.
package kubevirt

import (
	"bytes"
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
)

// VirtAPI is an HTTPS reverse proxy in front of the API server of a
// cluster that runs KubeVirt's virt-api: it passes every request on with
// the credentials it was given, records every request that is not a read,
// and, when told (Answer), answers the start, stop and restart
// subresources of subresources.kubevirt.io itself with a failure instead
// of passing them to virt-api. It does no authorization of its own: every
// request reaches the API server with the proxy's credentials.
type VirtAPI struct {
	server *httptest.Server

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

// NewFaultProxy starts the proxy in front of the API server cfg reaches:
// subresource calls reach virt-api unless Answer says otherwise.
func NewFaultProxy(cfg *rest.Config) (*VirtAPI, error) {
	target, _, err := rest.DefaultServerURL(cfg.Host, cfg.APIPath, schema.GroupVersion{}, true)
	if err != nil {
		return nil, fmt.Errorf("virt-api proxy: %w", err)
	}
	transport, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("virt-api proxy: %w", err)
	}
	a := &VirtAPI{}
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
		switch answer := a.answerFor(); answer {
		case 0:
			apiServer.ServeHTTP(w, r)
		case http.StatusNotFound:
			// What the API server answers for a group nobody serves.
			writeStatus(w, apierrors.NewGenericServerResponse(answer, "update",
				schema.GroupResource{Group: kubevirtv1.SubresourceGroupName, Resource: "virtualmachines/" + subresource}, key.Name, "", 0, true))
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

// Answer makes later start, stop and restart calls answer with the HTTP
// status code instead of reaching virt-api: http.StatusNotFound as the API
// server answers for a group nobody serves (a cluster without virt-api);
// other codes as virt-api (409) or the API aggregator (503: virt-api down)
// may answer. They change nothing. 0 passes them on again.
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
