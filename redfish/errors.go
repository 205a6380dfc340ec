package redfish

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/virtmetal/virtmetal/internal/egress"
	"github.com/virtmetal/virtmetal/machine"
)

// registryVersion prefixes every MessageId: "<Registry>.<major>.<minor>.<Key>".
const registryVersion = baseRegistryPrefix + ".1.19"

const baseRegistryPrefix = "Base"

// Base registry message keys the service answers with.
const (
	msgGeneralError                   = "GeneralError"
	msgMalformedJSON                  = "MalformedJSON"
	msgEmptyJSON                      = "EmptyJSON"
	msgPropertyUnknown                = "PropertyUnknown"
	msgPropertyNotWritable            = "PropertyNotWritable"
	msgPropertyValueTypeError         = "PropertyValueTypeError"
	msgPropertyValueNotInList         = "PropertyValueNotInList"
	msgPropertyValueFormatError       = "PropertyValueFormatError"
	msgPropertyMissing                = "PropertyMissing"
	msgActionNotSupported             = "ActionNotSupported"
	msgActionParameterMissing         = "ActionParameterMissing"
	msgActionParameterUnknown         = "ActionParameterUnknown"
	msgActionParameterNotSupported    = "ActionParameterNotSupported"
	msgActionParameterValueTypeError  = "ActionParameterValueTypeError"
	msgActionParameterValueNotInList  = "ActionParameterValueNotInList"
	msgActionParameterValueFormat     = "ActionParameterValueFormatError"
	msgResourceNotFound               = "ResourceNotFound"
	msgResourceInUse                  = "ResourceInUse"
	msgResourceInStandby              = "ResourceInStandby"
	msgOperationNotAllowed            = "OperationNotAllowed"
	msgPayloadTooLarge                = "PayloadTooLarge"
	msgNoValidSession                 = "NoValidSession"
	msgInsufficientPrivilege          = "InsufficientPrivilege"
	msgSessionLimitExceeded           = "SessionLimitExceeded"
	msgPreconditionFailed             = "PreconditionFailed"
	msgHeaderInvalid                  = "HeaderInvalid"
	msgQueryParameterUnsupported      = "QueryParameterUnsupported"
	msgServiceTemporarilyUnavailable  = "ServiceTemporarilyUnavailable"
	msgInternalError                  = "InternalError"
	msgHeaderMissing                  = "HeaderMissing"
	msgQueryParameterValueFormatError = "QueryParameterValueFormatError"
	msgEventSubscriptionLimitExceeded = "EventSubscriptionLimitExceeded"
	msgEventBufferExceeded            = "EventBufferExceeded"
	msgPropertyValueResourceConflict  = "PropertyValueResourceConflict"
	msgSuccess                        = "Success"
	msgResetRequired                  = "ResetRequired"
)

// registryEntry is a message of the DMTF Base registry; the texts are the
// registry's own, because clients match on them.
type registryEntry struct {
	text     string // %1, %2, ... are the arguments
	severity string
}

