package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strings"

	"github.com/virtmetal/virtmetal/conformance/schemacheck"
)

// Rule names, as the summary shows them.
const (
	ruleSchema          = "schema"
	ruleLinks           = "links resolve"
	ruleHeaders         = "response headers"
	ruleMetadata        = "$metadata"
	ruleServiceDocument = "service document"
	ruleRequired        = "required properties"
	ruleAnnotations     = "annotations"
	ruleCollectionCount = "Members@odata.count"
	ruleAllowable       = "allowable values"
	ruleHead            = "HEAD"
	ruleOptions         = "OPTIONS"
	ruleODataVersion    = "OData-Version"
	ruleQuery           = "query parameters"
	ruleAuthentication  = "authentication"
	ruleMediaType       = "415 for non-JSON bodies"
	ruleMethodNotAllow  = "405 and Allow"
	ruleNotFound        = "404"
	ruleErrorBody       = "error body"
	ruleRoles           = "roles"
	ruleAccountETag     = "account ETag"
	ruleAccountWrites   = "account management"
	ruleSessions        = "session life cycle"
	rulePatch           = "patch"
	ruleSubscriptions   = "subscriptions"
	ruleEventDelivery   = "event delivery"
)

const (
	versionPath         = "/redfish"
	serviceRootPath     = "/redfish/v1/"
	metadataPath        = "/redfish/v1/$metadata"
	serviceDocumentPath = "/redfish/v1/odata"
	errorSchema         = "redfish-error.v1_0_2.json"
)

// crawl fetches every resource reachable from the service root and checks
// its schema, its links and its headers.
func (s *session) crawl(ctx context.Context) error {
	crawler := &schemacheck.Crawler{
		Client: s.target.Client, BaseURL: s.target.BaseURL,
		Username: s.target.Username, Password: s.target.Password,
		Validator: s.validator,
	}
	report, err := crawler.Crawl(ctx)
	if err != nil {
		return fmt.Errorf("crawl: %w", err)
	}
	s.visited, s.odataTypes = report.Visited, report.ODataTypes
	byRule := map[string]map[string][]string{ruleSchema: {}, ruleLinks: {}, ruleHeaders: {}}
	for _, v := range report.Violations {
		rule := ruleSchema
		switch {
		case v.Schema == "HTTP status":
			rule = ruleLinks
		case strings.HasPrefix(v.Schema, "header "):
			rule = ruleHeaders
		}
		byRule[rule][v.URI] = append(byRule[rule][v.URI], v.String())
	}
	for _, uri := range s.visited {
		for _, rule := range []string{ruleLinks, ruleSchema, ruleHeaders} {
			s.check(rule, uri, byRule[rule][uri])
		}
	}
	return nil
}

func (s *session) checkMetadata(ctx context.Context) error {
	crawler := &schemacheck.Crawler{Client: s.target.Client, BaseURL: s.target.BaseURL}
	violations, err := crawler.CheckMetadata(ctx, filepath.Join(s.target.SchemaDir, "csdl"), s.odataTypes)
	if err != nil {
		return fmt.Errorf("$metadata: %w", err)
	}
	var problems []string
	for _, v := range violations {
		problems = append(problems, v.String())
	}
	s.check(ruleMetadata, metadataPath, problems)
	return nil
}

