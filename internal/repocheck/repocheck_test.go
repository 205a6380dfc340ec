// Package repocheck holds checks on the repository itself: what git tracks
// must be source, never a built binary or a large blob that every clone
// carries forever.
package repocheck

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// maxTrackedBytes is the largest file the repository may track outside
// largeFileDirs.
const maxTrackedBytes = 1 << 20

// largeFileDirs may hold files over maxTrackedBytes: schema bundles and test
// fixtures, which are data by nature.
var largeFileDirs = []string{"test/crds/", "conformance/testdata/", "redfish/testdata/"}

// binaryMagics are the first bytes of executable formats (ELF, PE, Mach-O
// in both byte orders and its fat form).
var binaryMagics = [][]byte{
	[]byte("\x7fELF"),
	[]byte("MZ"),
	{0xfe, 0xed, 0xfa, 0xce}, {0xfe, 0xed, 0xfa, 0xcf},
	{0xce, 0xfa, 0xed, 0xfe}, {0xcf, 0xfa, 0xed, 0xfe},
	{0xca, 0xfe, 0xba, 0xbe},
}

func TestNoBuiltBinariesOrLargeFiles(t *testing.T) {
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("git rev-parse: %v (the check needs a git checkout)", err)
	}
	top := strings.TrimSpace(string(root))
	out, err := exec.Command("git", "-C", top, "ls-files", "-s", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for _, entry := range bytes.Split(out, []byte{0}) {
		if len(entry) == 0 {
			continue
		}
		// "<mode> <object> <stage>\t<path>"
		meta, path, _ := strings.Cut(string(entry), "\t")
		mode := strings.Fields(meta)[0]
		if problem := checkTracked(filepath.Join(top, path), path, mode == "100755"); problem != "" {
			t.Errorf("%s: %s", path, problem)
		}
	}
}

// checkTracked says what is wrong with a tracked file, or "" when nothing.
// A file deleted in the work tree but still tracked is read from disk only
// when present.
func checkTracked(file, path string, executable bool) string {
	info, err := os.Stat(file)
	if err != nil {
		return ""
	}
	if info.Size() > maxTrackedBytes && !underAny(path, largeFileDirs) {
		return "over 1 MiB; keep large data out of git, or add its folder to largeFileDirs if it is a fixture"
	}
	head := make([]byte, 4)
	f, err := os.Open(file)
	if err != nil {
		return "unreadable: " + err.Error()
	}
	n, _ := f.Read(head)
	f.Close()
	head = head[:n]
	for _, magic := range binaryMagics {
		if bytes.HasPrefix(head, magic) {
			return "a built executable; build it, do not commit it (.gitignore it)"
		}
	}
	if executable && !bytes.HasPrefix(head, []byte("#!")) {
		return "executable but not a script (no #! line)"
	}
	return ""
}

func underAny(path string, dirs []string) bool {
	for _, dir := range dirs {
		if strings.HasPrefix(path, dir) {
			return true
		}
	}
	return false
}

func TestCheckTrackedCatchesWhatItShould(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name       string
		path       string
		data       []byte
		executable bool
		bad        bool
	}{
		{"ELF binary", "bmc-controller", []byte("\x7fELF\x02\x01\x01"), true, true},
		{"PE binary", "tool.exe", []byte("MZ\x90\x00"), false, true},
		{"Mach-O binary", "tool", []byte{0xcf, 0xfa, 0xed, 0xfe, 7}, false, true},
		{"executable without #!", "run", []byte("echo hi\n"), true, true},
		{"script", "hack/test.sh", []byte("#!/usr/bin/env bash\n"), true, false},
		{"large file", "docs/big.md", bytes.Repeat([]byte("a"), maxTrackedBytes+1), false, true},
		{"large fixture", "test/crds/big.yaml", bytes.Repeat([]byte("a"), maxTrackedBytes+1), false, false},
		{"source", "main.go", []byte("package main\n"), false, false},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			file := write(strings.Repeat("f", i+1), tc.data)
			if got := checkTracked(file, tc.path, tc.executable); (got != "") != tc.bad {
				t.Errorf("checkTracked(%s) = %q, want a problem: %v", tc.path, got, tc.bad)
			}
		})
	}
}
