// Package controller embeds the controller's generated manifests (hack/generate.sh
// writes them from api/ and controllers/), so tests install exactly what
// deploy/ installs.
package controller

import (
	"embed"
	"io/fs"
	"os"
	"path/filepath"
)

// CRDs holds crd/*.yaml: the VirtualMachineBMC CRD.
//
//go:embed crd/*.yaml
var CRDs embed.FS

// Webhooks holds webhook/*.yaml: the mutating and validating webhook
// configurations for VirtualMachines.
//
//go:embed webhook/*.yaml
var Webhooks embed.FS

// WriteWebhooks copies the webhook configurations into dir, for envtest,
// which reads them from files (kubetest.Options.WebhookPaths).
func WriteWebhooks(dir string) error {
	files, err := fs.Glob(Webhooks, "webhook/*.yaml")
	if err != nil {
		return err
	}
	for _, name := range files {
		data, err := Webhooks.ReadFile(name)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(name)), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
