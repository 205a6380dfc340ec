// Package promtest reads Prometheus metrics in tests as Prometheus does,
// through its own text parser.
package promtest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families is a scrape: metric families by name.
type Families map[string]*dto.MetricFamily

// Parse reads the text format; the test fails if Prometheus would refuse it.
func Parse(t testing.TB, text io.Reader) Families {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(text)
	if err != nil {
		t.Fatalf("Prometheus's parser refuses the metrics: %v", err)
	}
	return families
}

// Scrape GETs /metrics of handler and parses it.
func Scrape(t testing.TB, handler http.Handler) Families {
	t.Helper()
	w := httptest.NewRecorder()
	handler.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("/metrics: %d", w.Code)
	}
	return Parse(t, w.Body)
}

// Value is the first sample of name whose labels include want (nil: any);
// a histogram's value is its count. ok is false when there is none.
func (f Families) Value(name string, want map[string]string) (value float64, ok bool) {
	family := f[name]
	if family == nil {
		return 0, false
	}
	for _, m := range family.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		matches := true
		for k, v := range want {
			matches = matches && labels[k] == v
		}
		if !matches {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}
