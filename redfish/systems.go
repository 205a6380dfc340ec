package redfish

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"sort"
	"strings"

	"github.com/virtmetal/virtmetal/machine"
)

func systemPath(id string) string { return "/redfish/v1/Systems/" + url.PathEscape(id) }

// machineFor resolves a path variable to a machine; an unknown ID is a 404
// about resourceType.
func (s *Server) machineFor(c *call, idVar, resourceType string) (machine.Machine, error) {
	id := c.vars[idVar]
	m, err := s.backend.Machine(c.ctx(), id)
	if err != nil {
		return nil, s.mapBackendError(err, operation{resourceType: resourceType, resourceID: id})
	}
	return m, nil
}

// machineIDs lists the paths of the backend's machines for a collection.
func (s *Server) machineIDs(c *call, collectionType string, pathOf func(string) string) ([]string, error) {
	ids, err := s.backend.Machines(c.ctx())
	if err != nil {
		return nil, s.mapBackendError(err, operation{resourceType: collectionType})
	}
	paths := make([]string, len(ids))
	for i, id := range ids {
		paths[i] = pathOf(id)
	}
	return paths, nil
}

func (s *Server) getSystems(c *call) (result, error) {
	members, err := s.machineIDs(c, "ComputerSystemCollection", systemPath)
	if err != nil {
		return result{}, err
	}
	return result{body: collection(typeSystemCollection, "/redfish/v1/Systems", "Computer System Collection", members)}, nil
}

func (s *Server) getSystem(c *call) (result, error) {
	m, err := s.machineFor(c, "systemID", "ComputerSystem")
	if err != nil {
		return result{}, err
	}
	body, _, err := s.systemBody(c.ctx(), m)
	if err != nil {
		return result{}, err
	}
	return result{body: body, etag: systemETag(body)}, nil
}

// systemETag is the ComputerSystem's ETag in two parts, "<settings>-<power>":
// the first hashes everything but PowerState and BiosVersion, the second
// those two. The whole tag changes whenever the body does (so
// If-None-Match stays exact), while If-Match on PATCH compares the
// settings part only: MaaS reads the ETag and PATCHes Boot right after a
// ForceOff, and a power transition that ends in between (and with it the
// firmware in use, when a change was pending) must not fail its power-on
// with 412. Neither is writable, so ignoring them loses no update.
func systemETag(body map[string]any) string {
	settings := maps.Clone(body)
	delete(settings, "PowerState")
	delete(settings, "BiosVersion")
	settingsData, _ := json.Marshal(settings) // maps of JSON values always marshal
	powerSum := sha256.Sum256([]byte(fmt.Sprint(body["PowerState"], body["BiosVersion"])))
	return strings.TrimSuffix(etagOf(settingsData), `"`) + "-" + hex.EncodeToString(powerSum[:4]) + `"`
}

// systemSettingsMatch is If-Match for a ComputerSystem PATCH: "*" or a tag
// whose settings part equals the current one.
func systemSettingsMatch(ifMatch, current string) bool {
	settings, _, _ := strings.Cut(current, "-")
	for _, candidate := range strings.Split(ifMatch, ",") {
		candidate = strings.TrimSpace(candidate)
		if part, _, _ := strings.Cut(candidate, "-"); candidate == "*" || part == settings {
			return true
		}
	}
	return false
}

func stringsOf[T ~string](values []T) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = string(v)
	}
	return out
}

// bootTargetsAllowed are the values PATCH accepts for
// BootSourceOverrideTarget: None clears the override.
func bootTargetsAllowed(caps machine.Capabilities) []string {
	return append([]string{string(machine.BootNone)}, stringsOf(caps.BootTargets)...)
}

var bootEnabledAllowed = []string{string(machine.BootDisabled), string(machine.BootOnce), string(machine.BootContinuous)}

