package schemacheck_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/virtmetal/virtmetal/conformance/schemacheck"
)

func TestBundleDirHonoursEnvironment(t *testing.T) {
	complete := t.TempDir()
	for _, sub := range []string{"json-schema", "csdl"} {
		if err := os.Mkdir(filepath.Join(complete, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	incomplete := t.TempDir()
	if err := os.Mkdir(filepath.Join(incomplete, "json-schema"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		dir     string
		wantErr string
	}{
		{name: "complete bundle", dir: complete},
		{name: "no csdl folder", dir: incomplete, wantErr: "csdl"},
		{name: "missing folder", dir: filepath.Join(complete, "nope"), wantErr: "nope"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("REDFISH_SCHEMA_DIR", tt.dir)
			got, err := schemacheck.BundleDir()
			if tt.wantErr == "" {
				if err != nil || got != tt.dir {
					t.Fatalf("BundleDir() = %q, %v; want %q", got, err, tt.dir)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("BundleDir() = %q, %v; want an error mentioning %q", got, err, tt.wantErr)
			}
		})
	}
}

// stoppingTB records how RequireBundle ends a test; like testing.T it stops
// the calling goroutine on Skip and Fatal.
type stoppingTB struct {
	testing.TB
	ended string
}

func (s *stoppingTB) Helper() {}

func (s *stoppingTB) Skipf(format string, args ...any) {
	s.ended = "skip: " + fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (s *stoppingTB) Fatalf(format string, args ...any) {
	s.ended = "fatal: " + fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestRequireBundleFailsUnlessAllowed(t *testing.T) {
	tests := []struct {
		name, ci, allow, want string
	}{
		{name: "developer", want: "fatal: "},
		{name: "developer who opted out", allow: "1", want: "skip: "},
		{name: "CI", ci: "true", want: "fatal: "},
		{name: "CI ignores the opt-out", ci: "true", allow: "1", want: "fatal: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("REDFISH_SCHEMA_DIR", filepath.Join(t.TempDir(), "missing"))
			t.Setenv("CI", tt.ci)
			t.Setenv("VIRTMETAL_ALLOW_NO_SCHEMAS", tt.allow)
			tb := &stoppingTB{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				schemacheck.RequireBundle(tb)
			}()
			<-done
			if !strings.HasPrefix(tb.ended, tt.want) || !strings.Contains(tb.ended, "missing") {
				t.Fatalf("RequireBundle ended with %q; want %q naming the folder", tb.ended, tt.want)
			}
		})
	}
}
