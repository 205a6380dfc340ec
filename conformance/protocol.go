package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// checkProtocolRules: on every crawled URI, HEAD answers like GET without
// a body, OPTIONS names the methods, and GET carries Allow, Cache-Control
// and, for typed resources, Link rel=describedby.
func (s *session) checkProtocolRules(ctx context.Context) error {
	for _, uri := range s.visited {
		get, err := s.get(ctx, uri)
		if err != nil {
			return err
		}
		head, err := s.request(ctx, http.MethodHead, uri, nil, withBasic, nil)
		if err != nil {
			return err
		}
		var problems []string
		if head.status != get.status {
			problems = append(problems, fmt.Sprintf("HEAD answered %d, GET %d", head.status, get.status))
		}
		if len(head.body) != 0 {
			problems = append(problems, fmt.Sprintf("HEAD sent a %d-byte body", len(head.body)))
		}
		for _, h := range []string{"ETag", "Content-Type"} {
			if head.header.Get(h) != get.header.Get(h) {
				problems = append(problems, fmt.Sprintf("%s: HEAD %q, GET %q", h, head.header.Get(h), get.header.Get(h)))
			}
		}
		s.check(ruleHead, uri, problems)

		options, err := s.request(ctx, http.MethodOptions, uri, nil, withBasic, nil)
		if err != nil {
			return err
		}
		methods := allowed(options.header)
		switch {
		case options.status == http.StatusMethodNotAllowed || options.status == http.StatusNotImplemented:
			s.add(ruleOptions, uri, Warn, fmt.Sprintf("OPTIONS answered %d; clients cannot discover the methods", options.status))
		case options.status/100 != 2 || !methods[http.MethodGet] || !methods[http.MethodHead]:
			s.fail(ruleOptions, uri, "OPTIONS answered %d with Allow %q, want 2xx and an Allow naming GET and HEAD", options.status, options.header.Get("Allow"))
		default:
			s.pass(ruleOptions, uri)
		}

		problems = nil
		if get.status == http.StatusOK {
			if m := allowed(get.header); !m[http.MethodGet] {
				problems = append(problems, fmt.Sprintf("GET answer's Allow is %q, want the URI's methods, GET among them", get.header.Get("Allow")))
			}
			if get.header.Get("Cache-Control") == "" {
				problems = append(problems, "no Cache-Control header")
			}
			if _, typed := get.json["@odata.type"]; typed && !strings.Contains(get.header.Get("Link"), "rel=describedby") {
				problems = append(problems, fmt.Sprintf("Link is %q, want <schema URI>; rel=describedby", get.header.Get("Link")))
			}
		}
		s.check(ruleHeaders, uri, problems)
	}
	return nil
}

// errorCase is a request the service must refuse with a given status.
type errorCase struct {
	rule    string
	method  string
	path    string
	auth    credentials
	body    any // sent as JSON, with the headers' Content-Type if they set one
	headers map[string]string
	status  int
	// check adds rule-specific problems about the answer.
	check func(reply) []string
}

