// Package schemacheck checks a Redfish service against the DMTF schema bundle
// (DSP8010): it validates bodies against the JSON schema of their
// @odata.type, crawls every resource reachable from the service root, and
// checks $metadata against the CSDL files. It works offline: schemas come
// only from the local bundle folder.
package schemacheck

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// Violation is one way a response breaks the Redfish rules.
type Violation struct {
	// URI is the path that was fetched.
	URI string
	// Schema is the schema keyword that failed, as file#/json/pointer
	// (file names relative to the DMTF schema prefix), or for a protocol
	// rule the rule's name, such as "header ETag".
	Schema string
	// Pointer is the JSON pointer of the offending value in the body; ""
	// means the body (or the response) as a whole.
	Pointer string
	// Message says what is wrong and, for schema errors, what the schema wants.
	Message string
}

func (v Violation) String() string {
	pointer := v.Pointer
	if pointer == "" {
		pointer = "(body)"
	}
	return fmt.Sprintf("%s %s: %s [%s]", v.URI, pointer, v.Message, v.Schema)
}

// odataType is "#Namespace.Type" where Namespace is "Name" or "Name.vX_Y_Z".
var odataType = regexp.MustCompile(`^#([A-Za-z][A-Za-z0-9]*)(\.v\d+_\d+_\d+)?\.([A-Za-z][A-Za-z0-9]*)$`)

// Validator validates Redfish bodies against the JSON schemas of one bundle.
// It is safe for concurrent use.
type Validator struct {
	loader   *bundleLoader
	mu       sync.Mutex
	compiler *jsonschema.Compiler
	schemas  map[string]*jsonschema.Schema // by @odata.type
	printer  *message.Printer
}

// NewValidator loads schemas from jsonSchemaDir, the bundle's json-schema
// folder. Schemas are compiled on first use.
func NewValidator(jsonSchemaDir string) (*Validator, error) {
	loader := newBundleLoader(jsonSchemaDir)
	// The Redfish metaschema must be present: every schema declares it.
	if _, err := loader.resolveFile("redfish-schema-v1.json"); err != nil {
		return nil, fmt.Errorf("json-schema folder %s: %w", jsonSchemaDir, err)
	}
	compiler := jsonschema.NewCompiler()
	compiler.UseLoader(loader)
	return &Validator{
		loader:   loader,
		compiler: compiler,
		schemas:  map[string]*jsonschema.Schema{},
		printer:  message.NewPrinter(language.English),
	}, nil
}

// Validate checks one response body fetched from uri against the schema its
// @odata.type names. A body problem (bad JSON, missing or malformed
// @odata.type, schema violations) is a Violation; an error means the check
// itself could not run, for example because the bundle lacks the schema.
func (v *Validator) Validate(uri string, body []byte) ([]Violation, error) {
	instance, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return []Violation{{URI: uri, Schema: "JSON", Message: "body is not JSON: " + err.Error()}}, nil
	}
	obj, ok := instance.(map[string]any)
	if !ok {
		return []Violation{{URI: uri, Schema: "JSON", Message: "body is JSON but not an object"}}, nil
	}
	typeName, ok := obj["@odata.type"].(string)
	if !ok {
		return []Violation{{URI: uri, Schema: "@odata.type", Pointer: "/@odata.type", Message: "missing or not a string; every resource must name its schema in @odata.type"}}, nil
	}
	schema, violation, err := v.schemaFor(typeName)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", uri, err)
	}
	if violation != "" {
		return []Violation{{URI: uri, Schema: "@odata.type", Pointer: "/@odata.type", Message: violation}}, nil
	}
	err = schema.Validate(instance)
	if err == nil {
		return nil, nil
	}
	var verr *jsonschema.ValidationError
	if !errors.As(err, &verr) {
		return nil, fmt.Errorf("%s: validating: %w", uri, err)
	}
	return v.violations(uri, verr), nil
}

