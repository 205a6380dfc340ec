package redfish

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/gorilla/mux"
)

// call is one authorised request as a handler sees it.
type call struct {
	r    *http.Request
	vars map[string]string // path template variables
	user principal
	body []byte // the request body of POST and PATCH, already size-checked
}

func (c *call) ctx() context.Context { return c.r.Context() }

// result is what a handler answers. A nil body with no status is 204.
type result struct {
	status int
	body   any // marshalled to JSON
	header http.Header
	// etag, when set, replaces the ETag computed from the body.
	etag string
	// raw and contentType carry a non-JSON body ($metadata).
	raw         []byte
	contentType string
	// stream, when set, writes the whole answer itself (an SSE stream).
	stream func(w http.ResponseWriter, r *http.Request)
}

type handlerFunc func(s *Server, c *call) (result, error)

// route is one row of the route table: the only place that says which
// method, path and privilege reach which handler.
type route struct {
	method    string
	path      string
	privilege privilege
	handle    handlerFunc
	// owner, when set, names the account that owns the addressed resource;
	// that account may use the route without the privilege (ConfigureSelf).
	owner func(s *Server, c *call) string
	// rendered says how long a GET's answer stays valid, so that it is
	// rendered once and then served as bytes.
	rendered renderScope
}

func serverRoutes() []route {
	const (
		sys     = "/redfish/v1/Systems/{systemID}"
		mgr     = "/redfish/v1/Managers/{managerID}"
		sysCD   = sys + "/VirtualMedia/{mediaID}"
		mgrCD   = mgr + "/VirtualMedia/{mediaID}"
		session = "/redfish/v1/SessionService/Sessions/{sessionID}"
		account = "/redfish/v1/AccountService/Accounts/{accountID}"
		// A subscription's id is a number; a DELETE of "SSE" is a 404.
		subscription = subscriptionsPath + "/{subscriptionID:[0-9]+}"
		sysLog       = sys + "/LogServices/" + logServiceID
		sysStorage   = sys + "/Storage/{storageID}"
		mgrLog       = mgr + "/LogServices/" + logServiceID
	)
	return []route{
		{http.MethodGet, "/redfish", privNoAuth, (*Server).getVersions, nil, forLife},
		{http.MethodGet, "/redfish/v1", privNoAuth, (*Server).getServiceRoot, nil, forLife},
		{http.MethodGet, "/redfish/v1/$metadata", privNoAuth, (*Server).getMetadata, nil, forLife},
		{http.MethodGet, "/redfish/v1/odata", privNoAuth, (*Server).getServiceDocument, nil, forLife},

		{http.MethodGet, registriesPath, privLogin, (*Server).getRegistries, nil, forLife},
		{http.MethodGet, biosRegistryFile, privLogin, (*Server).getBiosRegistryFile, nil, forLife},
		{http.MethodGet, biosRegistryDocPath, privLogin, (*Server).getBiosRegistry, nil, forLife},

		{http.MethodGet, "/redfish/v1/Systems", privLogin, (*Server).getSystems, nil, whileMachineList},
		{http.MethodGet, sys, privLogin, (*Server).getSystem, nil, whileMachineState},
		{http.MethodPatch, sys, privConfigureComponents, (*Server).patchSystem, nil, perRequest},
		{http.MethodPost, sys + "/Actions/ComputerSystem.Reset", privConfigureComponents, (*Server).resetSystem, nil, perRequest},
		{http.MethodGet, sys + "/ResetActionInfo", privLogin, (*Server).getResetActionInfo, nil, whileMachineState},
		{http.MethodGet, sys + "/EthernetInterfaces", privLogin, (*Server).getEthernetInterfaces, nil, whileMachineState},
		{http.MethodGet, sys + "/EthernetInterfaces/{nicID}", privLogin, (*Server).getEthernetInterface, nil, whileMachineState},
		{http.MethodGet, sys + "/SimpleStorage", privLogin, (*Server).getSimpleStorages, nil, whileMachineState},
		{http.MethodGet, sys + "/SimpleStorage/{storageID}", privLogin, (*Server).getSimpleStorage, nil, whileMachineState},
		{http.MethodGet, sys + "/Processors", privLogin, (*Server).getProcessors, nil, whileMachineState},
		{http.MethodGet, sys + "/Processors/{processorID}", privLogin, (*Server).getProcessor, nil, whileMachineState},
		{http.MethodGet, sys + "/Memory", privLogin, (*Server).getMemoryCollection, nil, whileMachineState},
		{http.MethodGet, sys + "/Memory/{memoryID}", privLogin, (*Server).getMemory, nil, whileMachineState},
		{http.MethodGet, sys + "/Storage", privLogin, (*Server).getStorageCollection, nil, whileMachineState},
		{http.MethodGet, sysStorage, privLogin, (*Server).getStorage, nil, whileMachineState},
		{http.MethodGet, sysStorage + "/Volumes", privLogin, (*Server).getVolumes, nil, whileMachineState},
		{http.MethodGet, sysStorage + "/Volumes/{volumeID}", privLogin, (*Server).getVolume, nil, whileMachineState},
		{http.MethodGet, sysStorage + "/Controllers", privLogin, (*Server).getStorageControllers, nil, whileMachineState},
		{http.MethodGet, sysStorage + "/Controllers/{controllerID}", privLogin, (*Server).getStorageController, nil, whileMachineState},
		{http.MethodGet, sys + "/Bios", privLogin, (*Server).getBios, nil, whileMachineState},
		{http.MethodGet, sys + "/Bios/Settings", privLogin, (*Server).getBiosSettings, nil, whileMachineState},
		{http.MethodPatch, sys + "/Bios/Settings", privConfigureComponents, (*Server).patchBiosSettings, nil, perRequest},
		{http.MethodPost, sys + "/Bios/Actions/Bios.ResetBios", privConfigureComponents, (*Server).resetBios, nil, perRequest},
		{http.MethodGet, sys + "/SecureBoot", privLogin, (*Server).getSecureBoot, nil, whileMachineState},
		{http.MethodPatch, sys + "/SecureBoot", privConfigureComponents, (*Server).patchSecureBoot, nil, perRequest},
		{http.MethodPost, sys + "/SecureBoot/Actions/SecureBoot.ResetKeys", privConfigureComponents, (*Server).resetSecureBootKeys, nil, perRequest},
		// The consoles are WebSockets (console.go): the handshake is a GET.
		{http.MethodGet, sys + "/Oem/VirtMetal/SerialConsole", privConfigureComponents, (*Server).openSerialConsole, nil, perRequest},
		{http.MethodGet, sys + "/Oem/VirtMetal/GraphicalConsole", privConfigureComponents, (*Server).openGraphicalConsole, nil, perRequest},
		{http.MethodGet, sys + "/VirtualMedia", privLogin, (*Server).getVirtualMediaCollection, nil, whileMachineState},
		{http.MethodGet, sysCD, privLogin, (*Server).getVirtualMedia, nil, whileMachineState},
		{http.MethodGet, sysCD + "/InsertMediaActionInfo", privLogin, (*Server).getInsertMediaActionInfo, nil, whileMachineState},
		{http.MethodPost, sysCD + "/Actions/VirtualMedia.InsertMedia", privConfigureComponents, (*Server).insertMedia, nil, perRequest},
		{http.MethodPost, sysCD + "/Actions/VirtualMedia.EjectMedia", privConfigureComponents, (*Server).ejectMedia, nil, perRequest},

		{http.MethodGet, sys + "/LogServices", privLogin, getLogServices(systemLogs), nil, perRequest},
		{http.MethodGet, sysLog, privLogin, getLogService(systemLogs), nil, perRequest},
		{http.MethodGet, sysLog + "/Entries", privLogin, getLogEntries(systemLogs), nil, perRequest},
		{http.MethodGet, sysLog + "/Entries/{entryID}", privLogin, getLogEntry(systemLogs), nil, perRequest},
		{http.MethodPost, sysLog + "/Actions/LogService.ClearLog", privConfigureComponents, clearLog(systemLogs), nil, perRequest},

		{http.MethodGet, "/redfish/v1/Managers", privLogin, (*Server).getManagers, nil, whileMachineList},
		{http.MethodGet, mgr, privLogin, (*Server).getManager, nil, whileMachineState},
		{http.MethodPost, mgr + "/Actions/Manager.Reset", privConfigureManager, (*Server).resetManager, nil, perRequest},
		{http.MethodGet, mgr + "/NetworkProtocol", privLogin, (*Server).getNetworkProtocol, nil, whileMachineState},
		// The system's drive again, where older clients look (media.go).
		{http.MethodGet, mgr + "/VirtualMedia", privLogin, (*Server).getVirtualMediaCollection, nil, whileMachineState},
		{http.MethodGet, mgrCD, privLogin, (*Server).getVirtualMedia, nil, whileMachineState},
		{http.MethodGet, mgrCD + "/InsertMediaActionInfo", privLogin, (*Server).getInsertMediaActionInfo, nil, whileMachineState},
		{http.MethodPost, mgrCD + "/Actions/VirtualMedia.InsertMedia", privConfigureComponents, (*Server).insertMedia, nil, perRequest},
		{http.MethodPost, mgrCD + "/Actions/VirtualMedia.EjectMedia", privConfigureComponents, (*Server).ejectMedia, nil, perRequest},
		{http.MethodGet, mgr + "/LogServices", privLogin, getLogServices(managerLogs), nil, perRequest},
		{http.MethodGet, mgrLog, privLogin, getLogService(managerLogs), nil, perRequest},
		{http.MethodGet, mgrLog + "/Entries", privLogin, getLogEntries(managerLogs), nil, perRequest},
		{http.MethodGet, mgrLog + "/Entries/{entryID}", privLogin, getLogEntry(managerLogs), nil, perRequest},
		{http.MethodPost, mgrLog + "/Actions/LogService.ClearLog", privConfigureManager, clearLog(managerLogs), nil, perRequest},

		{http.MethodGet, "/redfish/v1/Chassis", privLogin, (*Server).getChassisCollection, nil, whileMachineList},
		{http.MethodGet, "/redfish/v1/Chassis/{chassisID}", privLogin, (*Server).getChassis, nil, whileMachineState},
		{http.MethodPatch, "/redfish/v1/Chassis/{chassisID}", privConfigureComponents, (*Server).patchChassis, nil, perRequest},
		{http.MethodGet, "/redfish/v1/Chassis/{chassisID}/Drives", privLogin, (*Server).getDrives, nil, whileMachineState},
		{http.MethodGet, "/redfish/v1/Chassis/{chassisID}/Drives/{driveID}", privLogin, (*Server).getDrive, nil, whileMachineState},

		{http.MethodGet, eventServicePath, privLogin, (*Server).getEventService, nil, forLife},
		{http.MethodGet, ssePath, privLogin, (*Server).streamEvents, nil, perRequest},
		{http.MethodPost, submitTestEventPath, privConfigureManager, (*Server).submitTestEvent, nil, perRequest},
		{http.MethodGet, subscriptionsPath, privLogin, (*Server).getSubscriptions, nil, perRequest},
		{http.MethodPost, subscriptionsPath, privConfigureComponents, (*Server).createSubscription, nil, perRequest},
		{http.MethodPost, subscriptionsPath + "/Members", privConfigureComponents, (*Server).createSubscription, nil, perRequest},
		{http.MethodGet, subscription, privLogin, (*Server).getSubscription, nil, perRequest},
		{http.MethodPatch, subscription, privConfigureManager, (*Server).patchSubscription, (*Server).subscriptionOwner, perRequest},
		{http.MethodDelete, subscription, privConfigureManager, (*Server).deleteSubscription, (*Server).subscriptionOwner, perRequest},
		{http.MethodPost, subscription + "/Actions/EventDestination.SuspendSubscription", privConfigureManager, (*Server).suspendSubscription, (*Server).subscriptionOwner, perRequest},
		{http.MethodPost, subscription + "/Actions/EventDestination.ResumeSubscription", privConfigureManager, (*Server).resumeSubscription, (*Server).subscriptionOwner, perRequest},

		// Tasks change without the machine's version saying so: an
		// import moves by itself.
		{http.MethodGet, taskServicePath, privLogin, (*Server).getTaskService, nil, forLife},
		{http.MethodGet, tasksPath, privLogin, (*Server).getTasks, nil, perRequest},
		{http.MethodGet, tasksPath + "/{taskID}", privLogin, (*Server).getTask, nil, perRequest},
		{http.MethodGet, taskMonitorsDir + "/{taskID}", privLogin, (*Server).getTaskMonitor, nil, perRequest},

		{http.MethodGet, "/redfish/v1/SessionService", privLogin, (*Server).getSessionService, nil, forLife},
		{http.MethodGet, "/redfish/v1/SessionService/Sessions", privLogin, (*Server).getSessions, nil, perRequest},
		{http.MethodPost, "/redfish/v1/SessionService/Sessions", privNoAuth, (*Server).createSession, nil, perRequest},
		// DSP0266: a POST to a collection's Members is a POST to the collection.
		{http.MethodPost, "/redfish/v1/SessionService/Sessions/Members", privNoAuth, (*Server).createSession, nil, perRequest},
		{http.MethodGet, session, privConfigureManager, (*Server).getSession, (*Server).sessionOwner, perRequest},
		{http.MethodDelete, session, privConfigureManager, (*Server).deleteSession, (*Server).sessionOwner, perRequest},

		{http.MethodGet, "/redfish/v1/AccountService", privLogin, (*Server).getAccountService, nil, forLife},
		{http.MethodGet, "/redfish/v1/AccountService/Accounts", privLogin, (*Server).getAccounts, nil, perRequest},
		{http.MethodGet, account, privConfigureUsers, (*Server).getAccount, (*Server).accountOwner, perRequest},
		{http.MethodGet, "/redfish/v1/AccountService/Roles", privLogin, (*Server).getRoles, nil, forLife},
		{http.MethodGet, "/redfish/v1/AccountService/Roles/{roleID}", privLogin, (*Server).getRole, nil, forLife},
	}
}

