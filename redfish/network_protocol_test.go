package redfish_test

import (
	"encoding/json"
	"testing"

	"github.com/virtmetal/virtmetal/redfish"
)

// TestNetworkProtocol (read with the read-only role): HTTPS or HTTP as
// configured, with the port when known (HTTP only when it is the listener's); IPMI on only for the
// machine it serves; SSH and SSDP, which the BMC does not implement, absent; FQDN and HostName (its
// first label) only when the name is known.
func TestNetworkProtocol(t *testing.T) {
	tests := []struct {
		name    string
		cfg     redfish.NetworkProtocol
		manager string
		want    map[string]string // property: its value as JSON; "" for absent
	}{
		{"HTTPS with IPMI", redfish.NetworkProtocol{RedfishPort: 8443, IPMIPort: 623, IPMIMachine: "vm-0"}, "vm-0", map[string]string{
			"HTTPS": `{"Port":8443,"ProtocolEnabled":true}`, "HTTP": "",
			"IPMI": `{"Port":623,"ProtocolEnabled":true}`, "SSH": "", "SSDP": "",
			"FQDN": "", "HostName": "",
		}},
		{"known name", redfish.NetworkProtocol{RedfishPort: 8443, FQDN: "web1.team-a.bmc.example.org"}, "vm-1", map[string]string{
			"FQDN": `"web1.team-a.bmc.example.org"`, "HostName": `"web1"`, "HTTPS": `{"Port":8443,"ProtocolEnabled":true}`,
		}},
		{"IPMI serves another machine", redfish.NetworkProtocol{RedfishPort: 8443, IPMIPort: 623, IPMIMachine: "vm-0"}, "vm-1", map[string]string{
			"HTTPS": `{"Port":8443,"ProtocolEnabled":true}`, "IPMI": `{"ProtocolEnabled":false}`,
		}},
		{"plain HTTP, port unknown, no IPMI", redfish.NetworkProtocol{PlainHTTP: true}, "vm-0", map[string]string{
			"HTTPS": `{"ProtocolEnabled":false}`, "HTTP": `{"ProtocolEnabled":true}`, "IPMI": `{"ProtocolEnabled":false}`,
			"SSH": "", "SSDP": "",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, func(c *redfish.Config, _ *stubBackend) { c.NetworkProtocol = tt.cfg })
			path := "/redfish/v1/Managers/" + tt.manager + "/NetworkProtocol"
			res := f.do(request{method: "GET", path: path, user: readerUser, pass: readerPass})
			if res.status != 200 {
				t.Fatalf("GET %s: %d %s", path, res.status, res.raw)
			}
			for property, want := range tt.want {
				value, present := res.json[property]
				got, _ := json.Marshal(value)
				switch {
				case want == "" && present:
					t.Errorf("%s = %s, want it left out", property, got)
				case want != "" && string(got) != want:
					t.Errorf("%s = %s, want %s", property, got, want)
				}
			}
			manager := f.do(asAdmin("GET", "/redfish/v1/Managers/"+tt.manager, ""))
			if link, _ := manager.json["NetworkProtocol"].(map[string]any); link["@odata.id"] != path {
				t.Errorf("Manager.NetworkProtocol = %v, want a link to %s", manager.json["NetworkProtocol"], path)
			}
		})
	}
	f := newFixture(t, nil)
	if res := f.do(asAdmin("GET", "/redfish/v1/Managers/vm-9/NetworkProtocol", "")); res.status != 404 {
		t.Errorf("an unknown manager's NetworkProtocol: %d, want 404", res.status)
	}
}
