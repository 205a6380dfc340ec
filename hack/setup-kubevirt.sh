#!/usr/bin/env bash
# hack/setup-kubevirt.sh [DEST]
#
# Builds KubeVirt's virt-controller and virt-api into DEST and prints DEST,
# for:  VIRTMETAL_KUBEVIRT_BIN=$(hack/setup-kubevirt.sh); export VIRTMETAL_KUBEVIRT_BIN
# (in one "export X=$(...)" the status of the build would be lost).
#
# 1. DEST already holds both binaries, stamped with the wanted version and
#    the hash of this script and the stand-ins (DEST/.stamp): nothing to do.
# 2. Otherwise they are built, CGO_ENABLED=0, from the Go module
#    kubevirt.io/kubevirt at KUBEVIRT_VERSION. The module's go.mod points
#    kubevirt.io/api and kubevirt.io/client-go at ./staging, which the module
#    zip does not hold: a copy of the source under SRC_CACHE gets those
#    replaces swapped for the published modules of the same version.
#    kubevirt.io/virt-template-api and -client-go, needed only to export a
#    VirtualMachineTemplate, are tried first (short timeout); if they cannot
#    be downloaded, the stand-ins in hack/kubevirt-standins/ replace them.
#    (kubevirt.io/virt-template-engine cannot be downloaded either, but these
#    two binaries do not import it, and a build loads only what it imports.)
#    Cold, this takes several minutes on 2 cores; the Go build cache makes
#    later builds fast.
#
# 3. Beside them, DEST/manifests/ gets what virt-operator would install for
#    them, printed by hack/kubevirt-manifests with virt-operator's own
#    generators: crds.yaml (every KubeVirt CRD), rbac.yaml (ServiceAccounts,
#    Roles and bindings of virt-api, virt-controller, virt-handler and the
#    cluster roles), virt-api.yaml (APIServices, webhook configurations).
#    internal/kubetest/realkubevirt reads them.
#
# Neither binary has a --version flag. The version is linked in where
# KubeVirt's own build puts it (kubevirt.io/client-go/version, which virt-api
# serves at /apis/subresources.kubevirt.io/v1/version; virt-controller does
# not link that package), and DEST/.stamp records the version, the recipe
# hash, the commit, the Go version and whether stand-ins were used.
#
# Env: KUBEVIRT_VERSION (that of kubevirt.io/api in go.mod), DOWNLOAD_TIMEOUT
#      (60s), SRC_CACHE (where the rewritten kubevirt source is kept; default
#      under the user cache dir).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
KUBEVIRT_VERSION=${KUBEVIRT_VERSION:-$(awk '$1 == "kubevirt.io/api" {print $2; exit}' "$repo/go.mod")}
KUBEVIRT_VERSION=${KUBEVIRT_VERSION:-v1.9.0}
DOWNLOAD_TIMEOUT=${DOWNLOAD_TIMEOUT:-60s}
CACHE_HOME=${XDG_CACHE_HOME:-$HOME/.cache}
DEST=${1:-$CACHE_HOME/virtmetal/kubevirt/${KUBEVIRT_VERSION#v}}
SRC_CACHE=${SRC_CACHE:-$CACHE_HOME/virtmetal/kubevirt-src}
STANDINS=$repo/hack/kubevirt-standins
BINARIES=(virt-controller virt-api)
# What hack/kubevirt-manifests prints (virt-operator's generators): the CRDs,
# the RBAC, virt-api's APIServices and webhook configurations.
MANIFESTS=(crds.yaml rbac.yaml virt-api.yaml)

export GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
say() { echo "setup-kubevirt: $*" >&2; }

mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)

# What the binaries are built from: the version, this script and the
# stand-ins. A change to any of them rebuilds.
recipe=$(cd "$repo" && cat hack/setup-kubevirt.sh $(find hack/kubevirt-standins hack/kubevirt-manifests -type f | LC_ALL=C sort) | sha256sum | cut -c1-16)
stamp_prefix="kubevirt $KUBEVIRT_VERSION recipe $recipe"

built_ok() {
  local b
  for b in "${BINARIES[@]}"; do [ -x "$DEST/$b" ] || return 1; done
  for m in "${MANIFESTS[@]}"; do [ -s "$DEST/manifests/$m" ] || return 1; done
  [ -f "$DEST/.stamp" ] && grep -qxF -- "$stamp_prefix" <(cut -d' ' -f1-4 "$DEST/.stamp")
}

if built_ok; then
  echo "$DEST"
  exit 0
fi

# One build at a time per cache (the machine may run CI and a developer).
mkdir -p "$SRC_CACHE"
if command -v flock >/dev/null; then
  exec 9>"$SRC_CACHE/.lock"
  flock 9
  if built_ok; then
    echo "$DEST"
    exit 0
  fi
fi

# --- the source, rewritten ----------------------------------------------------
src=$SRC_CACHE/kubevirt-$KUBEVIRT_VERSION
json=$(go mod download -json "kubevirt.io/kubevirt@$KUBEVIRT_VERSION") || {
  say "cannot download kubevirt.io/kubevirt@$KUBEVIRT_VERSION"
  exit 1
}
field() { sed -n "s/^[[:space:]]*\"$1\": \"\(.*\)\",\{0,1\}\$/\1/p" <<<"$json" | head -1; }
moddir=$(field Dir)
commit=$(field Hash)
info=$(field Info)
build_date=$( ([ -f "$info" ] && sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info") || true)
build_date=${build_date:-1970-01-01T00:00:00Z}
[ -d "$moddir" ] || { say "kubevirt.io/kubevirt@$KUBEVIRT_VERSION has no source directory"; exit 1; }

if [ "$(cat "$src/.rewritten" 2>/dev/null)" != "$recipe" ]; then
  say "preparing the source of kubevirt.io/kubevirt@$KUBEVIRT_VERSION in $src"
  rm -rf "$src" && mkdir -p "$SRC_CACHE" && cp -r "$moddir" "$src" && chmod -R u+w "$src"
  (
    cd "$src"
    rm -rf vendor go.work go.work.sum
    # Each "kubevirt.io/x => ./staging/..." replace becomes a require of the
    # published kubevirt.io/x at the same version.
    awk '/^replace \(/{r=1;next} r&&/^\)/{r=0} r&&$2=="=>"&&$3 ~ /^\.\/staging\//{print $1}' go.mod |
      while read -r mod; do
        go mod edit -dropreplace="$mod" -require="$mod@$KUBEVIRT_VERSION"
      done

    # The virt-template modules, real if they download, else the stand-ins
    # (both, as the stand-in client is written against the stand-in API).
    standins=no
    for mod in kubevirt.io/virt-template-api kubevirt.io/virt-template-client-go; do
      ver=$(awk -v m="$mod" '$1 == m {print $2; exit}' go.mod)
      [ -n "$ver" ] || continue
      if ! timeout "$DOWNLOAD_TIMEOUT" go mod download "$mod@$ver" >/dev/null 2>&1; then
        say "$mod@$ver cannot be downloaded; using the stand-ins in hack/kubevirt-standins"
        standins=yes
      fi
    done
    if [ "$standins" = yes ]; then
      mkdir -p _standins
      for mod in virt-template-api virt-template-client-go; do
        cp -r "$STANDINS/$mod" "_standins/$mod"
        go mod edit -replace="kubevirt.io/$mod=./_standins/$mod"
      done
    fi
    echo "$standins" >.standins
  )
  echo "$recipe" >"$src/.rewritten"
fi
standins=$(cat "$src/.standins")

# --- build ----------------------------------------------------------------------
pkg=kubevirt.io/client-go/version
ldflags="-s -w -X $pkg.gitVersion=$KUBEVIRT_VERSION -X $pkg.gitCommit=$commit"
ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
tmp=$DEST/.build.new
rm -rf "$tmp" && mkdir -p "$tmp"
say "building ${BINARIES[*]} $KUBEVIRT_VERSION (stand-ins: $standins)"
(cd "$src" && nice go build -trimpath -ldflags "$ldflags" -o "$tmp/" "${BINARIES[@]/#/./cmd/}")
# The manifests virt-operator would install, from its own generators: the
# program compiles only inside the kubevirt module, so it is copied there.
mkdir -p "$src/hack/virtmetal-manifests" "$tmp/manifests"
cp "$repo/hack/kubevirt-manifests/main.go" "$src/hack/virtmetal-manifests/main.go"
(cd "$src" && nice go build -trimpath -o "$tmp/kubevirt-manifests" ./hack/virtmetal-manifests/main.go)
(cd "$tmp/manifests" && "$tmp/kubevirt-manifests")
rm -f "$tmp/kubevirt-manifests"
rm -f "$DEST/.stamp"
for b in "${BINARIES[@]}"; do mv -f "$tmp/$b" "$DEST/$b"; done
rm -rf "$DEST/manifests" && mv "$tmp/manifests" "$DEST/manifests"
rmdir "$tmp"
echo "$stamp_prefix standins $standins commit $commit go $(go env GOVERSION)" >"$DEST/.stamp"

built_ok || { say "the binaries in $DEST are not stamped as $stamp_prefix"; exit 1; }
say "built into $DEST"
echo "$DEST"
