package bmcmetrics

import (
	"bufio"
	"bytes"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// The Go runtime's and the process's metrics keep the names, types and
// units Prometheus's client library gives them, so dashboards and alerts
// written for any Go program read them.

// gcPauseQuantiles are the quantiles of go_gc_duration_seconds.
var gcPauseQuantiles = []float64{0, 0.25, 0.5, 0.75, 1}

// goRuntime writes the go_ families from one reading of the runtime.
func goRuntime(w *bufio.Writer) {
	gc := debug.GCStats{PauseQuantiles: make([]time.Duration, len(gcPauseQuantiles))}
	debug.ReadGCStats(&gc)
	header{"go_gc_duration_seconds", "Stop-the-world pauses of the garbage collector.", "summary"}.writeHeader(w)
	for i, q := range gcPauseQuantiles {
		writeSample(w, "go_gc_duration_seconds", nil, labelValues{}, "quantile", formatFloat(q), gc.PauseQuantiles[i].Seconds())
	}
	writeSample(w, "go_gc_duration_seconds_sum", nil, labelValues{}, "", "", gc.PauseTotal.Seconds())
	writeSample(w, "go_gc_duration_seconds_count", nil, labelValues{}, "", "", float64(gc.NumGC))

	writeFamily(w, "go_gc_gogc_percent", "The collector's GOGC percentage (-1: off).", "gauge", gogc())
	writeFamily(w, "go_gc_gomemlimit_bytes", "The runtime's soft memory limit (GOMEMLIMIT).", "gauge", float64(debug.SetMemoryLimit(-1)))
	writeFamily(w, "go_goroutines", "Goroutines that exist now.", "gauge", float64(runtime.NumGoroutine()))
	header{"go_info", "The Go version the program was built with.", "gauge"}.writeHeader(w)
	writeSample(w, "go_info", nil, labelValues{}, "version", runtime.Version(), 1)

	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	for _, s := range []struct {
		name, help, kind string
		value            float64
	}{
		{"alloc_bytes", "Bytes of heap objects allocated and not yet freed.", "gauge", float64(m.Alloc)},
		{"alloc_bytes_total", "Bytes of heap objects allocated since the start.", "counter", float64(m.TotalAlloc)},
		{"buck_hash_sys_bytes", "Bytes of the profiling bucket hash table.", "gauge", float64(m.BuckHashSys)},
		{"frees_total", "Heap objects freed since the start.", "counter", float64(m.Frees)},
		{"gc_sys_bytes", "Bytes of the collector's metadata.", "gauge", float64(m.GCSys)},
		{"heap_alloc_bytes", "Bytes of heap objects allocated and not yet freed.", "gauge", float64(m.HeapAlloc)},
		{"heap_idle_bytes", "Bytes of heap spans holding no object.", "gauge", float64(m.HeapIdle)},
		{"heap_inuse_bytes", "Bytes of heap spans holding at least one object.", "gauge", float64(m.HeapInuse)},
		{"heap_objects", "Heap objects allocated and not yet freed.", "gauge", float64(m.HeapObjects)},
		{"heap_released_bytes", "Bytes of idle heap spans returned to the operating system.", "gauge", float64(m.HeapReleased)},
		{"heap_sys_bytes", "Bytes of heap memory obtained from the operating system.", "gauge", float64(m.HeapSys)},
		{"last_gc_time_seconds", "When the last collection ended, in seconds since the epoch (0: none yet).", "gauge", float64(m.LastGC) / 1e9},
		{"mallocs_total", "Heap objects allocated since the start.", "counter", float64(m.Mallocs)},
		{"mcache_inuse_bytes", "Bytes of mcache structures in use.", "gauge", float64(m.MCacheInuse)},
		{"mcache_sys_bytes", "Bytes of mcache structures obtained from the operating system.", "gauge", float64(m.MCacheSys)},
		{"mspan_inuse_bytes", "Bytes of mspan structures in use.", "gauge", float64(m.MSpanInuse)},
		{"mspan_sys_bytes", "Bytes of mspan structures obtained from the operating system.", "gauge", float64(m.MSpanSys)},
		{"next_gc_bytes", "Heap size at which the next collection starts.", "gauge", float64(m.NextGC)},
		{"other_sys_bytes", "Bytes of other runtime allocations.", "gauge", float64(m.OtherSys)},
		{"stack_inuse_bytes", "Bytes of stack spans in use.", "gauge", float64(m.StackInuse)},
		{"stack_sys_bytes", "Bytes of stack memory obtained from the operating system.", "gauge", float64(m.StackSys)},
		{"sys_bytes", "Bytes of memory obtained from the operating system in all.", "gauge", float64(m.Sys)},
	} {
		writeFamily(w, "go_memstats_"+s.name, s.help, s.kind, s.value)
	}
	writeFamily(w, "go_sched_gomaxprocs_threads", "GOMAXPROCS: threads that may run Go code at once.", "gauge", float64(runtime.GOMAXPROCS(0)))
	threads, _ := runtime.ThreadCreateProfile(nil)
	writeFamily(w, "go_threads", "Operating system threads created.", "gauge", float64(threads))
}

// gogc is the collector's percentage as the runtime took it from GOGC at
// start: bmc-server never sets another (runtime/metrics would say, but
// linking it costs every BMC pod its tables).
func gogc() float64 {
	switch v := os.Getenv("GOGC"); v {
	case "":
		return 100
	case "off":
		return -1
	default:
		n, err := strconv.Atoi(v)
		if err != nil {
			return 100 // the runtime ignores a GOGC it cannot read
		}
		return float64(n)
	}
}

// userHZ is the unit of /proc's CPU times: 100 a second on Linux whatever
// the kernel's tick.
const userHZ = 100

// process writes the process_ families from /proc/self; a figure /proc
// does not give (another system) is left out.
func process(w *bufio.Writer) {
	stat := procStat()
	if stat != nil {
		cpu := (field(stat, 14) + field(stat, 15)) / userHZ
		writeFamily(w, "process_cpu_seconds_total", "User and system CPU time used, in seconds.", "counter", cpu)
	}
	openFiles, addressSpace, limitsOK := procLimits()
	if limitsOK {
		writeFamily(w, "process_max_fds", "The limit on open file descriptors.", "gauge", openFiles)
	}
	if in, out, ok := procNetwork(); ok {
		writeFamily(w, "process_network_receive_bytes_total", "Bytes received by the process's network namespace.", "counter", in)
		writeFamily(w, "process_network_transmit_bytes_total", "Bytes sent by the process's network namespace.", "counter", out)
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		writeFamily(w, "process_open_fds", "Open file descriptors.", "gauge", float64(len(fds)))
	}
	if stat != nil {
		writeFamily(w, "process_resident_memory_bytes", "Resident memory, in bytes.", "gauge", field(stat, 24)*float64(os.Getpagesize()))
		if boot, ok := bootTime(); ok {
			writeFamily(w, "process_start_time_seconds", "When the process started, in seconds since the epoch.", "gauge", boot+field(stat, 22)/userHZ)
		}
		writeFamily(w, "process_virtual_memory_bytes", "Virtual memory, in bytes.", "gauge", field(stat, 23))
	}
	if limitsOK {
		writeFamily(w, "process_virtual_memory_max_bytes", "The limit on virtual memory, in bytes.", "gauge", addressSpace)
	}
}

// procStat is /proc/self/stat's fields from the third on (after the
// command name, which may hold spaces), or nil.
func procStat() []string {
	data, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(data[i+1:]))
}

