package redfish

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/virtmetal/virtmetal/internal/auditlog"
	"github.com/virtmetal/virtmetal/internal/throttle"
)

// Role is one of the standard Redfish roles.
type Role string

const (
	RoleAdministrator Role = "Administrator"
	RoleOperator      Role = "Operator"
	RoleReadOnly      Role = "ReadOnly"
)

// roles lists the standard roles in the order AccountService shows them.
var roles = []Role{RoleAdministrator, RoleOperator, RoleReadOnly}

// privilege is a Redfish privilege (Privileges.PrivilegeType).
type privilege string

const (
	// privNoAuth marks the URIs that answer without credentials.
	privNoAuth              privilege = ""
	privLogin               privilege = "Login"
	privConfigureManager    privilege = "ConfigureManager"
	privConfigureUsers      privilege = "ConfigureUsers"
	privConfigureComponents privilege = "ConfigureComponents"
	privConfigureSelf       privilege = "ConfigureSelf"
)

// privileges are the standard roles' privileges as DSP0266 assigns them.
func (r Role) privileges() []privilege {
	switch r {
	case RoleAdministrator:
		return []privilege{privLogin, privConfigureManager, privConfigureUsers, privConfigureComponents, privConfigureSelf}
	case RoleOperator:
		return []privilege{privLogin, privConfigureComponents, privConfigureSelf}
	case RoleReadOnly:
		return []privilege{privLogin, privConfigureSelf}
	}
	return nil
}

func (r Role) valid() bool { return slices.Contains(roles, r) }

// Account is a user of the service.
type Account struct {
	Username string
	Password string
	Role     Role
}

// account is an Account as the authenticator keeps it. It is immutable:
// SetAccounts replaces the whole list.
type account struct {
	id           string // position in the account list, from 1
	username     string
	usernameHash [sha256.Size]byte
	passwordHash [sha256.Size]byte
	role         Role
	// previousHash is the password before the last rotation, accepted
	// until previousUntil so clients can catch up.
	previousHash  [sha256.Size]byte
	previousUntil time.Time
}

// session is a login session; the token itself is never stored.
type session struct {
	id       string
	username string
	created  time.Time
	lastUsed time.Time
	// previousPassword: the login used a rotated-out password, so the
	// session ends with that password's grace window.
	previousPassword bool
}

// principal is who a request runs as.
type principal struct {
	username  string
	role      Role
	sessionID string // empty for HTTP Basic
}

func (p principal) has(priv privilege) bool {
	return priv == privNoAuth || slices.Contains(p.role.privileges(), priv)
}

// authenticator checks credentials and owns the sessions.
type authenticator struct {
	now                   func() time.Time
	timeout               time.Duration
	maxSessions           int
	maxSessionsPerAccount int
	limiter               *throttle.Limiter
	clients               clientAddresses
	audit                 *auditlog.Log              // logs failed logins
	accounts              atomic.Pointer[[]*account] // in Config order

	mu       sync.Mutex
	sessions map[[sha256.Size]byte]*session // by token hash
}

func newAuthenticator(accounts []Account, now func() time.Time, timeout time.Duration, maxSessions, maxPerAccount int, limiter *throttle.Limiter, clients clientAddresses) *authenticator {
	a := &authenticator{
		now:                   now,
		timeout:               timeout,
		maxSessions:           maxSessions,
		maxSessionsPerAccount: maxPerAccount,
		limiter:               limiter,
		clients:               clients,
		sessions:              map[[sha256.Size]byte]*session{},
	}
	a.setAccounts(accounts, 0)
	return a
}

