package deploy

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/virtmetal/virtmetal/sim/node"
)

// nonRootUID is the user the Dockerfile's images run as.
const nonRootUID = 65532

// imageSizeLimits bound each image, in bytes: about 1.5 times what they
// measured when set (bmc-server 21.1 MB, bmc-controller 45.1 MB,
// reconciler 30.4 MB), so that a dependency that bloats a binary is seen.
var imageSizeLimits = map[string]int64{
	"bmc-server":     32 << 20,
	"bmc-controller": 64 << 20,
	"reconciler":     48 << 20,
}

// imageFiles are the files each image holds, and nothing else: its binary,
// and the CA bundle for the two that verify TLS servers.
var imageFiles = map[string][]string{
	"bmc-server":     {"bmc-server", "etc/ssl/certs/ca-certificates.crt"},
	"bmc-controller": {"bmc-controller"},
	"reconciler":     {"etc/ssl/certs/ca-certificates.crt", "reconciler"},
}

// TestImages builds the images as `make images` does (hack/images.sh, with
// the Makefile's names and tag) and checks what they rely on and promise:
// each binary is static (scratch has no libc) and starts as the images'
// user in a folder it cannot write to, as with a read-only root filesystem;
// bmc-controller's default bmc-server image is the one built beside it; and
// each image, read with podman without running it, has that user and the
// binary as entrypoint, holds no shell nor any other file, and stays small.
// Without podman only the binaries are checked, and under CI=true that
// fails: hack/test.sh installs podman.
func TestImages(t *testing.T) {
	dockerfile := readFile(t, "../Dockerfile")
	// Every stage is scratch: a build pulls nothing and runs nothing.
	stages := regexp.MustCompile(`(?m)^FROM (\S+) AS (\S+)$`).FindAllStringSubmatch(dockerfile, -1)
	for _, m := range stages {
		if m[1] != "scratch" {
			t.Errorf("target %s is FROM %s, not scratch", m[2], m[1])
		}
	}
	if regexp.MustCompile(`(?m)^RUN `).MatchString(dockerfile) {
		t.Error("the Dockerfile RUNs a command: scratch has no shell, and builds run no container")
	}
	makefile := readFile(t, "../Makefile")
	prefix, tag := makeVariable(t, makefile, "IMAGE_PREFIX"), makeVariable(t, makefile, "IMAGE_TAG")
	images := strings.Fields(makeVariable(t, makefile, "IMAGES"))

	// With podman, the script builds the images in a store of the test's
	// own; without, it builds the binaries only.
	podman, missing := exec.LookPath("podman")
	engine, store := "none", []string(nil)
	if missing == nil {
		engine, store = podman, podmanStore(t)
	}
	buildContext := t.TempDir()
	script := exec.Command("../hack/images.sh")
	script.Env = append(os.Environ(), "IMAGE_PREFIX="+prefix, "IMAGE_TAG="+tag, "IMAGES="+strings.Join(images, " "),
		"IMAGES_CONTEXT="+buildContext, "CONTAINER_ENGINE="+engine)
	script.Env = append(script.Env, store...)
	if out, err := script.CombinedOutput(); err != nil {
		t.Fatalf("hack/images.sh: %v\n%s", err, out)
	}

	// The controller stamped with the tag starts the bmc-server image of
	// that tag: the one built with it.
	usage, _ := exec.Command(filepath.Join(buildContext, "bmc-controller"), "--help").CombinedOutput()
	if want := `(default "` + prefix + "/bmc-server:" + tag + `")`; !strings.Contains(string(usage), want) {
		t.Errorf("bmc-controller --help lacks %s:\n%s", want, usage)
	}

	t.Run("images", func(t *testing.T) {
		switch {
		case missing != nil && os.Getenv("CI") == "true":
			t.Fatalf("%v: under CI the images must be built and checked (hack/test.sh installs podman)", missing)
		case missing != nil:
			t.Skipf("%v: the images are not built nor checked (apt-get install podman)", missing)
		}
		run := func(args ...string) []byte {
			t.Helper()
			cmd := exec.Command(podman, args...)
			cmd.Env = append(os.Environ(), store...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
			}
			return out
		}
		for _, name := range images {
			t.Run(name, func(t *testing.T) {
				checkImage(t, run, name, prefix+"/"+name+":"+tag, filepath.Join(buildContext, name))
			})
		}
	})

	t.Run("binaries", func(t *testing.T) {
		// Only the binaries' folder and its parents let the user in;
		// nothing there is writable by it.
		for _, dir := range []string{filepath.Dir(buildContext), buildContext} {
			if err := os.Chmod(dir, 0o555); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			_ = os.Chmod(buildContext, 0o755)
			_ = os.Chmod(filepath.Dir(buildContext), 0o755)
		})
		for _, name := range images {
			t.Run(name, func(t *testing.T) { checkBinary(t, filepath.Join(buildContext, name)) })
		}
	})
}

// checkBinary: binary is static, and answers --help as the images' user in
// its own, read-only folder.
func checkBinary(t *testing.T, binary string) {
	f, err := elf.Open(binary)
	if err != nil {
		t.Fatal(err)
	}
	libs, err := f.ImportedLibraries()
	f.Close()
	if err != nil || len(libs) > 0 {
		t.Errorf("links %v (%v): not static", libs, err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("has an ELF interpreter: not static")
		}
	}
	dir := filepath.Dir(binary)
	cmd := exec.Command(binary, "--help")
	cmd.Dir = dir
	cmd.Env = []string{"HOME=" + dir, "TMPDIR=" + dir}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nonRootUID, Gid: nonRootUID}}
	msg, err := cmd.CombinedOutput()
	// Go's flag package answers --help with the usage and exit status 0
	// or 2 (flag.ErrHelp), depending on the command.
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() <= 2) {
		t.Fatalf("--help as uid %d: %v\n%s", nonRootUID, err, msg)
	}
	if !strings.Contains(string(msg), "Usage of") && !strings.Contains(string(msg), "-help") {
		t.Fatalf("--help as uid %d printed no usage:\n%s", nonRootUID, msg)
	}
}