// systemBody renders a ComputerSystem and returns the boot override it
// shows, so PATCH merges with exactly what the client saw.
func (s *Server) systemBody(ctx context.Context, m machine.Machine) (map[string]any, machine.BootOverride, error) {
	id := m.ID()
	op := operation{resourceType: "ComputerSystem", resourceID: id}
	inv, err := m.Inventory(ctx)
	if err != nil {
		return nil, machine.BootOverride{}, s.mapBackendError(err, op)
	}
	power, err := m.PowerState(ctx)
	if err != nil {
		return nil, machine.BootOverride{}, s.mapBackendError(err, op)
	}
	boot, err := m.BootOverride(ctx)
	if err != nil {
		return nil, machine.BootOverride{}, s.mapBackendError(err, op)
	}
	firmware, err := m.Firmware(ctx)
	if err != nil {
		return nil, machine.BootOverride{}, s.mapBackendError(err, op)
	}
	locator, err := m.LocatorActive(ctx)
	if err != nil {
		return nil, machine.BootOverride{}, s.mapBackendError(err, op)
	}
	caps := m.Capabilities()
	path := systemPath(id)

	body := resource(typeSystem, path, id, inv.Name)
	body["SystemType"] = "Virtual"
	body["UUID"] = inv.UUID
	body["SerialNumber"] = inv.SerialNumber
	body["Manufacturer"] = inv.Manufacturer
	body["Model"] = inv.Model
	body["PowerState"] = string(power)
	body["Status"] = statusOK()
	if firmware.Product != "" {
		body["BiosVersion"] = firmware.Product
	}
	body["Bios"] = link(biosPath(id))
	body["SecureBoot"] = link(secureBootPath(id))
	body[propLocator] = locator
	body["Boot"] = map[string]any{
		"BootSourceOverrideTarget":                          string(boot.Target),
		"BootSourceOverrideEnabled":                         string(boot.Enabled),
		"BootSourceOverrideMode":                            string(boot.Mode),
		"BootSourceOverrideTarget@Redfish.AllowableValues":  bootTargetsAllowed(caps),
		"BootSourceOverrideEnabled@Redfish.AllowableValues": bootEnabledAllowed,
		"BootSourceOverrideMode@Redfish.AllowableValues":    stringsOf(caps.BootModes),
		"@Redfish.WriteableProperties":                      []string{propTarget, propEnabled, propMode},
	}
	body["ProcessorSummary"] = processorSummary(inv.CPU)
	body["MemorySummary"] = map[string]any{"TotalSystemMemoryGiB": float64(inv.MemoryMiB) / 1024}
	body["Processors"] = link(processorsPath(id))
	body["Memory"] = link(memoryPath(id))
	body["EthernetInterfaces"] = link(path + "/EthernetInterfaces")
	body["LogServices"] = link(logServicesPath(path))
	body["SimpleStorage"] = link(path + "/SimpleStorage")
	body["Storage"] = link(path + "/Storage")
	if caps.VirtualMedia {
		body["VirtualMedia"] = link(mediaCollectionPath(id))
	}
	serial, graphical := s.consoleProperties(id, caps)
	if serial != nil {
		body["SerialConsole"] = serial
	}
	if graphical != nil {
		body["GraphicalConsole"] = graphical
	}
	body["Links"] = map[string]any{
		"Chassis":   links(chassisPath(id)),
		"ManagedBy": links(managerPath(id)),
	}
	body["Actions"] = map[string]any{
		"#ComputerSystem.Reset": map[string]any{
			"target":                            path + "/Actions/ComputerSystem.Reset",
			"ResetType@Redfish.AllowableValues": stringsOf(caps.ResetTypes),
			"@Redfish.ActionInfo":               resetActionInfoPath(id),
		},
	}
	return body, boot, nil
}

// bootProperties are the writable members of Boot.
const (
	propTarget  = "BootSourceOverrideTarget"
	propEnabled = "BootSourceOverrideEnabled"
	propMode    = "BootSourceOverrideMode"
)

// startPatch begins a PATCH: it resolves the machine, decodes the body (a
// non-empty object) and takes the machine's PATCH lock, which the caller
// releases with unlock.
func (s *Server) startPatch(c *call, idVar, resourceType string) (m machine.Machine, patch map[string]json.RawMessage, unlock func(), err error) {
	m, err = s.machineFor(c, idVar, resourceType)
	if err != nil {
		return nil, nil, nil, err
	}
	patch, apiErr := decodeObject(c.body)
	if apiErr != nil {
		return nil, nil, nil, apiErr
	}
	if len(patch) == 0 {
		return nil, nil, nil, newError(http.StatusBadRequest, msgEmptyJSON)
	}
	lock := s.patchLock(m.ID())
	lock.Lock()
	return m, patch, lock.Unlock, nil
}