// setAccounts replaces the accounts. An account whose password changed
// keeps accepting the old one for grace, and its sessions end with that
// window; sessions of removed accounts end at once.
func (a *authenticator) setAccounts(accounts []Account, grace time.Duration) {
	now := a.now()
	old := map[string]*account{}
	if prev := a.accounts.Load(); prev != nil {
		for _, acc := range *prev {
			old[acc.username] = acc
		}
	}
	list := make([]*account, len(accounts))
	rotated := map[string]bool{}
	for i, acc := range accounts {
		next := &account{
			id:           strconv.Itoa(i + 1),
			username:     acc.Username,
			usernameHash: sha256.Sum256([]byte(acc.Username)),
			passwordHash: sha256.Sum256([]byte(acc.Password)),
			role:         acc.Role,
		}
		if was := old[acc.Username]; was != nil {
			switch {
			case was.passwordHash != next.passwordHash:
				rotated[acc.Username] = true
				if grace > 0 {
					next.previousHash, next.previousUntil = was.passwordHash, now.Add(grace)
				}
			case was.passwordHash == next.passwordHash:
				next.previousHash, next.previousUntil = was.previousHash, was.previousUntil
			}
		}
		list[i] = next
	}
	a.accounts.Store(&list)
	a.mu.Lock()
	defer a.mu.Unlock()
	// Sessions opened with a password now rotated out live as long as it
	// is accepted.
	for _, s := range a.sessions {
		if rotated[s.username] {
			s.previousPassword = true
		}
	}
	a.expireLocked(now)
}

// checkPassword verifies a username and password from source, subject to
// throttling. Comparing fixed-size hashes of every account keeps the time
// spent independent of which names exist and of the secrets' lengths.
// previous reports that the rotated-out password matched.
func (a *authenticator) checkPassword(source, username, password string) (acc *account, previous, ok bool) {
	givenUser := sha256.Sum256([]byte(username))
	given := sha256.Sum256([]byte(password))
	for _, candidate := range *a.accounts.Load() {
		if subtle.ConstantTimeCompare(candidate.usernameHash[:], givenUser[:]) == 1 {
			acc = candidate
		}
	}
	named := throttle.UnknownAccount
	if acc != nil {
		named = throttle.Named(acc.username)
	}
	failed := func() {
		a.limiter.Failed(source, named)
		a.audit.LoginFailed(auditlog.Actor{Protocol: auditlog.Redfish, Account: username, Source: source})
	}
	if _, allowed := a.limiter.Allow(source, named); !allowed {
		// Not checked; counted, so a client that ignores the delay is
		// soon refused for longer.
		failed()
		return nil, false, false
	}
	if acc != nil {
		if subtle.ConstantTimeCompare(acc.passwordHash[:], given[:]) == 1 {
			ok = true
		} else if a.now().Before(acc.previousUntil) && subtle.ConstantTimeCompare(acc.previousHash[:], given[:]) == 1 {
			ok, previous = true, true
		}
	}
	if !ok {
		failed()
		return nil, false, false
	}
	a.limiter.Succeeded(source, named)
	return acc, previous, true
}

// stillAuthorized tells whether the credentials r was let in with still
// open the service: its session is live, or its password is the account's
// (or the previous one within the rotation's grace). It checks without
// counting a failure: a long-lived request (an SSE stream) asks it to end
// once its credentials no longer would be accepted.
func (a *authenticator) stillAuthorized(r *http.Request) bool {
	if token := sessionToken(r); token != "" {
		_, ok := a.sessionPrincipal(token)
		return ok
	}
	username, password, ok := r.BasicAuth()
	if !ok {
		return false
	}
	givenUser, given := sha256.Sum256([]byte(username)), sha256.Sum256([]byte(password))
	for _, acc := range *a.accounts.Load() {
		if subtle.ConstantTimeCompare(acc.usernameHash[:], givenUser[:]) != 1 {
			continue
		}
		return subtle.ConstantTimeCompare(acc.passwordHash[:], given[:]) == 1 ||
			a.now().Before(acc.previousUntil) && subtle.ConstantTimeCompare(acc.previousHash[:], given[:]) == 1
	}
	return false
}

// authenticate identifies the caller from X-Auth-Token (sessionToken) or
// HTTP Basic. A
// token wins when both are present, as DSP0266 prefers sessions.
func (a *authenticator) authenticate(r *http.Request) (principal, bool) {
	if token := sessionToken(r); token != "" {
		return a.sessionPrincipal(token)
	}
	username, password, ok := r.BasicAuth()
	if !ok {
		return principal{}, false
	}
	acc, _, ok := a.checkPassword(a.clients.source(r), username, password)
	if !ok {
		return principal{}, false
	}
	return principal{username: acc.username, role: acc.role}, true
}