// endpoint is a path's routes, one per method: 405 and Allow come straight
// from the table.
type endpoint struct {
	template pathTemplate
	routes   []route
	allow    string
	public   bool // no method needs credentials
}

// endpoints are the service's paths by their number of segments, the same
// for every Server, built once for the process (a shared bmc-server has a
// Server per VM). Every GET row also answers HEAD (RFC 9110: GET without
// the body), and every path answers OPTIONS with its methods. Templates
// are matched segment by segment, not by a regular expression each as a
// mux router would: those took 670 KB of every BMC's heap for the table's
// 79 paths.
var endpoints = sync.OnceValue(func() map[int][]*endpoint {
	byPath := map[string][]route{}
	var paths []string
	for _, rt := range serverRoutes() {
		if _, ok := byPath[rt.path]; !ok {
			paths = append(paths, rt.path)
		}
		byPath[rt.path] = append(byPath[rt.path], rt)
		if rt.method == http.MethodGet {
			head := rt
			head.method = http.MethodHead
			byPath[rt.path] = append(byPath[rt.path], head)
		}
	}
	bySegments := map[int][]*endpoint{}
	for _, p := range paths { // in the table's order: the first match wins
		routes := byPath[p]
		routes = append(routes, route{http.MethodOptions, p, optionsPrivilege(routes), answerOptions, nil, perRequest})
		allowed := make([]string, len(routes))
		for i, rt := range routes {
			allowed[i] = rt.method
		}
		t := parseTemplate(p)
		bySegments[len(t)] = append(bySegments[len(t)], &endpoint{
			template: t,
			routes:   routes,
			allow:    strings.Join(allowed, ", "),
			public:   !slices.ContainsFunc(routes, func(rt route) bool { return rt.privilege != privNoAuth }),
		})
	}
	return bySegments
})

