package redfish

import (
	"strings"
	"sync"
)

// link is a reference to another resource.
func link(path string) map[string]any { return map[string]any{"@odata.id": path} }

func links(paths ...string) []any {
	list := make([]any, len(paths))
	for i, p := range paths {
		list[i] = link(p)
	}
	return list
}

// resource starts a body with the properties every resource has.
func resource(t schemaType, path, id, name string) map[string]any {
	return map[string]any{
		"@odata.id":   path,
		"@odata.type": t.odataType(),
		"Id":          id,
		"Name":        name,
	}
}

func collection(t schemaType, path, name string, members []string) map[string]any {
	return map[string]any{
		"@odata.id":           path,
		"@odata.type":         t.odataType(),
		"Name":                name,
		"Members":             links(members...),
		"Members@odata.count": len(members),
	}
}

// statusOK is the Status of a resource that exists and works; a VM has no
// sensors that could say otherwise.
func statusOK() map[string]any { return map[string]any{"State": "Enabled", "Health": "OK"} }

func (s *Server) getVersions(*call) (result, error) {
	return result{body: map[string]any{"v1": "/redfish/v1/"}}, nil
}

func (s *Server) getServiceRoot(*call) (result, error) {
	body := resource(typeServiceRoot, "/redfish/v1/", "RootService", "Root Service")
	body["RedfishVersion"] = "1.11.0"
	body["UUID"] = s.serviceUUID
	body["Vendor"] = "virtmetal"
	body["Product"] = "virtmetal BMC"
	body["Systems"] = link("/redfish/v1/Systems")
	body["Managers"] = link("/redfish/v1/Managers")
	body["Chassis"] = link("/redfish/v1/Chassis")
	body["SessionService"] = link("/redfish/v1/SessionService")
	body["AccountService"] = link("/redfish/v1/AccountService")
	body["EventService"] = link(eventServicePath)
	body["Registries"] = link(registriesPath)
	body["Tasks"] = link(taskServicePath)
	body["Links"] = map[string]any{"Sessions": link("/redfish/v1/SessionService/Sessions")}
	// Query parameters are ignored; say so, so clients do not rely on them.
	body["ProtocolFeaturesSupported"] = map[string]any{
		"ExpandQuery":          map[string]any{"ExpandAll": false, "Levels": false, "Links": false, "NoLinks": false},
		"FilterQuery":          false,
		"SelectQuery":          false,
		"OnlyMemberQuery":      false,
		"ExcerptQuery":         false,
		"DeepOperations":       map[string]any{"DeepPATCH": false, "DeepPOST": false},
		"MultipleHTTPRequests": false,
	}
	return result{body: body}, nil
}

func (s *Server) getMetadata(*call) (result, error) {
	return result{raw: metadataDocument(), contentType: "application/xml; charset=utf-8"}, nil
}

// getServiceDocument is the OData service document: the top-level
// resources as singletons.
func (s *Server) getServiceDocument(*call) (result, error) {
	entry := func(name, url string) map[string]any {
		return map[string]any{"name": name, "kind": "Singleton", "url": url}
	}
	return result{body: map[string]any{
		"@odata.context": "/redfish/v1/$metadata",
		"value": []any{
			entry("Service", "/redfish/v1/"),
			entry("Systems", "/redfish/v1/Systems"),
			entry("Managers", "/redfish/v1/Managers"),
			entry("Chassis", "/redfish/v1/Chassis"),
			entry("SessionService", "/redfish/v1/SessionService"),
			entry("AccountService", "/redfish/v1/AccountService"),
			entry("EventService", eventServicePath),
			entry("Tasks", taskServicePath),
			entry("Registries", registriesPath),
			entry("Sessions", "/redfish/v1/SessionService/Sessions"),
		},
	}}, nil
}

// metadataDocument is $metadata, written at its first request and once per
// process: it depends on servedTypes alone, a bmc-server serving thousands
// of VMs would otherwise hold a copy of its 20 KB per VM, and a BMC nobody
// asks for it keeps neither the document nor the code that writes it in
// memory.
var metadataDocument = sync.OnceValue(buildMetadataDocument)

// buildMetadataDocument writes $metadata from servedTypes: one reference
// per DMTF CSDL file, including the unversioned and the served versioned
// namespace. It is written as text, not with encoding/xml: the document is
// a fixed shape of a few elements, and this was the only use of that
// package (and of its reflection) in a BMC's binary.
func buildMetadataDocument() []byte {
	var b strings.Builder
	xmlAttr := strings.NewReplacer(`&`, "&amp;", `<`, "&lt;", `>`, "&gt;", `"`, "&quot;").Replace
	reference := func(uri string) { b.WriteString(`  <edmx:Reference Uri="` + xmlAttr(uri) + "\">\n") }
	include := func(namespace, alias string) {
		b.WriteString(`    <edmx:Include Namespace="` + xmlAttr(namespace) + `"`)
		if alias != "" {
			b.WriteString(` Alias="` + xmlAttr(alias) + `"`)
		}
		b.WriteString("/>\n")
	}
	const endReference = "  </edmx:Reference>\n"

	b.WriteString(`<?xml version="1.0" encoding="UTF-8"?>` + "\n")
	b.WriteString(`<edmx:Edmx xmlns:edmx="http://docs.oasis-open.org/odata/ns/edmx" Version="4.0">` + "\n")
	reference(schemaBase + "RedfishExtensions_v1.xml")
	include("RedfishExtensions.v1_0_0", "Redfish")
	b.WriteString(endReference)
	for _, t := range servedTypes {
		reference(t.csdlURI())
		include(t.namespace, "")
		if t.version != "" {
			include(t.versionedNamespace(), "")
		}
		b.WriteString(endReference)
	}
	b.WriteString("  <edmx:DataServices>\n")
	b.WriteString(`    <Schema xmlns="http://docs.oasis-open.org/odata/ns/edm" Namespace="Service">` + "\n")
	b.WriteString(`      <EntityContainer Name="Service" Extends="` + xmlAttr(typeServiceRoot.versionedNamespace()+".ServiceContainer") + "\"/>\n")
	b.WriteString("    </Schema>\n  </edmx:DataServices>\n</edmx:Edmx>\n")
	return []byte(b.String())
}
