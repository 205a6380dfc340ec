// Package ceiling is the reference that Redfish throughput is measured
// against: the least an HTTPS server with HTTP Basic can do per request,
// check the credentials and answer a fixed JSON document the size of a
// ComputerSystem. Whatever the BMC adds shows as its distance from this.
package ceiling

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strconv"
)

// Body is the fixed answer: 1.4 KB of JSON.
var Body = []byte(`{"@odata.id":"/redfish/v1/Systems/vm-0","@odata.type":"#ComputerSystem.v1_27_0.ComputerSystem",` +
	`"Id":"vm-0","Name":"vm-0","SystemType":"Virtual","UUID":"5b0c7f2e-8a43-4b0e-9d51-0d7a3c6f1e22",` +
	`"SerialNumber":"vm-0.memory","Manufacturer":"virtmetal","Model":"in-memory machine","PowerState":"Off",` +
	`"Status":{"Health":"OK","State":"Enabled"},"Boot":{"BootSourceOverrideTarget":"None","BootSourceOverrideEnabled":"Disabled",` +
	`"BootSourceOverrideMode":"UEFI","BootSourceOverrideTarget@Redfish.AllowableValues":["None","Pxe","Hdd","Cd","UefiHttp"],` +
	`"BootSourceOverrideEnabled@Redfish.AllowableValues":["Disabled","Once","Continuous"],` +
	`"BootSourceOverrideMode@Redfish.AllowableValues":["UEFI","Legacy"]},"ProcessorSummary":{"Count":2,"LogicalProcessorCount":2,"Model":"virtual"},` +
	`"MemorySummary":{"TotalSystemMemoryGiB":4},"EthernetInterfaces":{"@odata.id":"/redfish/v1/Systems/vm-0/EthernetInterfaces"},` +
	`"SimpleStorage":{"@odata.id":"/redfish/v1/Systems/vm-0/SimpleStorage"},"VirtualMedia":{"@odata.id":"/redfish/v1/Systems/vm-0/VirtualMedia"},` +
	`"Links":{"Chassis":[{"@odata.id":"/redfish/v1/Chassis/vm-0"}],"ManagedBy":[{"@odata.id":"/redfish/v1/Managers/vm-0"}]},` +
	`"Actions":{"#ComputerSystem.Reset":{"target":"/redfish/v1/Systems/vm-0/Actions/ComputerSystem.Reset",` +
	`"ResetType@Redfish.AllowableValues":["On","ForceOn","ForceOff","GracefulShutdown","GracefulRestart","ForceRestart","PowerCycle","Nmi"]}}}`)

// Handler answers every request that carries the credentials with Body,
// and every other one with 401.
func Handler(username, password string) http.Handler {
	wantUser, wantPass := sha256.Sum256([]byte(username)), sha256.Sum256([]byte(password))
	length := strconv.Itoa(len(Body))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pass, ok := r.BasicAuth()
		gotUser, gotPass := sha256.Sum256([]byte(user)), sha256.Sum256([]byte(pass))
		if !ok || subtle.ConstantTimeCompare(gotUser[:], wantUser[:])&subtle.ConstantTimeCompare(gotPass[:], wantPass[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="ceiling"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "application/json; charset=utf-8")
		h.Set("Content-Length", length)
		_, _ = w.Write(Body)
	})
}