// schemaFor compiles (once) the schema of an @odata.type. A type that cannot
// name a schema yields a violation message; a schema that cannot be loaded
// yields an error.
func (v *Validator) schemaFor(typeName string) (*jsonschema.Schema, string, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if schema, ok := v.schemas[typeName]; ok {
		return schema, "", nil
	}
	m := odataType.FindStringSubmatch(typeName)
	if m == nil {
		return nil, fmt.Sprintf("%q is not of the form #Namespace.vX_Y_Z.Type or #Namespace.Type", typeName), nil
	}
	location, violation, err := v.location(m[1], m[2], m[3])
	if err != nil || violation != "" {
		return nil, violation, err
	}
	schema, err := v.compiler.Compile(location)
	if err != nil {
		return nil, "", fmt.Errorf("compiling %s for %s: %w", location, typeName, err)
	}
	v.schemas[typeName] = schema
	return schema, "", nil
}

// location maps an @odata.type onto a schema location: the definition in
// the versioned file, or for an unversioned type (collections) its inline
// branch, leaving out the bare idRef alternative that only a link may use.
func (v *Validator) location(name, version, typ string) (string, string, error) {
	v.loader.mu.Lock()
	defer v.loader.mu.Unlock()
	file, err := v.loader.resolveFile(name + version + ".json")
	if err != nil {
		return "", "", err
	}
	doc, err := v.loader.document(file)
	if err != nil {
		return "", "", err
	}
	if _, ok := definitionOf(doc, typ); !ok {
		return "", "", fmt.Errorf("%s has no definition %q: %w", file, typ, ErrSchemaNotFound)
	}
	pointer := "/definitions/" + typ
	if anyVersionDefinition(doc, typ) {
		return "", fmt.Sprintf("#%s.%s names no version; a resource's @odata.type must be #%s.vX_Y_Z.%s", name, typ, name, typ), nil
	}
	if alt := anyOfAlternatives(doc, typ); len(alt) == 2 && alt[0] == idRefLocation && alt[1] == "" {
		pointer += "/anyOf/1"
	}
	return dmtfSchemaPrefix + file + "#" + pointer, "", nil
}

func (v *Validator) violations(uri string, verr *jsonschema.ValidationError) []Violation {
	var out []Violation
	for _, leaf := range leaves(verr) {
		pointer := jsonPointer(leaf.InstanceLocation)
		schema := schemaLocation(leaf)
		switch k := leaf.ErrorKind.(type) {
		case *kind.AdditionalProperties:
			for _, property := range k.Properties {
				out = append(out, Violation{
					URI: uri, Schema: schema, Pointer: pointer + "/" + escapePointerToken(property),
					Message: fmt.Sprintf("property %q is not defined by the schema (additionalProperties is false)", property),
				})
			}
			continue
		case *kind.FalseSchema:
			if missing, ok := strings.CutPrefix(leaf.SchemaURL, notInBundlePrefix); ok {
				out = append(out, Violation{
					URI: uri, Schema: schema, Pointer: pointer,
					Message: fmt.Sprintf("value uses schema %s, which is not in the DMTF bundle and cannot be checked", unescapeNotInBundle(missing)),
				})
				continue
			}
		}
		out = append(out, Violation{URI: uri, Schema: schema, Pointer: pointer, Message: leaf.ErrorKind.LocalizedString(v.printer)})
	}
	slices.SortStableFunc(out, func(a, b Violation) int { return strings.Compare(a.Pointer, b.Pointer) })
	return out
}

// leaves flattens a validation error tree into the errors worth reporting.
// Under anyOf/oneOf it drops branches that failed only on "type" where some
// other branch got further: for `anyOf: [{$ref: Enum}, {type: null}]` the
// enum error is the useful one, not "want null".
func leaves(e *jsonschema.ValidationError) []*jsonschema.ValidationError {
	if len(e.Causes) == 0 {
		return []*jsonschema.ValidationError{e}
	}
	branches := make([][]*jsonschema.ValidationError, len(e.Causes))
	for i, cause := range e.Causes {
		branches[i] = leaves(cause)
	}
	switch e.ErrorKind.(type) {
	case *kind.AnyOf, *kind.OneOf:
		var informative [][]*jsonschema.ValidationError
		for _, branch := range branches {
			if !onlyTypeMismatches(branch, e.InstanceLocation) {
				informative = append(informative, branch)
			}
		}
		if len(informative) == 0 {
			return []*jsonschema.ValidationError{mergeTypeMismatches(branches)}
		}
		branches = informative
	}
	var out []*jsonschema.ValidationError
	for _, branch := range branches {
		out = append(out, branch...)
	}
	return out
}

