// Package version is the version of virtmetal a binary was built as, which
// is also the tag of the images built with it: bmc-controller starts the
// bmc-server image of its own version unless told otherwise.
package version

import (
	"regexp"
	"runtime/debug"
)

// Dev is the version of a build that carries no usable one: neither the
// linker flag below nor a module version that is an image tag (a build
// with -buildvcs=false, or of a modified work tree: "+dirty"). No image is
// published with it, so a dev controller needs --bmc-image, or an image
// built locally with `make images IMAGE_TAG=dev`.
const Dev = "dev"

// stamped is set at link time by hack/images.sh (`make images`):
//
//	go build -ldflags "-X github.com/virtmetal/virtmetal/internal/version.stamped=v0.1.0"
var stamped string

// tag is what an image reference accepts after the colon; a version outside
// it ("(devel)", a "+dirty" build) would make an unpullable image name.
var tag = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// Get returns the version stamped by the build, else the main module's
// version that the go command recorded (go install ...@v0.2.0, a build of
// a tagged commit, or of an untagged one its pseudo-version), else Dev.
func Get() string {
	info, ok := debug.ReadBuildInfo()
	return resolve(stamped, info, ok)
}

func resolve(stamped string, info *debug.BuildInfo, ok bool) string {
	if stamped != "" {
		return stamped
	}
	if ok && tag.MatchString(info.Main.Version) {
		return info.Main.Version
	}
	return Dev
}
