package redfish

import (
	"net/http"
	"net/url"
	"time"
)

const (
	sessionsPath       = "/redfish/v1/SessionService/Sessions"
	accountServicePath = "/redfish/v1/AccountService"
	accountsPath       = accountServicePath + "/Accounts"
	rolesPath          = "/redfish/v1/AccountService/Roles"
)

func sessionPath(id string) string { return sessionsPath + "/" + url.PathEscape(id) }
func accountPath(id string) string { return accountsPath + "/" + url.PathEscape(id) }
func rolePath(r Role) string       { return rolesPath + "/" + string(r) }

func (s *Server) getSessionService(*call) (result, error) {
	body := resource(typeSessionService, "/redfish/v1/SessionService", "SessionService", "Session Service")
	body["ServiceEnabled"] = true
	body["SessionTimeout"] = int(s.auth.timeout / time.Second)
	body["Sessions"] = link(sessionsPath)
	body["Status"] = statusOK()
	return result{body: body}, nil
}

func (s *Server) getSessions(*call) (result, error) {
	var members []string
	for _, sess := range s.auth.listSessions() {
		members = append(members, sessionPath(sess.id))
	}
	return result{body: collection(typeSessionCollection, sessionsPath, "Session Collection", members)}, nil
}

func sessionBody(sess session) map[string]any {
	body := resource(typeSession, sessionPath(sess.id), sess.id, "User Session")
	body["UserName"] = sess.username
	body["SessionType"] = "Redfish"
	body["CreatedTime"] = sess.created.UTC().Format(time.RFC3339)
	return body
}

// createSession is the login: POST {UserName, Password}. It answers 201
// with the token in X-Auth-Token and the session's URI in Location.
func (s *Server) createSession(c *call) (result, error) {
	params, apiErr := decodeObject(c.body)
	if apiErr != nil {
		return result{}, apiErr
	}
	var problems []message
	credentials := map[string]string{}
	for _, key := range []string{"UserName", "Password"} {
		raw, ok := params[key]
		if !ok {
			problems = append(problems, propertyError(msgPropertyMissing, "/"+key, key))
			continue
		}
		value, ok := jsonString(raw)
		if !ok {
			shown := jsonText(raw)
			if key == "Password" {
				shown = "(hidden)"
			}
			problems = append(problems, propertyError(msgPropertyValueTypeError, "/"+key, shown, key))
			continue
		}
		credentials[key] = value
	}
	for _, key := range sortedKeys(params) {
		if key != "UserName" && key != "Password" {
			problems = append(problems, propertyError(msgPropertyUnknown, "/"+key, key))
		}
	}
	if len(problems) > 0 {
		return result{}, badRequest(problems...)
	}
	acc, previous, ok := s.auth.checkPassword(s.auth.clients.source(c.r), credentials["UserName"], credentials["Password"])
	if !ok {
		return result{}, s.unauthorized()
	}
	sess, token, apiErr := s.auth.createSession(acc, previous)
	if apiErr != nil {
		return result{}, apiErr
	}
	return result{
		status: http.StatusCreated,
		body:   sessionBody(sess),
		header: http.Header{"X-Auth-Token": {token}, "Location": {sessionPath(sess.id)}},
	}, nil
}

// sessionOwner lets a user read and delete their own session without
// ConfigureManager.
func (s *Server) sessionOwner(c *call) string {
	sess, ok := s.auth.findSession(c.vars["sessionID"])
	if !ok {
		return ""
	}
	return sess.username
}

func (s *Server) getSession(c *call) (result, error) {
	id := c.vars["sessionID"]
	sess, ok := s.auth.findSession(id)
	if !ok {
		return result{}, newError(http.StatusNotFound, msgResourceNotFound, "Session", id)
	}
	return result{body: sessionBody(sess)}, nil
}

func (s *Server) deleteSession(c *call) (result, error) {
	id := c.vars["sessionID"]
	if !s.auth.deleteSession(id) {
		return result{}, newError(http.StatusNotFound, msgResourceNotFound, "Session", id)
	}
	return result{}, nil
}

func (s *Server) getAccountService(*call) (result, error) {
	body := resource(typeAccountService, accountServicePath, "AccountService", "Account Service")
	body["ServiceEnabled"] = true
	body["Status"] = statusOK()
	// Zero: accounts are never locked (failed logins throttle their source
	// instead, which an attacker cannot turn against the account's owner).
	body["AccountLockoutThreshold"] = 0
	body["Accounts"] = link(accountsPath)
	body["Roles"] = link(rolesPath)
	return result{body: body}, nil
}

func (s *Server) getAccounts(*call) (result, error) {
	accounts := s.auth.accountList()
	members := make([]string, len(accounts))
	for i, acc := range accounts {
		members[i] = accountPath(acc.id)
	}
	return result{body: collection(typeAccountCollection, accountsPath, "Accounts Collection", members)}, nil
}

// accountOwner lets a user read their own account without ConfigureUsers.
func (s *Server) accountOwner(c *call) string {
	if acc := s.auth.accountByID(c.vars["accountID"]); acc != nil {
		return acc.username
	}
	return ""
}

func (s *Server) getAccount(c *call) (result, error) {
	id := c.vars["accountID"]
	acc := s.auth.accountByID(id)
	if acc == nil {
		return result{}, newError(http.StatusNotFound, msgResourceNotFound, "ManagerAccount", id)
	}
	body := resource(typeAccount, accountPath(acc.id), acc.id, "User Account")
	body["UserName"] = acc.username
	body["RoleId"] = string(acc.role)
	body["Enabled"] = true
	body["Locked"] = false
	body["Password"] = nil
	body["AccountTypes"] = []string{"Redfish"}
	body["Links"] = map[string]any{"Role": link(rolePath(acc.role))}
	return result{body: body}, nil
}

func (s *Server) getRoles(*call) (result, error) {
	members := make([]string, len(roles))
	for i, r := range roles {
		members[i] = rolePath(r)
	}
	return result{body: collection(typeRoleCollection, rolesPath, "Roles Collection", members)}, nil
}

func (s *Server) getRole(c *call) (result, error) {
	r := Role(c.vars["roleID"])
	if !r.valid() {
		return result{}, newError(http.StatusNotFound, msgResourceNotFound, "Role", string(r))
	}
	body := resource(typeRole, rolePath(r), string(r), string(r)+" Role")
	body["RoleId"] = string(r)
	body["IsPredefined"] = true
	body["AssignedPrivileges"] = stringsOf(r.privileges())
	body["OemPrivileges"] = []string{}
	return result{body: body}, nil
}
