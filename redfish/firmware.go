package redfish

import (
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/virtmetal/virtmetal/machine"
)

// Bios and SecureBoot show the machine's firmware: the current boot's in
// Bios, the next boot's in Bios/Settings and in SecureBootEnable. Writes
// configure the next boot (SupportedApplyTimes OnReset), and while the
// running boot differs the answer asks for a reset.

func biosPath(systemID string) string         { return systemPath(systemID) + "/Bios" }
func biosSettingsPath(systemID string) string { return biosPath(systemID) + "/Settings" }
func secureBootPath(systemID string) string   { return systemPath(systemID) + "/SecureBoot" }

// Values of the SecureBoot attribute and of SecureBootCurrentBoot.
const (
	secureBootEnabled  = "Enabled"
	secureBootDisabled = "Disabled"
)

func enabledText(on bool) string {
	if on {
		return secureBootEnabled
	}
	return secureBootDisabled
}

// biosAttribute is one member of Bios Attributes. Names are stable: clients
// key their settings on them.
type biosAttribute struct {
	name        string
	displayName string // for the attribute registry
	// allowed lists the values of a writable attribute; nil: read-only.
	allowed func(caps machine.Capabilities) []string
	read    func(fw machine.Firmware, inv machine.Inventory) any
	// write sets the attribute's value on fw; only writable ones have it.
	write func(fw *machine.Firmware, value string)
}

var biosAttributes = []biosAttribute{
	{
		name:        "BootMode",
		displayName: "Boot mode",
		allowed:     func(caps machine.Capabilities) []string { return stringsOf(caps.BootModes) },
		read:        func(fw machine.Firmware, _ machine.Inventory) any { return string(fw.Mode) },
		write:       func(fw *machine.Firmware, v string) { fw.Mode = machine.BootMode(v) },
	},
	{
		name:        "SecureBoot",
		displayName: "UEFI Secure Boot",
		allowed:     func(machine.Capabilities) []string { return []string{secureBootEnabled, secureBootDisabled} },
		read:        func(fw machine.Firmware, _ machine.Inventory) any { return enabledText(fw.SecureBoot) },
		write:       func(fw *machine.Firmware, v string) { fw.SecureBoot = v == secureBootEnabled },
	},
	{name: "ProcessorSockets", displayName: "Processor sockets", read: func(_ machine.Firmware, inv machine.Inventory) any { return inv.CPU.Sockets }},
	{name: "ProcessorCores", displayName: "Processor cores", read: func(_ machine.Firmware, inv machine.Inventory) any { return inv.CPU.Sockets * inv.CPU.Cores }},
	{name: "ProcessorThreads", displayName: "Processor threads", read: func(_ machine.Firmware, inv machine.Inventory) any { return inv.CPU.LogicalProcessors() }},
	{name: "MemoryMiB", displayName: "Memory (MiB)", read: func(_ machine.Firmware, inv machine.Inventory) any { return inv.MemoryMiB }},
}

func attributesOf(fw machine.Firmware, inv machine.Inventory) map[string]any {
	attrs := make(map[string]any, len(biosAttributes))
	for _, a := range biosAttributes {
		attrs[a.name] = a.read(fw, inv)
	}
	return attrs
}

// firmwareView is what the firmware resources are rendered from.
type firmwareView struct {
	m     machine.Machine
	state machine.FirmwareState
	inv   machine.Inventory
}

func (s *Server) firmwareView(c *call, resourceType string) (firmwareView, error) {
	m, err := s.machineFor(c, "systemID", resourceType)
	if err != nil {
		return firmwareView{}, err
	}
	return s.firmwareViewOf(c, m, resourceType)
}

func (s *Server) firmwareViewOf(c *call, m machine.Machine, resourceType string) (firmwareView, error) {
	op := operation{resourceType: resourceType, resourceID: m.ID()}
	inv, err := m.Inventory(c.ctx())
	if err != nil {
		return firmwareView{}, s.mapBackendError(err, op)
	}
	state, err := m.Firmware(c.ctx())
	if err != nil {
		return firmwareView{}, s.mapBackendError(err, op)
	}
	return firmwareView{m: m, state: state, inv: inv}, nil
}