var baseRegistry = map[string]registryEntry{
	msgGeneralError:                   {"A general error has occurred.  See Resolution for information on how to resolve the error, or @Message.ExtendedInfo if Resolution is not provided.", "Critical"},
	msgMalformedJSON:                  {"The request body submitted was malformed JSON and could not be parsed by the receiving service.", "Critical"},
	msgEmptyJSON:                      {"The request body submitted contained an empty JSON object and the service is unable to process it.", "Warning"},
	msgPropertyUnknown:                {"The property '%1' is not in the list of valid properties for the resource.", "Warning"},
	msgPropertyNotWritable:            {"The property '%1' is a read-only property and cannot be assigned a value.", "Warning"},
	msgPropertyValueTypeError:         {"The value '%1' for the property '%2' is not a type that the property can accept.", "Warning"},
	msgPropertyValueNotInList:         {"The value '%1' for the property '%2' is not in the list of acceptable values.", "Warning"},
	msgPropertyValueFormatError:       {"The value '%1' for the property '%2' is not a format that the property can accept.", "Warning"},
	msgPropertyMissing:                {"The property '%1' is a required property and must be included in the request.", "Warning"},
	msgActionNotSupported:             {"The action '%1' is not supported by the resource.", "Critical"},
	msgActionParameterMissing:         {"The action '%1' requires the parameter '%2' to be present in the request body.", "Critical"},
	msgActionParameterUnknown:         {"The action '%1' was submitted with the invalid parameter '%2'.", "Warning"},
	msgActionParameterNotSupported:    {"The parameter '%1' for the action '%2' is not supported on the target resource.", "Warning"},
	msgActionParameterValueTypeError:  {"The value '%1' for the parameter '%2' in the action '%3' is not a type that the parameter can accept.", "Warning"},
	msgActionParameterValueNotInList:  {"The value '%1' for the parameter '%2' in the action '%3' is not in the list of acceptable values.", "Warning"},
	msgActionParameterValueFormat:     {"The value '%1' for the parameter '%2' in the action '%3' is not a format that the parameter can accept.", "Warning"},
	msgResourceNotFound:               {"The requested resource of type '%1' named '%2' was not found.", "Critical"},
	msgResourceInUse:                  {"The change to the requested resource failed because the resource is in use or in transition.", "Warning"},
	msgResourceInStandby:              {"The request could not be performed because the resource is in standby.", "Critical"},
	msgOperationNotAllowed:            {"The HTTP method is not allowed on this resource.", "Critical"},
	msgPayloadTooLarge:                {"The supplied payload exceeds the maximum size supported by the service.", "Critical"},
	msgNoValidSession:                 {"There is no valid session established with the implementation.", "Critical"},
	msgInsufficientPrivilege:          {"There are insufficient privileges for the account or credentials associated with the current session to perform the requested operation.", "Critical"},
	msgSessionLimitExceeded:           {"The session establishment failed due to the number of simultaneous sessions exceeding the limit of the implementation.", "Critical"},
	msgPreconditionFailed:             {"The ETag supplied did not match the ETag required to change this resource.", "Critical"},
	msgHeaderInvalid:                  {"Header '%1' is invalid.", "Critical"},
	msgQueryParameterUnsupported:      {"Query parameter '%1' is not supported.", "Warning"},
	msgServiceTemporarilyUnavailable:  {"The service is temporarily unavailable.  Retry in %1 seconds.", "Critical"},
	msgInternalError:                  {"The request failed due to an internal service error.  The service is still operational.", "Critical"},
	msgHeaderMissing:                  {"Required header '%1' is missing in the request.", "Critical"},
	msgQueryParameterValueFormatError: {"The value '%1' for the parameter '%2' is not a format that the parameter can accept.", "Warning"},
	msgEventSubscriptionLimitExceeded: {"The event subscription failed due to the number of simultaneous subscriptions exceeding the limit of the implementation.", "Critical"},
	msgEventBufferExceeded:            {"Event buffer exceeded.", "Warning"},
	msgPropertyValueResourceConflict:  {"The property '%1' with the requested value of '%2' could not be written because the value conflicts with the state or configuration of the resource at '%3'.", "Warning"},
	msgSuccess:                        {"The request completed successfully.", "OK"},
	msgResetRequired:                  {"In order to apply changes, recover from errors, or complete the operation, a component reset is required with the Reset action URI '%1' and ResetType '%2'.", "Warning"},
}

// taskEventVersion prefixes the MessageIds of DMTF's Task Event registry,
// whose messages a Task carries.
const taskEventVersion = "TaskEvent.1.0"

// Task Event registry message keys.
const (
	msgTaskStarted     = "TaskStarted"
	msgTaskCompletedOK = "TaskCompletedOK"
	msgTaskAborted     = "TaskAborted"
	msgTaskCancelled   = "TaskCancelled"
)

var taskEventRegistry = map[string]registryEntry{
	msgTaskStarted:     {"The task with Id '%1' has started.", "OK"},
	msgTaskCompletedOK: {"The task with Id '%1' has completed.", "OK"},
	msgTaskAborted:     {"The task with Id '%1' has been aborted.", "Critical"},
	msgTaskCancelled:   {"The task with Id '%1' has been cancelled.", "Warning"},
}

