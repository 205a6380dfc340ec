package certs_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"slices"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/internal/certs"
)

func TestSelfSigned(t *testing.T) {
	now := time.Now()
	cert, err := certs.SelfSigned([]string{"bmc.example", "127.0.0.1", "::1"}, 24*time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	key, ok := cert.PrivateKey.(*ecdsa.PrivateKey)
	if !ok || key.Curve != elliptic.P256() {
		t.Fatalf("key is %T, want ECDSA P-256", cert.PrivateKey)
	}
	leaf := cert.Leaf
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	tests := []struct {
		name    string
		host    string
		at      time.Time
		wantErr bool
	}{
		{"DNS name", "bmc.example", now, false},
		{"IPv4 loopback", "127.0.0.1", now, false},
		{"IPv6 loopback", "::1", now, false},
		{"other name", "evil.example", now, true},
		{"expired", "bmc.example", now.Add(25 * time.Hour), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := leaf.Verify(x509.VerifyOptions{DNSName: tt.host, Roots: roots, CurrentTime: tt.at})
			if (err != nil) != tt.wantErr {
				t.Errorf("Verify(%s) error = %v, wantErr %v", tt.host, err, tt.wantErr)
			}
		})
	}
}

func TestSelfSignedRejectsBadInput(t *testing.T) {
	if _, err := certs.SelfSigned(nil, time.Hour, time.Now()); err == nil {
		t.Error("no hosts: want an error")
	}
	if _, err := certs.SelfSigned([]string{"a"}, 0, time.Now()); err == nil {
		t.Error("zero validity: want an error")
	}
}

func TestHostsFor(t *testing.T) {
	tests := []struct {
		addr    string
		want    []string
		wantErr bool
	}{
		{"127.0.0.1:8443", []string{"localhost", "127.0.0.1", "::1"}, false},
		{"10.1.2.3:8443", []string{"10.1.2.3", "localhost", "127.0.0.1", "::1"}, false},
		{"bmc.example:443", []string{"bmc.example", "localhost", "127.0.0.1", "::1"}, false},
		{"0.0.0.0:8443", []string{"localhost", "127.0.0.1", "::1"}, false},
		{"[::]:8443", []string{"localhost", "127.0.0.1", "::1"}, false},
		{":8443", []string{"localhost", "127.0.0.1", "::1"}, false},
		{"no-port", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			got, err := certs.HostsFor(tt.addr)
			if (err != nil) != tt.wantErr {
				t.Fatalf("error = %v, wantErr %v", err, tt.wantErr)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("HostsFor(%q) = %v, want %v", tt.addr, got, tt.want)
			}
		})
	}
}
