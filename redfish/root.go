package redfish

import (
	"bytes"
	"encoding/xml"
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
	return result{raw: s.metadata, contentType: "application/xml; charset=utf-8"}, nil
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

// CSDL elements of $metadata.
type (
	edmx struct {
		XMLName      xml.Name        `xml:"edmx:Edmx"`
		Namespace    string          `xml:"xmlns:edmx,attr"`
		Version      string          `xml:"Version,attr"`
		References   []edmxReference `xml:"edmx:Reference"`
		DataServices edmxDataServices
	}
	edmxReference struct {
		URI      string        `xml:"Uri,attr"`
		Includes []edmxInclude `xml:"edmx:Include"`
	}
	edmxInclude struct {
		Namespace string `xml:"Namespace,attr"`
		Alias     string `xml:"Alias,attr,omitempty"`
	}
	edmxDataServices struct {
		XMLName xml.Name `xml:"edmx:DataServices"`
		Schema  edmSchema
	}
	edmSchema struct {
		XMLName   xml.Name `xml:"Schema"`
		Namespace string   `xml:"xmlns,attr"`
		Name      string   `xml:"Namespace,attr"`
		Container edmEntityContainer
	}
	edmEntityContainer struct {
		XMLName xml.Name `xml:"EntityContainer"`
		Name    string   `xml:"Name,attr"`
		Extends string   `xml:"Extends,attr"`
	}
)

// metadataDocument is $metadata, built once per process: it depends on
// servedTypes alone, and a bmc-server serving thousands of VMs would
// otherwise hold a copy of its 20 KB per VM.
var metadataDocument = sync.OnceValues(buildMetadataDocument)

// buildMetadataDocument builds $metadata from servedTypes: one reference
// per DMTF CSDL file, including the unversioned and the served versioned
// namespace.
func buildMetadataDocument() ([]byte, error) {
	doc := edmx{
		Namespace: "http://docs.oasis-open.org/odata/ns/edmx",
		Version:   "4.0",
		DataServices: edmxDataServices{Schema: edmSchema{
			Namespace: "http://docs.oasis-open.org/odata/ns/edm",
			Name:      "Service",
			Container: edmEntityContainer{Name: "Service", Extends: typeServiceRoot.versionedNamespace() + ".ServiceContainer"},
		}},
	}
	doc.References = append(doc.References, edmxReference{
		URI:      schemaBase + "RedfishExtensions_v1.xml",
		Includes: []edmxInclude{{Namespace: "RedfishExtensions.v1_0_0", Alias: "Redfish"}},
	})
	for _, t := range servedTypes {
		ref := edmxReference{URI: t.csdlURI(), Includes: []edmxInclude{{Namespace: t.namespace}}}
		if t.version != "" {
			ref.Includes = append(ref.Includes, edmxInclude{Namespace: t.versionedNamespace()})
		}
		doc.References = append(doc.References, ref)
	}
	var buf bytes.Buffer
	buf.WriteString(xml.Header)
	enc := xml.NewEncoder(&buf)
	enc.Indent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	buf.WriteString("\n")
	return bytes.Clone(buf.Bytes()), nil // no spare capacity kept
}
