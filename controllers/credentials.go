package controllers

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

// newUsername returns a random user name: a BMC user name that can be
// guessed lets anyone who reaches IPMI collect password hashes (RAKP), so
// it is never "admin".
func newUsername() string { return "bmc-" + randomToken(10) }

// newPassword returns a password of 20 characters (100 bits), the longest
// that IPMI 2.0 (and ipmitool's -P) carries.
func newPassword() string { return randomToken(20) }

var token = base32.StdEncoding.WithPadding(base32.NoPadding)

// randomToken returns n characters of [a-z2-7], safe in URLs, YAML and
// every BMC client's configuration. IPMI limits user names to 16 bytes and
// passwords to 20: callers keep within those.
func randomToken(n int) string {
	b := make([]byte, (n*5+7)/8)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return strings.ToLower(token.EncodeToString(b))[:n]
}
