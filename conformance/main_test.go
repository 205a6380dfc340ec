package conformance_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/virtmetal/virtmetal/internal/kubetest/realkubevirt"
	"github.com/virtmetal/virtmetal/machine/kubevirt/kubevirttest"
)

// KubeVirt's real control plane (CDI's API installed) with its node
// stand-in, for the package's KubeVirt tests; each test works in a
// namespace of its own.
var cluster *kubevirttest.Cluster

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var err error
	cluster, err = kubevirttest.StartReal(ctx, "conformance", realkubevirt.Options{KeepDir: os.Getenv("REALKUBEVIRT_KEEP") != ""})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = cluster.Stop() }()
	return m.Run()
}

// withoutCDI returns a copy of cfg through which the API server looks like
// a cluster without CDI: discovery does not list the group and its
// resources answer 404, as they do where CDI was never installed.
func withoutCDI(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(next http.RoundTripper) http.RoundTripper { return hideCDI{next: next} })
	return cfg
}

type hideCDI struct{ next http.RoundTripper }

func (h hideCDI) RoundTrip(r *http.Request) (*http.Response, error) {
	cdiPrefix := "/apis/" + cdiv1beta1.SchemeGroupVersion.Group
	if r.URL.Path == cdiPrefix || strings.HasPrefix(r.URL.Path, cdiPrefix+"/") {
		body := `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`
		return &http.Response{
			StatusCode: http.StatusNotFound, Status: "404 Not Found", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(body)),
			ContentLength: int64(len(body)), Request: r,
		}, nil
	}
	if r.URL.Path != "/apis" {
		return h.next.RoundTrip(r)
	}
	// Ask for the plain group list (not the aggregated document) and drop
	// CDI's group from it.
	r = r.Clone(r.Context())
	r.Header.Set("Accept", "application/json")
	res, err := h.next.RoundTrip(r)
	if err != nil || res.StatusCode != http.StatusOK {
		return res, err
	}
	defer res.Body.Close()
	var groups metav1.APIGroupList
	if err := json.NewDecoder(res.Body).Decode(&groups); err != nil {
		return nil, fmt.Errorf("decoding /apis: %w", err)
	}
	kept := groups.Groups[:0]
	for _, g := range groups.Groups {
		if g.Name != cdiv1beta1.SchemeGroupVersion.Group {
			kept = append(kept, g)
		}
	}
	groups.Groups = kept
	data, err := json.Marshal(groups)
	if err != nil {
		return nil, err
	}
	res.Body = io.NopCloser(bytes.NewReader(data))
	res.ContentLength = int64(len(data))
	res.Header = res.Header.Clone()
	res.Header.Set("Content-Type", "application/json")
	res.Header.Del("Content-Length")
	return res, nil
}
