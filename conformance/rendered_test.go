package conformance_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"github.com/virtmetal/virtmetal/internal/poll"
)

// TestAnswersFollowEveryChange: answers are rendered once per change of
// the machine and then served as bytes, so every write is followed by a
// GET that shows it (never the state from before), and a resource's ETag
// changes exactly when its body does, on both backends. Changes made
// behind the BMC's back show too.
func TestAnswersFollowEveryChange(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			b := startBMC(t, backend)
			media := b.system + "/VirtualMedia/Cd"
			resources := []string{b.system, media}
			boot := func(target, enabled string) map[string]any {
				return map[string]any{"Boot": map[string]any{"BootSourceOverrideTarget": target, "BootSourceOverrideEnabled": enabled}}
			}
			steps := []struct {
				name, method, path string
				body               any
				// want checks the resource at path after the write.
				wantPath string
				want     func(doc map[string]any) bool
			}{
				{"boot Pxe once", "PATCH", b.system, boot("Pxe", "Once"),
					b.system, bootIs("Pxe", "Once")},
				{"same boot again", "PATCH", b.system, boot("Pxe", "Once"),
					b.system, bootIs("Pxe", "Once")},
				{"boot Hdd continuous", "PATCH", b.system, boot("Hdd", "Continuous"),
					b.system, bootIs("Hdd", "Continuous")},
				{"boot cleared", "PATCH", b.system, boot("None", "Disabled"),
					b.system, bootIs("None", "Disabled")},
				{"insert media", "POST", media + "/Actions/VirtualMedia.InsertMedia", map[string]any{"Image": "http://images.test/boot.iso"},
					media, func(doc map[string]any) bool {
						return doc["Inserted"] == true && doc["Image"] == "http://images.test/boot.iso"
					}},
				{"eject media", "POST", media + "/Actions/VirtualMedia.EjectMedia", map[string]any{},
					media, func(doc map[string]any) bool { return doc["Inserted"] == false && doc["Image"] == nil }},
				{"power on", "POST", b.system + "/Actions/ComputerSystem.Reset", map[string]any{"ResetType": "On"},
					b.system, powerIn("On", "PoweringOn")},
				{"power on again", "POST", b.system + "/Actions/ComputerSystem.Reset", map[string]any{"ResetType": "On"},
					b.system, powerIn("On", "PoweringOn")},
				{"force off", "POST", b.system + "/Actions/ComputerSystem.Reset", map[string]any{"ResetType": "ForceOff"},
					b.system, powerIn("Off", "PoweringOff")},
			}
			for _, step := range steps {
				t.Run(step.name, func(t *testing.T) {
					before := map[string]served{}
					for _, path := range resources {
						before[path] = serve(t, b, path)
					}
					if status, _, _ := kvRequest(t, b.ts, step.method, step.path, step.body, ""); status/100 != 2 {
						t.Fatalf("%s %s: %d", step.method, step.path, status)
					}
					after := serve(t, b, step.wantPath)
					if !step.want(after.doc) {
						t.Fatalf("GET %s right after the write shows the state from before: %s", step.wantPath, after.body)
					}
					for _, path := range resources {
						checkETagFollowsBody(t, b, path, before[path])
					}
				})
			}
			t.Run("change behind the BMC", func(t *testing.T) {
				before := serve(t, b, b.system)
				b.changeOutside(t)
				// Another writer's change reaches the BMC through its
				// backend (for KubeVirt, an informer event): poll for it.
				poll.True(t, "GET "+b.system+" showing the change", func() bool { return !bytes.Equal(serve(t, b, b.system).body, before.body) })
				checkETagFollowsBody(t, b, b.system, before)
			})
		})
	}
}

// served is one 200 answer.
type served struct {
	etag string
	body []byte
	doc  map[string]any
}

func serve(t *testing.T, b bmc, path string) served {
	t.Helper()
	status, etag, body := rawGet(t, b.ts, path, "")
	var doc map[string]any
	if status != http.StatusOK || etag == "" || json.Unmarshal(body, &doc) != nil {
		t.Fatalf("GET %s: %d, ETag %q, %s", path, status, etag, body)
	}
	return served{etag: etag, body: body, doc: doc}
}

// checkETagFollowsBody GETs path again and compares with an earlier
// answer: same ETag exactly when same bytes, and If-None-Match with the
// earlier ETag is 304 exactly then.
func checkETagFollowsBody(t *testing.T, b bmc, path string, earlier served) {
	t.Helper()
	now := serve(t, b, path)
	same := bytes.Equal(now.body, earlier.body)
	if (now.etag == earlier.etag) != same {
		t.Errorf("GET %s: ETag %s -> %s while the body changed = %v:\nbefore %s\nafter  %s", path, earlier.etag, now.etag, !same, earlier.body, now.body)
	}
	status, _, _ := rawGet(t, b.ts, path, earlier.etag)
	if want := map[bool]int{true: http.StatusNotModified, false: http.StatusOK}[now.etag == earlier.etag]; status != want {
		t.Errorf("GET %s If-None-Match the earlier ETag: %d, want %d", path, status, want)
	}
}

func powerIn(states ...string) func(map[string]any) bool {
	return func(doc map[string]any) bool {
		state, _ := doc["PowerState"].(string)
		return slices.Contains(states, state)
	}
}

func bootIs(target, enabled string) func(map[string]any) bool {
	return func(doc map[string]any) bool {
		boot, _ := doc["Boot"].(map[string]any)
		return boot["BootSourceOverrideTarget"] == target && boot["BootSourceOverrideEnabled"] == enabled
	}
}
