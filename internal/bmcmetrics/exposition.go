package bmcmetrics

import (
	"bufio"
	"cmp"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// The metrics are written in Prometheus's text exposition format by the
// few types below rather than by Prometheus's client library: that library
// and the protocol buffers it links cost every BMC pod about 2 MB of
// resident memory (docs/benchmarks.md), for counters, histograms and
// gauges read at each scrape.

// contentType is the text exposition format's.
const contentType = "text/plain; version=0.0.4; charset=utf-8"

// labelValues are a series' label values, in the order of its family's
// label names; a comparable key, so finding a series allocates nothing.
type labelValues [3]string

// family is one metric name: its HELP and TYPE lines and its samples.
type family interface {
	name() string
	write(w *bufio.Writer)
}

// header is what every family writes first.
type header struct {
	metric, help, kind string
}

func (h header) name() string { return h.metric }

func (h header) writeHeader(w *bufio.Writer) {
	w.WriteString("# HELP ")
	w.WriteString(h.metric)
	w.WriteByte(' ')
	w.WriteString(escapeHelp(h.help))
	w.WriteString("\n# TYPE ")
	w.WriteString(h.metric)
	w.WriteByte(' ')
	w.WriteString(h.kind)
	w.WriteByte('\n')
}

// counterVec counts events by label values.
type counterVec struct {
	header
	labels []string
	mu     sync.RWMutex
	series map[labelValues]*atomic.Uint64
}

func newCounterVec(metric, help string, labels ...string) *counterVec {
	return &counterVec{header: header{metric, help, "counter"}, labels: labels, series: map[labelValues]*atomic.Uint64{}}
}

// with is the counter of values, made at its first use.
func (c *counterVec) with(values labelValues) *atomic.Uint64 {
	c.mu.RLock()
	n, ok := c.series[values]
	c.mu.RUnlock()
	if ok {
		return n
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n, ok = c.series[values]; !ok {
		n = &atomic.Uint64{}
		c.series[values] = n
	}
	return n
}

// write writes nothing before the first series, as Prometheus's client
// does.
func (c *counterVec) write(w *bufio.Writer) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if len(c.series) == 0 {
		return
	}
	c.writeHeader(w)
	for _, k := range sortedKeys(c.series) {
		writeSample(w, c.metric, c.labels, k, "", "", float64(c.series[k].Load()))
	}
}

// histogramVec observes durations by label values into fixed buckets.
type histogramVec struct {
	header
	labels  []string
	buckets []float64 // upper bounds, ascending; +Inf is implied
	mu      sync.RWMutex
	series  map[labelValues]*histogram
}

// histogram is one series: a count per bucket (not cumulative: each
// observation adds to one), their total and the observations' sum.
type histogram struct {
	counts  []atomic.Uint64
	count   atomic.Uint64
	sumBits atomic.Uint64
}

func newHistogramVec(metric, help string, buckets []float64, labels ...string) *histogramVec {
	return &histogramVec{header: header{metric, help, "histogram"}, labels: labels, buckets: buckets, series: map[labelValues]*histogram{}}
}

func (h *histogramVec) observe(values labelValues, v float64) {
	h.mu.RLock()
	s, ok := h.series[values]
	h.mu.RUnlock()
	if !ok {
		h.mu.Lock()
		if s, ok = h.series[values]; !ok {
			s = &histogram{counts: make([]atomic.Uint64, len(h.buckets))}
			h.series[values] = s
		}
		h.mu.Unlock()
	}
	if i, _ := slices.BinarySearch(h.buckets, v); i < len(h.buckets) {
		s.counts[i].Add(1)
	}
	for {
		old := s.sumBits.Load()
		if s.sumBits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			break
		}
	}
	s.count.Add(1)
}

func (h *histogramVec) write(w *bufio.Writer) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if len(h.series) == 0 {
		return
	}
	h.writeHeader(w)
	for _, k := range sortedKeys(h.series) {
		s := h.series[k]
		// The total is read first: a concurrent observation then shows in
		// no bucket rather than making a bucket exceed +Inf's.
		count := s.count.Load()
		var cumulative uint64
		for i, bound := range h.buckets {
			cumulative += s.counts[i].Load()
			writeSample(w, h.metric+"_bucket", h.labels, k, "le", formatFloat(bound), float64(min(cumulative, count)))
		}
		writeSample(w, h.metric+"_bucket", h.labels, k, "le", "+Inf", float64(count))
		writeSample(w, h.metric+"_sum", h.labels, k, "", "", math.Float64frombits(s.sumBits.Load()))
		writeSample(w, h.metric+"_count", h.labels, k, "", "", float64(count))
	}
}