// checkErrorBodies sends requests every service must refuse (an unknown
// URI, a wrong method, no credentials, an unsupported OData-Version or $
// parameter), checks the status of each and validates each error body
// against redfish-error and its messages against the Message schema.
func (s *session) checkErrorBodies(ctx context.Context) error {
	protected := s.protectedURIs()
	cases := []errorCase{
		{rule: ruleNotFound, method: http.MethodGet, path: "/redfish/v1/ConformanceNoSuchResource", auth: withBasic, status: http.StatusNotFound},
		{rule: ruleMethodNotAllow, method: http.MethodDelete, path: serviceRootPath, auth: withBasic, status: http.StatusMethodNotAllowed, check: func(r reply) []string {
			if m := allowed(r.header); len(m) == 0 || m[http.MethodDelete] {
				return []string{fmt.Sprintf("Allow is %q, want the methods the URI takes, DELETE not among them", r.header.Get("Allow"))}
			}
			return nil
		}},
		{rule: ruleODataVersion, method: http.MethodGet, path: serviceRootPath, headers: map[string]string{"OData-Version": "4.1"}, status: http.StatusPreconditionFailed},
		{rule: ruleQuery, method: http.MethodGet, path: serviceRootPath + "?$conformanceunknown", status: http.StatusNotImplemented},
	}
	// Without credentials every protected URI answers 401, whatever the
	// method: a 405 with Allow would map the service to anyone.
	for _, uri := range protected {
		for _, method := range []string{http.MethodGet, http.MethodPut} {
			cases = append(cases, errorCase{rule: ruleAuthentication, method: method, path: uri, auth: anonymous, status: http.StatusUnauthorized})
		}
	}
	// A login posted as a form (what a web page can make a browser send)
	// is refused for its media type, before its made-up credentials count.
	cases = append(cases, errorCase{
		rule: ruleMediaType, method: http.MethodPost, path: "/redfish/v1/SessionService/Sessions", auth: anonymous,
		body:    map[string]any{"UserName": "conformance-no-such-user", "Password": "wrong"},
		headers: map[string]string{"Content-Type": "text/plain"}, status: http.StatusUnsupportedMediaType,
	})
	for _, c := range cases {
		r, err := s.request(ctx, c.method, c.path, c.body, c.auth, c.headers)
		if err != nil {
			return err
		}
		uri := c.method + " " + c.path
		if r.status != c.status {
			s.fail(c.rule, uri, "answered %d, want %d", r.status, c.status)
			continue
		}
		var problems []string
		if c.check != nil {
			problems = c.check(r)
		}
		s.check(c.rule, uri, problems)
		bodyProblems, err := s.errorBodyProblems(uri, r)
		if err != nil {
			return err
		}
		s.check(ruleErrorBody, uri, bodyProblems)
	}
	// What must still work: OData-Version 4.0, and parameters without $.
	for _, c := range []struct{ rule, path, version string }{
		{ruleODataVersion, serviceRootPath, "4.0"},
		{ruleQuery, serviceRootPath + "?conformanceunknown=1", ""},
	} {
		headers := map[string]string{}
		if c.version != "" {
			headers["OData-Version"] = c.version
		}
		r, err := s.request(ctx, http.MethodGet, c.path, nil, withBasic, headers)
		if err != nil {
			return err
		}
		if r.status != http.StatusOK {
			s.fail(c.rule, "GET "+c.path, "answered %d, want 200", r.status)
		} else {
			s.pass(c.rule, "GET "+c.path)
		}
	}
	return nil
}

// protectedURIs are the crawled URIs that need credentials: all but the
// version object, the service root, $metadata and the service document.
func (s *session) protectedURIs() []string {
	open := []string{versionPath, serviceRootPath, metadataPath, serviceDocumentPath}
	var out []string
	for _, uri := range s.visited {
		if !slices.ContainsFunc(open, func(o string) bool { return strings.TrimSuffix(o, "/") == strings.TrimSuffix(uri, "/") }) {
			out = append(out, uri)
		}
	}
	return out
}

// errorBodyProblems validates an error answer: JSON, the redfish-error
// schema, and each @Message.ExtendedInfo entry against its Message type.
// createdProblems checks a 201 answer: its body against its schema, and
// that the body is the resource at Location.
func (s *session) createdProblems(where string, created reply, location string) ([]string, error) {
	var problems []string
	violations, err := s.validator.Validate(where, created.body)
	if err != nil {
		return nil, err
	}
	for _, v := range violations {
		problems = append(problems, "201 body: "+v.String())
	}
	if id, _ := created.json["@odata.id"].(string); strings.TrimSuffix(id, "/") != strings.TrimSuffix(location, "/") {
		problems = append(problems, fmt.Sprintf("201 body's @odata.id %q is not the Location %q", id, location))
	}
	return problems, nil
}

