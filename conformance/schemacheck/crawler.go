package schemacheck

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"sort"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

const (
	versionPath  = "/redfish"
	serviceRoot  = "/redfish/v1/"
	maxBodyBytes = 16 << 20
	// defaultMaxResources stops a crawl of a service that mints endless URIs.
	defaultMaxResources = 5000
)

// Crawler fetches every resource reachable from the Redfish service root
// with HTTP Basic auth and checks each response.
type Crawler struct {
	// Client sends the requests; for a TLS test server use its Client().
	Client *http.Client
	// BaseURL is scheme://host:port of the service, without a path.
	BaseURL   string
	Username  string
	Password  string
	Validator *Validator
	// MaxResources bounds the crawl; 0 means 5000.
	MaxResources int
}

// Report is the outcome of a crawl.
type Report struct {
	// Visited lists the fetched paths in crawl order.
	Visited []string
	// Violations lists every problem found, in crawl order.
	Violations []Violation
	// ODataTypes lists, sorted and once each, every @odata.type value found
	// anywhere in the bodies.
	ODataTypes []string
}

// link is a URI to crawl with where it was found, for reports.
type link struct {
	path     string
	referrer string
	pointer  string
}

// Crawl checks the version object at /redfish, then every resource reachable
// from /redfish/v1/ through @odata.id (and @Redfish.ActionInfo) values found
// anywhere in bodies. Action targets are not followed: they only take POST.
// An error means the crawl could not go on (transport failure, a schema
// missing from the bundle); problems of the service are Violations.
func (c *Crawler) Crawl(ctx context.Context) (*Report, error) {
	report := &Report{}
	if err := c.checkVersionObject(ctx, report); err != nil {
		return nil, err
	}
	limit := c.MaxResources
	if limit == 0 {
		limit = defaultMaxResources
	}
	types := map[string]bool{}
	seen := map[string]bool{canonicalPath(serviceRoot): true}
	queue := []link{{path: serviceRoot}}
	for len(queue) > 0 {
		if len(report.Visited) == limit {
			return nil, fmt.Errorf("crawl stopped after %d resources with %d still queued; raise MaxResources if the service is that large", limit, len(queue))
		}
		next := queue[0]
		queue = queue[1:]
		links, err := c.checkResource(ctx, next, report, types)
		if err != nil {
			return nil, err
		}
		for _, l := range links {
			if key := canonicalPath(l.path); !seen[key] {
				seen[key] = true
				queue = append(queue, l)
			}
		}
	}
	for t := range types {
		report.ODataTypes = append(report.ODataTypes, t)
	}
	sort.Strings(report.ODataTypes)
	return report, nil
}

func (c *Crawler) checkVersionObject(ctx context.Context, report *Report) error {
	resp, body, err := c.get(ctx, versionPath)
	if err != nil {
		return err
	}
	report.Visited = append(report.Visited, versionPath)
	report.Violations = append(report.Violations, responseViolations(versionPath, resp, "application/json", false)...)
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	instance, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	obj, ok := instance.(map[string]any)
	if err != nil || !ok || obj["v1"] != serviceRoot {
		report.Violations = append(report.Violations, Violation{
			URI: versionPath, Schema: "Redfish version object", Pointer: "/v1",
			Message: fmt.Sprintf("body must be a JSON object with \"v1\": %q; got %.200s", serviceRoot, body),
		})
	}
	return nil
}

// checkResource fetches one resource, records its violations and @odata.type
// values, and returns the links it holds.
func (c *Crawler) checkResource(ctx context.Context, target link, report *Report, types map[string]bool) ([]link, error) {
	resp, body, err := c.get(ctx, target.path)
	if err != nil {
		return nil, err
	}
	report.Visited = append(report.Visited, target.path)
	violations := responseViolations(target.path, resp, "application/json", true)
	if resp.StatusCode != http.StatusOK {
		for i := range violations {
			if violations[i].Schema == "HTTP status" && target.referrer != "" {
				violations[i].Message += fmt.Sprintf(" (linked from %s at %s)", target.referrer, target.pointer)
			}
		}
		report.Violations = append(report.Violations, violations...)
		return nil, nil
	}
	schemaViolations, err := c.Validator.Validate(target.path, body)
	if err != nil {
		return nil, err
	}
	violations = append(violations, schemaViolations...)
	var links []link
	if instance, err := jsonschema.UnmarshalJSON(bytes.NewReader(body)); err == nil {
		if obj, ok := instance.(map[string]any); ok {
			violations = append(violations, identityViolations(target.path, obj)...)
		}
		var linkViolations []Violation
		links, linkViolations = collectLinks(target.path, instance, "", types)
		violations = append(violations, linkViolations...)
	}
	report.Violations = append(report.Violations, violations...)
	return links, nil
}

