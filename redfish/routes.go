package redfish

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/gorilla/mux"

	"github.com/virtmetal/virtmetal/internal/auditlog"
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

type handlerFunc func(c *call) (result, error)

// route is one row of the route table: the only place that says which
// method, path and privilege reach which handler.
type route struct {
	method    string
	path      string
	privilege privilege
	handle    handlerFunc
	// owner, when set, names the account that owns the addressed resource;
	// that account may use the route without the privilege (ConfigureSelf).
	owner func(c *call) string
	// rendered says how long a GET's answer stays valid, so that it is
	// rendered once and then served as bytes.
	rendered renderScope
}

func (s *Server) routes() []route {
	const (
		sys     = "/redfish/v1/Systems/{systemID}"
		mgr     = "/redfish/v1/Managers/{managerID}"
		sysCD   = sys + "/VirtualMedia/{mediaID}"
		session = "/redfish/v1/SessionService/Sessions/{sessionID}"
		account = "/redfish/v1/AccountService/Accounts/{accountID}"
		// A subscription's id is a number; a DELETE of "SSE" is a 404.
		subscription = subscriptionsPath + "/{subscriptionID:[0-9]+}"
		sysLog       = sys + "/LogServices/" + logServiceID
		sysStorage   = sys + "/Storage/{storageID}"
		mgrLog       = mgr + "/LogServices/" + logServiceID
	)
	return []route{
		{http.MethodGet, "/redfish", privNoAuth, s.getVersions, nil, forLife},
		{http.MethodGet, "/redfish/v1", privNoAuth, s.getServiceRoot, nil, forLife},
		{http.MethodGet, "/redfish/v1/$metadata", privNoAuth, s.getMetadata, nil, forLife},
		{http.MethodGet, "/redfish/v1/odata", privNoAuth, s.getServiceDocument, nil, forLife},

		{http.MethodGet, "/redfish/v1/Systems", privLogin, s.getSystems, nil, whileMachineList},
		{http.MethodGet, sys, privLogin, s.getSystem, nil, whileMachineState},
		{http.MethodPatch, sys, privConfigureComponents, s.patchSystem, nil, perRequest},
		{http.MethodPost, sys + "/Actions/ComputerSystem.Reset", privConfigureComponents, s.resetSystem, nil, perRequest},
		{http.MethodGet, sys + "/EthernetInterfaces", privLogin, s.getEthernetInterfaces, nil, whileMachineState},
		{http.MethodGet, sys + "/EthernetInterfaces/{nicID}", privLogin, s.getEthernetInterface, nil, whileMachineState},
		{http.MethodGet, sys + "/SimpleStorage", privLogin, s.getSimpleStorages, nil, whileMachineState},
		{http.MethodGet, sys + "/SimpleStorage/{storageID}", privLogin, s.getSimpleStorage, nil, whileMachineState},
		{http.MethodGet, sys + "/Processors", privLogin, s.getProcessors, nil, whileMachineState},
		{http.MethodGet, sys + "/Processors/{processorID}", privLogin, s.getProcessor, nil, whileMachineState},
		{http.MethodGet, sys + "/Memory", privLogin, s.getMemoryCollection, nil, whileMachineState},
		{http.MethodGet, sys + "/Memory/{memoryID}", privLogin, s.getMemory, nil, whileMachineState},
		{http.MethodGet, sys + "/Storage", privLogin, s.getStorageCollection, nil, whileMachineState},
		{http.MethodGet, sysStorage, privLogin, s.getStorage, nil, whileMachineState},
		{http.MethodGet, sysStorage + "/Volumes", privLogin, s.getVolumes, nil, whileMachineState},
		{http.MethodGet, sysStorage + "/Volumes/{volumeID}", privLogin, s.getVolume, nil, whileMachineState},
		{http.MethodGet, sys + "/VirtualMedia", privLogin, s.getVirtualMediaCollection, nil, whileMachineState},
		{http.MethodGet, sysCD, privLogin, s.getVirtualMedia, nil, whileMachineState},
		{http.MethodPost, sysCD + "/Actions/VirtualMedia.InsertMedia", privConfigureComponents, s.insertMedia, nil, perRequest},
		{http.MethodPost, sysCD + "/Actions/VirtualMedia.EjectMedia", privConfigureComponents, s.ejectMedia, nil, perRequest},

		{http.MethodGet, sys + "/LogServices", privLogin, s.getLogServices(systemLogs), nil, perRequest},
		{http.MethodGet, sysLog, privLogin, s.getLogService(systemLogs), nil, perRequest},
		{http.MethodGet, sysLog + "/Entries", privLogin, s.getLogEntries(systemLogs), nil, perRequest},
		{http.MethodGet, sysLog + "/Entries/{entryID}", privLogin, s.getLogEntry(systemLogs), nil, perRequest},
		{http.MethodPost, sysLog + "/Actions/LogService.ClearLog", privConfigureComponents, s.clearLog(systemLogs), nil, perRequest},

		{http.MethodGet, "/redfish/v1/Managers", privLogin, s.getManagers, nil, whileMachineList},
		{http.MethodGet, mgr, privLogin, s.getManager, nil, whileMachineState},
		{http.MethodPost, mgr + "/Actions/Manager.Reset", privConfigureManager, s.resetManager, nil, perRequest},
		{http.MethodGet, mgr + "/LogServices", privLogin, s.getLogServices(managerLogs), nil, perRequest},
		{http.MethodGet, mgrLog, privLogin, s.getLogService(managerLogs), nil, perRequest},
		{http.MethodGet, mgrLog + "/Entries", privLogin, s.getLogEntries(managerLogs), nil, perRequest},
		{http.MethodGet, mgrLog + "/Entries/{entryID}", privLogin, s.getLogEntry(managerLogs), nil, perRequest},
		{http.MethodPost, mgrLog + "/Actions/LogService.ClearLog", privConfigureManager, s.clearLog(managerLogs), nil, perRequest},

		{http.MethodGet, "/redfish/v1/Chassis", privLogin, s.getChassisCollection, nil, whileMachineList},
		{http.MethodGet, "/redfish/v1/Chassis/{chassisID}", privLogin, s.getChassis, nil, whileMachineState},
		{http.MethodGet, "/redfish/v1/Chassis/{chassisID}/Drives", privLogin, s.getDrives, nil, whileMachineState},
		{http.MethodGet, "/redfish/v1/Chassis/{chassisID}/Drives/{driveID}", privLogin, s.getDrive, nil, whileMachineState},

		{http.MethodGet, eventServicePath, privLogin, s.getEventService, nil, forLife},
		{http.MethodGet, ssePath, privLogin, s.streamEvents, nil, perRequest},
		{http.MethodPost, submitTestEventPath, privConfigureManager, s.submitTestEvent, nil, perRequest},
		{http.MethodGet, subscriptionsPath, privLogin, s.getSubscriptions, nil, perRequest},
		{http.MethodPost, subscriptionsPath, privConfigureComponents, s.createSubscription, nil, perRequest},
		{http.MethodPost, subscriptionsPath + "/Members", privConfigureComponents, s.createSubscription, nil, perRequest},
		{http.MethodGet, subscription, privLogin, s.getSubscription, nil, perRequest},
		{http.MethodPatch, subscription, privConfigureManager, s.patchSubscription, s.subscriptionOwner, perRequest},
		{http.MethodDelete, subscription, privConfigureManager, s.deleteSubscription, s.subscriptionOwner, perRequest},
		{http.MethodPost, subscription + "/Actions/EventDestination.SuspendSubscription", privConfigureManager, s.suspendSubscription, s.subscriptionOwner, perRequest},
		{http.MethodPost, subscription + "/Actions/EventDestination.ResumeSubscription", privConfigureManager, s.resumeSubscription, s.subscriptionOwner, perRequest},

		{http.MethodGet, "/redfish/v1/SessionService", privLogin, s.getSessionService, nil, forLife},
		{http.MethodGet, "/redfish/v1/SessionService/Sessions", privLogin, s.getSessions, nil, perRequest},
		{http.MethodPost, "/redfish/v1/SessionService/Sessions", privNoAuth, s.createSession, nil, perRequest},
		// DSP0266: a POST to a collection's Members is a POST to the collection.
		{http.MethodPost, "/redfish/v1/SessionService/Sessions/Members", privNoAuth, s.createSession, nil, perRequest},
		{http.MethodGet, session, privConfigureManager, s.getSession, s.sessionOwner, perRequest},
		{http.MethodDelete, session, privConfigureManager, s.deleteSession, s.sessionOwner, perRequest},

		{http.MethodGet, "/redfish/v1/AccountService", privLogin, s.getAccountService, nil, forLife},
		{http.MethodGet, "/redfish/v1/AccountService/Accounts", privLogin, s.getAccounts, nil, perRequest},
		{http.MethodGet, account, privConfigureUsers, s.getAccount, s.accountOwner, perRequest},
		{http.MethodGet, "/redfish/v1/AccountService/Roles", privLogin, s.getRoles, nil, forLife},
		{http.MethodGet, "/redfish/v1/AccountService/Roles/{roleID}", privLogin, s.getRole, nil, forLife},
	}
}

