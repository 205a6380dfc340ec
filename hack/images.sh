#!/usr/bin/env bash
# Builds virtmetal's images (`make images` runs this with the Makefile's
# variables): the commands of $IMAGES as static binaries by the local Go,
# stamped with $IMAGE_TAG as their version, then each Dockerfile target of
# that name from them, tagged $IMAGE_PREFIX/NAME:$IMAGE_TAG.
#
#   CONTAINER_ENGINE  the engine command, flags allowed ("podman --root DIR");
#                     by default podman, else docker. "none" stops after
#                     filling the build context.
#   IMAGES_CONTEXT    the build context to fill (default dist/images).
#
# The binaries are built here rather than in a golang build stage, so that
# building an image pulls nothing: every stage is FROM scratch.
set -euo pipefail
cd "$(dirname "$0")/.."

: "${IMAGE_PREFIX:?IMAGE_PREFIX is unset (make images sets it)}"
: "${IMAGE_TAG:?IMAGE_TAG is unset (make images sets it)}"
: "${IMAGES:?IMAGES is unset (make images sets it)}"
# The tag is also the version stamped into the binaries, which
# bmc-controller makes an image name of.
if ! [[ $IMAGE_TAG =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]]; then
  echo "images: IMAGE_TAG $IMAGE_TAG is not an image tag" >&2
  exit 1
fi
context=${IMAGES_CONTEXT:-dist/images}
engine=${CONTAINER_ENGINE:-}
if [ -z "$engine" ]; then
  # podman first: it needs no daemon, and a docker client without one is
  # common.
  engine=$(command -v podman || command -v docker || true)
  if [ -z "$engine" ]; then
    echo "images: no container engine: install podman or docker, or set CONTAINER_ENGINE" >&2
    exit 1
  fi
fi
log() { echo "[images] $*" >&2; }

mkdir -p "$context"
packages=()
for image in $IMAGES; do packages+=("./cmd/$image"); done
log "go build ${packages[*]} (version $IMAGE_TAG) into $context"
# Static (scratch has no libc), without local paths, stripped. The version
# is stamped, so VCS stamping is off: it fails in a checkout that git does
# not trust (safe.directory), as a CI runner's often is.
CGO_ENABLED=0 GOOS=linux go build -trimpath -buildvcs=false \
  -ldflags "-s -w -X github.com/virtmetal/virtmetal/internal/version.stamped=$IMAGE_TAG" \
  -o "$context/" "${packages[@]}"
# The CA bundle of the images that make TLS connections (Dockerfile).
ca=/etc/ssl/certs/ca-certificates.crt
if [ ! -f "$ca" ]; then
  echo "images: no $ca: install ca-certificates" >&2
  exit 1
fi
install -m 0644 "$ca" "$context/ca-certificates.crt"

[ "$engine" = none ] && exit 0
for image in $IMAGES; do
  log "$engine build --target $image -t $IMAGE_PREFIX/$image:$IMAGE_TAG"
  # $engine unquoted: it may carry flags.
  $engine build -f Dockerfile --target "$image" -t "$IMAGE_PREFIX/$image:$IMAGE_TAG" "$context"
done
