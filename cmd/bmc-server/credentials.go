package main

import (
	"crypto/rand"
	"encoding/base64"
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

// generatedUsername is the account name when no credentials are configured.
const generatedUsername = "admin"

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
	// for IPMI 1.5, whose passwords are at most 16 bytes.
	secret := make([]byte, 12)
	if _, err := rand.Read(secret); err != nil {
		return credentials{}, fmt.Errorf("generating a password: %w", err)
	}
	return credentials{username: generatedUsername, password: base64.RawURLEncoding.EncodeToString(secret), generated: true}, nil
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
