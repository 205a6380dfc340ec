package node

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/virtmetal/virtmetal/internal/poll"
)

// TestProbes: the container's declared probes, their named port resolved
// to the address standing for it, decide: readiness once /readyz passes,
// unready after failureThreshold failures, and a kill once /healthz fails
// failureThreshold times.
func TestProbes(t *testing.T) {
	var healthy, ready atomic.Bool
	ready.Store(true)
	healthy.Store(true)
	server := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok := map[string]*atomic.Bool{"/readyz": &ready, "/healthz": &healthy}[r.URL.Path]
		if ok == nil || !ok.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer server.Close()
	declared := func(path string) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("redfish"), Scheme: corev1.URISchemeHTTPS}},
			PeriodSeconds: 1, FailureThreshold: 2,
		}
	}
	container := corev1.Container{Name: "bmc-server", Ports: []corev1.ContainerPort{{Name: "redfish", ContainerPort: 8443}}}
	ports := map[int32]string{8443: strings.TrimPrefix(server.URL, "https://")}
	readiness, err := probeOf(declared("/readyz"), container, ports)
	if err != nil {
		t.Fatal(err)
	}
	liveness, err := probeOf(declared("/healthz"), container, ports)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := probeOf(&corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromString("metrics")}}}, container, ports); err == nil {
		t.Error("a probe of a port the container does not declare was accepted")
	}

	key := types.NamespacedName{Namespace: "ns", Name: "bmc"}
	done := make(chan struct{})
	var killed atomic.Bool
	p := &bmcProcess{deployment: key, proc: &Process{done: done, kill: func() {
		killed.Store(true)
		close(done)
	}}}
	s := New(Options{})
	s.running[key] = p
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.runProbes(ctx, key, p, readiness, liveness)
	isReady := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return p.ready
	}
	poll.True(t, "ready", isReady)
	ready.Store(false)
	poll.True(t, "unready after two failed readiness probes", func() bool { return !isReady() })
	if killed.Load() {
		t.Fatal("killed while healthy")
	}
	healthy.Store(false)
	poll.True(t, "killed after two failed liveness probes", killed.Load)
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatal("still running")
	}
}