func (s *session) errorBodyProblems(uri string, r reply) ([]string, error) {
	if !strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
		return []string{fmt.Sprintf("Content-Type is %q, want application/json", r.header.Get("Content-Type"))}, nil
	}
	violations, err := s.validator.ValidateAgainst(uri, r.body, errorSchema)
	if err != nil {
		return nil, err
	}
	var problems []string
	for _, v := range violations {
		problems = append(problems, v.String())
	}
	errObj, _ := r.json["error"].(map[string]any)
	infos, _ := errObj["@Message.ExtendedInfo"].([]any)
	if len(infos) == 0 {
		problems = append(problems, "error has no @Message.ExtendedInfo saying what went wrong")
	}
	for i, info := range infos {
		data, _ := json.Marshal(info) // a decoded JSON value marshals
		more, err := s.validator.Validate(fmt.Sprintf("%s @Message.ExtendedInfo/%d", uri, i), data)
		if err != nil {
			return nil, err
		}
		for _, v := range more {
			problems = append(problems, v.String())
		}
	}
	return problems, nil
}

// standardRoles are DSP0266's predefined roles and their privileges.
var standardRoles = map[string][]string{
	"Administrator": {"ConfigureComponents", "ConfigureManager", "ConfigureSelf", "ConfigureUsers", "Login"},
	"Operator":      {"ConfigureComponents", "ConfigureSelf", "Login"},
	"ReadOnly":      {"ConfigureSelf", "Login"},
}

// checkRoles: AccountService links Roles, which hold the standard roles
// with their standard privileges.
func (s *session) checkRoles(ctx context.Context) error {
	service, err := s.get(ctx, "/redfish/v1/AccountService")
	if err != nil {
		return err
	}
	rolesPath := odataID(service.json, "Roles")
	if rolesPath == "" {
		s.fail(ruleRoles, "/redfish/v1/AccountService", "AccountService has no Roles link")
		return nil
	}
	collection, err := s.get(ctx, rolesPath)
	if err != nil {
		return err
	}
	found := map[string][]string{}
	for _, member := range members(collection.json) {
		role, err := s.get(ctx, member)
		if err != nil {
			return err
		}
		id, _ := role.json["RoleId"].(string)
		if id == "" {
			id, _ = role.json["Id"].(string)
		}
		var privileges []string
		list, _ := role.json["AssignedPrivileges"].([]any)
		for _, p := range list {
			if name, ok := p.(string); ok {
				privileges = append(privileges, name)
			}
		}
		slices.Sort(privileges)
		found[id] = privileges
	}
	for _, name := range sortedKeys(standardRoles) {
		switch got, ok := found[name]; {
		case !ok:
			s.fail(ruleRoles, rolesPath, "the standard role %s is missing", name)
		case !slices.Equal(got, standardRoles[name]):
			s.fail(ruleRoles, rolesPath+"/"+name, "AssignedPrivileges are %v, want %v", got, standardRoles[name])
		default:
			s.pass(ruleRoles, rolesPath+"/"+name)
		}
	}
	return nil
}

// checkAccounts: every account answers with an ETag, and the account
// operations the service does not offer (by its Allow header) are refused
// with 405 and a Base message. Offered ones are never sent: they would
// change the service's accounts.
func (s *session) checkAccounts(ctx context.Context) error {
	const accountsPath = "/redfish/v1/AccountService/Accounts"
	service, err := s.get(ctx, "/redfish/v1/AccountService")
	if err != nil {
		return err
	}
	path := odataID(service.json, "Accounts")
	if path == "" {
		path = accountsPath
	}
	collection, err := s.get(ctx, path)
	if err != nil {
		return err
	}
	if collection.status != http.StatusOK {
		s.fail(ruleAccountETag, path, "GET answered %d", collection.status)
		return nil
	}
	if err := s.refuseUnoffered(ctx, path, collection.header, http.MethodPost, map[string]any{"UserName": "conformance", "Password": "Conformance-1-not-a-secret", "RoleId": "ReadOnly"}); err != nil {
		return err
	}
	for i, member := range members(collection.json) {
		account, err := s.get(ctx, member)
		if err != nil {
			return err
		}
		switch {
		case account.status != http.StatusOK:
			s.fail(ruleAccountETag, member, "GET answered %d", account.status)
			continue
		case account.header.Get("ETag") == "" && odataEtag(account.json) == "":
			s.fail(ruleAccountETag, member, "no ETag header and no @odata.etag")
		default:
			s.pass(ruleAccountETag, member)
		}
		if i > 0 {
			continue // one account shows how writes are refused
		}
		for _, method := range []string{http.MethodPatch, http.MethodDelete} {
			if err := s.refuseUnoffered(ctx, member, account.header, method, map[string]any{}); err != nil {
				return err
			}
		}
	}
	return nil
}

