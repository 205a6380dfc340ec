package metricsserver_test

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/virtmetal/virtmetal/internal/metricsserver"
	"github.com/virtmetal/virtmetal/internal/poll"
)

func TestServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := metricsserver.Serve(ctx, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "up 1\n")
	}))
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + addr.String()
	tests := []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/metrics", http.StatusOK},
		{http.MethodPost, "/metrics", http.StatusMethodNotAllowed},
		{http.MethodGet, "/redfish/v1", http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, base+tt.path, nil)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != tt.want {
				t.Errorf("%d, want %d", res.StatusCode, tt.want)
			}
		})
	}
	if _, err := metricsserver.Serve(ctx, addr.String(), http.NotFoundHandler()); err == nil {
		t.Error("a second server on a taken address did not fail")
	}
	cancel()
	poll.True(t, "no longer serving once the context ended", func() bool {
		res, err := http.Get(base + "/metrics")
		if err != nil {
			return true
		}
		res.Body.Close()
		return false
	})
}
