package bmcserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// rotator is what takes new credentials: the Redfish and IPMI servers.
type rotator func(creds credentials, grace time.Duration) error

// watchCredentials polls dir, a mounted Secret that Kubernetes updates in
// place, and hands changed credentials to every rotator. During grace the
// previous password still works, so MaaS keeps power control while the
// reconciler tells it the new one. A half-written update (a missing or
// empty file) is logged and skipped; the next poll sees the whole one.
func watchCredentials(ctx context.Context, dir string, current credentials, every, grace time.Duration, log logr.Logger, rotators ...rotator) {
	pollUntilDone(ctx, every, func() {
		next, err := loadCredentials(func(string) string { return "" }, dir)
		if err != nil {
			log.Error(err, "cannot read the rotated credentials; keeping the current ones")
			return
		}
		if next.username == current.username && next.password == current.password {
			return
		}
		for _, rotate := range rotators {
			if err := rotate(next, grace); err != nil {
				log.Error(err, "cannot apply the rotated credentials")
			}
		}
		current = next
		log.Info("credentials rotated", "username", next.username, "previousAcceptedFor", grace)
	})
}

// pollUntilDone calls poll every interval until ctx ends: both reloaders
// read their files again rather than wait to be told of a change.
func pollUntilDone(ctx context.Context, every time.Duration, poll func()) {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		poll()
	}
}

// certReloader serves the certificate in certFile/keyFile and picks up a
// renewal (cert-manager rewrites the files) without a restart.
type certReloader struct {
	certFile, keyFile string
	cert              atomic.Pointer[tls.Certificate]
	certPEM, keyPEM   []byte
}

func newCertReloader(certFile, keyFile string) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile}
	if _, err := r.reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// reload reads the files and reports whether the certificate changed; a
// pair that does not load (one file rewritten, not yet the other) keeps
// the current certificate.
func (r *certReloader) reload() (bool, error) {
	certPEM, err := os.ReadFile(r.certFile)
	if err != nil {
		return false, fmt.Errorf("TLS certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(r.keyFile)
	if err != nil {
		return false, fmt.Errorf("TLS key: %w", err)
	}
	if bytes.Equal(certPEM, r.certPEM) && bytes.Equal(keyPEM, r.keyPEM) {
		return false, nil
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return false, fmt.Errorf("TLS certificate: %w", err)
	}
	r.certPEM, r.keyPEM = certPEM, keyPEM
	r.cert.Store(&cert)
	return true, nil
}

func (r *certReloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.cert.Load(), nil
}

// watch polls the files until ctx ends.
func (r *certReloader) watch(ctx context.Context, every time.Duration, log logr.Logger) {
	pollUntilDone(ctx, every, func() {
		switch changed, err := r.reload(); {
		case err != nil:
			log.Error(err, "cannot reload the TLS certificate; serving the current one")
		case changed:
			log.Info("TLS certificate reloaded", "file", r.certFile)
		}
	})
}
