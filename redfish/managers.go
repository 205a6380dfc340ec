package redfish

import (
	"net/url"

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
	path := managerPath(id)
	body := resource(typeManager, path, id, "Manager for "+id)
	body["ManagerType"] = "BMC"
	body["Model"] = "virtmetal"
	body["PowerState"] = string(machine.PowerOn)
	body["Status"] = statusOK()
	body["Links"] = map[string]any{
		"ManagerForServers": links(systemPath(id)),
		"ManagerForChassis": links(chassisPath(id)),
	}
	if m.Capabilities().VirtualMedia {
		body["VirtualMedia"] = link(managerMedia.collectionPath(id))
	}
	body["Actions"] = map[string]any{
		"#Manager.Reset": map[string]any{
			"target":                            path + "/Actions/Manager.Reset",
			"ResetType@Redfish.AllowableValues": managerResetTypes,
		},
	}
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
	id := m.ID()
	op := operation{resourceType: "Chassis", resourceID: id}
	inv, err := m.Inventory(c.ctx())
	if err != nil {
		return result{}, s.mapBackendError(err, op)
	}
	power, err := m.PowerState(c.ctx())
	if err != nil {
		return result{}, s.mapBackendError(err, op)
	}
	body := resource(typeChassis, chassisPath(id), id, "Chassis for "+inv.Name)
	body["ChassisType"] = "Other"
	body["Manufacturer"] = inv.Manufacturer
	body["Model"] = inv.Model
	body["SerialNumber"] = inv.SerialNumber
	body["PowerState"] = string(power)
	body["Status"] = statusOK()
	body["Links"] = map[string]any{
		"ComputerSystems": links(systemPath(id)),
		"ManagedBy":       links(managerPath(id)),
	}
	return result{body: body}, nil
}
