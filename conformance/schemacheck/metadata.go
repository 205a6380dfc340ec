package schemacheck

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
)

const (
	metadataPath = "/redfish/v1/$metadata"
)

type edmxDocument struct {
	XMLName      xml.Name        `xml:"http://docs.oasis-open.org/odata/ns/edmx Edmx"`
	Version      string          `xml:"Version,attr"`
	References   []edmxReference `xml:"http://docs.oasis-open.org/odata/ns/edmx Reference"`
	DataServices struct {
		Schemas []struct {
			Namespace string `xml:"Namespace,attr"`
		} `xml:"http://docs.oasis-open.org/odata/ns/edm Schema"`
	} `xml:"http://docs.oasis-open.org/odata/ns/edmx DataServices"`
}

type edmxReference struct {
	URI      string `xml:"Uri,attr"`
	Includes []struct {
		Namespace string `xml:"Namespace,attr"`
	} `xml:"http://docs.oasis-open.org/odata/ns/edmx Include"`
}

// CheckMetadata fetches /redfish/v1/$metadata and checks it with
// MetadataViolations against the CSDL folder and the @odata.type values a
// crawl found.
func (c *Crawler) CheckMetadata(ctx context.Context, csdlDir string, odataTypes []string) ([]Violation, error) {
	resp, body, err := c.get(ctx, metadataPath)
	if err != nil {
		return nil, err
	}
	violations := responseViolations(metadataPath, resp, "application/xml", false)
	if resp.StatusCode != http.StatusOK {
		return violations, nil
	}
	more, err := MetadataViolations(metadataPath, body, csdlDir, odataTypes)
	return append(violations, more...), err
}

// MetadataViolations checks a $metadata document: every edmx:Reference Uri
// must name a CSDL file of csdlDir that declares each namespace the
// reference includes, and the namespace of every given @odata.type must be
// included. An error means csdlDir itself could not be read.
func MetadataViolations(uri string, body []byte, csdlDir string, odataTypes []string) ([]Violation, error) {
	var doc edmxDocument
	if err := xml.NewDecoder(bytes.NewReader(body)).Decode(&doc); err != nil {
		return []Violation{{URI: uri, Schema: "CSDL", Message: "not an edmx:Edmx XML document: " + err.Error()}}, nil
	}
	var violations []Violation
	if doc.Version != "4.0" {
		violations = append(violations, Violation{URI: uri, Schema: "CSDL edmx:Edmx", Message: fmt.Sprintf("Version is %q, want \"4.0\"", doc.Version)})
	}
	included := map[string]bool{}
	for i, ref := range doc.References {
		where := fmt.Sprintf("edmx:Reference[%d] Uri=%q", i+1, ref.URI)
		declared, violation, err := csdlNamespaces(csdlDir, ref.URI)
		if err != nil {
			return nil, err
		}
		if violation != "" {
			violations = append(violations, Violation{URI: uri, Schema: "CSDL edmx:Reference", Message: where + ": " + violation})
		}
		for _, include := range ref.Includes {
			included[include.Namespace] = true
			if declared != nil && !declared[include.Namespace] {
				violations = append(violations, Violation{
					URI: uri, Schema: "CSDL edmx:Include",
					Message: fmt.Sprintf("%s includes Namespace %q, which %s does not declare", where, include.Namespace, path.Base(ref.URI)),
				})
			}
		}
	}
	for _, typ := range odataTypes {
		namespace := typeNamespace(typ)
		if !included[namespace] {
			violations = append(violations, Violation{
				URI: uri, Schema: "CSDL edmx:Include",
				Message: fmt.Sprintf("no edmx:Include of Namespace %q, used by @odata.type %q", namespace, typ),
			})
		}
	}
	return violations, nil
}

// csdlNamespaces reads the CSDL file a reference URI names and returns the
// namespaces it declares; a URI naming no file of the bundle is a violation.
func csdlNamespaces(csdlDir, refURI string) (map[string]bool, string, error) {
	parsed, err := url.Parse(refURI)
	if err != nil || parsed.Path == "" {
		return nil, "Uri is not a URL", nil
	}
	name := path.Base(parsed.Path)
	data, err := os.ReadFile(filepath.Join(csdlDir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Sprintf("names %s, which is not a CSDL file of the DMTF bundle", name), nil
	}
	if err != nil {
		return nil, "", err
	}
	var csdl edmxDocument
	if err := xml.Unmarshal(data, &csdl); err != nil {
		return nil, "", fmt.Errorf("bundle CSDL %s: %w", name, err)
	}
	declared := map[string]bool{}
	for _, schema := range csdl.DataServices.Schemas {
		declared[schema.Namespace] = true
	}
	return declared, "", nil
}

// typeNamespace is the namespace of "#Namespace.Type".
func typeNamespace(odataType string) string {
	trimmed := strings.TrimPrefix(odataType, "#")
	if i := strings.LastIndex(trimmed, "."); i >= 0 {
		return trimmed[:i]
	}
	return trimmed
}
