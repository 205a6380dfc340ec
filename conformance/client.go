package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// maxReplyBytes bounds what one answer may hold.
const maxReplyBytes = 16 << 20

// credentials say how a request authenticates.
type credentials struct {
	basic bool
	token string // X-Auth-Token
}

var (
	withBasic = credentials{basic: true}
	anonymous = credentials{}
)

func withToken(token string) credentials { return credentials{token: token} }

// reply is one answer, its body decoded when it is a JSON object.
type reply struct {
	status int
	header http.Header
	body   []byte
	json   map[string]any
}

// request sends one request; path may carry a query.
func (s *session) request(ctx context.Context, method, path string, body any, auth credentials, headers map[string]string) (reply, error) {
	var reader io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return reply{}, err
		}
		reader = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(s.target.BaseURL, "/")+path, reader)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if auth.basic {
		req.SetBasicAuth(s.target.Username, s.target.Password)
	}
	if auth.token != "" {
		req.Header.Set("X-Auth-Token", auth.token)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := s.target.Client.Do(req)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes+1))
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if len(data) > maxReplyBytes {
		return reply{}, fmt.Errorf("%s %s: answer larger than %d bytes", method, path, maxReplyBytes)
	}
	r := reply{status: resp.StatusCode, header: resp.Header, body: data}
	if len(bytes.TrimSpace(data)) > 0 {
		var obj map[string]any
		if json.Unmarshal(data, &obj) == nil {
			r.json = obj
		}
	}
	return r, nil
}

func (s *session) get(ctx context.Context, path string) (reply, error) {
	return s.request(ctx, http.MethodGet, path, nil, withBasic, nil)
}

// allowed parses an Allow header into its methods.
func allowed(h http.Header) map[string]bool {
	methods := map[string]bool{}
	for _, v := range h.Values("Allow") {
		for _, m := range strings.Split(v, ",") {
			if m = strings.TrimSpace(m); m != "" {
				methods[strings.ToUpper(m)] = true
			}
		}
	}
	return methods
}

// odataID returns the @odata.id of a link object found under keys.
func odataID(body map[string]any, keys ...string) string {
	var cur any = body
	for _, k := range keys {
		m, ok := cur.(map[string]any)
		if !ok {
			return ""
		}
		cur = m[k]
	}
	m, _ := cur.(map[string]any)
	id, _ := m["@odata.id"].(string)
	return id
}

// members returns the @odata.id of a collection's Members.
func members(body map[string]any) []string {
	list, _ := body["Members"].([]any)
	var out []string
	for _, item := range list {
		if m, ok := item.(map[string]any); ok {
			if id, ok := m["@odata.id"].(string); ok {
				out = append(out, id)
			}
		}
	}
	return out
}

// pathOf reduces a Location header or @odata.id to its path.
func pathOf(ref string) string {
	if u, err := url.Parse(ref); err == nil && u.Path != "" {
		return u.Path
	}
	return ref
}