func odataEtag(body map[string]any) string {
	tag, _ := body["@odata.etag"].(string)
	return tag
}

// refuseUnoffered sends method to uri only when the Allow header of its
// GET leaves it out, and wants 405 with Allow and an error body then.
func (s *session) refuseUnoffered(ctx context.Context, uri string, getHeader http.Header, method string, body any) error {
	methods := allowed(getHeader)
	where := method + " " + uri
	switch {
	case len(methods) == 0:
		s.fail(ruleAccountWrites, where, "GET gave no Allow header, so whether %s is offered cannot be told", method)
		return nil
	case methods[method]:
		s.add(ruleAccountWrites, where, Warn, method+" is offered; not exercised, as it would change the accounts")
		return nil
	}
	r, err := s.request(ctx, method, uri, body, withBasic, nil)
	if err != nil {
		return err
	}
	if r.status != http.StatusMethodNotAllowed {
		s.fail(ruleAccountWrites, where, "Allow leaves %s out, but it answered %d, want 405", method, r.status)
		return nil
	}
	problems, err := s.errorBodyProblems(where, r)
	if err != nil {
		return err
	}
	if len(allowed(r.header)) == 0 {
		problems = append(problems, "405 without an Allow header")
	}
	s.check(ruleAccountWrites, where, problems)
	return nil
}

// checkSessionLifeCycle logs in, uses the token, validates the 201 body,
// logs out and checks the token is dead; an unknown user gets 401.
func (s *session) checkSessionLifeCycle(ctx context.Context) error {
	service, err := s.get(ctx, "/redfish/v1/SessionService")
	if err != nil {
		return err
	}
	sessionsPath := odataID(service.json, "Sessions")
	if sessionsPath == "" {
		s.fail(ruleSessions, "/redfish/v1/SessionService", "SessionService has no Sessions link")
		return nil
	}
	refused, err := s.request(ctx, http.MethodPost, sessionsPath, map[string]any{"UserName": "conformance-no-such-user", "Password": "wrong"}, anonymous, nil)
	if err != nil {
		return err
	}
	if refused.status != http.StatusUnauthorized {
		s.fail(ruleSessions, "POST "+sessionsPath, "a login as an unknown user answered %d, want 401", refused.status)
	} else {
		s.pass(ruleSessions, "POST "+sessionsPath+" (unknown user)")
	}

	created, err := s.request(ctx, http.MethodPost, sessionsPath, map[string]any{"UserName": s.target.Username, "Password": s.target.Password}, anonymous, nil)
	if err != nil {
		return err
	}
	token, location := created.header.Get("X-Auth-Token"), pathOf(created.header.Get("Location"))
	if created.status != http.StatusCreated || token == "" || location == "" {
		s.fail(ruleSessions, "POST "+sessionsPath, "login answered %d with X-Auth-Token %t and Location %q, want 201, a token and the session's URI", created.status, token != "", location)
		return nil
	}
	problems, err := s.createdProblems("POST "+sessionsPath, created, location)
	if err != nil {
		return err
	}
	if _, hasPassword := created.json["Password"]; hasPassword && created.json["Password"] != nil {
		problems = append(problems, "201 body shows the Password")
	}
	for _, uri := range []string{location, "/redfish/v1/Systems"} {
		r, err := s.request(ctx, http.MethodGet, uri, nil, withToken(token), nil)
		if err != nil {
			return err
		}
		if r.status != http.StatusOK {
			problems = append(problems, fmt.Sprintf("GET %s with the session's token answered %d", uri, r.status))
		}
	}
	deleted, err := s.request(ctx, http.MethodDelete, location, nil, withToken(token), nil)
	if err != nil {
		return err
	}
	if deleted.status != http.StatusOK && deleted.status != http.StatusNoContent {
		problems = append(problems, fmt.Sprintf("DELETE %s (logout) answered %d", location, deleted.status))
	}
	after, err := s.request(ctx, http.MethodGet, "/redfish/v1/Systems", nil, withToken(token), nil)
	if err != nil {
		return err
	}
	if after.status != http.StatusUnauthorized {
		problems = append(problems, fmt.Sprintf("the token still answers %d after logout, want 401", after.status))
	}
	s.check(ruleSessions, location, problems)
	return nil
}