// pathTemplate is a route's path split at its slashes.
type pathTemplate []templateSegment

// templateSegment is a literal, or a variable: "{name}" matches any
// segment but an empty one, "{name:[0-9]+}" one of digits only.
type templateSegment struct {
	literal  string
	variable string
	digits   bool
}

// parseTemplate splits a route table path; a variable pattern it does not
// know is the table's mistake, found by every test that serves a request.
func parseTemplate(path string) pathTemplate {
	var t pathTemplate
	for _, seg := range strings.Split(strings.TrimPrefix(path, "/"), "/") {
		inner, ok := strings.CutPrefix(seg, "{")
		if !ok {
			t = append(t, templateSegment{literal: seg})
			continue
		}
		inner, ok = strings.CutSuffix(inner, "}")
		name, pattern, hasPattern := strings.Cut(inner, ":")
		if !ok || name == "" || (hasPattern && pattern != "[0-9]+") {
			panic("redfish: route path " + path + ": segment " + seg + " is not a literal, {name} or {name:[0-9]+}")
		}
		t = append(t, templateSegment{variable: name, digits: hasPattern})
	}
	return t
}

// match tells whether path matches t, and the values of t's variables.
func (t pathTemplate) match(path string) (map[string]string, bool) {
	rest := strings.TrimPrefix(path, "/")
	var vars map[string]string
	for i, ts := range t {
		seg, after, more := strings.Cut(rest, "/")
		if more == (i == len(t)-1) {
			return nil, false // the path has more or fewer segments
		}
		rest = after
		switch {
		case ts.variable == "":
			if seg != ts.literal {
				return nil, false
			}
			continue
		case seg == "", ts.digits && strings.Trim(seg, "0123456789") != "":
			return nil, false
		}
		if vars == nil {
			vars = map[string]string{}
		}
		vars[ts.variable] = seg
	}
	return vars, true
}

