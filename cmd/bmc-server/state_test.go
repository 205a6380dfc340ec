package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/deploy/bmc"
	"github.com/virtmetal/virtmetal/internal/poll"
)

// TestSubscriptionsSurviveARestartPerVM runs the shared bmc-server of two
// VMs on KubeVirt's real control plane, with the state Secrets the controller
// makes: a subscription made at one VM's host is there again after the
// process restarts, at that host only, and kept in that VM's Secret only.
func TestSubscriptionsSurviveARestartPerVM(t *testing.T) {
	env := useAPIServer(t)
	const namespace = "team-s"
	if err := env.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	hosts := map[string]string{"web1": "web1.team-s.bmc.example.com", "web2": "web2.team-s.bmc.example.com"}
	for i, vm := range []string{"web1", "web2"} {
		createVM(t, env.Client, namespace, vm, "6a1c2a3e-1b2d-4c5e-8f90-a1b2c3d4e5f"+string(rune('1'+i)), "02:00:00:00:02:0"+string(rune('1'+i)))
		writeVMFile(t, dir, vm, "maas-"+vm, "pw-"+vm, hosts[vm])
		state := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: bmc.StateSecretName(vm)}}
		if err := env.Client.Create(t.Context(), state); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"--backend", "kubevirt", "--namespace", namespace, "--vms-dir", dir, "--listen", "127.0.0.1:0", "--insecure-http"}
	httpClient := &http.Client{Timeout: 15 * time.Second}
	members := func(s *started, vm string) []string {
		t.Helper()
		var res hostResponse
		poll.True(t, vm+"'s subscriptions loaded", func() bool {
			res = doAtHost(t, httpClient, "GET", s.base+"/redfish/v1/EventService/Subscriptions", hosts[vm], "maas-"+vm, "pw-"+vm, "")
			return res.status != http.StatusServiceUnavailable
		})
		if res.status != http.StatusOK {
			t.Fatalf("Subscriptions at %s: %d %s", hosts[vm], res.status, res.body)
		}
		return memberIDs(res.body)
	}

	first := startServer(t, args, nil, fastTuning)
	members(first, "web1")
	// A name that is refused when a delivery dials it (loopback), so the
	// test sends nothing anywhere.
	created := doAtHost(t, httpClient, "POST", first.base+"/redfish/v1/EventService/Subscriptions", hosts["web1"], "maas-web1", "pw-web1",
		`{"Destination":"https://localhost:9/events","Protocol":"Redfish","Context":"web1 only"}`)
	if created.status != http.StatusCreated {
		t.Fatalf("POST at web1's host: %d %s", created.status, created.body)
	}
	first.cancel()
	err := <-first.done
	first.done <- err // for the cleanup's check

	second := startServer(t, args, nil, fastTuning)
	if got := members(second, "web1"); len(got) != 1 {
		t.Errorf("web1's subscriptions after the restart: %v, want the one made", got)
	}
	if got := members(second, "web2"); len(got) != 0 {
		t.Errorf("web2's subscriptions: %v, want none: web1's are its own", got)
	}
	for vm, want := range map[string]bool{"web1": true, "web2": false} {
		var state corev1.Secret
		if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: bmc.StateSecretName(vm)}, &state); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(state.Data["redfish-subscriptions"]), "web1 only"); got != want {
			t.Errorf("%s's state Secret holds web1's subscription: %v, want %v (%s)", vm, got, want, state.Data)
		}
	}
}