// checkPatch writes back a system's BootSourceOverrideEnabled with its
// ETag: the answer is 200 with a valid body or 204; a stale ETag gets 412
// and an unknown property 400, both with error bodies.
func (s *session) checkPatch(ctx context.Context) error {
	systems, err := s.get(ctx, "/redfish/v1/Systems")
	if err != nil {
		return err
	}
	for _, uri := range members(systems.json) {
		system, err := s.get(ctx, uri)
		if err != nil {
			return err
		}
		boot, _ := system.json["Boot"].(map[string]any)
		enabled, ok := boot["BootSourceOverrideEnabled"].(string)
		if !ok {
			continue
		}
		etag := system.header.Get("ETag")
		if etag == "" {
			etag = odataEtag(system.json)
		}
		same := map[string]any{"Boot": map[string]any{"BootSourceOverrideEnabled": enabled}}
		var problems []string
		stale, err := s.request(ctx, http.MethodPatch, uri, same, withBasic, map[string]string{"If-Match": `"conformance-stale"`})
		if err != nil {
			return err
		}
		if stale.status != http.StatusPreconditionFailed {
			problems = append(problems, fmt.Sprintf("PATCH with a stale If-Match answered %d, want 412", stale.status))
		} else if more, err := s.errorBodyProblems("PATCH "+uri, stale); err != nil {
			return err
		} else {
			problems = append(problems, more...)
		}
		unknown, err := s.request(ctx, http.MethodPatch, uri, map[string]any{"ConformanceUnknownProperty": 1}, withBasic, nil)
		if err != nil {
			return err
		}
		if unknown.status != http.StatusBadRequest {
			problems = append(problems, fmt.Sprintf("PATCH of an unknown property answered %d, want 400", unknown.status))
		} else if !bytes.Contains(unknown.body, []byte("PropertyUnknown")) {
			problems = append(problems, "PATCH of an unknown property did not answer with PropertyUnknown")
		}
		headers := map[string]string{}
		if etag != "" {
			headers["If-Match"] = etag
		}
		patched, err := s.request(ctx, http.MethodPatch, uri, same, withBasic, headers)
		if err != nil {
			return err
		}
		switch patched.status {
		case http.StatusOK:
			violations, err := s.validator.Validate("PATCH "+uri, patched.body)
			if err != nil {
				return err
			}
			for _, v := range violations {
				problems = append(problems, "200 body: "+v.String())
			}
		case http.StatusNoContent, http.StatusAccepted:
		default:
			problems = append(problems, fmt.Sprintf("PATCH with the current ETag answered %d: %.200s", patched.status, patched.body))
		}
		s.check(rulePatch, uri, problems)
		return nil
	}
	s.fail(rulePatch, "/redfish/v1/Systems", "no system has Boot.BootSourceOverrideEnabled to PATCH")
	return nil
}