// message is one entry of @Message.ExtendedInfo, or of a Task's Messages.
type message struct {
	key     string
	args    []string
	related string // JSON pointer of the offending property, if any
	// resolution, when set, says what happened and what to do, beyond
	// what the registry's text can.
	resolution string
}

// entry is m's registry entry and MessageId: the Base registry's, or the
// Task Event registry's for a task's messages.
func (m message) entry() (registryEntry, string) {
	if e, ok := taskEventRegistry[m.key]; ok {
		return e, taskEventVersion + "." + m.key
	}
	return baseRegistry[m.key], registryVersion + "." + m.key
}

func (m message) text() string {
	e, _ := m.entry()
	return m.format(e.text)
}

// format fills a registry text with m's arguments, in one pass, so an
// argument that contains "%2" stays as sent.
func (m message) format(text string) string {
	pairs := make([]string, 0, 2*len(m.args))
	for i, arg := range m.args {
		pairs = append(pairs, "%"+strconv.Itoa(i+1), arg)
	}
	return strings.NewReplacer(pairs...).Replace(text)
}

func (m message) body() map[string]any {
	e, id := m.entry()
	body := map[string]any{
		"@odata.type":     typeMessage.odataType(),
		"MessageId":       id,
		"Message":         m.text(),
		"MessageArgs":     append([]string{}, m.args...),
		"MessageSeverity": e.severity,
	}
	if m.related != "" {
		body["RelatedProperties"] = []string{"#" + m.related}
	}
	if m.resolution != "" {
		body["Resolution"] = m.resolution
	}
	return body
}

// apiError is a Redfish error response: an HTTP status and one or more Base
// registry messages.
type apiError struct {
	status   int
	messages []message
	header   http.Header // extra response headers (Retry-After, WWW-Authenticate)
	cause    error       // logged for 5xx answers, never sent to the client
}

func (e *apiError) Error() string {
	texts := make([]string, len(e.messages))
	for i, m := range e.messages {
		texts[i] = m.text()
	}
	msg := fmt.Sprintf("%d: %s", e.status, strings.Join(texts, "; "))
	if e.cause != nil {
		msg += ": " + e.cause.Error()
	}
	return msg
}

// retryLater is a 503 with the message key and a Retry-After of the
// service's RetryAfter.
func (s *Server) retryLater(key string, args ...string) *apiError {
	e := newError(http.StatusServiceUnavailable, key, args...)
	e.header = http.Header{"Retry-After": {strconv.Itoa(int(s.retryAfter / time.Second))}}
	return e
}

func newError(status int, key string, args ...string) *apiError {
	return &apiError{status: status, messages: []message{{key: key, args: args}}}
}

// propertyError is a 400 about one property of a PATCH body.
func propertyError(key, pointer string, args ...string) message {
	return message{key: key, args: args, related: pointer}
}

// badRequest gathers property messages into one 400 answer.
func badRequest(msgs ...message) *apiError {
	return &apiError{status: http.StatusBadRequest, messages: msgs}
}

// body is the JSON error object defined by redfish-error.v1_0_2.
func (e *apiError) body() map[string]any {
	code, text := registryVersion+"."+msgGeneralError, baseRegistry[msgGeneralError].text
	if len(e.messages) == 1 {
		_, code = e.messages[0].entry()
		text = e.messages[0].text()
	}
	info := make([]any, len(e.messages))
	for i, m := range e.messages {
		info[i] = m.body()
	}
	return map[string]any{"error": map[string]any{
		"code":                  code,
		"message":               text,
		"@Message.ExtendedInfo": info,
	}}
}

// operation says what a handler asked the backend, so that mapBackendError
// can phrase a failure in Redfish terms.
type operation struct {
	resourceType string // schema name, e.g. "ComputerSystem"
	resourceID   string
	action       string // e.g. "Reset"; empty outside actions
	parameter    string // action parameter or PATCH property (JSON pointer)
	value        string // the value the client sent for parameter
	// console: the request opens a console, so a conflict other than
	// machine.ErrConsoleInUse is a machine that is not running.
	console bool
	// conflictsWith is the URI of the resource whose state a conflicting
	// PATCH value meets (the empty virtual CD a Cd boot needs), or "".
	conflictsWith string
}

