package redfish

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/virtmetal/virtmetal/internal/auditlog"
)

// Each ComputerSystem and each Manager has one LogService, "Log": the
// BMC's audit log of that machine (auditlog), the same entries under both,
// because MaaS-era tools read the Manager's and Redfish clients often look
// under the system. Entries are OEM records: the DMTF registries have no
// message for "who did what through the BMC", and inventing MessageIds of
// a registry the service does not serve would mislead validators.
const (
	logServiceID    = "Log"
	logRecordFormat = "virtmetal-audit"
)

// logOwner is a resource that has the LogService: a system or a manager.
type logOwner struct {
	idVar, resourceType string
	path                func(id string) string
}

var (
	systemLogs  = logOwner{"systemID", "ComputerSystem", systemPath}
	managerLogs = logOwner{"managerID", "Manager", managerPath}
)

func logServicesPath(ownerPath string) string { return ownerPath + "/LogServices" }
func logServicePath(ownerPath string) string  { return logServicesPath(ownerPath) + "/" + logServiceID }
func logEntriesPath(ownerPath string) string  { return logServicePath(ownerPath) + "/Entries" }

// logOf resolves the owner's machine; the log is the server's.
func (s *Server) logOf(c *call, o logOwner) (string, error) {
	m, err := s.machineFor(c, o.idVar, o.resourceType)
	if err != nil {
		return "", err
	}
	return m.ID(), nil
}

func getLogServices(o logOwner) handlerFunc {
	return func(s *Server, c *call) (result, error) {
		id, err := s.logOf(c, o)
		if err != nil {
			return result{}, err
		}
		owner := o.path(id)
		return result{body: collection(typeLogServiceCollection, logServicesPath(owner), "Log Services", []string{logServicePath(owner)})}, nil
	}
}

func getLogService(o logOwner) handlerFunc {
	return func(s *Server, c *call) (result, error) {
		id, err := s.logOf(c, o)
		if err != nil {
			return result{}, err
		}
		owner := o.path(id)
		path := logServicePath(owner)
		body := resource(typeLogService, path, logServiceID, "Audit Log")
		body["Description"] = "Power, boot and media actions on this machine and failed logins to its BMC, with who asked, through which protocol and from where; newest first"
		body["LogEntryType"] = "OEM"
		body["LogPurposes"] = []string{"Security", "Operations"}
		body["MaxNumberOfRecords"] = s.audit.Capacity()
		body["OverWritePolicy"] = "WrapsWhenFull"
		body["Persistency"] = false
		body["ServiceEnabled"] = true
		body["DateTime"] = s.now().UTC().Format(time.RFC3339)
		body["Status"] = statusOK()
		body["Entries"] = link(logEntriesPath(owner))
		body["Actions"] = map[string]any{
			"#LogService.ClearLog": map[string]any{"target": path + "/Actions/LogService.ClearLog"},
		}
		return result{body: body}, nil
	}
}

func getLogEntries(o logOwner) handlerFunc {
	return func(s *Server, c *call) (result, error) {
		id, err := s.logOf(c, o)
		if err != nil {
			return result{}, err
		}
		owner := o.path(id)
		entries := s.audit.Entries(id)
		// The schema auto-expands the members: each is the whole entry,
		// as clients read a log in one request.
		members := make([]any, len(entries))
		for i, e := range entries {
			members[i] = logEntryBody(owner, e)
		}
		body := collection(typeLogEntryCollection, logEntriesPath(owner), "Log Entries", nil)
		body["Members"], body["Members@odata.count"] = members, len(members)
		return result{body: body, etag: entriesETag(entries)}, nil
	}
}

// entriesETag changes whenever the collection does: a new entry, a burst's
// count, a clear.
func entriesETag(entries []auditlog.Entry) string {
	if len(entries) == 0 {
		return `W/"empty"`
	}
	return fmt.Sprintf(`W/"%d-%d-%d"`, entries[0].ID, len(entries), entries[0].Updated.UnixNano())
}

func getLogEntry(o logOwner) handlerFunc {
	return func(s *Server, c *call) (result, error) {
		id, err := s.logOf(c, o)
		if err != nil {
			return result{}, err
		}
		entryID, parseErr := strconv.ParseUint(c.vars["entryID"], 10, 64)
		e, ok := s.audit.Entry(id, entryID)
		if parseErr != nil || !ok {
			return result{}, newError(http.StatusNotFound, msgResourceNotFound, "LogEntry", c.vars["entryID"])
		}
		return result{body: logEntryBody(o.path(id), e)}, nil
	}
}

// logEntryBody is one entry of the log of the resource at owner.
func logEntryBody(owner string, e auditlog.Entry) map[string]any {
	body := resource(typeLogEntry, logEntriesPath(owner)+"/"+strconv.FormatUint(e.ID, 10), strconv.FormatUint(e.ID, 10), "Log Entry "+strconv.FormatUint(e.ID, 10))
	body["EntryType"] = "Oem"
	body["OemRecordFormat"] = logRecordFormat
	body["Severity"] = string(e.Severity())
	body["Created"] = e.Created.UTC().Format(time.RFC3339)
	if !e.Updated.Equal(e.Created) {
		body["Modified"] = e.Updated.UTC().Format(time.RFC3339)
	}
	body["Message"] = e.Message()
	body["Persistency"] = false
	if e.Machine != "" {
		body["Links"] = map[string]any{"OriginOfCondition": link(systemPath(e.Machine))}
	}
	return body
}

func clearLog(o logOwner) handlerFunc {
	return func(s *Server, c *call) (result, error) {
		id, err := s.logOf(c, o)
		if err != nil {
			return result{}, err
		}
		params, apiErr := actionParams(c.body, "ClearLog", []string{"LogEntriesETag"}, nil)
		if apiErr != nil {
			return result{}, apiErr
		}
		if raw, given := params["LogEntriesETag"]; given {
			var etag string
			if err := json.Unmarshal(raw, &etag); err != nil {
				return result{}, newError(http.StatusBadRequest, msgActionParameterValueTypeError, jsonText(raw), "LogEntriesETag", "ClearLog")
			}
			if etag != entriesETag(s.audit.Entries(id)) {
				return result{}, newError(http.StatusPreconditionFailed, msgPreconditionFailed)
			}
		}
		s.audit.Clear(id)
		s.log.Info("log cleared", "machine", id, "user", c.user.username)
		return result{}, nil
	}
}
