package node

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSecretVolumeWrite: a Secret's change rewrites the changed files only,
// each replaced whole by a rename, removes the removed keys and leaves no
// temporary file behind.
func TestSecretVolumeWrite(t *testing.T) {
	v := &secretVolume{dir: t.TempDir()}
	if err := v.write(map[string][]byte{"web1": []byte("one"), "web2": []byte("two")}); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(filepath.Join(v.dir, "web1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := v.write(map[string][]byte{"web1": []byte("one"), "web3": []byte("three")}); err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(filepath.Join(v.dir, "web1"))
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) {
		t.Error("the unchanged file was rewritten")
	}
	entries, err := os.ReadDir(v.dir)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(v.dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		got[e.Name()] = string(data)
	}
	if len(got) != 2 || got["web1"] != "one" || got["web3"] != "three" {
		t.Errorf("folder holds %v, want web1=one and web3=three only", got)
	}
}
