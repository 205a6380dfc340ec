package redfish

import "github.com/virtmetal/virtmetal/machine"

// The Bios attributes are described by an attribute registry of the
// service's own, so that a client (Ironic through sushy) can tell the
// writable attributes, their values and that a change needs a reset, before
// it writes. It describes every machine the service serves: a value one
// machine's capabilities refuse is still refused by its PATCH.

const (
	registriesPath = "/redfish/v1/Registries"
	// biosRegistryID names the registry, its file and its version, as
	// Bios.AttributeRegistry, which clients match against either.
	biosRegistryID      = "BiosAttributeRegistry.1.0.0"
	biosRegistryName    = "BiosAttributeRegistry.1.0" // MessageRegistryFile.Registry: name.major.minor
	biosRegistryFile    = registriesPath + "/" + biosRegistryID
	biosRegistryDocPath = biosRegistryFile + "/" + biosRegistryID
)

func (s *Server) getRegistries(*call) (result, error) {
	return result{body: collection(typeRegistryFileCollection, registriesPath, "Registry File Collection", []string{biosRegistryFile})}, nil
}

func (s *Server) getBiosRegistryFile(*call) (result, error) {
	body := resource(typeRegistryFile, biosRegistryFile, biosRegistryID, "BIOS Attribute Registry File")
	body["Registry"] = biosRegistryName
	body["Languages"] = []string{"en"}
	body["Location"] = []any{map[string]any{"Language": "en", "Uri": biosRegistryDocPath}}
	return result{body: body}, nil
}

func (s *Server) getBiosRegistry(*call) (result, error) {
	body := resource(typeAttributeRegistry, biosRegistryDocPath, biosRegistryID, "BIOS Attribute Registry")
	body["Language"] = "en"
	body["OwningEntity"] = "virtmetal"
	body["RegistryVersion"] = "1.0.0"
	entries := make([]any, 0, len(biosAttributes))
	for i, a := range biosAttributes {
		entry := map[string]any{
			"AttributeName": a.name,
			"DisplayName":   a.displayName,
			"DisplayOrder":  i + 1,
			"ReadOnly":      a.write == nil,
			"Type":          "Integer",
		}
		if a.write != nil {
			entry["Type"] = "Enumeration"
			entry["ResetRequired"] = true // firmware changes apply at the next boot
			var values []any
			for _, v := range a.allowed(allCapabilities) {
				values = append(values, map[string]any{"ValueName": v, "ValueDisplayName": v})
			}
			entry["Value"] = values
		}
		entries = append(entries, entry)
	}
	body["RegistryEntries"] = map[string]any{"Attributes": entries}
	return result{body: body}, nil
}

// allCapabilities is every value a backend may accept, for the registry.
var allCapabilities = machine.Capabilities{
	BootModes: []machine.BootMode{machine.BootModeUEFI, machine.BootModeLegacy},
}