// checkServiceDocument: /redfish/v1/odata lists the service root and
// top-level resources as entries whose URLs resolve.
func (s *session) checkServiceDocument(ctx context.Context) error {
	r, err := s.get(ctx, serviceDocumentPath)
	if err != nil {
		return err
	}
	if r.status != http.StatusOK || r.json == nil {
		s.fail(ruleServiceDocument, serviceDocumentPath, "GET answered %d with %.100q, want 200 and a JSON object", r.status, r.body)
		return nil
	}
	var problems []string
	if ctxURL, _ := r.json["@odata.context"].(string); ctxURL != "/redfish/v1/$metadata" {
		problems = append(problems, fmt.Sprintf("@odata.context is %q, want /redfish/v1/$metadata", ctxURL))
	}
	entries, _ := r.json["value"].([]any)
	sawRoot := false
	for i, e := range entries {
		entry, _ := e.(map[string]any)
		name, _ := entry["name"].(string)
		kind, _ := entry["kind"].(string)
		url, _ := entry["url"].(string)
		if name == "" || url == "" || (kind != "" && kind != "Singleton" && kind != "EntitySet") {
			problems = append(problems, fmt.Sprintf("value/%d needs a name, a url and kind Singleton or EntitySet: %v", i, entry))
			continue
		}
		if strings.TrimSuffix(url, "/") == "/redfish/v1" {
			sawRoot = true
		}
		target, err := s.get(ctx, url)
		if err != nil {
			return err
		}
		if target.status != http.StatusOK {
			problems = append(problems, fmt.Sprintf("value/%d (%s) points at %s, which answers %d", i, name, url, target.status))
		}
	}
	if !sawRoot {
		problems = append(problems, "no entry for the service root /redfish/v1/")
	}
	s.check(ruleServiceDocument, serviceDocumentPath, problems)
	return nil
}

// resourceURIs are the crawled URIs with JSON resource bodies.
func (s *session) resourceURIs() []string {
	var out []string
	for _, uri := range s.visited {
		if uri != versionPath {
			out = append(out, uri)
		}
	}
	return out
}

// checkResources reads every resource again and checks what the schemas
// cannot express: required identity properties, annotations, counts and
// allowable values.
func (s *session) checkResources(ctx context.Context) error {
	for _, uri := range s.resourceURIs() {
		r, err := s.get(ctx, uri)
		if err != nil {
			return err
		}
		if r.status != http.StatusOK || r.json == nil {
			continue // the crawl reported it
		}
		s.check(ruleRequired, uri, requiredProperties(r.json))
		annotations, counts := annotationProblems(r.json)
		s.check(ruleAnnotations, uri, annotations)
		if _, isCollection := r.json["Members"]; isCollection {
			s.check(ruleCollectionCount, uri, counts)
		}
		allowable, err := s.allowableValueProblems(uri, r.json)
		if err != nil {
			return err
		}
		s.check(ruleAllowable, uri, allowable)
	}
	return nil
}

// requiredProperties: every resource names itself and its type; members
// of collections also carry an Id.
func requiredProperties(body map[string]any) []string {
	want := []string{"@odata.id", "@odata.type", "Name"}
	if _, isCollection := body["Members"]; !isCollection {
		want = append(want, "Id")
	}
	var problems []string
	for _, key := range want {
		if v, ok := body[key].(string); !ok || v == "" {
			problems = append(problems, fmt.Sprintf("%s is missing or not a non-empty string", key))
		}
	}
	return problems
}

// annotationNamespaces are the vocabularies a payload annotation may use.
var annotationNamespaces = []string{"odata", "Redfish", "Message", "Privileges"}

// annotationProblems walks every object of a body: a property annotation
// ("P@Namespace.Term") uses a known vocabulary; P@odata.count counts the
// array P; P@Redfish.AllowableValues is a non-empty list of strings about a
// property the object has (or an action parameter). The second list holds
// the Members@odata.count problems.
func annotationProblems(body map[string]any) (problems, counts []string) {
	if _, isCollection := body["Members"]; isCollection {
		if _, ok := body["Members@odata.count"]; !ok {
			counts = append(counts, "a collection must carry Members@odata.count")
		}
	}
	walkObjects(body, "", func(pointer string, obj map[string]any) {
		_, isAction := obj["target"]
		for _, key := range sortedKeys(obj) {
			at := strings.Index(key, "@")
			if at <= 0 {
				continue
			}
			property, term := key[:at], key[at+1:]
			where := pointer + "/" + key
			namespace, _, _ := strings.Cut(term, ".")
			if !slices.Contains(annotationNamespaces, namespace) {
				problems = append(problems, fmt.Sprintf("%s uses vocabulary %q, not one of %v", where, namespace, annotationNamespaces))
				continue
			}
			switch term {
			case "odata.count":
				list, isList := obj[property].([]any)
				n, isNumber := obj[key].(float64)
				switch {
				case !isList:
					counts = append(counts, fmt.Sprintf("%s counts %s, which is not an array", where, property))
				case !isNumber || int(n) != len(list):
					counts = append(counts, fmt.Sprintf("%s is %v, but %s has %d members", where, obj[key], property, len(list)))
				}
			case "Redfish.AllowableValues":
				values, ok := obj[key].([]any)
				if !ok || len(values) == 0 {
					problems = append(problems, fmt.Sprintf("%s must be a non-empty array", where))
				}
				for i, v := range values {
					if _, ok := v.(string); !ok {
						problems = append(problems, fmt.Sprintf("%s/%d is %v, not a string", where, i, v))
					}
				}
				if _, ok := obj[property]; !ok && !isAction {
					problems = append(problems, fmt.Sprintf("%s annotates %s, which the object does not have", where, property))
				}
			}
		}
	})
	return problems, counts
}

