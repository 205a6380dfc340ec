// Package certs generates the self-signed TLS certificate a BMC serves when
// no certificate is configured. BMCs ship such certificates and clients
// (MaaS, Ironic) are configured not to verify them.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"time"
)

// SelfSigned returns an ECDSA P-256 certificate for hosts (DNS names or IP
// addresses), valid from now for validFor.
func SelfSigned(hosts []string, validFor time.Duration, now time.Time) (tls.Certificate, error) {
	if len(hosts) == 0 {
		return tls.Certificate{}, errors.New("certs: no host names for the certificate")
	}
	if validFor <= 0 {
		return tls.Certificate{}, fmt.Errorf("certs: validity %v is not positive", validFor)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certs: generating key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certs: generating serial: %w", err)
	}
	template := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"virtmetal"}, CommonName: hosts[0]},
		// Backdated a little so clients with a slightly slow clock accept it.
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validFor),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		// Self-signed: it is its own CA, so clients can pin it as a root.
		IsCA: true,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			template.IPAddresses = append(template.IPAddresses, ip)
		} else {
			template.DNSNames = append(template.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certs: signing: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certs: parsing the new certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// HostsFor lists the names a server listening on addr is reached by: the
// listen host (unless it is a wildcard), localhost and the loopback
// addresses.
func HostsFor(addr string) ([]string, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("certs: listen address %q: %w", addr, err)
	}
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) && !slices.Contains(hosts, host) {
		hosts = append([]string{host}, hosts...)
	}
	return hosts, nil
}
