package main

import (
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtmetal/virtmetal/internal/poll"
)

// The addresses of the lockout tests: the owner (MaaS), an attacker, and
// an Ingress controller in front of both, all on loopback.
const (
	ownerAddress    = "127.0.0.1"
	attackerAddress = "127.0.0.3"
	ingressAddress  = "127.0.0.2"
	// behind the Ingress, X-Forwarded-For names them as the Ingress saw them
	forwardedOwner    = "192.0.2.10"
	forwardedAttacker = "198.51.100.66"
)

// loginAttempts is more than the limiter's free failures and its
// BlockAfter, and more than the account-wide count the limiter once kept
// across sources.
const loginAttempts = 25

// clientFrom is a client whose connections come from a loopback source
// address, one connection a request.
func clientFrom(source string) *http.Client {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 2 * time.Second}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: dialer.DialContext, DisableKeepAlives: true}}
}

// login is a GET of url with Basic credentials at host (a shared server's
// virtual host; "" for the URL's), sent from a loopback address, through
// the Ingress when forwardedFor is set.
type login struct {
	from, forwardedFor, host, user, pass string
}

func (l login) status(t *testing.T, url string) int {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.host != "" {
		req.Host = l.host
	}
	req.SetBasicAuth(l.user, l.pass)
	if l.forwardedFor != "" {
		req.Header.Set("X-Forwarded-For", l.forwardedFor)
	}
	res, err := clientFrom(l.from).Do(req)
	if err != nil {
		t.Fatalf("GET %s from %s: %v", url, l.from, err)
	}
	res.Body.Close()
	return res.StatusCode
}

// failMany sends loginAttempts logins that fail, with l's user, or with a
// different unknown user name each time when unknownNames is set.
func failMany(t *testing.T, url string, l login, unknownNames bool) {
	t.Helper()
	for i := range loginAttempts {
		attempt := l
		if unknownNames {
			attempt.user = fmt.Sprintf("admin%d", i)
		}
		if got := attempt.status(t, url); got != http.StatusUnauthorized {
			t.Fatalf("failed login %d: %d, want 401", i+1, got)
		}
	}
}

// TestNoLockoutThroughTheIngress: the attacks of issue 35 item 5 on a
// bmc-server of one machine (--vm's, here the memory backend's), as the
// controller runs it behind an Ingress with --trusted-proxies. After
// loginAttempts failed logins the owner's right password is still let in.
func TestNoLockoutThroughTheIngress(t *testing.T) {
	env := map[string]string{"BMC_USERNAME": "maas", "BMC_PASSWORD": "s3cret"}
	s := startServer(t, []string{"--listen", "127.0.0.1:0", "--insecure-http", "--trusted-proxies", ingressAddress + "/32"}, env, fastTuning)
	url := s.base + "/redfish/v1/Systems"
	t.Run("unknown user names from the owner's own address", func(t *testing.T) {
		failMany(t, url, login{from: ownerAddress, pass: "guess"}, true)
		if got := (login{from: ownerAddress, user: "maas", pass: "s3cret"}).status(t, url); got != http.StatusOK {
			t.Errorf("the owner's right password from the address that sent them: %d, want 200", got)
		}
	})
	t.Run("the owner's user name from another client behind the Ingress", func(t *testing.T) {
		failMany(t, url, login{from: ingressAddress, forwardedFor: forwardedAttacker, user: "maas", pass: "guess"}, false)
		if got := (login{from: ingressAddress, forwardedFor: forwardedOwner, user: "maas", pass: "s3cret"}).status(t, url); got != http.StatusOK {
			t.Errorf("the owner behind the same Ingress: %d, want 200", got)
		}
		// The attacker is held back: even the right password is refused.
		if got := (login{from: ingressAddress, forwardedFor: forwardedAttacker, user: "maas", pass: "s3cret"}).status(t, url); got != http.StatusUnauthorized {
			t.Errorf("the guessing client with the right password: %d, want 401 (throttled)", got)
		}
	})
	t.Run("a client that writes the owner's address into X-Forwarded-For", func(t *testing.T) {
		// The Ingress appends the address it received from: the client
		// is the right-most address that is not a trusted proxy.
		const owner = "192.0.2.11"
		failMany(t, url, login{from: ingressAddress, forwardedFor: owner + ", " + forwardedAttacker, user: "maas", pass: "guess"}, false)
		if got := (login{from: ingressAddress, forwardedFor: owner, user: "maas", pass: "s3cret"}).status(t, url); got != http.StatusOK {
			t.Errorf("the owner whose address the attacker wrote: %d, want 200", got)
		}
	})
}

