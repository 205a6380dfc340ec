// Package controller embeds the controller's generated manifests (hack/generate.sh
// writes them from api/ and controllers/), so tests install exactly what
// deploy/ installs.
package controller

import "embed"

// CRDs holds crd/*.yaml: the VirtualMachineBMC CRD.
//
//go:embed crd/*.yaml
var CRDs embed.FS