// serveEndpoint serves r with the first endpoint whose path template r's
// path matches, with the template's variables.
func (s *Server) serveEndpoint(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	for _, ep := range endpoints()[strings.Count(strings.TrimPrefix(path, "/"), "/")+1] {
		if vars, ok := ep.template.match(path); ok {
			s.serveAt(w, mux.SetURLVars(r, vars), ep)
			return
		}
	}
	s.notFound(w, r)
}

// optionsPrivilege lets OPTIONS through without credentials where some
// method of the path needs none (the service root, the login), and asks for
// a login elsewhere, so that it reveals nothing about protected URIs.
func optionsPrivilege(routes []route) privilege {
	if slices.ContainsFunc(routes, func(rt route) bool { return rt.privilege == privNoAuth }) {
		return privNoAuth
	}
	return privLogin
}

// answerOptions is OPTIONS: the Allow header the endpoint sets is the answer.
func answerOptions(*Server, *call) (result, error) { return result{}, nil }

// serveAt serves r with the endpoint's route of its method, or 405.
func (s *Server) serveAt(w http.ResponseWriter, r *http.Request, ep *endpoint) {
	if rec, ok := w.(*recordingWriter); ok {
		rec.route = ep.routes[0].path // for the Observer
	}
	i := slices.IndexFunc(ep.routes, func(rt route) bool { return rt.method == r.Method })
	if i < 0 {
		// Only callers who may see the resource learn which methods
		// it has: a 405 with Allow would map every path without
		// credentials.
		if _, ok := s.auth.authenticate(r); !ok && !ep.public {
			s.writeError(w, r, s.unauthorized())
			return
		}
		e := newError(http.StatusMethodNotAllowed, msgOperationNotAllowed)
		e.header = http.Header{"Allow": {ep.allow}}
		s.writeError(w, r, e)
		return
	}
	// DSP0266 wants Allow on every GET and HEAD answer, and OPTIONS
	// answers with nothing else.
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		w.Header().Set("Allow", ep.allow)
	}
	s.serveRoute(w, r, ep.routes[i])
}

