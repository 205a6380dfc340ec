package redfish

import "strings"

// schemaBase is where DMTF publishes the schemas; clients resolve
// @odata.type, Link headers and $metadata references against it.
// swordfishBase is where the Swordfish schemas Redfish uses live (their
// $id, and their CSDL's Uri in every DMTF file that references them).
const (
	schemaBase    = "http://redfish.dmtf.org/schemas/v1/"
	swordfishBase = "http://redfish.dmtf.org/schemas/swordfish/v1/"
)

// swordfishNamespaces are the served namespaces that Swordfish defines.
var swordfishNamespaces = map[string]bool{"Volume": true, "VolumeCollection": true}

// baseOf is where the schema of a namespace is published.
func baseOf(namespace string) string {
	if swordfishNamespaces[namespace] {
		return swordfishBase
	}
	return schemaBase
}

// schemaType is one DMTF schema type the service serves. Every body, the
// Link header and $metadata derive their type names from these values, so a
// version bump happens in one place.
type schemaType struct {
	namespace string // "ComputerSystem" or "ComputerSystemCollection"
	version   string // "v1_27_0"; empty for the unversioned collection schemas
}

// odataType is the value of @odata.type, e.g.
// "#ComputerSystem.v1_27_0.ComputerSystem".
func (t schemaType) odataType() string {
	if t.version == "" {
		return "#" + t.namespace + "." + t.namespace
	}
	return "#" + t.namespace + "." + t.version + "." + t.namespace
}

// versionedNamespace is the CSDL namespace that defines the type.
func (t schemaType) versionedNamespace() string {
	if t.version == "" {
		return t.namespace
	}
	return t.namespace + "." + t.version
}

// csdlURI is the DMTF CSDL document that defines the namespace.
func (t schemaType) csdlURI() string { return baseOf(t.namespace) + t.namespace + "_v1.xml" }

// Versions chosen from the DMTF 2025.4 bundle: the newest minor version of
// each schema, declared with its .0 errata.
var (
	typeServiceRoot            = schemaType{"ServiceRoot", "v1_20_0"}
	typeSystemCollection       = schemaType{"ComputerSystemCollection", ""}
	typeSystem                 = schemaType{"ComputerSystem", "v1_27_0"}
	typeEthernetCollection     = schemaType{"EthernetInterfaceCollection", ""}
	typeEthernetInterface      = schemaType{"EthernetInterface", "v1_12_0"}
	typeSimpleStorageColl      = schemaType{"SimpleStorageCollection", ""}
	typeSimpleStorage          = schemaType{"SimpleStorage", "v1_3_0"}
	typeManagerCollection      = schemaType{"ManagerCollection", ""}
	typeManager                = schemaType{"Manager", "v1_24_0"}
	typeNetworkProtocol        = schemaType{"ManagerNetworkProtocol", "v1_12_0"}
	typeVirtualMediaColl       = schemaType{"VirtualMediaCollection", ""}
	typeVirtualMedia           = schemaType{"VirtualMedia", "v1_6_0"}
	typeChassisCollection      = schemaType{"ChassisCollection", ""}
	typeChassis                = schemaType{"Chassis", "v1_28_0"}
	typeSessionService         = schemaType{"SessionService", "v1_2_0"}
	typeSessionCollection      = schemaType{"SessionCollection", ""}
	typeSession                = schemaType{"Session", "v1_8_0"}
	typeAccountService         = schemaType{"AccountService", "v1_18_0"}
	typeAccountCollection      = schemaType{"ManagerAccountCollection", ""}
	typeAccount                = schemaType{"ManagerAccount", "v1_14_0"}
	typeRoleCollection         = schemaType{"RoleCollection", ""}
	typeRole                   = schemaType{"Role", "v1_3_0"}
	typeResource               = schemaType{"Resource", "v1_23_0"}
	typeMessage                = schemaType{"Message", "v1_3_0"}
	typeLogServiceCollection   = schemaType{"LogServiceCollection", ""}
	typeLogService             = schemaType{"LogService", "v1_9_0"}
	typeLogEntryCollection     = schemaType{"LogEntryCollection", ""}
	typeLogEntry               = schemaType{"LogEntry", "v1_21_0"}
	typeEventService           = schemaType{"EventService", "v1_10_0"}
	typeEvent                  = schemaType{"Event", "v1_10_0"}
	typeEventDestinationColl   = schemaType{"EventDestinationCollection", ""}
	typeEventDestination       = schemaType{"EventDestination", "v1_16_0"}
	typeProcessorCollection    = schemaType{"ProcessorCollection", ""}
	typeProcessor              = schemaType{"Processor", "v1_22_0"}
	typeMemoryCollection       = schemaType{"MemoryCollection", ""}
	typeMemory                 = schemaType{"Memory", "v1_23_0"}
	typeStorageCollection      = schemaType{"StorageCollection", ""}
	typeStorage                = schemaType{"Storage", "v1_21_0"}
	typeDrive                  = schemaType{"Drive", "v1_22_0"}
	typeDriveCollection        = schemaType{"DriveCollection", ""}
	typeVolumeCollection       = schemaType{"VolumeCollection", ""}
	typeVolume                 = schemaType{"Volume", "v1_10_0"}
	typeStorageControllerColl  = schemaType{"StorageControllerCollection", ""}
	typeStorageController      = schemaType{"StorageController", "v1_9_0"}
	typeBios                   = schemaType{"Bios", "v1_2_0"}
	typeSecureBoot             = schemaType{"SecureBoot", "v1_1_0"}
	typeSettings               = schemaType{"Settings", "v1_4_0"}
	typeRegistryFileCollection = schemaType{"MessageRegistryFileCollection", ""}
	// Its newest errata: v1_1_0's JSON schema declares a draft-04 style
	// metaschema of its own that JSON schema validators cannot compile.
	typeRegistryFile      = schemaType{"MessageRegistryFile", "v1_1_5"}
	typeAttributeRegistry = schemaType{"AttributeRegistry", "v1_3_0"}
	typeTaskService       = schemaType{"TaskService", "v1_3_0"}
	typeTaskCollection    = schemaType{"TaskCollection", ""}
	typeTask              = schemaType{"Task", "v1_7_0"}
	typeActionInfo        = schemaType{"ActionInfo", "v1_5_0"}
)