// TestSharedNoLockoutThroughTheIngress: the attacks of issue 35 items 5
// and 7 on a shared bmc-server (--vms-dir) behind an Ingress: failed logins
// at one VM lock neither the owner of that VM nor another VM out, and a
// login to one VM clears no failure at another.
func TestSharedNoLockoutThroughTheIngress(t *testing.T) {
	env := useAPIServer(t)
	const namespace = "lockout"
	if err := env.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		t.Fatal(err)
	}
	createVM(t, env.Client, namespace, "web1", "2f6c2a3e-1b2d-4c5e-8f90-a1b2c3d4e5f1", "02:00:00:00:02:01")
	createVM(t, env.Client, namespace, "web2", "2f6c2a3e-1b2d-4c5e-8f90-a1b2c3d4e5f2", "02:00:00:00:02:02")
	dir := t.TempDir()
	const web1Host, web2Host = "web1.lockout.bmc.example.com", "web2.lockout.bmc.example.com"
	writeVMFile(t, dir, "web1", "maas-web1", "pw-web1", web1Host)
	writeVMFile(t, dir, "web2", "maas-web2", "pw-web2", web2Host)
	s := startServer(t, []string{"--backend", "kubevirt", "--namespace", namespace, "--vms-dir", dir,
		"--listen", "127.0.0.1:0", "--insecure-http", "--trusted-proxies", ingressAddress + "/32"}, nil, fastTuning)
	url := s.base + "/redfish/v1/Systems"
	web1Owner := login{from: ingressAddress, forwardedFor: forwardedOwner, host: web1Host, user: "maas-web1", pass: "pw-web1"}
	// Another client waits for the VMs, so that the owner has not logged
	// in before the attacks (the limiter once trusted such a client more).
	for _, l := range []login{
		{from: ingressAddress, forwardedFor: "192.0.2.200", host: web1Host, user: "maas-web1", pass: "pw-web1"},
		{from: ingressAddress, forwardedFor: "192.0.2.200", host: web2Host, user: "maas-web2", pass: "pw-web2"},
	} {
		poll.True(t, l.host+"'s cache synced", func() bool { return l.status(t, url) != http.StatusServiceUnavailable })
	}

	t.Run("unknown user names from the owner's own address", func(t *testing.T) {
		failMany(t, url, login{from: ingressAddress, forwardedFor: forwardedOwner, host: web1Host, pass: "guess"}, true)
		if got := web1Owner.status(t, url); got != http.StatusOK {
			t.Errorf("web1's owner from the address that sent them: %d, want 200", got)
		}
	})
	t.Run("the owner's user name from another client behind the Ingress", func(t *testing.T) {
		failMany(t, url, login{from: ingressAddress, forwardedFor: forwardedAttacker, host: web1Host, user: "maas-web1", pass: "guess"}, false)
		if got := web1Owner.status(t, url); got != http.StatusOK {
			t.Errorf("web1's owner behind the same Ingress: %d, want 200", got)
		}
	})
	t.Run("guesses at one VM between logins to another", func(t *testing.T) {
		// A tenant that owns web1 (its credentials are right) guesses
		// web2's password, logging in to web1 between guesses.
		tenantAtWeb1 := login{from: attackerAddress, host: web1Host, user: "maas-web1", pass: "pw-web1"}
		guessAtWeb2 := login{from: attackerAddress, host: web2Host, user: "maas-web2", pass: "guess"}
		for round := range 5 {
			for range 3 {
				guessAtWeb2.status(t, url)
			}
			if got := tenantAtWeb1.status(t, url); got != http.StatusOK {
				t.Fatalf("round %d: the tenant at web1 after guessing at web2: %d, want 200", round+1, got)
			}
		}
		rightAtWeb2 := guessAtWeb2
		rightAtWeb2.pass = "pw-web2"
		if got := rightAtWeb2.status(t, url); got != http.StatusUnauthorized {
			t.Errorf("web2's right password from the source of 15 guesses, each 3 followed by a login to web1: %d, want 401 (throttled)", got)
		}
		failMany(t, url, guessAtWeb2, false)
		if got := tenantAtWeb1.status(t, url); got != http.StatusOK {
			t.Errorf("web1 from the source of %d more guesses at web2: %d, want 200", loginAttempts, got)
		}
	})
}
