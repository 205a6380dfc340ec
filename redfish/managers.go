package redfish

import (
	"crypto/sha1"
	"fmt"
	"net/http"
	"net/url"
	"runtime/debug"
	"strings"

	"github.com/virtmetal/virtmetal/machine"
)

// Each machine has its own Manager and Chassis with the machine's ID, as
// sushy-tools lays them out; provisioning tools follow Links either way.
func managerPath(id string) string { return "/redfish/v1/Managers/" + url.PathEscape(id) }
func chassisPath(id string) string { return "/redfish/v1/Chassis/" + url.PathEscape(id) }

// managerResetTypes are what Manager.Reset accepts. Either ends every
// session, as a real BMC's restart does; nothing else of the simulated BMC
// needs restarting.
var managerResetTypes = []string{string(machine.ResetGracefulRestart), string(machine.ResetForceRestart)}

// managerUUIDNamespace names virtmetal's BMCs: a Manager's UUID is the
// name-based (SHA-1) UUID of its machine's system UUID in this namespace, so
// it is stable across restarts and differs from the system's own.
var managerUUIDNamespace = [16]byte{0x6d, 0x1e, 0x0b, 0x7a, 0x3c, 0x52, 0x4f, 0x8e, 0x9a, 0x41, 0x2d, 0x67, 0xc0, 0x13, 0xf5, 0x88}

// managerUUID derives the Manager's UUID from the system UUID, or from the
// machine ID where the backend reports no system UUID.
func managerUUID(inv machine.Inventory, id string) string {
	name := inv.UUID
	if name == "" {
		name = "machine:" + id
	}
	h := sha1.New()
	h.Write(managerUUIDNamespace[:])
	h.Write([]byte(name))
	b := h.Sum(nil)[:16]
	b[6] = b[6]&0x0f | 0x50 // version 5
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// buildVersion is the main module's version as the Go toolchain stamped it
// (a tag, or a pseudo-version from the commit; "(devel)" when unknown).
func buildVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
		return info.Main.Version
	}
	return "(devel)"
}

func (s *Server) getManagers(c *call) (result, error) {
	members, err := s.machineIDs(c, "ManagerCollection", managerPath)
	if err != nil {
		return result{}, err
	}
	return result{body: collection(typeManagerCollection, "/redfish/v1/Managers", "Manager Collection", members)}, nil
}

func (s *Server) getManager(c *call) (result, error) {
	m, err := s.machineFor(c, "managerID", "Manager")
	if err != nil {
		return result{}, err
	}
	id := m.ID()
	inv, err := m.Inventory(c.ctx())
	if err != nil {
		return result{}, s.mapBackendError(err, operation{resourceType: "Manager", resourceID: id})
	}
	path := managerPath(id)
	body := resource(typeManager, path, id, "Manager for "+id)
	body["ManagerType"] = "BMC"
	body["Model"] = "virtmetal"
	body["UUID"] = managerUUID(inv, id)
	body["FirmwareVersion"] = s.firmwareVersion
	body["PowerState"] = string(machine.PowerOn)
	body["Status"] = statusOK()
	body["LogServices"] = link(logServicesPath(path))
	body["NetworkProtocol"] = link(path + "/NetworkProtocol")
	if m.Capabilities().VirtualMedia {
		body["VirtualMedia"] = link(mediaCollectionUnder(path)) // the system's drive (media.go)
	}
	body["Links"] = map[string]any{
		"ManagerForServers": links(systemPath(id)),
		"ManagerForChassis": links(chassisPath(id)),
	}
	body["Actions"] = map[string]any{
		"#Manager.Reset": map[string]any{
			"target":                            path + "/Actions/Manager.Reset",
			"ResetType@Redfish.AllowableValues": managerResetTypes,
		},
	}
	return result{body: body}, nil
}

// NetworkProtocol is what the BMC knows of its own network services. It
// serves no EthernetInterfaces of its own: the BMC is a process behind a
// Kubernetes Service (or a port-forward), with no NIC, MAC or address that
// a client could use. The name it is reached by is known only when its
// deployer says (FQDN); otherwise HostName and FQDN are left out.
type NetworkProtocol struct {
	// FQDN is the DNS name clients reach the service at (bmc-controller's
	// Ingress host), served as FQDN and, its first label, as HostName;
	// empty leaves both out rather than guess.
	FQDN string
	// RedfishPort is the port the Redfish service listens on; 0 when not
	// known (a listener the caller made). A Service may publish another.
	RedfishPort int
	// PlainHTTP: the Redfish service speaks HTTP, not HTTPS.
	PlainHTTP bool
	// IPMIPort is the UDP port IPMI listens on for IPMIMachine (IPMI serves
	// one machine); 0 when IPMI is off.
	IPMIPort    int
	IPMIMachine string
}

// protocolSettings is one protocol's entry: enabled with its port (when
// known), or disabled without one.
func protocolSettings(enabled bool, port int) map[string]any {
	p := map[string]any{"ProtocolEnabled": enabled}
	if enabled && port > 0 {
		p["Port"] = port
	}
	return p
}