// actionParameterSchemas are the JSON schema definitions of the action
// parameters whose allowable values can be checked; the JSON schemas do
// not describe action parameters otherwise.
var actionParameterSchemas = map[string]string{
	"ResetType":            "Resource.json#/definitions/ResetType",
	"TransferProtocolType": "VirtualMedia.v1_6_0.json#/definitions/TransferProtocolType",
	"TransferMethod":       "VirtualMedia.v1_6_0.json#/definitions/TransferMethod",
}

// allowableValueProblems: every value a property's AllowableValues offers
// must be one its schema accepts (checked by validating the body with the
// value in place), the current value must be among them, and action
// parameters must offer values of their type.
func (s *session) allowableValueProblems(uri string, body map[string]any) ([]string, error) {
	var problems []string
	var failure error
	walkObjects(body, "", func(pointer string, obj map[string]any) {
		_, isAction := obj["target"]
		for _, key := range sortedKeys(obj) {
			property, found := strings.CutSuffix(key, "@Redfish.AllowableValues")
			values, ok := obj[key].([]any)
			if !found || !ok || failure != nil {
				continue
			}
			if isAction {
				definition, known := actionParameterSchemas[property]
				if !known {
					continue
				}
				for _, v := range values {
					data, _ := json.Marshal(v) // a decoded JSON value marshals
					violations, err := s.validator.ValidateAgainst(uri, data, definition)
					if err != nil {
						failure = err
						return
					}
					if len(violations) > 0 {
						problems = append(problems, fmt.Sprintf("%s/%s offers %v, which %s does not accept", pointer, key, v, definition))
					}
				}
				continue
			}
			if current, isString := obj[property].(string); isString && !slices.Contains(values, any(current)) {
				problems = append(problems, fmt.Sprintf("%s/%s is %q, which %s does not list", pointer, property, current, key))
			}
			for _, v := range values {
				original := obj[property]
				obj[property] = v
				data, _ := json.Marshal(body) // a decoded JSON document marshals
				obj[property] = original
				violations, err := s.validator.Validate(uri, data)
				if err != nil {
					failure = err
					return
				}
				for _, violation := range violations {
					if violation.Pointer == pointer+"/"+property {
						problems = append(problems, fmt.Sprintf("%s offers %v, which the schema refuses: %s", key, v, violation.Message))
					}
				}
			}
		}
	})
	return problems, failure
}

// walkObjects calls visit for every JSON object in v, with its pointer.
func walkObjects(v any, pointer string, visit func(string, map[string]any)) {
	switch n := v.(type) {
	case map[string]any:
		visit(pointer, n)
		for _, k := range sortedKeys(n) {
			walkObjects(n[k], pointer+"/"+strings.NewReplacer("~", "~0", "/", "~1").Replace(k), visit)
		}
	case []any:
		for i, item := range n {
			walkObjects(item, fmt.Sprintf("%s/%d", pointer, i), visit)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
