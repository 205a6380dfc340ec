#!/usr/bin/env bash
# hack/generate.sh [OUT]: regenerates, from the Go types and markers, the
# deep-copy functions of api/ and the controller's manifests: the CRD, the
# controller's ClusterRole and the webhook configurations, into OUT
# (default deploy/controller). controller-gen is a Go tool of this module
# (go.mod's tool line), so it comes from the module proxy at a pinned version.
# TestGeneratedManifestsAreCurrent runs this into a temporary folder and
# fails when the committed files differ.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-deploy/controller}
if [ "$out" = deploy/controller ]; then
  go tool controller-gen object paths=./api/...
fi
go tool controller-gen \
  crd paths=./api/... output:crd:dir="$out/crd" \
  rbac:roleName=virtmetal-controller paths=./controllers/... output:rbac:dir="$out/rbac" \
  webhook paths=./controllers/... output:webhook:dir="$out/webhook"
