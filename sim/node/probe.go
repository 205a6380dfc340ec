package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// firstReadyPoll is how often a readiness probe runs until it first
// passes. A kubelet waits a whole period (10 s for the BMCs') after a
// failure; the stand-in keeps a BMC's start from costing that.
const firstReadyPoll = 50 * time.Millisecond

// probe is a container's HTTP probe as its pod declares it, its port
// resolved to the loopback address that stands for it.
type probe struct {
	url                                string
	initialDelay, period, timeout      time.Duration
	successThreshold, failureThreshold int
}

// probeOf resolves a declared probe; nil when none is declared.
func probeOf(p *corev1.Probe, container corev1.Container, ports map[int32]string) (*probe, error) {
	if p == nil {
		return nil, nil
	}
	if p.HTTPGet == nil {
		return nil, fmt.Errorf("container %s: only httpGet probes are run by the node stand-in", container.Name)
	}
	port := p.HTTPGet.Port.IntVal
	if p.HTTPGet.Port.Type == intstr.String {
		port = 0
		for _, cp := range container.Ports {
			if cp.Name == p.HTTPGet.Port.StrVal {
				port = cp.ContainerPort
			}
		}
	}
	addr, ok := ports[port]
	if !ok {
		return nil, fmt.Errorf("container %s: probe port %s is no port it listens on", container.Name, p.HTTPGet.Port.String())
	}
	scheme := "http"
	if p.HTTPGet.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	seconds := func(n, fallback int32) time.Duration {
		if n <= 0 {
			n = fallback
		}
		return time.Duration(n) * time.Second
	}
	threshold := func(n, fallback int32) int {
		if n <= 0 {
			return int(fallback)
		}
		return int(n)
	}
	// Zero fields take the API server's defaults.
	return &probe{
		url:              scheme + "://" + addr + p.HTTPGet.Path,
		initialDelay:     time.Duration(p.InitialDelaySeconds) * time.Second,
		period:           seconds(p.PeriodSeconds, 10),
		timeout:          seconds(p.TimeoutSeconds, 1),
		successThreshold: threshold(p.SuccessThreshold, 1),
		failureThreshold: threshold(p.FailureThreshold, 3),
	}, nil
}

// check runs the probe once: a status from 200 to 399 passes, as with the
// kubelet, which trusts any certificate.
func (p *probe) check(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url, nil)
	if err != nil {
		return false
	}
	res, err := probeClient.Do(req)
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode >= 200 && res.StatusCode < 400
}

var probeClient = &http.Client{Transport: &http.Transport{
	TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // as the kubelet's probes
	DisableKeepAlives: true,
}}

// runProbes is the kubelet's prober for one container until it exits:
// its readiness probe decides whether its hosts lead to it, its liveness
// probe whether it is killed (sync then starts it again, as a restart).
// Without a readiness probe it is ready once started.
func (s *Node) runProbes(ctx context.Context, key types.NamespacedName, p *bmcProcess, readiness, liveness *probe) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-p.proc.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	if liveness != nil {
		go s.runLiveness(ctx, key, p, liveness)
	}
	if readiness == nil {
		s.setReady(key, p, true)
		return
	}
	if !sleep(ctx, readiness.initialDelay) {
		return
	}
	ready, wasReady := false, false
	successes, failures := 0, 0
	for {
		if readiness.check(ctx) {
			successes, failures = successes+1, 0
		} else {
			successes, failures = 0, failures+1
		}
		switch {
		case !ready && successes >= readiness.successThreshold:
			ready, wasReady = true, true
			s.setReady(key, p, true)
		case ready && failures >= readiness.failureThreshold:
			ready = false
			s.logf("%s: readiness probe failed %d times: not ready", key, failures)
			s.setReady(key, p, false)
		}
		wait := readiness.period
		if !wasReady {
			wait = firstReadyPoll
		}
		if !sleep(ctx, wait) {
			return
		}
	}
}

// runLiveness kills the container once its liveness probe fails
// failureThreshold times in a row.
func (s *Node) runLiveness(ctx context.Context, key types.NamespacedName, p *bmcProcess, liveness *probe) {
	if !sleep(ctx, liveness.initialDelay) {
		return
	}
	for failures := 0; ; {
		if liveness.check(ctx) {
			failures = 0
		} else if failures++; failures >= liveness.failureThreshold && ctx.Err() == nil {
			s.logf("%s: liveness probe failed %d times: killed, to be started again", key, failures)
			p.proc.Kill()
			return
		}
		if !sleep(ctx, liveness.period) {
			return
		}
	}
}

// setReady records the container's readiness, if it still runs for key,
// and has it routed at once.
func (s *Node) setReady(key types.NamespacedName, p *bmcProcess, ready bool) {
	s.mu.Lock()
	if s.running[key] == p {
		p.ready = ready
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