func biosBody(v firmwareView) map[string]any {
	id := v.m.ID()
	body := resource(typeBios, biosPath(id), "Bios", "BIOS Configuration Current Settings")
	body["Attributes"] = attributesOf(v.state.Current, v.inv)
	body["AttributeRegistry"] = biosRegistryID
	// The settings in effect are those of the running boot: their ETag is
	// Bios/Settings' as it read when they were written, and the message
	// says whether a reset is still to apply newer ones.
	applied := v
	applied.state.Next = v.state.Current
	outcome := message{key: msgSuccess}
	if v.state.Pending() {
		outcome = resetRequired(v)
	}
	settings := map[string]any{
		"@odata.type":         typeSettings.odataType(),
		"SettingsObject":      link(biosSettingsPath(id)),
		"SupportedApplyTimes": biosApplyTimes,
		"ETag":                bodyETag(biosSettingsBody(applied)),
		"Messages":            []any{outcome.body()},
	}
	// When the settings in effect were applied: the running boot's start.
	if !v.state.Booted.IsZero() {
		settings["Time"] = v.state.Booted.UTC().Format(time.RFC3339)
	}
	body["@Redfish.Settings"] = settings
	body["Actions"] = map[string]any{
		"#Bios.ResetBios": map[string]any{"target": biosPath(id) + "/Actions/Bios.ResetBios"},
	}
	return body
}

func biosSettingsBody(v firmwareView) map[string]any {
	body := resource(typeBios, biosSettingsPath(v.m.ID()), "Settings", "BIOS Configuration Pending Settings")
	body["Attributes"] = attributesOf(v.state.Next, v.inv)
	// When the settings written here apply (sushy's apply_time_settings).
	body[propSettingsApplyTime] = map[string]any{"@odata.type": preferredApplyTimeType, "ApplyTime": biosApplyTimes[0]}
	return body
}

// biosApplyTimes are the SupportedApplyTimes of the Bios settings: a VM's
// firmware is chosen when it starts, so a write applies at the next reset.
var biosApplyTimes = []string{"OnReset"}

const propSettingsApplyTime = "@Redfish.SettingsApplyTime"

// preferredApplyTimeType is the type of @Redfish.SettingsApplyTime.
var preferredApplyTimeType = "#" + typeSettings.namespace + "." + typeSettings.version + ".PreferredApplyTime"

// anyPreferredApplyTime matches PreferredApplyTime of any Settings version
// ("#Settings.v1_0_0.PreferredApplyTime", as sushy sends it).
var anyPreferredApplyTime = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^#Settings\.(v1_[0-9]+_[0-9]+\.)?PreferredApplyTime$`)
})

// applyTimeProblems checks a PATCH's @Redfish.SettingsApplyTime, which
// Ironic sends with every BIOS write ({"@odata.type":
// "#Settings.v1_0_0.PreferredApplyTime", "ApplyTime": "OnReset"}): an
// ApplyTime among biosApplyTimes, an @odata.type of any PreferredApplyTime.
// The maintenance window members mean something only for the
// AtMaintenanceWindow apply times, which are not offered.
func applyTimeProblems(raw json.RawMessage) []message {
	pointer := "/" + propSettingsApplyTime
	var members map[string]json.RawMessage
	if err := json.Unmarshal(raw, &members); err != nil || members == nil {
		return []message{propertyError(msgPropertyValueTypeError, pointer, jsonText(raw), pointer)}
	}
	var problems []message
	for _, key := range sortedKeys(members) {
		p := pointer + "/" + key
		value, isString := jsonString(members[key])
		switch {
		case key != "@odata.type" && key != "ApplyTime":
			problems = append(problems, propertyError(msgPropertyUnknown, p, p))
		case !isString:
			problems = append(problems, propertyError(msgPropertyValueTypeError, p, jsonText(members[key]), p))
		case key == "ApplyTime" && !slices.Contains(biosApplyTimes, value):
			problems = append(problems, propertyError(msgPropertyValueNotInList, p, value, p))
		case key == "@odata.type" && !anyPreferredApplyTime().MatchString(value):
			problems = append(problems, propertyError(msgPropertyValueNotInList, p, value, p))
		}
	}
	return problems
}

// secureBootBody leaves SecureBootMode out: KubeVirt does not say which
// keys its Secure Boot firmware has enrolled.
func secureBootBody(v firmwareView) map[string]any {
	body := resource(typeSecureBoot, secureBootPath(v.m.ID()), "SecureBoot", "UEFI Secure Boot")
	body["SecureBootEnable"] = v.state.Next.SecureBoot
	body["@Redfish.WriteableProperties"] = []string{propSecureBootEnable}
	body["SecureBootCurrentBoot"] = enabledText(v.state.Current.SecureBoot)
	return body
}

