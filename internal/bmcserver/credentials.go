package bmcserver

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// credentials of the single administrator account.
type credentials struct {
	username  string
	password  string
	generated bool
	source    string // where they came from, for the start-up banner
}

// generatedUsernamePrefix starts a generated account name. The rest is
// random: knowing the username is all RAKP needs to hand out a hash keyed
// by the password (CVE-2013-4786), so it must not be guessable either.
const generatedUsernamePrefix = "bmc-"

// loadCredentials reads the environment or the credentials directory; with
// neither it generates a password. Both at once is refused: which one wins
// would be a guess.
func loadCredentials(getenv func(string) string, dir string) (credentials, error) {
	user, pass := getenv("BMC_USERNAME"), getenv("BMC_PASSWORD")
	fromEnv := user != "" || pass != ""
	switch {
	case fromEnv && dir != "":
		return credentials{}, errors.New("credentials given twice: BMC_USERNAME/BMC_PASSWORD and --credentials-dir; use one")
	case fromEnv:
		if user == "" || pass == "" {
			return credentials{}, errors.New("set both BMC_USERNAME and BMC_PASSWORD, or neither")
		}
		return credentials{username: user, password: pass, source: "BMC_PASSWORD"}, nil
	case dir != "":
		user, err := readSecretFile(dir, "username")
		if err != nil {
			return credentials{}, err
		}
		pass, err := readSecretFile(dir, "password")
		if err != nil {
			return credentials{}, err
		}
		return credentials{username: user, password: pass, source: filepath.Join(dir, "password")}, nil
	}
	// 12 random bytes are 16 characters: 96 bits, and still short enough
	// for IPMI 1.5, whose passwords are at most 16 bytes. The username's 6
	// bytes make 12 characters, 16 with the prefix: IPMI's limit.
	secret := make([]byte, 12+6)
	if _, err := rand.Read(secret); err != nil {
		return credentials{}, fmt.Errorf("generating credentials: %w", err)
	}
	return credentials{
		username:  generatedUsernamePrefix + hex.EncodeToString(secret[12:]),
		password:  base64.RawURLEncoding.EncodeToString(secret[:12]),
		generated: true,
	}, nil
}

// readSecretFile reads one key of a mounted Secret. A trailing newline is
// dropped because files written with echo have one.
func readSecretFile(dir, name string) (string, error) {
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "", fmt.Errorf("credentials: %w", err)
	}
	value := strings.TrimRight(string(data), "\r\n")
	if value == "" {
		return "", fmt.Errorf("credentials: %s is empty", filepath.Join(dir, name))
	}
	return value, nil
}