// notFound answers unknown URIs; callers must still authenticate, so the
// answer does not reveal which URIs exist.
func (s *Server) notFound(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.auth.authenticate(r); !ok {
		s.writeError(w, r, s.unauthorized())
		return
	}
	NotFound(w, r)
}

func (s *Server) unauthorized() *apiError {
	e := newError(http.StatusUnauthorized, msgNoValidSession)
	e.header = http.Header{"WWW-Authenticate": {`Basic realm="virtmetal"`}}
	return e
}

func (s *Server) serveRoute(w http.ResponseWriter, r *http.Request, rt route) {
	c := &call{r: r, vars: mux.Vars(r)}
	if rt.privilege != privNoAuth {
		user, ok := s.auth.authenticate(r)
		if !ok {
			s.writeError(w, r, s.unauthorized())
			return
		}
		c.user = user
		if !user.has(rt.privilege) && (rt.owner == nil || rt.owner(s, c) != user.username) {
			s.writeError(w, r, newError(http.StatusForbidden, msgInsufficientPrivilege))
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead && r.Method != http.MethodOptions {
			// The audit log says who asked for the writes this request makes.
			c.r = r.WithContext(s.actorContext(c))
		}
	}
	if err := checkProtocol(r, rt.path == ssePath); err != nil {
		s.writeError(w, r, err)
		return
	}
	if r.Method == http.MethodPost || r.Method == http.MethodPatch {
		body, err := s.readBody(w, r)
		if err == nil {
			err = checkJSONContentType(r, body)
		}
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		c.body = body
	}
	if rt.rendered != perRequest && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		s.serveGet(w, r, c, rt)
		return
	}
	res, err := rt.handle(s, c)
	if err != nil {
		s.writeError(w, r, asAPIError(err))
		return
	}
	s.writeResult(w, r, res)
}

// asAPIError is err as the answer it gets: a handler's own, or a 500.
func asAPIError(err error) *apiError {
	var apiErr *apiError
	if !errors.As(err, &apiErr) {
		apiErr = &apiError{status: http.StatusInternalServerError, messages: []message{{key: msgInternalError}}, cause: err}
	}
	return apiErr
}
