package bmcserver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadCredentials(t *testing.T) {
	dir := func(files map[string]string) string {
		d := t.TempDir()
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(d, name), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	tests := []struct {
		name     string
		env      map[string]string
		dir      string
		wantUser string
		wantPass string
		wantErr  string
	}{
		{name: "environment", env: map[string]string{"BMC_USERNAME": "maas", "BMC_PASSWORD": "s3cret"}, wantUser: "maas", wantPass: "s3cret"},
		{name: "secret files", dir: dir(map[string]string{"username": "maas\n", "password": "s3cret\n"}), wantUser: "maas", wantPass: "s3cret"},
		{name: "password keeps inner spaces", dir: dir(map[string]string{"username": "maas", "password": " a b "}), wantUser: "maas", wantPass: " a b "},
		{name: "only username in env", env: map[string]string{"BMC_USERNAME": "maas"}, wantErr: "both"},
		{name: "only password in env", env: map[string]string{"BMC_PASSWORD": "x"}, wantErr: "both"},
		{name: "env and dir", env: map[string]string{"BMC_USERNAME": "a", "BMC_PASSWORD": "b"}, dir: dir(map[string]string{"username": "c", "password": "d"}), wantErr: "twice"},
		{name: "missing password file", dir: dir(map[string]string{"username": "maas"}), wantErr: "password"},
		{name: "empty username file", dir: dir(map[string]string{"username": "\n", "password": "x"}), wantErr: "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := loadCredentials(func(k string) string { return tt.env[k] }, tt.dir)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.username != tt.wantUser || got.password != tt.wantPass || got.generated {
				t.Errorf("got %+v, want %s/%s", got, tt.wantUser, tt.wantPass)
			}
		})
	}
}

func TestGeneratedCredentials(t *testing.T) {
	noEnv := func(string) string { return "" }
	a, err := loadCredentials(noEnv, "")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := loadCredentials(noEnv, "")
	// 16 characters of base64 carry 96 random bits and fit IPMI 1.5; the
	// username is random too, and fits IPMI's 16 bytes.
	if !a.generated || !strings.HasPrefix(a.username, "bmc-") || len(a.username) != 16 || len(a.password) != 16 {
		t.Errorf("generated credentials %+v: want bmc-<12 hex> and a 16-character password", a)
	}
	if a.password == b.password || a.username == b.username {
		t.Errorf("two generated credentials share a username or password: %+v %+v", a, b)
	}
}