func (s *Server) getNetworkProtocol(c *call) (result, error) {
	m, err := s.machineFor(c, "managerID", "Manager")
	if err != nil {
		return result{}, err
	}
	id := m.ID()
	p := s.protocols
	body := resource(typeNetworkProtocol, managerPath(id)+"/NetworkProtocol", "NetworkProtocol", "Manager Network Protocol")
	body["Status"] = statusOK()
	if p.FQDN != "" {
		body["FQDN"] = p.FQDN
		body["HostName"], _, _ = strings.Cut(p.FQDN, ".")
	}
	// One listener speaks Redfish, HTTPS or plain HTTP: HTTPS says which,
	// and HTTP is listed only when it is that listener's. SSH and SSDP,
	// which this BMC does not implement, are left out rather than shown
	// off: off would promise a switch (and a port) that does not exist.
	body["HTTPS"] = protocolSettings(!p.PlainHTTP, p.RedfishPort)
	if p.PlainHTTP {
		body["HTTP"] = protocolSettings(true, p.RedfishPort)
	}
	body["IPMI"] = protocolSettings(p.IPMIPort > 0 && p.IPMIMachine == id, p.IPMIPort)
	return result{body: body}, nil
}

func (s *Server) resetManager(c *call) (result, error) {
	if _, err := s.machineFor(c, "managerID", "Manager"); err != nil {
		return result{}, err
	}
	params, apiErr := actionParams(c.body, "Reset", []string{"ResetType"}, []string{"ResetType"})
	if apiErr != nil {
		return result{}, apiErr
	}
	if _, apiErr := enumParam(params["ResetType"], "Reset", "ResetType", managerResetTypes); apiErr != nil {
		return result{}, apiErr
	}
	ended := s.auth.endAllSessions()
	s.log.Info("manager reset: sessions ended", "sessions", ended, "user", c.user.username)
	return result{}, nil
}

func (s *Server) getChassisCollection(c *call) (result, error) {
	members, err := s.machineIDs(c, "ChassisCollection", chassisPath)
	if err != nil {
		return result{}, err
	}
	return result{body: collection(typeChassisCollection, "/redfish/v1/Chassis", "Chassis Collection", members)}, nil
}

func (s *Server) getChassis(c *call) (result, error) {
	m, err := s.machineFor(c, "chassisID", "Chassis")
	if err != nil {
		return result{}, err
	}
	body, err := s.chassisBody(c, m)
	if err != nil {
		return result{}, err
	}
	return result{body: body}, nil
}

func (s *Server) chassisBody(c *call, m machine.Machine) (map[string]any, error) {
	id := m.ID()
	op := operation{resourceType: "Chassis", resourceID: id}
	inv, err := m.Inventory(c.ctx())
	if err != nil {
		return nil, s.mapBackendError(err, op)
	}
	power, err := m.PowerState(c.ctx())
	if err != nil {
		return nil, s.mapBackendError(err, op)
	}
	locator, err := m.LocatorActive(c.ctx())
	if err != nil {
		return nil, s.mapBackendError(err, op)
	}
	body := resource(typeChassis, chassisPath(id), id, "Chassis for "+inv.Name)
	body[propLocator] = locator // the system's light: a VM is one chassis
	body["ChassisType"] = "Other"
	body["Manufacturer"] = inv.Manufacturer
	body["Model"] = inv.Model
	body["SerialNumber"] = inv.SerialNumber
	if inv.UUID != "" {
		body["UUID"] = inv.UUID // the system's: a VM is one chassis
	}
	body["PowerState"] = string(power)
	body["Drives"] = link(drivesPath(id))
	body["Status"] = statusOK()
	body["Links"] = map[string]any{
		"ComputerSystems": links(systemPath(id)),
		"ManagedBy":       links(managerPath(id)),
	}
	return body, nil
}

// patchChassis switches the locator light, the chassis' one writable
// property.
func (s *Server) patchChassis(c *call) (result, error) {
	m, patch, unlock, err := s.startPatch(c, "chassisID", "Chassis")
	if err != nil {
		return result{}, err
	}
	defer unlock()
	current, err := s.chassisBody(c, m)
	if err != nil {
		return result{}, err
	}
	if ifMatch := c.r.Header.Get("If-Match"); ifMatch != "" && !etagMatches(ifMatch, bodyETag(current)) {
		return result{}, newError(http.StatusPreconditionFailed, msgPreconditionFailed)
	}
	problems := othersNotWritable(patch, current, propLocator, propIndicatorLED)
	locator, locatorProblems := mergeLocatorPatch(patch)
	if problems = append(problems, locatorProblems...); len(problems) > 0 {
		return result{}, badRequest(problems...)
	}
	if locator != nil {
		if err := m.SetLocatorActive(c.ctx(), *locator); err != nil {
			return result{}, s.mapBackendError(err, operation{resourceType: "Chassis", resourceID: m.ID(), parameter: "/" + propLocator})
		}
	}
	updated, err := s.chassisBody(c, m)
	if err != nil {
		return result{}, err
	}
	return result{body: updated}, nil
}