// refusedDestinationResolution says why a destination was refused without
// saying what its name resolved to, which the client need not learn.
const refusedDestinationResolution = "The service does not send to, nor has anything fetched from, link-local, " +
	"metadata, loopback or its own addresses, nor the networks its operator denies, in any IPv4 or IPv6 form, " +
	"whether named directly or through a host name. Use an address outside them."

// mapDestinationError turns egress.Policy's refusal of an action's URL
// parameter (InsertMedia's Image) into its answer: the value is not one
// the service accepts; a name whose resolution failed for now is a 503,
// one that does not resolve is refused as well.
func (s *Server) mapDestinationError(err error, op operation) *apiError {
	var unresolved *egress.UnresolvedError
	if errors.As(err, &unresolved) && unresolved.Temporary() {
		e := s.retryLater(msgServiceTemporarilyUnavailable, strconv.Itoa(int(s.retryAfter/time.Second)))
		e.cause = err
		return e
	}
	s.log.Info("destination refused", "resource", op.resourceType, "parameter", op.parameter, "value", op.value, "reason", err.Error())
	m := message{key: msgActionParameterValueNotInList, args: []string{op.value, op.parameter, op.action}, resolution: refusedDestinationResolution}
	return &apiError{status: http.StatusBadRequest, messages: []message{m}, cause: err}
}

// mapBackendError is the one place that turns machine contract errors into
// HTTP answers.
func (s *Server) mapBackendError(err error, op operation) *apiError {
	switch {
	case errors.Is(err, machine.ErrNotFound):
		return newError(http.StatusNotFound, msgResourceNotFound, op.resourceType, op.resourceID)
	case errors.Is(err, machine.ErrInvalidArgument):
		switch {
		case op.action != "" && op.parameter != "":
			return newError(http.StatusBadRequest, msgActionParameterValueFormat, op.value, op.parameter, op.action)
		case op.parameter != "":
			return badRequest(propertyError(msgPropertyValueFormatError, op.parameter, op.value, op.parameter))
		}
		return &apiError{status: http.StatusBadRequest, messages: []message{{key: msgGeneralError}}, cause: err}
	case errors.Is(err, machine.ErrNotSupported):
		switch {
		case op.action != "" && op.parameter != "":
			return newError(http.StatusBadRequest, msgActionParameterNotSupported, op.parameter, op.action)
		case op.action != "":
			return newError(http.StatusBadRequest, msgActionNotSupported, op.action)
		case op.parameter != "":
			return badRequest(propertyError(msgPropertyValueNotInList, op.parameter, op.value, op.parameter))
		}
		return &apiError{status: http.StatusNotImplemented, messages: []message{{key: msgOperationNotAllowed}}, cause: err}
	case errors.Is(err, machine.ErrConflict) && op.parameter != "" && op.conflictsWith != "":
		return &apiError{status: http.StatusConflict, messages: []message{propertyError(msgPropertyValueResourceConflict, op.parameter,
			op.parameter, op.value, op.conflictsWith)}, cause: err}
	case errors.Is(err, machine.ErrConflict) && op.console && !errors.Is(err, machine.ErrConsoleInUse):
		return &apiError{status: http.StatusConflict, messages: []message{{key: msgResourceInStandby,
			resolution: "The console exists while the system runs. Power the system on and connect again."}}, cause: err}
	case errors.Is(err, machine.ErrConflict):
		return &apiError{status: http.StatusConflict, messages: []message{{key: msgResourceInUse}}, cause: err}
	case errors.Is(err, machine.ErrUnavailable):
		e := s.retryLater(msgServiceTemporarilyUnavailable, strconv.Itoa(int(s.retryAfter/time.Second)))
		e.cause = err
		return e
	}
	return &apiError{status: http.StatusInternalServerError, messages: []message{{key: msgInternalError}}, cause: err}
}