// newEndpoints makes one endpoint per path; the methods of that path are
// dispatched there, so 405 and Allow come straight from the table. Every
// GET row also answers HEAD (RFC 9110: GET without the body), and every
// path answers OPTIONS with its methods.
func (s *Server) newEndpoints() map[string]http.Handler {
	byPath := map[string][]route{}
	var paths []string
	for _, rt := range s.routes() {
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
	endpoints := make(map[string]http.Handler, len(paths))
	for _, p := range paths {
		routes := byPath[p]
		routes = append(routes, route{http.MethodOptions, p, optionsPrivilege(routes), answerOptions, nil, perRequest})
		endpoints[p] = s.endpoint(routes)
	}
	s.paths = pathMatcher(paths)
	return endpoints
}

// The path templates are the same for every Server, and a mux router
// compiles regular expressions for each (about 400 KB): one matcher serves
// every Server of the process, which may be one per VM.
var (
	pathMatcherOnce sync.Once
	sharedPaths     *mux.Router
)

// pathMatcher is the process's matcher of the routes' path templates.
func pathMatcher(paths []string) *mux.Router {
	pathMatcherOnce.Do(func() {
		router := mux.NewRouter()
		// Unclean paths get a 404, not a redirect that a BMC client would
		// not follow.
		router.SkipClean(true)
		for _, p := range paths {
			router.NewRoute().Path(p)
		}
		sharedPaths = router
	})
	return sharedPaths
}

// serveEndpoint serves r with this Server's endpoint of the path template
// r's path matches, with the template's variables.
func (s *Server) serveEndpoint(w http.ResponseWriter, r *http.Request) {
	var match mux.RouteMatch
	if !s.paths.Match(r, &match) {
		s.notFound(w, r)
		return
	}
	template, err := match.Route.GetPathTemplate()
	endpoint, ok := s.endpoints[template]
	if err != nil || !ok {
		s.notFound(w, r)
		return
	}
	endpoint.ServeHTTP(w, mux.SetURLVars(r, match.Vars))
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
func answerOptions(*call) (result, error) { return result{}, nil }

func (s *Server) endpoint(routes []route) http.Handler {
	allowed := make([]string, len(routes))
	for i, rt := range routes {
		allowed[i] = rt.method
	}
	allow := strings.Join(allowed, ", ")
	public := !slices.ContainsFunc(routes, func(rt route) bool { return rt.privilege != privNoAuth })
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rec, ok := w.(*recordingWriter); ok {
			rec.route = routes[0].path // for the Observer
		}
		i := slices.IndexFunc(routes, func(rt route) bool { return rt.method == r.Method })
		if i < 0 {
			// Only callers who may see the resource learn which methods
			// it has: a 405 with Allow would map every path without
			// credentials.
			if _, ok := s.auth.authenticate(r); !ok && !public {
				s.writeError(w, r, s.unauthorized())
				return
			}
			e := newError(http.StatusMethodNotAllowed, msgOperationNotAllowed)
			e.header = http.Header{"Allow": {allow}}
			s.writeError(w, r, e)
			return
		}
		// DSP0266 wants Allow on every GET and HEAD answer, and OPTIONS
		// answers with nothing else.
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			w.Header().Set("Allow", allow)
		}
		s.serveRoute(w, r, routes[i])
	})
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
		if !user.has(rt.privilege) && (rt.owner == nil || rt.owner(c) != user.username) {
			s.writeError(w, r, newError(http.StatusForbidden, msgInsufficientPrivilege))
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead && r.Method != http.MethodOptions {
			// The audit log says who asked for the writes this request makes.
			c.r = r.WithContext(auditlog.WithActor(r.Context(), auditlog.Actor{
				Protocol: auditlog.Redfish, Account: user.username, Source: s.auth.clients.source(r)}))
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
	res, err := rt.handle(c)
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
