package redfish

import (
	"net/http"
	"net/url"

	"github.com/virtmetal/virtmetal/machine"
)

// Each machine has its own Manager and Chassis with the machine's ID, as
// sushy-tools lays them out; provisioning tools follow Links either way.
func managerPath(id string) string { return "/redfish/v1/Managers/" + url.PathEscape(id) }
func chassisPath(id string) string { return "/redfish/v1/Chassis/" + url.PathEscape(id) }

// cdMediaID is the virtual CD drive, the only virtual media device.
const cdMediaID = "Cd"

func mediaPath(id string) string { return managerPath(id) + "/VirtualMedia/" + cdMediaID }

// managerResetTypes are what Manager.Reset accepts; restarting a simulated
// BMC has nothing to do, so both succeed at once.
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
		body["VirtualMedia"] = link(path + "/VirtualMedia")
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
	return result{}, nil
}

// mediaMachine resolves a virtual media URI; a machine without virtual
// media has no media resources at all.
func (s *Server) mediaMachine(c *call) (machine.Machine, error) {
	m, err := s.machineFor(c, "managerID", "Manager")
	if err != nil {
		return nil, err
	}
	if !m.Capabilities().VirtualMedia {
		return nil, newError(http.StatusNotFound, msgResourceNotFound, "VirtualMediaCollection", m.ID())
	}
	if id, ok := c.vars["mediaID"]; ok && id != cdMediaID {
		return nil, newError(http.StatusNotFound, msgResourceNotFound, "VirtualMedia", id)
	}
	return m, nil
}

func (s *Server) getVirtualMediaCollection(c *call) (result, error) {
	m, err := s.mediaMachine(c)
	if err != nil {
		return result{}, err
	}
	return result{body: collection(typeVirtualMediaColl, managerPath(m.ID())+"/VirtualMedia", "Virtual Media Collection", []string{mediaPath(m.ID())})}, nil
}

func (s *Server) getVirtualMedia(c *call) (result, error) {
	m, err := s.mediaMachine(c)
	if err != nil {
		return result{}, err
	}
	media, err := m.VirtualMedia(c.ctx())
	if err != nil {
		return result{}, s.mapBackendError(err, operation{resourceType: "VirtualMedia", resourceID: cdMediaID})
	}
	path := mediaPath(m.ID())
	body := resource(typeVirtualMedia, path, cdMediaID, "Virtual CD")
	body["MediaTypes"] = []string{"CD", "DVD"}
	body["Inserted"] = media.Inserted
	body["WriteProtected"] = media.WriteProtected
	if media.Inserted {
		body["Image"] = media.Image
		body["ConnectedVia"] = "URI"
	} else {
		body["Image"] = nil
		body["ConnectedVia"] = "NotConnected"
	}
	body["Actions"] = map[string]any{
		"#VirtualMedia.InsertMedia": map[string]any{"target": path + "/Actions/VirtualMedia.InsertMedia"},
		"#VirtualMedia.EjectMedia":  map[string]any{"target": path + "/Actions/VirtualMedia.EjectMedia"},
	}
	return result{body: body}, nil
}

// insertMediaParams are the InsertMedia parameters the schema defines.
// Image, Inserted and WriteProtected are honoured; the transfer and
// credential parameters are refused because images are fetched over plain
// http(s) by the backend.
var (
	insertMediaKnown       = []string{"Image", "Inserted", "WriteProtected", "TransferMethod", "TransferProtocolType", "UserName", "Password"}
	insertMediaUnsupported = []string{"TransferMethod", "TransferProtocolType", "UserName", "Password"}
)

func (s *Server) insertMedia(c *call) (result, error) {
	const action = "InsertMedia"
	m, err := s.mediaMachine(c)
	if err != nil {
		return result{}, err
	}
	params, apiErr := actionParams(c.body, action, insertMediaKnown, []string{"Image"})
	if apiErr != nil {
		return result{}, apiErr
	}
	var problems []message
	for _, key := range insertMediaUnsupported {
		if _, ok := params[key]; ok {
			problems = append(problems, message{key: msgActionParameterNotSupported, args: []string{key, action}})
		}
	}
	image, ok := jsonString(params["Image"])
	if !ok {
		problems = append(problems, message{key: msgActionParameterValueTypeError, args: []string{jsonText(params["Image"]), "Image", action}})
	}
	// The drive is a CD: media is always inserted and write-protected.
	for _, key := range []string{"Inserted", "WriteProtected"} {
		raw, given := params[key]
		if !given {
			continue
		}
		switch value, ok := jsonBool(raw); {
		case !ok:
			problems = append(problems, message{key: msgActionParameterValueTypeError, args: []string{jsonText(raw), key, action}})
		case !value:
			problems = append(problems, message{key: msgActionParameterValueNotInList, args: []string{"false", key, action}})
		}
	}
	if len(problems) > 0 {
		return result{}, badRequest(problems...)
	}
	if err := m.InsertMedia(c.ctx(), image); err != nil {
		return result{}, s.mapBackendError(err, operation{
			resourceType: "VirtualMedia", resourceID: cdMediaID,
			action: action, parameter: "Image", value: image,
		})
	}
	return result{}, nil
}

func (s *Server) ejectMedia(c *call) (result, error) {
	m, err := s.mediaMachine(c)
	if err != nil {
		return result{}, err
	}
	if _, apiErr := actionParams(c.body, "EjectMedia", nil, nil); apiErr != nil {
		return result{}, apiErr
	}
	if err := m.EjectMedia(c.ctx()); err != nil {
		return result{}, s.mapBackendError(err, operation{resourceType: "VirtualMedia", resourceID: cdMediaID, action: "EjectMedia"})
	}
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
