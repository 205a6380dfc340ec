package redfish

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
)

const jsonContentType = "application/json; charset=utf-8"

// commonHeaders are on every answer: OData-Version because DSP0266 requires
// it, no-cache because BMC state changes under clients' feet.
func commonHeaders(h http.Header) {
	h.Set("OData-Version", "4.0")
	h.Set("Cache-Control", "no-cache")
}

// copyHeader adds extra headers under their canonical names.
func copyHeader(dst, extra http.Header) {
	for k, values := range extra {
		for _, v := range values {
			dst.Add(k, v)
		}
	}
}

// etagOf is a strong ETag over the representation: it changes exactly when
// the body does.
func etagOf(body []byte) string {
	sum := sha256.Sum256(body)
	return `"` + hex.EncodeToString(sum[:12]) + `"`
}

func (s *Server) writeResult(w http.ResponseWriter, r *http.Request, res result) {
	if res.stream != nil {
		res.stream(w, r)
		return
	}
	e, apiErr := render(res, nil)
	if apiErr != nil {
		s.writeError(w, r, apiErr)
		return
	}
	e.write(w, r)
}

// writeBody sends the body, except to HEAD, which gets the GET answer's
// headers (Content-Length included) and nothing else.
func writeBody(w http.ResponseWriter, r *http.Request, data []byte) {
	if r.Method != http.MethodHead {
		_, _ = w.Write(data)
	}
}

// linkFor names the JSON schema that describes a body.
func linkFor(body any) string {
	m, ok := body.(map[string]any)
	if !ok {
		return ""
	}
	if t, ok := m["@odata.type"].(string); ok {
		return describedBy(t)
	}
	if _, ok := m["@odata.context"]; ok {
		return serviceDocumentSchemaURI
	}
	return ""
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, e *apiError) {
	if e.status >= 500 {
		s.log.Error(e, "request failed", "method", r.Method, "path", r.URL.Path, "status", e.status)
	}
	writeErrorBody(w, r, e)
}

// NotFound answers 404 with the Base registry's ResourceNotFound for r's
// path, as the service does for an unknown URI: for a front end (virtual
// hosts) that has no service to hand the request to.
func NotFound(w http.ResponseWriter, r *http.Request) {
	writeErrorBody(w, r, newError(http.StatusNotFound, msgResourceNotFound, "Resource", r.URL.Path))
}

// writeErrorBody sends e as the redfish-error JSON object.
func writeErrorBody(w http.ResponseWriter, r *http.Request, e *apiError) {
	h := w.Header()
	commonHeaders(h)
	copyHeader(h, e.header)
	data, _ := json.Marshal(e.body()) // a map of strings and slices always marshals
	h.Set("Content-Type", jsonContentType)
	h.Set("Link", "<"+errorSchemaURI+">; rel=describedby")
	h.Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(e.status)
	writeBody(w, r, data)
}

// etagMatches implements If-Match / If-None-Match list matching with strong
// comparison; "*" matches any current representation.
func etagMatches(header, etag string) bool {
	for header != "" {
		var candidate string
		candidate, header, _ = strings.Cut(header, ",")
		if candidate = strings.TrimSpace(candidate); candidate == "*" || candidate == etag {
			return true
		}
	}
	return false
}

// readBody reads a POST or PATCH body, refusing more than MaxBodyBytes.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	if r.ContentLength > s.maxBody {
		return nil, newError(http.StatusRequestEntityTooLarge, msgPayloadTooLarge)
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, newError(http.StatusRequestEntityTooLarge, msgPayloadTooLarge)
	case err != nil:
		return nil, newError(http.StatusBadRequest, msgMalformedJSON)
	}
	return data, nil
}

// decodeObject parses a body as a JSON object of raw members. An empty body
// is an empty object: EjectMedia and friends are often posted bare.
func decodeObject(body []byte) (map[string]json.RawMessage, *apiError) {
	obj := map[string]json.RawMessage{}
	if strings.TrimSpace(string(body)) == "" {
		return obj, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&obj); err != nil || obj == nil {
		return nil, newError(http.StatusBadRequest, msgMalformedJSON)
	}
	// Trailing garbage after the object is malformed too.
	if _, err := dec.Token(); err != io.EOF {
		return nil, newError(http.StatusBadRequest, msgMalformedJSON)
	}
	return obj, nil
}

// jsonText renders a raw JSON value for a message argument: strings
// unquoted, anything else as sent.
func jsonText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return strings.TrimSpace(string(raw))
}

// jsonString returns the string a raw JSON value holds, or false when it is
// another type (null included).
func jsonString(raw json.RawMessage) (string, bool) {
	var s string
	trimmed := strings.TrimSpace(string(raw))
	if !strings.HasPrefix(trimmed, `"`) || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// jsonBool returns the boolean a raw JSON value holds.
func jsonBool(raw json.RawMessage) (bool, bool) {
	switch strings.TrimSpace(string(raw)) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}