func (s *Server) patchSystem(c *call) (result, error) {
	m, patch, unlock, err := s.startPatch(c, "systemID", "ComputerSystem")
	if err != nil {
		return result{}, err
	}
	defer unlock()

	current, boot, err := s.systemBody(c.ctx(), m)
	if err != nil {
		return result{}, err
	}
	if ifMatch := c.r.Header.Get("If-Match"); ifMatch != "" && !systemSettingsMatch(ifMatch, systemETag(current)) {
		return result{}, newError(http.StatusPreconditionFailed, msgPreconditionFailed)
	}
	desired, locator, apiErr := mergeSystemPatch(patch, current, boot, m.Capabilities())
	if apiErr != nil {
		return result{}, apiErr
	}
	if locator != nil {
		if err := m.SetLocatorActive(c.ctx(), *locator); err != nil {
			return result{}, s.mapBackendError(err, operation{resourceType: "ComputerSystem", resourceID: m.ID(), parameter: "/" + propLocator})
		}
	}
	if desired != boot {
		if err := m.SetBootOverride(c.ctx(), desired); err != nil {
			return result{}, s.mapBackendError(err, bootOperation(m, boot, desired))
		}
	}
	updated, _, err := s.systemBody(c.ctx(), m)
	if err != nil {
		return result{}, err
	}
	return result{body: updated, etag: systemETag(updated)}, nil
}

// bootOperation names the Boot property a failed SetBootOverride is
// about: the mode when that changed (it may meet Secure Boot), else the
// target.
func bootOperation(m machine.Machine, from, to machine.BootOverride) operation {
	op := operation{resourceType: "ComputerSystem", resourceID: m.ID()}
	if from.Mode != to.Mode {
		op.parameter, op.value, op.conflictsWith = "/Boot/"+propMode, string(to.Mode), secureBootPath(m.ID())
		return op
	}
	op.parameter, op.value, op.conflictsWith = "/Boot/"+propTarget, string(to.Target), bootTargetNeeds(m, to.Target)
	return op
}

// bootTargetNeeds is the resource a boot target needs to be there: a Cd
// boot needs virtual media inserted (a VM without a CD-ROM has one once
// media is), any other target the system's own devices.
func bootTargetNeeds(m machine.Machine, target machine.BootTarget) string {
	if target == machine.BootCd && m.Capabilities().VirtualMedia {
		return cdPath(m.ID())
	}
	return systemPath(m.ID())
}

// The locator light's two properties: LocationIndicatorActive, and the
// deprecated IndicatorLED that older clients write. IndicatorLED is
// accepted but not shown: the DMTF Service Validator warns about every
// deprecated property served.
const (
	propLocator      = "LocationIndicatorActive"
	propIndicatorLED = "IndicatorLED"
	indicatorLit     = "Lit"
	indicatorOff     = "Off"
)

// mergeSystemPatch validates a ComputerSystem PATCH body against the
// current representation and returns the boot override it asks for and
// the locator state (nil: not asked). Every problem is reported, not just
// the first.
func mergeSystemPatch(patch map[string]json.RawMessage, current map[string]any, boot machine.BootOverride, caps machine.Capabilities) (machine.BootOverride, *bool, *apiError) {
	problems := othersNotWritable(patch, current, "Boot", propLocator, propIndicatorLED)
	locator, locatorProblems := mergeLocatorPatch(patch)
	desired, bootProblems := mergeBootPatch(patch, current, boot, caps)
	if problems = slices.Concat(problems, locatorProblems, bootProblems); len(problems) > 0 {
		return boot, nil, badRequest(problems...)
	}
	return desired, locator, nil
}

// othersNotWritable reports every member of patch but the writable ones as
// read-only or unknown.
func othersNotWritable(patch map[string]json.RawMessage, current map[string]any, writable ...string) []message {
	var problems []message
	for _, key := range sortedKeys(patch) {
		if !slices.Contains(writable, key) {
			problems = append(problems, readOnlyOrUnknown(current, key, "/"+key))
		}
	}
	return problems
}

