package deploy

import (
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// nonRootUID is the user the Dockerfile's images run as.
const nonRootUID = 65532

// TestImages builds the three commands as the Dockerfile does (its go build
// line and its build stage's environment, read from the file so that they
// cannot drift) and checks what the images rely on: each binary is static
// (no interpreter, no shared library: scratch has neither), and starts as the
// images' non-root user in a folder it cannot write to, as with a read-only
// root filesystem. No container engine runs here.
func TestImages(t *testing.T) {
	dockerfile := readFile(t, "../Dockerfile")
	if !regexp.MustCompile(`(?m)^USER 65532:65532$`).MatchString(dockerfile) {
		t.Fatalf("the Dockerfile does not run as %d", nonRootUID)
	}
	for _, m := range regexp.MustCompile(`(?m)^FROM (\S+) AS (\S+)$`).FindAllStringSubmatch(dockerfile, -1) {
		if m[2] != "build" && m[1] != "scratch" && m[1] != "base" {
			t.Errorf("target %s is FROM %s, not scratch", m[2], m[1])
		}
	}
	env := dockerEnv(t, dockerfile)
	if env["CGO_ENABLED"] != "0" {
		t.Fatalf("the build stage sets CGO_ENABLED=%q", env["CGO_ENABLED"])
	}
	line := regexp.MustCompile(`(?m)^RUN (go build .*)$`).FindStringSubmatch(dockerfile)
	if line == nil {
		t.Fatal("no RUN go build line in the Dockerfile")
	}
	args := shellWords(t, line[1])
	if !slices.Contains(args, "-trimpath") {
		t.Errorf("go build %q lacks -trimpath", args)
	}

	out := t.TempDir()
	for i, a := range args {
		if a == "-o" && i+1 < len(args) {
			args[i+1] = out + "/"
		}
	}
	build := exec.Command(args[0], args[1:]...)
	build.Dir = ".."
	build.Env = os.Environ()
	for k, v := range env {
		build.Env = append(build.Env, k+"="+v)
	}
	if msg, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", line[1], err, msg)
	}

	// Only the binaries' folder and its parents let the user in; nothing
	// there is writable by it.
	for _, dir := range []string{filepath.Dir(out), out} {
		if err := os.Chmod(dir, 0o555); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = os.Chmod(out, 0o755)
		_ = os.Chmod(filepath.Dir(out), 0o755)
	})
	for _, name := range []string{"bmc-server", "bmc-controller", "reconciler"} {
		t.Run(name, func(t *testing.T) {
			binary := filepath.Join(out, name)
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
			cmd := exec.Command(binary, "--help")
			cmd.Dir = out
			cmd.Env = []string{"HOME=" + out, "TMPDIR=" + out}
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nonRootUID, Gid: nonRootUID}}
			msg, err := cmd.CombinedOutput()
			// Go's flag package answers --help with the usage and exit
			// status 0 or 2 (flag.ErrHelp), depending on the command.
			var exit *exec.ExitError
			if err != nil && !(errors.As(err, &exit) && exit.ExitCode() <= 2) {
				t.Fatalf("--help as uid %d: %v\n%s", nonRootUID, err, msg)
			}
			if !strings.Contains(string(msg), "Usage of") && !strings.Contains(string(msg), "-help") {
				t.Fatalf("--help as uid %d printed no usage:\n%s", nonRootUID, msg)
			}
		})
	}
}

// dockerEnv is the environment the Dockerfile's build stage sets (ENV lines
// before the first FROM after it).
func dockerEnv(t *testing.T, dockerfile string) map[string]string {
	t.Helper()
	env := map[string]string{}
	inBuild := false
	for _, line := range strings.Split(dockerfile, "\n") {
		switch {
		case strings.HasPrefix(line, "FROM "):
			inBuild = strings.HasSuffix(line, " AS build")
		case inBuild && strings.HasPrefix(line, "ENV "):
			for _, kv := range shellWords(t, strings.TrimPrefix(line, "ENV ")) {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					t.Fatalf("ENV %q: only KEY=VALUE is understood here", kv)
				}
				env[k] = v
			}
		}
	}
	return env
}

// shellWords splits a command line as sh would for what the Dockerfile
// uses: blanks between words, double quotes around parts of a word.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var word strings.Builder
	inWord, quoted := false, false
	for _, r := range line {
		switch {
		case r == '"':
			quoted, inWord = !quoted, true
		case (r == ' ' || r == '\t') && !quoted:
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
		case r == '\\' || r == '\'' || r == '$' || r == '`':
			t.Fatalf("%q: shell syntax beyond double quotes is not understood here", line)
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		t.Fatalf("%q: unterminated quote", line)
	}
	if inWord {
		words = append(words, word.String())
	}
	return words
}