func (a *authenticator) sessionPrincipal(token string) (principal, bool) {
	key := sha256.Sum256([]byte(token))
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	s, ok := a.sessions[key]
	if !ok {
		return principal{}, false
	}
	acc := a.account(s.username)
	if a.endedLocked(s, acc, now) {
		delete(a.sessions, key)
		return principal{}, false
	}
	s.lastUsed = now
	return principal{username: s.username, role: acc.role, sessionID: s.id}, true
}

// endedLocked reports whether s is over: idle too long, its account gone,
// or made with a rotated-out password whose grace has ended.
func (a *authenticator) endedLocked(s *session, acc *account, now time.Time) bool {
	return now.Sub(s.lastUsed) >= a.timeout || acc == nil || s.previousPassword && !now.Before(acc.previousUntil)
}

// account returns the account with that username, or nil.
func (a *authenticator) account(username string) *account {
	for _, acc := range *a.accounts.Load() {
		if acc.username == username {
			return acc
		}
	}
	return nil
}

// accountList returns the accounts in order.
func (a *authenticator) accountList() []*account { return *a.accounts.Load() }

// accountByID returns the account with that Id, or nil.
func (a *authenticator) accountByID(id string) *account {
	for _, acc := range *a.accounts.Load() {
		if acc.id == id {
			return acc
		}
	}
	return nil
}

// errSessionLimit is returned when maxSessions live sessions exist.
var errSessionLimit = newError(http.StatusServiceUnavailable, msgSessionLimitExceeded)

// createSession starts a session for acc and returns its secret token.
func (a *authenticator) createSession(acc *account, previousPassword bool) (session, string, *apiError) {
	token := randomHex(32)
	id := randomHex(16)
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	a.expireLocked(now)
	if len(a.sessions) >= a.maxSessions {
		return session{}, "", errSessionLimit
	}
	// One account cannot take every slot and keep the others out.
	mine := 0
	for _, s := range a.sessions {
		if s.username == acc.username {
			mine++
		}
	}
	if mine >= a.maxSessionsPerAccount {
		return session{}, "", errSessionLimit
	}
	s := &session{id: id, username: acc.username, created: now, lastUsed: now, previousPassword: previousPassword}
	a.sessions[sha256.Sum256([]byte(token))] = s
	return *s, token, nil
}

// expireLocked drops the sessions that are over; callers hold mu. Expiry
// is otherwise lazy: a stale token is refused when presented.
func (a *authenticator) expireLocked(now time.Time) {
	for key, s := range a.sessions {
		if a.endedLocked(s, a.account(s.username), now) {
			delete(a.sessions, key)
		}
	}
}

// endAllSessions logs everyone out, as a BMC reset does.
func (a *authenticator) endAllSessions() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := len(a.sessions)
	clear(a.sessions)
	return n
}

// listSessions returns the live sessions ordered by creation time.
func (a *authenticator) listSessions() []session {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.expireLocked(a.now())
	list := make([]session, 0, len(a.sessions))
	for _, s := range a.sessions {
		list = append(list, *s)
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].created.Equal(list[j].created) {
			return list[i].id < list[j].id
		}
		return list[i].created.Before(list[j].created)
	})
	return list
}

// findSession returns the live session with that Id.
func (a *authenticator) findSession(id string) (session, bool) {
	for _, s := range a.listSessions() {
		if s.id == id {
			return s, true
		}
	}
	return session{}, false
}

// deleteSession ends the session with that Id.
func (a *authenticator) deleteSession(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for key, s := range a.sessions {
		if s.id == id {
			delete(a.sessions, key)
			return true
		}
	}
	return false
}

func randomHex(n int) string {
	b := make([]byte, n)
	// crypto/rand.Read never returns an error on the supported platforms.
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