func (c *Crawler) get(ctx context.Context, path string) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(c.BaseURL, "/")+path, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("GET %s: %w", path, err)
	}
	req.SetBasicAuth(c.Username, c.Password)
	req.Header.Set("Accept", "application/json")
	resp, err := c.Client.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBodyBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("GET %s: reading body: %w", path, err)
	}
	if len(body) > maxBodyBytes {
		return nil, nil, fmt.Errorf("GET %s: body larger than %d bytes", path, maxBodyBytes)
	}
	return resp, body, nil
}

// responseViolations checks status and headers. Resources (everything but the
// /redfish version object) must also carry an ETag.
func responseViolations(uri string, resp *http.Response, wantType string, resource bool) []Violation {
	if resp.StatusCode != http.StatusOK {
		return []Violation{{URI: uri, Schema: "HTTP status", Message: fmt.Sprintf("GET answered %s, want 200 OK", resp.Status)}}
	}
	var out []Violation
	if got := resp.Header.Get("OData-Version"); got != "4.0" {
		out = append(out, Violation{URI: uri, Schema: "header OData-Version", Message: fmt.Sprintf("OData-Version is %q, want \"4.0\"", got)})
	}
	contentType := resp.Header.Get("Content-Type")
	mediaType, params, err := mime.ParseMediaType(contentType)
	charset, hasCharset := params["charset"]
	if err != nil || mediaType != wantType || (hasCharset && !strings.EqualFold(charset, "utf-8")) {
		out = append(out, Violation{URI: uri, Schema: "header Content-Type", Message: fmt.Sprintf("Content-Type is %q, want %s (charset utf-8 if any)", contentType, wantType)})
	}
	if resource && resp.Header.Get("ETag") == "" {
		out = append(out, Violation{URI: uri, Schema: "header ETag", Message: "no ETag header"})
	}
	return out
}

// identityViolations checks that a resource names itself: @odata.id equals
// the URI fetched, up to a trailing slash.
func identityViolations(uri string, obj map[string]any) []Violation {
	id, ok := obj["@odata.id"].(string)
	switch {
	case !ok:
		return []Violation{{URI: uri, Schema: "@odata.id", Pointer: "/@odata.id", Message: "missing or not a string"}}
	case canonicalPath(id) != canonicalPath(uri):
		return []Violation{{URI: uri, Schema: "@odata.id", Pointer: "/@odata.id", Message: fmt.Sprintf("is %q, want the URI fetched, %q", id, uri)}}
	}
	return nil
}

// collectLinks walks a body for @odata.id and @Redfish.ActionInfo values
// and the service's own registry Locations (to crawl) and @odata.type values (for the $metadata check).
func collectLinks(uri string, node any, pointer string, types map[string]bool) ([]link, []Violation) {
	var links []link
	var violations []Violation
	switch n := node.(type) {
	case map[string]any:
		keys := make([]string, 0, len(n))
		for key := range n {
			keys = append(keys, key)
		}
		slices.Sort(keys)
		for _, key := range keys {
			childPointer := pointer + "/" + escapePointerToken(key)
			value, isString := n[key].(string)
			switch {
			case key == "@odata.type" && isString:
				types[value] = true
			case (key == "@odata.id" || strings.HasSuffix(key, "@Redfish.ActionInfo")) && isString:
				path, _, _ := strings.Cut(value, "#") // a fragment points into a resource
				if canonicalPath(path) != "/redfish/v1" && !strings.HasPrefix(path, serviceRoot) {
					violations = append(violations, Violation{URI: uri, Schema: "link", Pointer: childPointer, Message: fmt.Sprintf("%q is not a path under %s", value, serviceRoot)})
					continue
				}
				links = append(links, link{path: path, referrer: uri, pointer: childPointer})
			case key == "Uri" && isString && strings.Contains(pointer, "/Location/") && strings.HasPrefix(value, serviceRoot):
				// A registry file's copy of its registry, when the service
				// holds it: a resource too, though no @odata.id names it.
				links = append(links, link{path: value, referrer: uri, pointer: childPointer})
			default:
				childLinks, childViolations := collectLinks(uri, n[key], childPointer, types)
				links = append(links, childLinks...)
				violations = append(violations, childViolations...)
			}
		}
	case []any:
		for i, child := range n {
			childLinks, childViolations := collectLinks(uri, child, fmt.Sprintf("%s/%d", pointer, i), types)
			links = append(links, childLinks...)
			violations = append(violations, childViolations...)
		}
	}
	return links, violations
}

func canonicalPath(path string) string {
	if trimmed := strings.TrimRight(path, "/"); trimmed != "" {
		return trimmed
	}
	return "/"
}