func (s *Server) getBios(c *call) (result, error) {
	v, err := s.firmwareView(c, "Bios")
	if err != nil {
		return result{}, err
	}
	return result{body: biosBody(v)}, nil
}

func (s *Server) getBiosSettings(c *call) (result, error) {
	v, err := s.firmwareView(c, "Bios")
	if err != nil {
		return result{}, err
	}
	return result{body: biosSettingsBody(v)}, nil
}

func (s *Server) getSecureBoot(c *call) (result, error) {
	v, err := s.firmwareView(c, "SecureBoot")
	if err != nil {
		return result{}, err
	}
	return result{body: secureBootBody(v)}, nil
}

// firmwarePatch is what a PATCH of a firmware resource asks: the firmware
// wanted and, for an error, the property that asked for a change.
type firmwarePatch struct {
	want  machine.Firmware
	op    operation
	fails []message
}

// patchFirmware is the PATCH of a firmware resource: If-Match against the
// body render makes, merge's validation (nothing is written unless all of
// the body is valid), then the write and the body again with what it
// means for the running boot.
func (s *Server) patchFirmware(c *call, resourceType string, render func(firmwareView) map[string]any,
	merge func(patch map[string]json.RawMessage, current map[string]any, v firmwareView) firmwarePatch) (result, error) {
	m, patch, unlock, err := s.startPatch(c, "systemID", resourceType)
	if err != nil {
		return result{}, err
	}
	defer unlock()
	v, err := s.firmwareViewOf(c, m, resourceType)
	if err != nil {
		return result{}, err
	}
	current := render(v)
	if ifMatch := c.r.Header.Get("If-Match"); ifMatch != "" && !etagMatches(ifMatch, bodyETag(current)) {
		return result{}, newError(http.StatusPreconditionFailed, msgPreconditionFailed)
	}
	asked := merge(patch, current, v)
	if len(asked.fails) > 0 {
		return result{}, badRequest(asked.fails...)
	}
	if asked.want != v.state.Next {
		if err := v.m.SetFirmware(c.ctx(), asked.want); err != nil {
			asked.op.resourceType, asked.op.resourceID = resourceType, v.m.ID()
			return result{}, s.mapBackendError(err, asked.op)
		}
	}
	return s.firmwareApplied(c, resourceType, render)
}

// firmwareApplied answers a firmware write: the resource as it reads now,
// Success, and ResetRequired while the running boot has other firmware.
func (s *Server) firmwareApplied(c *call, resourceType string, render func(firmwareView) map[string]any) (result, error) {
	v, err := s.firmwareView(c, resourceType)
	if err != nil {
		return result{}, err
	}
	body := render(v)
	etag := bodyETag(body)
	msgs := []any{message{key: msgSuccess}.body()}
	if v.state.Pending() {
		msgs = append(msgs, resetRequired(v).body())
	}
	body["@Message.ExtendedInfo"] = msgs
	return result{body: body, etag: etag}, nil
}

// resetRequired says which reset applies the pending firmware.
func resetRequired(v firmwareView) message {
	return message{key: msgResetRequired, args: []string{
		systemPath(v.m.ID()) + "/Actions/ComputerSystem.Reset", string(restartType(v.m.Capabilities())),
	}}
}

// restartType is the reset that applies pending firmware: a graceful
// restart where the machine has one.
func restartType(caps machine.Capabilities) machine.ResetType {
	for _, r := range []machine.ResetType{machine.ResetGracefulRestart, machine.ResetForceRestart, machine.ResetPowerCycle} {
		if caps.SupportsReset(r) {
			return r
		}
	}
	return machine.ResetForceRestart
}

// bodyETag is the ETag a GET of body answers with.
func bodyETag(body map[string]any) string {
	data, _ := json.Marshal(body) // maps of JSON values always marshal
	return etagOf(data)
}

func (s *Server) patchBiosSettings(c *call) (result, error) {
	return s.patchFirmware(c, "Bios", biosSettingsBody, mergeBiosPatch)
}

