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
	"time"
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

// account is an Account with its lockout state. Fields after role are
// guarded by authenticator.mu.
type account struct {
	id           string // position in Config.Accounts, from 1
	username     string
	usernameHash [sha256.Size]byte
	passwordHash [sha256.Size]byte
	role         Role

	failures    int
	lastFailure time.Time
	lockedUntil time.Time
}

// session is a login session; the token itself is never stored.
type session struct {
	id       string
	username string
	created  time.Time
	lastUsed time.Time
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

// lockoutPolicy is AccountService's lockout settings; threshold 0 disables
// lockout.
type lockoutPolicy struct {
	threshold  int
	duration   time.Duration
	resetAfter time.Duration
}

// authenticator checks credentials and owns the sessions.
type authenticator struct {
	now         func() time.Time
	timeout     time.Duration
	maxSessions int
	lockout     lockoutPolicy
	accounts    []*account // in Config order

	mu       sync.Mutex
	sessions map[[sha256.Size]byte]*session // by token hash
}

func newAuthenticator(accounts []Account, now func() time.Time, timeout time.Duration, maxSessions int, lockout lockoutPolicy) *authenticator {
	a := &authenticator{
		now:         now,
		timeout:     timeout,
		maxSessions: maxSessions,
		lockout:     lockout,
		sessions:    map[[sha256.Size]byte]*session{},
	}
	for i, acc := range accounts {
		a.accounts = append(a.accounts, &account{
			id:           strconv.Itoa(i + 1),
			username:     acc.Username,
			usernameHash: sha256.Sum256([]byte(acc.Username)),
			passwordHash: sha256.Sum256([]byte(acc.Password)),
			role:         acc.Role,
		})
	}
	return a
}

// checkPassword verifies a username and password and applies the lockout
// policy. Comparing fixed-size hashes of every account keeps the time spent
// independent of which names exist and of the secrets' lengths.
func (a *authenticator) checkPassword(username, password string) (*account, bool) {
	givenUser := sha256.Sum256([]byte(username))
	given := sha256.Sum256([]byte(password))
	var found *account
	for _, acc := range a.accounts {
		if subtle.ConstantTimeCompare(acc.usernameHash[:], givenUser[:]) == 1 {
			found = acc
		}
	}
	if found == nil {
		return nil, false
	}
	passwordOK := subtle.ConstantTimeCompare(found.passwordHash[:], given[:]) == 1

	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	if now.Before(found.lockedUntil) {
		return nil, false
	}
	if passwordOK {
		found.failures = 0
		return found, true
	}
	if a.lockout.threshold > 0 {
		if now.Sub(found.lastFailure) >= a.lockout.resetAfter {
			found.failures = 0
		}
		found.failures++
		found.lastFailure = now
		if found.failures >= a.lockout.threshold {
			found.lockedUntil = now.Add(a.lockout.duration)
			found.failures = 0
		}
	}
	return nil, false
}

// locked reports whether the lockout policy currently refuses acc.
func (a *authenticator) locked(acc *account) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.now().Before(acc.lockedUntil)
}

// authenticate identifies the caller from X-Auth-Token or HTTP Basic. A
// token wins when both are present, as DSP0266 prefers sessions.
func (a *authenticator) authenticate(r *http.Request) (principal, bool) {
	if token := r.Header.Get("X-Auth-Token"); token != "" {
		return a.sessionPrincipal(token)
	}
	username, password, ok := r.BasicAuth()
	if !ok {
		return principal{}, false
	}
	acc, ok := a.checkPassword(username, password)
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
	if now.Sub(s.lastUsed) >= a.timeout {
		delete(a.sessions, key)
		return principal{}, false
	}
	s.lastUsed = now
	acc := a.account(s.username)
	return principal{username: s.username, role: acc.role, sessionID: s.id}, true
}

// account returns the account with that username, or nil.
func (a *authenticator) account(username string) *account {
	for _, acc := range a.accounts {
		if acc.username == username {
			return acc
		}
	}
	return nil
}

// accountByID returns the account with that Id, or nil.
func (a *authenticator) accountByID(id string) *account {
	for _, acc := range a.accounts {
		if acc.id == id {
			return acc
		}
	}
	return nil
}

// errSessionLimit is returned when maxSessions live sessions exist.
var errSessionLimit = newError(http.StatusServiceUnavailable, msgSessionLimitExceeded)

// createSession starts a session for acc and returns its secret token.
func (a *authenticator) createSession(acc *account) (session, string, *apiError) {
	token := randomHex(32)
	id := randomHex(16)
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	a.expireLocked(now)
	if len(a.sessions) >= a.maxSessions {
		return session{}, "", errSessionLimit
	}
	s := &session{id: id, username: acc.username, created: now, lastUsed: now}
	a.sessions[sha256.Sum256([]byte(token))] = s
	return *s, token, nil
}

// expireLocked drops idle sessions; callers hold mu. Expiry is otherwise
// lazy: a stale token is refused when presented.
func (a *authenticator) expireLocked(now time.Time) {
	for key, s := range a.sessions {
		if now.Sub(s.lastUsed) >= a.timeout {
			delete(a.sessions, key)
		}
	}
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
