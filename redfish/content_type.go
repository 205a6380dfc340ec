package redfish

import (
	"mime"
	"net/http"
)

// checkJSONContentType refuses a POST or PATCH body that is not declared
// application/json. A browser can send text/plain and form bodies to any
// site without a preflight; if they were executed, any web page could make
// a browser that holds Basic credentials power a machine off. A bare body
// (EjectMedia is often posted empty) needs no type.
func checkJSONContentType(r *http.Request, body []byte) *apiError {
	header := r.Header.Get("Content-Type")
	if header == "" {
		if len(body) == 0 {
			return nil
		}
		return newError(http.StatusUnsupportedMediaType, msgHeaderMissing, "Content-Type")
	}
	mediaType, _, err := mime.ParseMediaType(header)
	if err != nil || mediaType != "application/json" {
		return newError(http.StatusUnsupportedMediaType, msgHeaderInvalid, "Content-Type")
	}
	return nil
}
