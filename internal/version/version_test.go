package version

import (
	"runtime/debug"
	"testing"
)

func TestResolve(t *testing.T) {
	withVersion := func(v string) *debug.BuildInfo {
		return &debug.BuildInfo{Main: debug.Module{Path: "github.com/virtmetal/virtmetal", Version: v}}
	}
	tests := []struct {
		name, stamped string
		info          *debug.BuildInfo
		ok            bool
		want          string
	}{
		{"stamped wins", "v0.1.0", withVersion("v0.0.0-20260101000000-0123456789ab"), true, "v0.1.0"},
		{"module version", "", withVersion("v0.2.0"), true, "v0.2.0"},
		{"pseudo-version", "", withVersion("v0.0.0-20260101000000-0123456789ab"), true, "v0.0.0-20260101000000-0123456789ab"},
		{"devel", "", withVersion("(devel)"), true, Dev},
		{"dirty work tree", "", withVersion("v0.0.0-20260101000000-0123456789ab+dirty"), true, Dev},
		{"no module version", "", withVersion(""), true, Dev},
		{"no build info", "", nil, false, Dev},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := resolve(tc.stamped, tc.info, tc.ok); got != tc.want {
				t.Errorf("resolve = %q, want %q", got, tc.want)
			}
		})
	}
}
