#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this), on a
# fresh machine: it installs what the tests need and caches it outside the
# repository, then runs vet, every Go test, bounded fuzzing, the benchmarks
# once each (so they cannot rot) and the python tests of the MaaS script.
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${XDG_CACHE_HOME:-$HOME/.cache}/virtmetal
# Fuzzing is bounded by a count of executions, not a duration: with a
# duration, Go 1.26's fuzz coordinator can report a spurious "context
# deadline exceeded" failure as the time runs out (golang/go#75804, fixed in
# Go 1.27). 50,000 executions take a few seconds to half a minute per target.
fuzztime=${FUZZTIME:-50000x}
log() { echo "[test] $(date +%T) $*" >&2; }

# Real IPMI clients for the conformance of ipmi/ (MaaS runs freeipmi).
need_apt=()
command -v ipmitool >/dev/null || need_apt+=(ipmitool)
command -v ipmipower >/dev/null || need_apt+=(freeipmi-tools)
command -v python3 >/dev/null || need_apt+=(python3)
# Ironic's client library for conformance's Ironic flows; they run it with
# Debian's python3, where the package installs (and fail without it under
# CI=true).
/usr/bin/python3 -c 'import sushy' 2>/dev/null || need_apt+=(python3-sushy)
# OpenStack Ironic itself, API and conductor, run standalone on loopback by
# conformance's TestIronicConductor (it fails without them under CI=true).
command -v ironic-conductor >/dev/null || need_apt+=(ironic-conductor)
command -v ironic-api >/dev/null || need_apt+=(ironic-api)
# deploy/'s TestImages builds and reads the images with podman (it fails
# without it under CI=true), from binaries and the host's CA bundle.
command -v podman >/dev/null || need_apt+=(podman)
# The lab runs the BMC pods from that image with runc, as a kubelet's
# runtime would (its TestBMCContainer fails without runc under CI=true).
command -v runc >/dev/null || need_apt+=(runc)
# internal/kubetest/realkubevirt runs KubeVirt in a network namespace of its own.
command -v ip >/dev/null || need_apt+=(iproute2)
[ -f /etc/ssl/certs/ca-certificates.crt ] || need_apt+=(ca-certificates)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing ${need_apt[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

# A real kube-apiserver and etcd for envtest.
if [ -z "${KUBEBUILDER_ASSETS:-}" ]; then
  export KUBEBUILDER_ASSETS="$cache/envtest/1.37.2"
  hack/setup-envtest.sh "$KUBEBUILDER_ASSETS"
fi

# KubeVirt's virt-controller and virt-api, built from the Go module (the
# version of kubevirt.io/api in go.mod). Assigned, then exported, so that a
# failing build stops the run (export VAR=$(...) would hide its status).
if [ -z "${VIRTMETAL_KUBEVIRT_BIN:-}" ]; then
  VIRTMETAL_KUBEVIRT_BIN=$(hack/setup-kubevirt.sh)
  export VIRTMETAL_KUBEVIRT_BIN
fi

export REDFISH_SCHEMA_DIR=${REDFISH_SCHEMA_DIR:-$(cd .. && pwd)/shared/redfish-schemas}

log "go vet"
go vet ./...
# bmclib's client for conformance is a module of its own (conformance/bmclib:
# bmclib needs an older gofish than virtmetal's); its test builds it.
(cd conformance/bmclib && go vet ./...)
# The Helm chart's generator and tests are a module of their own too
# (deploy/helm: Helm's dependencies stay out of virtmetal's module).
(cd deploy/helm && go vet ./...)

log "go test"
go test -count=1 -timeout 40m ./...
(cd deploy/helm && go test -count=1 -timeout 10m ./...)

log "fuzzing each target ($fuzztime)"
# Every FuzzXxx in the tree, found rather than listed, so a new target is
# fuzzed without touching this script.
grep -rl --include='*_test.go' '^func Fuzz' . | while read -r file; do
  pkg=./$(dirname "${file#./}")
  for target in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$file"); do
    log "fuzz $pkg $target"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg"
  done
done

log "benchmarks, one iteration each"
# One package at a time: a figure taken while another package's benchmark
# holds the other core is not the figure docs/benchmarks.md compares.
# Small sizes only: docs/benchmarks.md has the full ones (the shared
# bmc-server from 1 to 2,000 VMs, enrolment of 1,000 and 10,000 VMs, the
# MaaS reconciler's idle cycle over 1,000 and 10,000 machines), minutes to
# an hour of object creation for a run that only keeps the benchmarks from
# rotting. The lab's create-to-Ready and its reference, KubeVirt alone
# making the same power changes, run their own sizes, 1 and 50 VMs, on
# KubeVirt's real control plane: a few minutes.
VIRTMETAL_SHARED_BENCH_VMS=1,10 VIRTMETAL_ENROL_BENCH_VMS=100 VIRTMETAL_IDLE_BENCH_MACHINES=10,100 \
  go test -p 1 -count=1 -run '^$' -bench . -benchtime 1x ./...

log "python tests of the MaaS commissioning script"
python3 -m unittest discover -s deploy/maas -p '*_test.py' -v