// mergeBiosPatch validates {"Attributes": {...}}: every attribute named
// must exist, be writable, and have one of its allowed values.
func mergeBiosPatch(patch map[string]json.RawMessage, current map[string]any, v firmwareView) firmwarePatch {
	asked := firmwarePatch{want: v.state.Next}
	for _, key := range sortedKeys(patch) {
		switch key {
		case "Attributes":
		case propSettingsApplyTime:
			asked.fails = append(asked.fails, applyTimeProblems(patch[key])...)
		default:
			asked.fails = append(asked.fails, readOnlyOrUnknown(current, key, "/"+key))
		}
	}
	raw, ok := patch["Attributes"]
	if !ok {
		return asked
	}
	var attrs map[string]json.RawMessage
	if err := json.Unmarshal(raw, &attrs); err != nil || attrs == nil {
		asked.fails = append(asked.fails, propertyError(msgPropertyValueTypeError, "/Attributes", jsonText(raw), "/Attributes"))
		return asked
	}
	caps := v.m.Capabilities()
	for _, name := range sortedKeys(attrs) {
		pointer := "/Attributes/" + name
		i := slices.IndexFunc(biosAttributes, func(a biosAttribute) bool { return a.name == name })
		if i < 0 {
			asked.fails = append(asked.fails, propertyError(msgPropertyUnknown, pointer, pointer))
			continue
		}
		attr := biosAttributes[i]
		if attr.write == nil {
			asked.fails = append(asked.fails, propertyError(msgPropertyNotWritable, pointer, pointer))
			continue
		}
		value, ok := jsonString(attrs[name])
		switch {
		case !ok:
			asked.fails = append(asked.fails, propertyError(msgPropertyValueTypeError, pointer, jsonText(attrs[name]), pointer))
		case !slices.Contains(attr.allowed(caps), value):
			asked.fails = append(asked.fails, propertyError(msgPropertyValueNotInList, pointer, value, pointer))
		default:
			before := asked.want
			attr.write(&asked.want, value)
			if asked.want != before {
				asked.op = operation{parameter: pointer, value: value, conflictsWith: biosSettingsPath(v.m.ID())}
			}
		}
	}
	return asked
}

func (s *Server) patchSecureBoot(c *call) (result, error) {
	return s.patchFirmware(c, "SecureBoot", secureBootBody, mergeSecureBootPatch)
}

const propSecureBootEnable = "SecureBootEnable"

// mergeSecureBootPatch validates a SecureBoot PATCH: SecureBootEnable is
// its one writable property. Turning it on needs UEFI, which the backend
// checks against the boot mode.
func mergeSecureBootPatch(patch map[string]json.RawMessage, current map[string]any, v firmwareView) firmwarePatch {
	asked := firmwarePatch{want: v.state.Next}
	for _, key := range sortedKeys(patch) {
		pointer := "/" + key
		if key != propSecureBootEnable {
			asked.fails = append(asked.fails, readOnlyOrUnknown(current, key, pointer))
			continue
		}
		on, ok := jsonBool(patch[key])
		if !ok {
			asked.fails = append(asked.fails, propertyError(msgPropertyValueTypeError, pointer, jsonText(patch[key]), pointer))
			continue
		}
		asked.want.SecureBoot = on
		asked.op = operation{parameter: pointer, value: jsonText(patch[key]), conflictsWith: systemPath(v.m.ID())}
	}
	return asked
}

// resetBios configures the machine's first firmware for its next boot.
func (s *Server) resetBios(c *call) (result, error) {
	m, err := s.machineFor(c, "systemID", "Bios")
	if err != nil {
		return result{}, err
	}
	if _, apiErr := actionParams(c.body, "ResetBios", nil, nil); apiErr != nil {
		return result{}, apiErr
	}
	if err := m.ResetFirmware(c.ctx()); err != nil {
		return result{}, s.mapBackendError(err, operation{resourceType: "Bios", resourceID: m.ID(), action: "ResetBios"})
	}
	res, err := s.firmwareApplied(c, "Bios", biosBody)
	if err != nil {
		return result{}, err
	}
	// An action answers with its messages, not with the resource.
	body := res.body.(map[string]any)
	return result{body: map[string]any{"@Message.ExtendedInfo": body["@Message.ExtendedInfo"]}}, nil
}

// resetSecureBootKeys answers ResetKeys, which is not advertised: KubeVirt
// has no API to change the keys its Secure Boot firmware enrolls.
func (s *Server) resetSecureBootKeys(c *call) (result, error) {
	if _, err := s.machineFor(c, "systemID", "SecureBoot"); err != nil {
		return result{}, err
	}
	return result{}, newError(http.StatusBadRequest, msgActionNotSupported, "SecureBoot.ResetKeys")
}