func onlyTypeMismatches(branch []*jsonschema.ValidationError, at []string) bool {
	for _, leaf := range branch {
		if _, ok := leaf.ErrorKind.(*kind.Type); !ok || !slices.Equal(leaf.InstanceLocation, at) {
			return false
		}
	}
	return true
}

// mergeTypeMismatches turns "got number, want string" and "got number, want
// null" from the branches of one anyOf into "got number, want string or null".
func mergeTypeMismatches(branches [][]*jsonschema.ValidationError) *jsonschema.ValidationError {
	first := branches[0][0]
	merged := &kind.Type{Got: first.ErrorKind.(*kind.Type).Got}
	for _, branch := range branches {
		for _, leaf := range branch {
			for _, want := range leaf.ErrorKind.(*kind.Type).Want {
				if !slices.Contains(merged.Want, want) {
					merged.Want = append(merged.Want, want)
				}
			}
		}
	}
	return &jsonschema.ValidationError{SchemaURL: first.SchemaURL, InstanceLocation: first.InstanceLocation, ErrorKind: merged}
}

// schemaLocation is the failing keyword as file#/pointer, relative to the
// DMTF schema prefix so that reports stay readable.
func schemaLocation(e *jsonschema.ValidationError) string {
	location := e.SchemaURL
	if !strings.Contains(location, "#") {
		location += "#"
	}
	location = strings.TrimSuffix(location, "/") + jsonPointer(e.ErrorKind.KeywordPath())
	if short, ok := strings.CutPrefix(location, dmtfSchemaPrefix); ok {
		return short
	}
	if missing, ok := strings.CutPrefix(location, notInBundlePrefix); ok {
		return unescapeNotInBundle(missing)
	}
	return location
}

func unescapeNotInBundle(escaped string) string {
	escaped = strings.TrimSuffix(escaped, "#")
	return strings.NewReplacer("%2F", "/", "%23", "#", "%3A", ":").Replace(escaped)
}

func jsonPointer(tokens []string) string {
	var sb strings.Builder
	for _, token := range tokens {
		sb.WriteByte('/')
		sb.WriteString(escapePointerToken(token))
	}
	return sb.String()
}

func escapePointerToken(token string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(token)
}

// ValidateAgainst checks a body that names no @odata.type (an error
// response, the OData service document) against a schema of the bundle
// given by file name and optional fragment, e.g. "redfish-error.v1_0_2.json".
func (v *Validator) ValidateAgainst(uri string, body []byte, schema string) ([]Violation, error) {
	instance, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return []Violation{{URI: uri, Schema: "JSON", Message: "body is not JSON: " + err.Error()}}, nil
	}
	compiled, err := v.compileLocation(dmtfSchemaPrefix + schema)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", uri, err)
	}
	err = compiled.Validate(instance)
	if err == nil {
		return nil, nil
	}
	var verr *jsonschema.ValidationError
	if !errors.As(err, &verr) {
		return nil, fmt.Errorf("%s: validating: %w", uri, err)
	}
	return v.violations(uri, verr), nil
}

// compileLocation compiles (once) the schema at a location; the cache
// shares the map of @odata.type schemas, whose keys start with "#" and so
// never collide with locations.
func (v *Validator) compileLocation(location string) (*jsonschema.Schema, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if schema, ok := v.schemas[location]; ok {
		return schema, nil
	}
	schema, err := v.compiler.Compile(location)
	if err != nil {
		return nil, fmt.Errorf("compiling %s: %w", location, err)
	}
	v.schemas[location] = schema
	return schema, nil
}