// podmanStore is the environment that gives podman a store of its own in
// a temporary folder, the one the lab's node runs the BMC pods from
// (node.PodmanStore: vfs, configured there and nowhere else). Builds need
// no network: nothing is pulled and nothing is run.
func podmanStore(t *testing.T) []string {
	env, err := node.PodmanStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	removeBlobInfoCache(t)
	return env
}

// removeBlobInfoCache removes, after the test, what podman as root writes
// outside its store whatever it is told: its cache of blob digests in
// /var/lib/containers/cache. Only what was not there before goes, so that
// the cache of anyone else's podman stays.
func removeBlobInfoCache(t *testing.T) {
	if os.Geteuid() != 0 {
		return
	}
	var added []string
	for _, p := range []string{"/var/lib/containers", "/var/lib/containers/cache", "/var/lib/containers/cache/blob-info-cache-v1.boltdb"} {
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			added = append(added, p)
		}
	}
	t.Cleanup(func() {
		// The file first; a folder that holds something else stays.
		for _, p := range slices.Backward(added) {
			_ = os.Remove(p)
		}
	})
}

// checkImage reads image ref of Dockerfile target name with podman: its
// configuration (inspect) and its files (save, which exports the layers
// without creating a container), against binary, the file it was built
// from.
func checkImage(t *testing.T, podman func(...string) []byte, name, ref, binary string) {
	var inspected []struct {
		Size   int64
		Os     string
		Config struct {
			User       string
			Entrypoint []string
			Cmd        []string
		}
	}
	if err := json.Unmarshal(podman("image", "inspect", ref), &inspected); err != nil || len(inspected) != 1 {
		t.Fatalf("podman image inspect %s: %v (%d images)", ref, err, len(inspected))
	}
	image := inspected[0]
	t.Logf("%s: %.1f MB", ref, float64(image.Size)/1e6)
	if want := "65532:65532"; image.Config.User != want {
		t.Errorf("user %q, want %q", image.Config.User, want)
	}
	if want := []string{"/" + name}; !slices.Equal(image.Config.Entrypoint, want) || len(image.Config.Cmd) > 0 {
		t.Errorf("entrypoint %q, cmd %q: want entrypoint %q alone", image.Config.Entrypoint, image.Config.Cmd, want)
	}
	if image.Os != "linux" {
		t.Errorf("os %q", image.Os)
	}
	if limit := imageSizeLimits[name]; limit == 0 || image.Size > limit {
		t.Errorf("%d bytes, over the %d of imageSizeLimits", image.Size, limit)
	}

	archive := filepath.Join(t.TempDir(), "image.tar")
	podman("save", "--format", "docker-archive", "--output", archive, ref)
	files := imageContent(t, archive)
	var regular []string
	for p, f := range files {
		if f.typeflag != tar.TypeDir {
			regular = append(regular, p)
		}
	}
	slices.Sort(regular)
	if !slices.Equal(regular, imageFiles[name]) {
		t.Errorf("files %q, want %q", regular, imageFiles[name])
	}
	for _, shell := range []string{"bin/sh", "usr/bin/sh", "bin/busybox"} {
		if _, ok := files[shell]; ok {
			t.Errorf("holds %s", shell)
		}
	}
	want, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	entry := files[name]
	// Root's, and the user may run it but not change it.
	if entry.sum != sha256.Sum256(want) || entry.uid != 0 || entry.mode&0o005 != 0o005 || entry.mode&0o022 != 0 {
		t.Errorf("/%s: uid %d, mode %o, same as %s: %v", name, entry.uid, entry.mode, binary, entry.sum == sha256.Sum256(want))
	}
}

type imageFile struct {
	typeflag byte
	uid      int
	mode     int64
	sum      [sha256.Size]byte
}

// imageContent reads a docker-archive: the files of its image's layers,
// by path without the leading slash.
func imageContent(t *testing.T, archive string) map[string]imageFile {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	members := map[string][]byte{}
	for r := tar.NewReader(f); ; {
		h, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
		if h.Typeflag == tar.TypeReg {
			if members[path.Clean(h.Name)], err = io.ReadAll(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	var manifest []struct{ Layers []string }
	if err := json.Unmarshal(members["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("manifest.json: %v (%d images)", err, len(manifest))
	}
	files := map[string]imageFile{}
	for _, layer := range manifest[0].Layers {
		data, ok := members[path.Clean(layer)]
		if !ok {
			t.Fatalf("layer %s is not a file of the archive", layer)
		}
		for r := tar.NewReader(bytes.NewReader(data)); ; {
			h, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("layer %s: %v", layer, err)
			}
			if strings.HasPrefix(path.Base(h.Name), ".wh.") {
				t.Errorf("layer %s removes %s: the images only add files", layer, h.Name)
			}
			content, err := io.ReadAll(r)
			if err != nil {
				t.Fatal(err)
			}
			name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
			files[name] = imageFile{typeflag: h.Typeflag, uid: h.Uid, mode: h.Mode, sum: sha256.Sum256(content)}
		}
	}
	delete(files, "")
	return files
}
