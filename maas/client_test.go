package maas_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/virtmetal/virtmetal/maas"
	maassim "github.com/virtmetal/virtmetal/sim/maas"
)

func TestParseAPIKey(t *testing.T) {
	tests := []struct {
		in   string
		want maas.APIKey
		ok   bool
	}{
		{"c:t:s", maas.APIKey{Consumer: "c", Token: "t", Secret: "s"}, true},
		{"  c:t:s\n", maas.APIKey{Consumer: "c", Token: "t", Secret: "s"}, true},
		{"c:t", maas.APIKey{}, false},
		{"c:t:s:x", maas.APIKey{}, false},
		{"c::s", maas.APIKey{}, false},
		{"", maas.APIKey{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := maas.ParseAPIKey(tt.in)
			if (err == nil) != tt.ok || got != tt.want {
				t.Fatalf("ParseAPIKey(%q) = %v, %v", tt.in, got, err)
			}
			if err != nil && (!errors.Is(err, maas.ErrInvalidArgument) || (strings.Contains(tt.in, "s") && strings.Contains(err.Error(), tt.in))) {
				t.Errorf("error %q must be ErrInvalidArgument and must not echo the key", err)
			}
		})
	}
}

func TestAPIKeyNeverPrintsSecret(t *testing.T) {
	key := maas.APIKey{Consumer: "c", Token: "t", Secret: "hunter2"}
	for _, format := range []string{"%v", "%s", "%+v", "%#v"} {
		if got := fmt.Sprintf(format, key); strings.Contains(got, "hunter2") {
			t.Errorf("%s prints the secret: %s", format, got)
		}
	}
}

func TestNewClientURLs(t *testing.T) {
	s := maassim.New(t)
	key, _ := maas.ParseAPIKey(maassim.APIKey)
	for _, base := range []string{s.URL(), s.URL() + "/", s.URL() + "/api/2.0", s.URL() + "/api/2.0/"} {
		t.Run(base, func(t *testing.T) {
			c, err := maas.NewClient(base, key, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Machines(context.Background()); err != nil {
				t.Fatalf("Machines via %q: %v", base, err)
			}
		})
	}
	for _, bad := range []string{"", "maas:5240/MAAS", "ftp://maas/MAAS", "http://"} {
		t.Run("bad "+bad, func(t *testing.T) {
			if _, err := maas.NewClient(bad, key, nil); !errors.Is(err, maas.ErrInvalidArgument) {
				t.Fatalf("NewClient(%q) err = %v, want ErrInvalidArgument", bad, err)
			}
		})
	}
}

func TestClientRejectedKey(t *testing.T) {
	s := maassim.New(t)
	c, err := maas.NewClient(s.URL(), maas.APIKey{Consumer: "consumerkey", Token: "tokenkey", Secret: "wrong-secret"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Machines(context.Background())
	if !errors.Is(err, maas.ErrUnauthorized) {
		t.Fatalf("err = %v, want ErrUnauthorized", err)
	}
	if strings.Contains(err.Error(), "wrong-secret") {
		t.Errorf("error leaks the secret: %v", err)
	}
}

func TestClientSendsFreshNonces(t *testing.T) {
	// The simulator refuses a reused nonce, so many requests in the same
	// second only pass with a new nonce each.
	s := maassim.New(t)
	c := s.Client(t)
	for i := range 50 {
		if _, err := c.Machines(context.Background()); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
}

func TestClientCanceledContext(t *testing.T) {
	s := maassim.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Client(t).Machines(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestClientUnreachable(t *testing.T) {
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	key, _ := maas.ParseAPIKey(maassim.APIKey)
	c, err := maas.NewClient(gone.URL+"/MAAS", key, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Machines(context.Background()); !errors.Is(err, maas.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
}
