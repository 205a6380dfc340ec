package redfish

import (
	"net/http"
	"sort"
	"strings"
)

// supportedODataVersion is the only OData version the service speaks.
const supportedODataVersion = "4.0"

// checkProtocol refuses requests that ask for what the service cannot do
// (DSP0266 "Request headers" and "Query parameters"): an OData-Version
// other than 4.0 is a 412, and any query parameter starting with $ is a
// 501, since ProtocolFeaturesSupported advertises no query support, except
// $filter where allowFilter (the SSE stream, whose filters the
// EventService advertises). Parameters without a $ are ignored, as the
// specification requires.
func checkProtocol(r *http.Request, allowFilter bool) *apiError {
	if v := r.Header.Get("OData-Version"); v != "" && v != supportedODataVersion {
		return newError(http.StatusPreconditionFailed, msgHeaderInvalid, "OData-Version: "+v)
	}
	var unsupported []string
	for name := range r.URL.Query() {
		if strings.HasPrefix(name, "$") && !(allowFilter && name == "$filter") {
			unsupported = append(unsupported, name)
		}
	}
	if len(unsupported) == 0 {
		return nil
	}
	sort.Strings(unsupported)
	e := &apiError{status: http.StatusNotImplemented}
	for _, name := range unsupported {
		e.messages = append(e.messages, message{key: msgQueryParameterUnsupported, args: []string{name}})
	}
	return e
}