// field is stat's field n as proc(5) numbers them (1 is the pid).
func field(stat []string, n int) float64 {
	if n-3 >= len(stat) {
		return math.NaN()
	}
	v, err := strconv.ParseFloat(stat[n-3], 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

// procLimits reads the soft limits on open files and on the address
// space; unlimited is the largest uint64, as Prometheus's client reports it.
func procLimits() (openFiles, addressSpace float64, ok bool) {
	data, err := os.ReadFile("/proc/self/limits")
	if err != nil {
		return 0, 0, false
	}
	limit := func(name string) (float64, bool) {
		for line := range strings.Lines(string(data)) {
			rest, found := strings.CutPrefix(line, name)
			if !found {
				continue
			}
			fields := strings.Fields(rest)
			if len(fields) == 0 {
				return 0, false
			}
			if fields[0] == "unlimited" {
				return math.MaxUint64, true
			}
			v, err := strconv.ParseFloat(fields[0], 64)
			return v, err == nil
		}
		return 0, false
	}
	openFiles, okFiles := limit("Max open files")
	addressSpace, okSpace := limit("Max address space")
	return openFiles, addressSpace, okFiles && okSpace
}

// procNetwork reads the octets in and out of the process's network
// namespace from /proc/self/net/netstat's IpExt lines (names, then values).
func procNetwork() (in, out float64, ok bool) {
	data, err := os.ReadFile("/proc/self/net/netstat")
	if err != nil {
		return 0, 0, false
	}
	var names []string
	for line := range strings.Lines(string(data)) {
		rest, found := strings.CutPrefix(line, "IpExt:")
		if !found {
			continue
		}
		fields := strings.Fields(rest)
		if names == nil {
			names = fields
			continue
		}
		var foundIn, foundOut bool
		for i, name := range names {
			if i >= len(fields) {
				break
			}
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				continue
			}
			switch name {
			case "InOctets":
				in, foundIn = v, true
			case "OutOctets":
				out, foundOut = v, true
			}
		}
		return in, out, foundIn && foundOut
	}
	return 0, 0, false
}

// bootTime is when the system booted, in seconds since the epoch, from
// /proc/stat's btime.
func bootTime() (float64, bool) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(data)) {
		if rest, found := strings.CutPrefix(line, "btime "); found {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}
