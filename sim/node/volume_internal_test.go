package node

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestVolumeWrite: a volume is laid out as the kubelet lays it out, each
// key a link through ..data; a change swaps ..data to a new folder,
// removes the removed keys' links and the old folder, and leaves nothing
// else behind; the same data again writes nothing.
func TestVolumeWrite(t *testing.T) {
	v := &volume{dir: filepath.Join(t.TempDir(), "credentials"), mode: 0o440, gid: 65532}
	read := func() (map[string]string, []string) {
		t.Helper()
		entries, err := os.ReadDir(v.dir)
		if err != nil {
			t.Fatal(err)
		}
		got, names := map[string]string{}, []string(nil)
		for _, e := range entries {
			names = append(names, e.Name())
			if e.Name()[0] == '.' {
				continue
			}
			path := filepath.Join(v.dir, e.Name())
			if target, err := os.Readlink(path); err != nil || target != filepath.Join("..data", e.Name()) {
				t.Errorf("%s: a link to %q (%v), want one to ..data/%s", e.Name(), target, err, e.Name())
			}
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			got[e.Name()] = string(data)
		}
		return got, names
	}
	if err := v.write(map[string][]byte{"web1": []byte("one"), "web2": []byte("two")}); err != nil {
		t.Fatal(err)
	}
	first := v.timestamp
	info, err := os.Stat(filepath.Join(v.dir, "web1"))
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o440 {
		t.Errorf("web1 has mode %o, want 440", info.Mode().Perm())
	}
	if err := v.write(map[string][]byte{"web1": []byte("one"), "web2": []byte("two")}); err != nil || v.timestamp != first {
		t.Errorf("the same data again: %v, ..data moved from %s to %s; want nothing written", err, first, v.timestamp)
	}
	if err := v.write(map[string][]byte{"web1": []byte("uno"), "web3": []byte("three")}); err != nil {
		t.Fatal(err)
	}
	got, names := read()
	if len(got) != 2 || got["web1"] != "uno" || got["web3"] != "three" {
		t.Errorf("folder shows %v, want web1=uno and web3=three only", got)
	}
	if want := []string{v.timestamp, "..data", "web1", "web3"}; !slices.Equal(names, want) || v.timestamp == first {
		t.Errorf("folder holds %q, want %q (the first folder %s gone)", names, want, first)
	}
}
