package schemacheck

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// dmtfSchemaPrefix is how every DMTF JSON schema names its siblings; the
// loader maps it onto the local bundle folder so nothing goes to the network.
const dmtfSchemaPrefix = "http://redfish.dmtf.org/schemas/v1/"

// swordfishSchemaPrefix names the Swordfish schemas (Volume, ...). DSP8010
// carries those Redfish's own schemas use, in the same folder; a reference
// to one of them reads the bundle's file, to any other one is not in it.
const swordfishSchemaPrefix = "http://redfish.dmtf.org/schemas/swordfish/v1/"

// notInBundlePrefix marks references to schemas the bundle lacks (the rest
// of Swordfish).
// They load as the schema `false`, so a body that uses such a property fails
// with a message naming the missing schema instead of passing unchecked.
const notInBundlePrefix = "urn:virtmetal:not-in-bundle:"

const idRefLocation = dmtfSchemaPrefix + "odata-v4.json#/definitions/idRef"

// ErrSchemaNotFound means the bundle has no schema file for a name, even after
// falling back to the newest errata of the same minor version.
var ErrSchemaNotFound = errors.New("schema not in bundle")

// BundleDir returns the DMTF schema bundle folder (it holds json-schema/ and
// csdl/): $REDFISH_SCHEMA_DIR if set, else ../shared/redfish-schemas beside the
// repository root, found by walking up from the working directory to go.mod.
func BundleDir() (string, error) {
	if dir := os.Getenv("REDFISH_SCHEMA_DIR"); dir != "" {
		return checkBundleDir(dir)
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return checkBundleDir(filepath.Join(dir, "..", "shared", "redfish-schemas"))
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("no go.mod above %s, so the schema bundle cannot be located; set REDFISH_SCHEMA_DIR", wd)
		}
	}
}

// RequireBundle returns BundleDir for a test. A missing bundle fails the
// test, except that a developer may set VIRTMETAL_ALLOW_NO_SCHEMAS=1 to skip
// instead; under CI (CI=true) it always fails.
func RequireBundle(t testing.TB) string {
	t.Helper()
	dir, err := BundleDir()
	if err == nil {
		return dir
	}
	if os.Getenv("VIRTMETAL_ALLOW_NO_SCHEMAS") == "1" && os.Getenv("CI") != "true" {
		t.Skipf("skipping: %v (VIRTMETAL_ALLOW_NO_SCHEMAS=1)", err)
	}
	t.Fatalf("%v\nThe DMTF schema bundle is required: put it at ../shared/redfish-schemas beside the repository or set REDFISH_SCHEMA_DIR.", err)
	return ""
}

func checkBundleDir(dir string) (string, error) {
	for _, sub := range []string{"json-schema", "csdl"} {
		info, err := os.Stat(filepath.Join(dir, sub))
		if err != nil {
			return "", fmt.Errorf("redfish schema bundle at %s: %w", dir, err)
		}
		if !info.IsDir() {
			return "", fmt.Errorf("redfish schema bundle at %s: %s is not a folder", dir, sub)
		}
	}
	return filepath.Clean(dir), nil
}

// versionedName splits "ComputerSystem.v1_20_1.json" into its stem, minor
// version prefix and errata number.
var versionedName = regexp.MustCompile(`^(.+\.v\d+_\d+_)(\d+)\.json$`)

// bundleLoader serves DMTF schema URLs from the local json-schema folder. It
// rewrites each document once as it is loaded (see rewriteRefs).
type bundleLoader struct {
	dir  string
	mu   sync.Mutex
	docs map[string]map[string]any // by file name
}

func newBundleLoader(dir string) *bundleLoader {
	return &bundleLoader{dir: dir, docs: map[string]map[string]any{}}
}

