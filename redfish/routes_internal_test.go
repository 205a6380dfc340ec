package redfish

import (
	"maps"
	"net/http"
	"strings"
	"testing"
)

// TestPathTemplateMatch: a template matches a path of as many segments,
// literal for literal; a variable takes a whole, non-empty segment, and a
// digits-only variable nothing else.
func TestPathTemplateMatch(t *testing.T) {
	tests := []struct {
		template, path string
		want           map[string]string // nil: no match
	}{
		{"/redfish/v1/Systems", "/redfish/v1/Systems", map[string]string{}},
		{"/redfish/v1/Systems", "/redfish/v1/Chassis", nil},
		{"/redfish/v1/Systems", "/redfish/v1", nil},
		{"/redfish/v1/Systems", "/redfish/v1/Systems/x", nil},
		{"/redfish/v1/Systems/{systemID}", "/redfish/v1/Systems/vm-0", map[string]string{"systemID": "vm-0"}},
		{"/redfish/v1/Systems/{systemID}", "/redfish/v1/Systems/", nil},
		{"/redfish/v1/Systems/{systemID}/Bios", "/redfish/v1/Systems//Bios", nil},
		{"/redfish/v1/Systems/{systemID}/Bios", "/redfish/v1/Systems/vm-0/Bios", map[string]string{"systemID": "vm-0"}},
		{"/redfish/v1/Systems/{systemID}/Bios", "/redfish/v1/Systems/vm-0/Bios/Settings", nil},
		{"/a/{x:[0-9]+}/{y}", "/a/042/b", map[string]string{"x": "042", "y": "b"}},
		{"/a/{x:[0-9]+}/{y}", "/a/4x/b", nil},
		{"/a/{x:[0-9]+}", "/a/", nil},
	}
	for _, tt := range tests {
		t.Run(tt.template+" "+tt.path, func(t *testing.T) {
			vars, ok := parseTemplate(tt.template).match(tt.path)
			if ok != (tt.want != nil) {
				t.Fatalf("matched %v, want %v", ok, tt.want != nil)
			}
			if ok && (len(vars) != len(tt.want) || !maps.Equal(vars, tt.want) && len(tt.want) > 0) {
				t.Errorf("vars %v, want %v", vars, tt.want)
			}
		})
	}
}

// TestParseTemplateRefusesUnknownPatterns: a variable pattern the matcher
// does not implement stops the table from being built, rather than being
// matched as something else.
func TestParseTemplateRefusesUnknownPatterns(t *testing.T) {
	for _, path := range []string{"/a/{x:[a-z]+}", "/a/{x", "/a/{}"} {
		t.Run(path, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("%s was accepted", path)
				}
			}()
			parseTemplate(path)
		})
	}
}

// TestEveryRouteIsReached: each path of the route table is served by its
// own endpoint, not taken by an earlier template, with the variables
// filled from the request's path.
func TestEveryRouteIsReached(t *testing.T) {
	for _, group := range endpoints() {
		for _, ep := range group {
			var path strings.Builder
			want := map[string]string{}
			for _, seg := range ep.template {
				path.WriteString("/")
				switch {
				case seg.variable == "":
					path.WriteString(seg.literal)
				case seg.digits:
					path.WriteString("7")
					want[seg.variable] = "7"
				default:
					path.WriteString("v-" + seg.variable)
					want[seg.variable] = "v-" + seg.variable
				}
			}
			p := path.String()
			var got *endpoint
			var vars map[string]string
			for _, candidate := range endpoints()[len(ep.template)] {
				if v, ok := candidate.template.match(p); ok {
					got, vars = candidate, v
					break
				}
			}
			if got != ep {
				t.Errorf("%s reaches %v, want its own endpoint %s", p, got, ep.routes[0].path)
				continue
			}
			if len(want) > 0 && !maps.Equal(vars, want) {
				t.Errorf("%s: vars %v, want %v", p, vars, want)
			}
			if got.routes[len(got.routes)-1].method != http.MethodOptions {
				t.Errorf("%s answers no OPTIONS", p)
			}
		}
	}
}
