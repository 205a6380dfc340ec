package ceiling_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/virtmetal/virtmetal/internal/ceiling"
)

func TestHandler(t *testing.T) {
	if n := len(ceiling.Body); n < 1350 || n > 1450 || !json.Valid(ceiling.Body) {
		t.Fatalf("Body is %d bytes, valid JSON %v; want 1.4 KB of JSON", n, json.Valid(ceiling.Body))
	}
	h := ceiling.Handler("user", "pass")
	for _, tt := range []struct {
		name, user, pass string
		want             int
	}{
		{"right credentials", "user", "pass", http.StatusOK},
		{"wrong password", "user", "nope", http.StatusUnauthorized},
		{"wrong user", "other", "pass", http.StatusUnauthorized},
		{"none", "", "", http.StatusUnauthorized},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			if tt.user != "" {
				req.SetBasicAuth(tt.user, tt.pass)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.want || tt.want == http.StatusOK && rec.Body.Len() != len(ceiling.Body) {
				t.Fatalf("status %d, %d bytes; want %d", rec.Code, rec.Body.Len(), tt.want)
			}
		})
	}
}