// Load implements jsonschema.URLLoader.
func (l *bundleLoader) Load(rawURL string) (any, error) {
	if strings.HasPrefix(rawURL, notInBundlePrefix) {
		return false, nil
	}
	name, ok := strings.CutPrefix(rawURL, dmtfSchemaPrefix)
	if !ok {
		return nil, fmt.Errorf("%s is outside %s and is never fetched: %w", rawURL, dmtfSchemaPrefix, ErrSchemaNotFound)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.document(name)
}

// resolveFile maps a schema file name onto a file that exists, falling back
// from a missing errata to the newest errata of the same vX_Y.
func (l *bundleLoader) resolveFile(name string) (string, error) {
	if strings.ContainsAny(name, `/\`) {
		return "", fmt.Errorf("schema file name %q: %w", name, ErrSchemaNotFound)
	}
	if _, err := os.Stat(filepath.Join(l.dir, name)); err == nil {
		return name, nil
	}
	m := versionedName.FindStringSubmatch(name)
	if m == nil {
		return "", fmt.Errorf("%s in %s: %w", name, l.dir, ErrSchemaNotFound)
	}
	candidates, err := filepath.Glob(filepath.Join(l.dir, m[1]+"*.json"))
	if err != nil {
		return "", err
	}
	best, bestErrata := "", -1
	for _, path := range candidates {
		cm := versionedName.FindStringSubmatch(filepath.Base(path))
		if cm == nil || cm[1] != m[1] {
			continue
		}
		if errata, err := strconv.Atoi(cm[2]); err == nil && errata > bestErrata {
			best, bestErrata = filepath.Base(path), errata
		}
	}
	if best == "" {
		return "", fmt.Errorf("%s (nor any %s*.json) in %s: %w", name, m[1], l.dir, ErrSchemaNotFound)
	}
	return best, nil
}

// document returns the rewritten schema document stored under name. The
// caller holds l.mu.
func (l *bundleLoader) document(name string) (map[string]any, error) {
	if doc, ok := l.docs[name]; ok {
		return doc, nil
	}
	doc, err := l.readDocument(name)
	if err != nil {
		return nil, err
	}
	// The served URL becomes the document's identity: several files declare
	// an $id of another file (odata-v4.json says odata.v4_0_5.json), which
	// would register one schema twice.
	doc["$id"] = dmtfSchemaPrefix + name
	l.docs[name] = doc
	if err := l.rewriteRefs(doc); err != nil {
		delete(l.docs, name)
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return doc, nil
}

func (l *bundleLoader) readDocument(name string) (map[string]any, error) {
	f, err := os.Open(filepath.Join(l.dir, name))
	if err != nil {
		return nil, fmt.Errorf("%s: %w (%w)", name, ErrSchemaNotFound, err)
	}
	defer f.Close()
	parsed, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	doc, ok := parsed.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: a schema document must be a JSON object", name)
	}
	return doc, nil
}

// rewriteRefs adjusts every $ref of a freshly loaded document:
//   - a missing errata points at the newest errata of its vX_Y;
//   - a Swordfish schema the bundle holds is read from it, as if DMTF's;
//   - a schema outside the bundle (other Swordfish) points at a `false` schema;
//   - a reference to "any version of resource X" (the unversioned anyOf of
//     idRef and every X.vN file) becomes idRef alone. Crawled bodies only hold
//     references there, never expanded resources, and compiling every
//     version of every schema reachable from the service root takes minutes,
//     because each one links to all the others. The exception is an
//     auto-expanded collection's members (LogEntryCollection), which are
//     whole resources: they are checked against the newest version.
func (l *bundleLoader) rewriteRefs(node any) error {
	switch n := node.(type) {
	case map[string]any:
		if items, ok := n["items"].(map[string]any); ok && n["autoExpand"] == true {
			if err := l.expandToNewestVersion(items); err != nil {
				return err
			}
		}
		if ref, ok := n["$ref"].(string); ok {
			rewritten, err := l.rewriteRef(ref)
			if err != nil {
				return err
			}
			n["$ref"] = rewritten
		}
		for _, child := range n {
			if err := l.rewriteRefs(child); err != nil {
				return err
			}
		}
	case []any:
		for _, child := range n {
			if err := l.rewriteRefs(child); err != nil {
				return err
			}
		}
	}
	return nil
}

// expandToNewestVersion points an any-version reference at the newest
// version's definition, the last branch of the DMTF's anyOf.
func (l *bundleLoader) expandToNewestVersion(items map[string]any) error {
	ref, ok := items["$ref"].(string)
	rest, isDMTF := strings.CutPrefix(ref, dmtfSchemaPrefix)
	if !ok || !isDMTF {
		return nil
	}
	name, fragment, _ := strings.Cut(rest, "#")
	definition, ok := strings.CutPrefix(fragment, "/definitions/")
	if !ok || versionedName.MatchString(name) {
		return nil
	}
	doc, err := l.document(name)
	if err != nil {
		return err
	}
	if !anyVersionDefinition(doc, definition) {
		return nil
	}
	alternatives := anyOfAlternatives(doc, definition)
	items["$ref"] = alternatives[len(alternatives)-1]
	return nil
}

func (l *bundleLoader) rewriteRef(ref string) (string, error) {
	if strings.HasPrefix(ref, "#") {
		return ref, nil
	}
	if rest, ok := strings.CutPrefix(ref, swordfishSchemaPrefix); ok {
		name, _, _ := strings.Cut(rest, "#")
		if _, err := l.resolveFile(name); err == nil {
			ref = dmtfSchemaPrefix + rest
		}
	}
	rest, ok := strings.CutPrefix(ref, dmtfSchemaPrefix)
	if !ok {
		return notInBundlePrefix + url.PathEscape(ref), nil
	}
	name, fragment, _ := strings.Cut(rest, "#")
	file, err := l.resolveFile(name)
	if err != nil {
		return "", fmt.Errorf("$ref %s: %w", ref, err)
	}
	if definition, ok := strings.CutPrefix(fragment, "/definitions/"); ok && !versionedName.MatchString(file) {
		anyVersion, err := l.isAnyVersionReference(file, definition)
		if err != nil {
			return "", err
		}
		if anyVersion {
			return idRefLocation, nil
		}
	}
	if fragment == "" {
		return dmtfSchemaPrefix + file, nil
	}
	return dmtfSchemaPrefix + file + "#" + fragment, nil
}

// isAnyVersionReference reports whether the definition is the DMTF shape
// `anyOf: [idRef, X.v1_0_n, X.v1_1_n, ...]`: a link to a resource of any version.
func (l *bundleLoader) isAnyVersionReference(file, definition string) (bool, error) {
	doc, err := l.document(file)
	if err != nil {
		return false, err
	}
	return anyVersionDefinition(doc, definition), nil
}

func anyVersionDefinition(doc map[string]any, definition string) bool {
	alternatives := anyOfAlternatives(doc, definition)
	if len(alternatives) < 2 || alternatives[0] != idRefLocation {
		return false
	}
	for _, alt := range alternatives[1:] {
		name, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(alt, dmtfSchemaPrefix), swordfishSchemaPrefix), "#")
		if !versionedName.MatchString(name) {
			return false
		}
	}
	return true
}

// anyOfAlternatives lists the $ref of each anyOf branch of a definition, with
// "" for an inline branch; nil when the definition is not an anyOf.
func anyOfAlternatives(doc map[string]any, definition string) []string {
	def, ok := definitionOf(doc, definition)
	if !ok {
		return nil
	}
	branches, ok := def["anyOf"].([]any)
	if !ok {
		return nil
	}
	refs := make([]string, len(branches))
	for i, branch := range branches {
		if obj, ok := branch.(map[string]any); ok {
			refs[i], _ = obj["$ref"].(string)
		}
	}
	return refs
}

func definitionOf(doc map[string]any, definition string) (map[string]any, bool) {
	defs, ok := doc["definitions"].(map[string]any)
	if !ok {
		return nil, false
	}
	def, ok := defs[definition].(map[string]any)
	return def, ok
}