// Schemas of the two bodies that carry no @odata.type.
const (
	errorSchemaURI           = schemaBase + "redfish-error.v1_0_2.json"
	serviceDocumentSchemaURI = schemaBase + "odata-v4.json"
)

// servedTypes lists every type that appears in a body, for $metadata.
var servedTypes = []schemaType{
	typeServiceRoot,
	typeSystemCollection, typeSystem,
	typeEthernetCollection, typeEthernetInterface,
	typeSimpleStorageColl, typeSimpleStorage,
	typeProcessorCollection, typeProcessor, typeMemoryCollection, typeMemory,
	typeStorageCollection, typeStorage, typeDriveCollection, typeDrive, typeVolumeCollection, typeVolume,
	typeStorageControllerColl, typeStorageController,
	typeBios, typeSecureBoot, typeSettings,
	typeRegistryFileCollection, typeRegistryFile, typeAttributeRegistry,
	typeManagerCollection, typeManager, typeNetworkProtocol,
	typeVirtualMediaColl, typeVirtualMedia,
	typeChassisCollection, typeChassis,
	typeSessionService, typeSessionCollection, typeSession,
	typeAccountService, typeAccountCollection, typeAccount,
	typeRoleCollection, typeRole,
	typeResource, typeMessage,
	typeLogServiceCollection, typeLogService, typeLogEntryCollection, typeLogEntry,
	typeEventService, typeEvent, typeEventDestinationColl, typeEventDestination,
	typeTaskService, typeTaskCollection, typeTask, typeActionInfo,
}

// describedBy returns the JSON schema URI for an @odata.type value, for the
// Link header: "#ComputerSystem.v1_27_0.ComputerSystem" gives
// ".../ComputerSystem.v1_27_0.json" and a collection's unversioned type
// gives ".../ComputerSystemCollection.json".
func describedBy(odataType string) string {
	parts := strings.Split(strings.TrimPrefix(odataType, "#"), ".")
	if len(parts) < 2 {
		return ""
	}
	return baseOf(parts[0]) + strings.Join(parts[:len(parts)-1], ".") + ".json"
}
