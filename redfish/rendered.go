package redfish

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
)

// renderScope says for how long a GET's answer stays what it is. A status
// poll is the request every provisioning system repeats, so answers are
// rendered (JSON, ETag, headers) once per change and then served as bytes:
// If-None-Match becomes a comparison.
type renderScope int

const (
	// perRequest: rendered for every request (sessions and accounts change
	// without the machine's state saying so).
	perRequest renderScope = iota
	// forLife: nothing the answer shows changes while the server runs.
	forLife
	// whileMachineList: the backend's machine list, which a
	// machine.Versioned backend never changes.
	whileMachineList
	// whileMachineState: the addressed machine's state, as long as the
	// backend's StateVersion of it stays the same.
	whileMachineState
)

// rendered is a complete answer, immutable once built: its header values
// are shared by every response that serves it.
type rendered struct {
	status int
	header http.Header
	etag   string // empty: not a 200 with a body
	data   []byte

	// What a cached answer was rendered from, to render it again when it
	// is out of date without going through the router.
	route     route
	vars      map[string]string
	machineID string
	version   uint64
}

// renderCache holds the rendered GET answers by request path. Paths that
// reach it rendered a 200 through the route table, so their number is
// bounded by the resources that exist. Readers never lock: the map is
// replaced, not changed.
type renderCache struct {
	mu      sync.Mutex // serialises writers
	entries atomic.Pointer[map[string]*rendered]
}

func (c *renderCache) get(path string) *rendered {
	if m := c.entries.Load(); m != nil {
		return (*m)[path]
	}
	return nil
}

func (c *renderCache) put(path string, e *rendered) {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := map[string]*rendered{path: e}
	if m := c.entries.Load(); m != nil {
		for k, v := range *m {
			if k != path {
				next[k] = v
			}
		}
	}
	c.entries.Store(&next)
}

// value is a header value that no response may change: a slice of length
// and capacity one, so an Add by anyone appends to a copy.
func value(v string) []string { return []string{v}[:1:1] }

// Values every answer shares.
var (
	odataVersionValue = value("4.0")
	noCacheValue      = value("no-cache")
	jsonTypeValue     = value(jsonContentType)
)

// render turns a handler's result into the bytes and headers of the answer.
// allow is the path's Allow header (nil where the answer carries none).
func render(res result, allow []string) (*rendered, *apiError) {
	e := &rendered{status: res.status, header: http.Header{
		"Odata-Version": odataVersionValue,
		"Cache-Control": noCacheValue,
	}}
	if allow != nil {
		e.header["Allow"] = allow
	}
	copyHeader(e.header, res.header)
	switch {
	case res.raw != nil:
		e.data = res.raw
		e.header["Content-Type"] = value(res.contentType)
	case res.body != nil:
		data, err := json.Marshal(res.body)
		if err != nil {
			return nil, &apiError{status: http.StatusInternalServerError, messages: []message{{key: msgInternalError}}, cause: err}
		}
		e.data = data
		e.header["Content-Type"] = jsonTypeValue
		if link := linkFor(res.body); link != "" {
			e.header["Link"] = value("<" + link + ">; rel=describedby")
		}
	}
	if e.status == 0 {
		e.status = http.StatusOK
		if e.data == nil {
			e.status = http.StatusNoContent
		}
	}
	if e.data != nil && e.status == http.StatusOK {
		e.etag = res.etag
		if e.etag == "" {
			e.etag = etagOf(e.data)
		}
		e.header["Etag"] = value(e.etag)
	}
	if e.data != nil {
		e.header["Content-Length"] = value(strconv.Itoa(len(e.data)))
	}
	return e, nil
}

// write sends e. A GET or HEAD whose If-None-Match names the ETag gets 304
// with the same headers but the length.
func (e *rendered) write(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	notModified := e.etag != "" && (r.Method == http.MethodGet || r.Method == http.MethodHead) &&
		etagMatches(r.Header.Get("If-None-Match"), e.etag)
	for k, v := range e.header {
		if notModified && k == "Content-Length" {
			continue
		}
		h[k] = v
	}
	if notModified {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.WriteHeader(e.status)
	writeBody(w, r, e.data)
}

// renderedVersion is the version a cached answer of rt is valid for, read
// before rendering so that a change while rendering makes the answer out of
// date rather than unnoticed. ok is false where the answer cannot be kept.
func (s *Server) renderedVersion(rt route, vars map[string]string) (machineID string, version uint64, ok bool) {
	switch rt.rendered {
	case forLife:
		return "", 0, true
	case whileMachineList:
		return "", 0, s.versioned != nil
	case whileMachineState:
		if s.versioned == nil {
			return "", 0, false
		}
		id := machineVar(vars)
		version, ok := s.versioned.StateVersion(id)
		return id, version, ok
	}
	return "", 0, false
}

// machineVar is the path variable naming the machine of a machine's
// resource.
func machineVar(vars map[string]string) string {
	for _, name := range []string{"systemID", "managerID", "chassisID"} {
		if id, ok := vars[name]; ok {
			return id
		}
	}
	return ""
}

// upToDate reports whether a cached answer still shows the current state.
func (s *Server) upToDate(e *rendered) bool {
	if e.route.rendered != whileMachineState {
		return true
	}
	version, ok := s.versioned.StateVersion(e.machineID)
	return ok && version == e.version
}

// serveGet answers an authorised GET or HEAD of a route whose answer can be
// kept: rendered afresh, kept when it is a plain 200, and sent.
func (s *Server) serveGet(w http.ResponseWriter, r *http.Request, c *call, rt route) {
	machineID, version, keep := s.renderedVersion(rt, c.vars)
	res, err := rt.handle(s, c)
	if err != nil {
		s.writeError(w, r, asAPIError(err))
		return
	}
	e, apiErr := render(res, w.Header()["Allow"])
	if apiErr != nil {
		s.writeError(w, r, apiErr)
		return
	}
	if keep && e.status == http.StatusOK && res.header == nil {
		e.route, e.vars, e.machineID, e.version = rt, c.vars, machineID, version
		s.rendered.put(r.URL.Path, e)
	}
	e.write(w, r)
}

// serveKept answers a GET or HEAD whose path has a kept answer, without
// the router: the same checks as serveRoute, then the bytes when they are
// up to date, or a fresh rendering. It returns false for requests it
// leaves to the router (query parameters, another OData-Version).
func (s *Server) serveKept(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead || r.URL.RawQuery != "" {
		return false
	}
	e := s.rendered.get(r.URL.Path)
	if e == nil {
		return false
	}
	if rec, ok := w.(*recordingWriter); ok {
		rec.route = e.route.path // for the Observer
	}
	if v := r.Header.Get("OData-Version"); v != "" && v != supportedODataVersion {
		return false
	}
	var user principal
	if e.route.privilege != privNoAuth {
		var ok bool
		if user, ok = s.auth.authenticate(r); !ok {
			s.writeError(w, r, s.unauthorized())
			return true
		}
		if !user.has(e.route.privilege) {
			s.writeError(w, r, newError(http.StatusForbidden, msgInsufficientPrivilege))
			return true
		}
	}
	if allow := e.header["Allow"]; allow != nil {
		w.Header()["Allow"] = allow
	}
	if s.upToDate(e) {
		e.write(w, r)
		return true
	}
	s.serveGet(w, r, &call{r: r, vars: e.vars, user: user}, e.route)
	return true
}
