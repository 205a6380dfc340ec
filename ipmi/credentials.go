package ipmi

import (
	"fmt"
	"slices"
	"time"
)

// credentials are the account, and after a rotation the previous one,
// accepted until prevUntil so clients keep working while they learn the new
// password.
type credentials struct {
	username, password         []byte
	prevUsername, prevPassword []byte
	prevUntil                  time.Time
	// switched holds the sources whose RAKP 2 uses the current password
	// during a grace window (see choose).
	switched map[string]bool
}

// maxSwitchedSources bounds credentials.switched; past it, the map starts
// over, costing clients at most one more failed handshake each.
const maxSwitchedSources = 1024

// candidate is a password an account name may log in with.
type candidate struct {
	password []byte
	previous bool // the rotated-out one
}

// candidates lists the passwords name may use now.
func (c *credentials) candidates(name []byte, now time.Time) []candidate {
	var out []candidate
	if now.Before(c.prevUntil) && equalConstantTime(name, c.prevUsername) {
		out = append(out, candidate{password: c.prevPassword, previous: true})
	}
	if equalConstantTime(name, c.username) {
		out = append(out, candidate{password: c.password})
	}
	return out
}

// choose picks the password RAKP 2 is keyed with. The BMC must commit to
// one before the console proves which it holds, so during a grace window a
// source starts on the previous password (the one its clients were set up
// with) and switches after a handshake the console aborted.
func (c *credentials) choose(name []byte, source string, now time.Time) (candidate, bool) {
	list := c.candidates(name, now)
	switch {
	case len(list) == 0:
		return candidate{}, false
	case len(list) == 2 && c.switched[source]:
		return list[1], true
	}
	return list[0], true
}

// aborted records that a console from source refused the RAKP 2 keyed
// with the previous password; its next handshake uses the other one.
func (c *credentials) aborted(source string, used candidate, now time.Time) {
	if !now.Before(c.prevUntil) {
		return
	}
	if c.switched == nil || len(c.switched) >= maxSwitchedSources {
		c.switched = map[string]bool{}
	}
	c.switched[source] = used.previous
}

// SetCredentials replaces the account, as when a mounted Secret is
// rotated. The previous username and password stay valid for grace, and
// the sessions opened with them end when grace does.
func (s *Server) SetCredentials(username, password string, grace time.Duration) error {
	if err := checkCredentials(username, password); err != nil {
		return err
	}
	if len(s.v15Auth) > 0 && len(password) > maxV15PasswordLength {
		return fmt.Errorf("ipmi: IPMI 1.5 is enabled, so the password must be at most %d bytes", maxV15PasswordLength)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if string(s.creds.username) == username && string(s.creds.password) == password {
		return nil
	}
	now := s.now()
	s.creds = credentials{
		username: []byte(username), password: []byte(password),
		prevUsername: s.creds.username, prevPassword: s.creds.password,
	}
	if grace > 0 {
		s.creds.prevUntil = now.Add(grace)
	}
	for _, sess := range s.sessions.byID {
		sess.previous = true
	}
	s.endRotatedOut(now)
	s.log.Info("credentials rotated", "graceWindow", grace)
	return nil
}

// endRotatedOut ends the sessions opened with the previous credentials once
// their grace window is over.
func (s *Server) endRotatedOut(now time.Time) {
	if now.Before(s.creds.prevUntil) {
		return
	}
	for _, sess := range s.sessions.byID {
		if sess.previous {
			s.endSession(sess, "password rotated")
		}
	}
}

func checkCredentials(username, password string) error {
	if len(username) > maxUsernameLength || slices.Contains([]byte(username), 0) {
		return fmt.Errorf("ipmi: username must be at most %d bytes without NUL", maxUsernameLength)
	}
	if len(password) > maxPasswordLength {
		return fmt.Errorf("ipmi: password must be at most %d bytes", maxPasswordLength)
	}
	return nil
}
