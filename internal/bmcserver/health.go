package bmcserver

import (
	"net/http"

	"github.com/virtmetal/virtmetal/machine"
)

// withHealth serves /healthz (the process answers) and /readyz (ready, nil
// when always, says the process can serve) beside next, for any Host: the
// kubelet probes the pod's address. They need no credentials and say
// nothing beyond ok or not: the reason is logged by the backend, not shown
// to whoever probes.
func withHealth(next http.Handler, readiness machine.Readiness) http.Handler {
	ready := func() error { return nil }
	if readiness != nil {
		ready = readiness.Ready
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		plain(w, http.StatusOK, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready() != nil {
			plain(w, http.StatusServiceUnavailable, "not ready\n")
			return
		}
		plain(w, http.StatusOK, "ok\n")
	})
	mux.Handle("/", next)
	return mux
}

func plain(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}