// mergeLocatorPatch reads the locator light's state from either property
// (nil: neither given); LocationIndicatorActive wins over IndicatorLED.
func mergeLocatorPatch(patch map[string]json.RawMessage) (*bool, []message) {
	var problems []message
	var locator *bool
	if raw, ok := patch[propIndicatorLED]; ok {
		pointer := "/" + propIndicatorLED
		value, ok := jsonString(raw)
		switch {
		case !ok:
			problems = append(problems, propertyError(msgPropertyValueTypeError, pointer, jsonText(raw), pointer))
		case value != indicatorLit && value != indicatorOff: // a VM's light cannot blink
			problems = append(problems, propertyError(msgPropertyValueNotInList, pointer, value, pointer))
		default:
			on := value == indicatorLit
			locator = &on
		}
	}
	if raw, ok := patch[propLocator]; ok {
		pointer := "/" + propLocator
		if on, ok := jsonBool(raw); ok {
			locator = &on
		} else {
			problems = append(problems, propertyError(msgPropertyValueTypeError, pointer, jsonText(raw), pointer))
		}
	}
	return locator, problems
}

// mergeBootPatch validates the Boot member of a ComputerSystem PATCH and
// returns the boot override it asks for.
func mergeBootPatch(patch map[string]json.RawMessage, current map[string]any, boot machine.BootOverride, caps machine.Capabilities) (machine.BootOverride, []message) {
	var problems []message

	desired := boot
	if raw, ok := patch["Boot"]; ok {
		var bootPatch map[string]json.RawMessage
		if err := json.Unmarshal(raw, &bootPatch); err != nil || bootPatch == nil {
			return desired, append(problems, propertyError(msgPropertyValueTypeError, "/Boot", jsonText(raw), "/Boot"))
		}
		currentBoot, _ := current["Boot"].(map[string]any)
		_, targetGiven := bootPatch[propTarget]
		_, enabledGiven := bootPatch[propEnabled]
		for _, key := range sortedKeys(bootPatch) {
			raw, pointer := bootPatch[key], "/Boot/"+key
			var allowed []string
			switch key {
			case propTarget:
				allowed = bootTargetsAllowed(caps)
			case propEnabled:
				allowed = bootEnabledAllowed
			case propMode:
				allowed = stringsOf(caps.BootModes)
			default:
				problems = append(problems, readOnlyOrUnknown(currentBoot, key, pointer))
				continue
			}
			value, ok := jsonString(raw)
			switch {
			case !ok:
				problems = append(problems, propertyError(msgPropertyValueTypeError, pointer, jsonText(raw), pointer))
			case !slices.Contains(allowed, value):
				problems = append(problems, propertyError(msgPropertyValueNotInList, pointer, value, pointer))
			case key == propTarget:
				desired.Target = machine.BootTarget(value)
			case key == propEnabled:
				desired.Enabled = machine.BootEnabled(value)
			case key == propMode:
				desired.Mode = machine.BootMode(value)
			}
		}
		// A target set on a machine without an override would be dropped by
		// Disabled; clients that name a device want to boot from it, so the
		// override lasts one boot unless they say otherwise.
		if targetGiven && !enabledGiven && desired.Enabled == machine.BootDisabled && desired.Target != machine.BootNone {
			desired.Enabled = machine.BootOnce
		}
	}
	return desired.Normalize(), problems
}

