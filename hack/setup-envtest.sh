#!/usr/bin/env bash
# hack/setup-envtest.sh [DEST]
#
# Puts kube-apiserver and etcd for controller-runtime's envtest into DEST
# and prints DEST, for:  export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)
#
# 1. DEST already holds binaries of the wanted versions: nothing to do.
# 2. Otherwise setup-envtest downloads the release binaries (short timeout).
# 3. Where downloads are blocked, the binaries are built from the Go modules:
#    kube-apiserver from k8s.io/kubernetes (its go.mod points the
#    k8s.io/* staging modules at ./staging; those lines are swapped for the
#    published v0.X.Y modules), etcd from go.etcd.io/etcd/server/v3 through a
#    scratch module. Cold, this takes ~15 minutes on 2 cores; the Go build
#    cache makes later runs fast. kubectl, which envtest can also use, is
#    not built: no test runs it, and on 2 cores its build cost minutes of
#    every cold run.
#
# Env: K8S_VERSION (v1.37.2), ETCD_VERSION (v3.7.3), SETUP_ENVTEST_VERSION
#      (release-0.25), DOWNLOAD_TIMEOUT (90s), SRC_CACHE (where the rewritten
#      kubernetes source is kept; default under the user cache dir).
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}
SETUP_ENVTEST_VERSION=${SETUP_ENVTEST_VERSION:-release-0.25}
DOWNLOAD_TIMEOUT=${DOWNLOAD_TIMEOUT:-90s}
CACHE_HOME=${XDG_CACHE_HOME:-$HOME/.cache}
DEST=${1:-$CACHE_HOME/virtmetal/envtest/${K8S_VERSION#v}}
SRC_CACHE=${SRC_CACHE:-$CACHE_HOME/virtmetal/envtest-src}

export GOWORK=off GOFLAGS="-mod=mod -buildvcs=false"
say() { echo "setup-envtest: $*" >&2; }

mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)

# reports BIN EXPECTED ARGS...: DEST/BIN runs and its output mentions EXPECTED.
reports() {
  local bin=$DEST/$1 expected=$2 out
  shift 2
  [ -x "$bin" ] || return 1
  out=$("$bin" "$@" 2>/dev/null) || true # grep -q in a pipe would SIGPIPE it
  grep -qF -- "$expected" <<<"$out"
}

apiserver_ok() { reports kube-apiserver "Kubernetes $K8S_VERSION" --version; }
etcd_ok() { reports etcd "etcd Version: ${ETCD_VERSION#v}" --version; }

if apiserver_ok && [ -x "$DEST/etcd" ]; then
  echo "$DEST"
  exit 0
fi

# --- 2. download with setup-envtest -------------------------------------------
try_download() {
  local store
  store=$(mktemp -d)
  local dir
  if dir=$(timeout "$DOWNLOAD_TIMEOUT" go run "sigs.k8s.io/controller-runtime/tools/setup-envtest@$SETUP_ENVTEST_VERSION" \
      use "${K8S_VERSION#v}" --bin-dir "$store" -p path 2>/dev/null) && [ -x "$dir/kube-apiserver" ]; then
    for b in kube-apiserver etcd; do cp -f "$dir/$b" "$DEST/$b"; done
    rm -rf "$store"
    return 0
  fi
  rm -rf "$store"
  return 1
}

say "trying setup-envtest@$SETUP_ENVTEST_VERSION (timeout $DOWNLOAD_TIMEOUT)"
if try_download && apiserver_ok; then
  say "downloaded into $DEST"
  echo "$DEST"
  exit 0
fi
say "download unavailable; building from the Go modules"

# --- 3. build from modules ----------------------------------------------------
if ! apiserver_ok; then
  src=$SRC_CACHE/kubernetes-$K8S_VERSION
  if [ ! -f "$src/.staging-rewritten" ]; then
    moddir=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -d "$moddir" ] || { say "cannot download k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
    rm -rf "$src" && mkdir -p "$SRC_CACHE" && cp -r "$moddir" "$src" && chmod -R u+w "$src"
    staging=v0.${K8S_VERSION#v1.}
    (
      cd "$src"
      rm -rf vendor go.work go.work.sum
      # Each "k8s.io/x => ./staging/..." replace becomes a require of the
      # published k8s.io/x at the matching v0 tag (when kubernetes requires it).
      awk '/^replace \(/{r=1;next} r&&/^\)/{r=0} r&&$2=="=>"&&$3 ~ /^\.\/staging\//{print $1}' go.mod |
        while read -r mod; do
          go mod edit -dropreplace="$mod"
          if grep -qE "^[[:space:]]+$mod v0\.0\.0$" go.mod; then go mod edit -require="$mod@$staging"; fi
        done
    )
    touch "$src/.staging-rewritten"
  fi
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1"
  ldflags="$ldflags -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
  ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  say "building kube-apiserver $K8S_VERSION"
  (cd "$src" && go build -ldflags "$ldflags" -o "$DEST/.kube-apiserver.new" ./cmd/kube-apiserver)
  mv -f "$DEST/.kube-apiserver.new" "$DEST/kube-apiserver"
fi

if ! etcd_ok; then
  scratch=$SRC_CACHE/etcd-$ETCD_VERSION
  rm -rf "$scratch" && mkdir -p "$scratch"
  say "building etcd $ETCD_VERSION"
  (
    cd "$scratch"
    printf 'module virtmetal.local/etcd\n\ngo 1.24\n' >go.mod
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    go build -ldflags "-s -w" -o "$DEST/.etcd.new" go.etcd.io/etcd/server/v3
  )
  rm -f "$DEST/etcd"
  mv -f "$DEST/.etcd.new" "$DEST/etcd"
fi

apiserver_ok || { say "kube-apiserver in $DEST does not report $K8S_VERSION"; exit 1; }
echo "$DEST"