// funcSample is one sample of a funcFamily: its constant label and the
// function read at each scrape.
type funcSample struct {
	label, value string // no label when label is ""
	read         func() float64
}

// funcFamily is a gauge or counter whose samples are read at each scrape.
type funcFamily struct {
	header
	samples []funcSample
}

func (f *funcFamily) write(w *bufio.Writer) {
	f.writeHeader(w)
	for _, s := range f.samples {
		writeSample(w, f.metric, nil, labelValues{}, s.label, s.value, s.read())
	}
}

// group is families computed together at each scrape (the Go runtime's,
// the process's), named by their common prefix and written in order.
type group struct {
	prefix string
	emit   func(w *bufio.Writer)
}

func (g group) name() string          { return g.prefix }
func (g group) write(w *bufio.Writer) { g.emit(w) }

// writeFamily writes a family of one sample without labels.
func writeFamily(w *bufio.Writer, metric, help, kind string, v float64) {
	header{metric, help, kind}.writeHeader(w)
	writeSample(w, metric, nil, labelValues{}, "", "", v)
}

// registry is a process's families, written sorted by name.
type registry struct {
	mu       sync.Mutex
	families map[string]family
}

func (r *registry) add(families ...family) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range families {
		if _, dup := r.families[f.name()]; dup {
			panic("bmcmetrics: " + f.name() + " registered twice")
		}
		r.families[f.name()] = f
	}
}

// addFunc adds a sample read at each scrape to family metric, creating it
// (samples of one name share their HELP and TYPE).
func (r *registry) addFunc(metric, help, kind string, sample funcSample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f, ok := r.families[metric].(*funcFamily); ok {
		f.samples = append(f.samples, sample)
		return
	}
	if _, dup := r.families[metric]; dup {
		panic("bmcmetrics: " + metric + " registered twice")
	}
	r.families[metric] = &funcFamily{header: header{metric, help, kind}, samples: []funcSample{sample}}
}

// ServeHTTP writes every family in the text exposition format.
func (r *registry) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", contentType)
	r.writeTo(w)
}

func (r *registry) writeTo(out io.Writer) {
	r.mu.Lock()
	families := make([]family, 0, len(r.families))
	for _, f := range r.families {
		families = append(families, f)
	}
	r.mu.Unlock()
	slices.SortFunc(families, func(a, b family) int { return cmp.Compare(a.name(), b.name()) })
	w := bufio.NewWriter(out)
	for _, f := range families {
		f.write(w)
	}
	_ = w.Flush() // a scraper that went away
}

// writeSample writes one line: metric, the labels names[i]=values[i] and
// extra=extraValue when extra is not "", and v.
func writeSample(w *bufio.Writer, metric string, names []string, values labelValues, extra, extraValue string, v float64) {
	w.WriteString(metric)
	if len(names) > 0 || extra != "" {
		w.WriteByte('{')
		sep := false
		label := func(name, value string) {
			if sep {
				w.WriteByte(',')
			}
			sep = true
			w.WriteString(name)
			w.WriteString(`="`)
			w.WriteString(escapeLabel(value))
			w.WriteByte('"')
		}
		for i, name := range names {
			label(name, values[i])
		}
		if extra != "" {
			label(extra, extraValue)
		}
		w.WriteByte('}')
	}
	w.WriteByte(' ')
	w.WriteString(formatFloat(v))
	w.WriteByte('\n')
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

func escapeHelp(s string) string  { return helpEscaper.Replace(s) }
func escapeLabel(s string) string { return labelEscaper.Replace(s) }

// sortedKeys are m's label values in order, so scrapes list series alike.
func sortedKeys[V any](m map[labelValues]V) []labelValues {
	keys := make([]labelValues, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b labelValues) int {
		for i := range a {
			if c := cmp.Compare(a[i], b[i]); c != 0 {
				return c
			}
		}
		return 0
	})
	return keys
}