// readOnlyOrUnknown says why a property cannot be written: it is either
// part of the representation (read-only) or not a property at all.
func readOnlyOrUnknown(representation map[string]any, key, pointer string) message {
	if _, ok := representation[key]; ok {
		return propertyError(msgPropertyNotWritable, pointer, pointer)
	}
	return propertyError(msgPropertyUnknown, pointer, pointer)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// actionParams checks an action body: known parameters only, and the
// required ones present. It returns the parameters or a 400 listing every
// problem.
func actionParams(body []byte, action string, known, required []string) (map[string]json.RawMessage, *apiError) {
	params, apiErr := decodeObject(body)
	if apiErr != nil {
		return nil, apiErr
	}
	var problems []message
	for _, key := range sortedKeys(params) {
		if !slices.Contains(known, key) {
			problems = append(problems, message{key: msgActionParameterUnknown, args: []string{action, key}})
		}
	}
	for _, key := range required {
		if _, ok := params[key]; !ok {
			problems = append(problems, message{key: msgActionParameterMissing, args: []string{action, key}})
		}
	}
	if len(problems) > 0 {
		return nil, badRequest(problems...)
	}
	return params, nil
}

// enumParam reads a string action parameter that must be one of allowed.
func enumParam(raw json.RawMessage, action, param string, allowed []string) (string, *apiError) {
	value, problem := enumValue(raw, action, param, allowed)
	if problem != nil {
		return "", newError(http.StatusBadRequest, problem.key, problem.args...)
	}
	return value, nil
}

// enumValue reads an action's string parameter that must be one of
// allowed, or says what is wrong with it.
func enumValue(raw json.RawMessage, action, param string, allowed []string) (string, *message) {
	value, ok := jsonString(raw)
	if !ok {
		return "", &message{key: msgActionParameterValueTypeError, args: []string{jsonText(raw), param, action}}
	}
	if !slices.Contains(allowed, value) {
		return "", &message{key: msgActionParameterValueNotInList, args: []string{value, param, action}}
	}
	return value, nil
}

func resetActionInfoPath(id string) string { return systemPath(id) + "/ResetActionInfo" }

// actionParameter is one Parameters entry of an ActionInfo.
type actionParameter struct {
	name     string
	required bool
	dataType string // "String", "Boolean"
	allowed  []string
}

// actionInfo renders the ActionInfo of an action: the parameters the
// service accepts, with the values it accepts.
func actionInfo(path, action string, params ...actionParameter) map[string]any {
	list := make([]any, len(params))
	for i, p := range params {
		entry := map[string]any{"Name": p.name, "Required": p.required, "DataType": p.dataType}
		if p.allowed != nil {
			entry["AllowableValues"] = p.allowed
		}
		list[i] = entry
	}
	body := resource(typeActionInfo, path, action+"ActionInfo", action+" Action Info")
	body["Parameters"] = list
	return body
}

func (s *Server) getResetActionInfo(c *call) (result, error) {
	m, err := s.machineFor(c, "systemID", "ComputerSystem")
	if err != nil {
		return result{}, err
	}
	return result{body: actionInfo(resetActionInfoPath(m.ID()), "Reset",
		actionParameter{name: "ResetType", required: true, dataType: "String", allowed: stringsOf(m.Capabilities().ResetTypes)})}, nil
}

func (s *Server) resetSystem(c *call) (result, error) {
	m, err := s.machineFor(c, "systemID", "ComputerSystem")
	if err != nil {
		return result{}, err
	}
	params, apiErr := actionParams(c.body, "Reset", []string{"ResetType"}, []string{"ResetType"})
	if apiErr != nil {
		return result{}, apiErr
	}
	// If-Match is deliberately not checked on actions: gofish sends the
	// system's last ETag with every POST, stale or not. The advertised
	// list is checked here, before the backend sees the request.
	value, apiErr := enumParam(params["ResetType"], "Reset", "ResetType", stringsOf(m.Capabilities().ResetTypes))
	if apiErr != nil {
		return result{}, apiErr
	}
	if err := m.Reset(c.ctx(), machine.ResetType(value)); err != nil {
		return result{}, s.mapBackendError(err, operation{
			resourceType: "ComputerSystem", resourceID: m.ID(),
			action: "Reset", parameter: "ResetType", value: value,
		})
	}
	return result{}, nil
}

func ethernetPath(systemID, nic string) string {
	return systemPath(systemID) + "/EthernetInterfaces/" + url.PathEscape(nic)
}

// systemInventory resolves the system of the path and reads its inventory.
func (s *Server) systemInventory(c *call) (machine.Machine, machine.Inventory, error) {
	return s.inventoryOf(c, "systemID", "ComputerSystem")
}

// inventoryOf resolves the path variable idVar to its machine, a
// resourceType of that name, and reads the machine's inventory.
func (s *Server) inventoryOf(c *call, idVar, resourceType string) (machine.Machine, machine.Inventory, error) {
	m, err := s.machineFor(c, idVar, resourceType)
	if err != nil {
		return nil, machine.Inventory{}, err
	}
	inv, err := m.Inventory(c.ctx())
	if err != nil {
		return nil, machine.Inventory{}, s.mapBackendError(err, operation{resourceType: resourceType, resourceID: m.ID()})
	}
	return m, inv, nil
}

func (s *Server) getEthernetInterfaces(c *call) (result, error) {
	m, inv, err := s.systemInventory(c)
	if err != nil {
		return result{}, err
	}
	members := make([]string, len(inv.NICs))
	for i, nic := range inv.NICs {
		members[i] = ethernetPath(m.ID(), nic.Name)
	}
	return result{body: collection(typeEthernetCollection, systemPath(m.ID())+"/EthernetInterfaces", "Ethernet Interface Collection", members)}, nil
}

// linkStatuses maps a NIC's link onto EthernetInterface's LinkStatus; an
// unknown one is left out.
var linkStatuses = map[machine.LinkState]string{machine.LinkUp: "LinkUp", machine.LinkDown: "LinkDown"}

func (s *Server) getEthernetInterface(c *call) (result, error) {
	m, inv, err := s.systemInventory(c)
	if err != nil {
		return result{}, err
	}
	name := c.vars["nicID"]
	i := slices.IndexFunc(inv.NICs, func(n machine.NIC) bool { return n.Name == name })
	if i < 0 {
		return result{}, newError(http.StatusNotFound, msgResourceNotFound, "EthernetInterface", name)
	}
	nic := inv.NICs[i]
	body := resource(typeEthernetInterface, ethernetPath(m.ID(), nic.Name), nic.Name, nic.Name)
	// A NIC whose MAC is not known yet (a VM with none in its spec and no
	// instance) leaves it out: "" is no MAC, and fails the schema's pattern.
	if nic.MAC != "" {
		body["MACAddress"] = nic.MAC
		body["PermanentMACAddress"] = nic.MAC
	}
	body["InterfaceEnabled"] = true
	if status, ok := linkStatuses[nic.Link]; ok {
		body["LinkStatus"] = status
	}
	body["Status"] = statusOK()
	v4, v6 := []any{}, []any{}
	for _, ip := range nic.IPs {
		addr, err := netip.ParseAddr(ip)
		if err != nil {
			// Some backends report CIDR notation.
			prefix, perr := netip.ParsePrefix(ip)
			if perr != nil {
				continue
			}
			addr = prefix.Addr()
		}
		if addr.Is4() {
			v4 = append(v4, map[string]any{"Address": addr.String()})
		} else {
			v6 = append(v6, map[string]any{"Address": addr.String()})
		}
	}
	body["IPv4Addresses"] = v4
	body["IPv6Addresses"] = v6
	return result{body: body}, nil
}

// simpleStorageID names the one storage controller each system shows.
const simpleStorageID = "1"

func (s *Server) getSimpleStorages(c *call) (result, error) {
	m, err := s.machineFor(c, "systemID", "ComputerSystem")
	if err != nil {
		return result{}, err
	}
	path := systemPath(m.ID()) + "/SimpleStorage"
	return result{body: collection(typeSimpleStorageColl, path, "Simple Storage Collection", []string{path + "/" + simpleStorageID})}, nil
}

func (s *Server) getSimpleStorage(c *call) (result, error) {
	m, inv, err := s.systemInventory(c)
	if err != nil {
		return result{}, err
	}
	if id := c.vars["storageID"]; id != simpleStorageID {
		return result{}, newError(http.StatusNotFound, msgResourceNotFound, "SimpleStorage", id)
	}
	devices := []any{}
	for _, d := range inv.Disks {
		if d.Kind != machine.DiskKindDisk {
			continue
		}
		device := map[string]any{"Name": d.Name, "Status": statusOK()}
		if d.CapacityBytes > 0 {
			device["CapacityBytes"] = d.CapacityBytes
		}
		devices = append(devices, device)
	}
	body := resource(typeSimpleStorage, systemPath(m.ID())+"/SimpleStorage/"+simpleStorageID, simpleStorageID, "Virtual disk controller")
	body["Devices"] = devices
	body["Status"] = statusOK()
	return result{body: body}, nil
}
