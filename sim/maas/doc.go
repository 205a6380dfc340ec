// Package maas simulates MaaS itself, which cannot run here, in the two
// parts virtmetal meets: the region's REST API (Server) and the rack
// controller toward the machines (Rack). Importers name it maassim, as maas
// is the real client and reconciler.
//
// Server is the part of the MaaS REST API 2.0 that virtmetal uses, on a
// loopback HTTP server, statefully and with MaaS's own rules, so that the
// maas package can be tested against it with its real client:
//
//   - every request must carry a valid OAuth 1.0 PLAINTEXT header for one of
//     the server's API keys (APIKey, an admin's, or NonAdminAPIKey) with a
//     fresh nonce and an integer timestamp within 300 s of the server's clock
//     (else 401; a non-integer timestamp is 400, as in MaaS);
//   - hostnames are unique DNS names: labels of at most 63 letters, digits
//     and inner hyphens (no underscore, no leading or trailing hyphen), else
//     400, and "Node with this Hostname already exists." for a taken one;
//     pool names are unique (400), and pool= must name an existing pool
//     (400);
//   - power settings live on BMC rows, not on machines, as in MaaS: for a
//     chassis-capable power type (redfish) machines whose power type,
//     power_address and power_user match share one row, so a PUT of power
//     parameters on one of them changes them for all; node_id is each
//     machine's own. A machine of another power type (manual, none) set
//     to a row's address and user joins it; a machine already on a row of
//     its own type moved onto another row's address and user is 409, as
//     MaaS 3.4's unique index answers. A PUT that changes the power type
//     away from a shared row (power_type=manual) moves the machine to a
//     fresh row of its own and leaves the others untouched. PUT merges
//     power_parameters_<key> fields into the row's parameters. Every
//     password a machine's row ever gave it is kept (PasswordsHeld), so a
//     test sees a secret that reached a machine even for a moment;
//   - power settings given through the API (PUT, anonymous POST) are
//     validated merged with what is stored: an empty Redfish power_user or
//     power_pass is 400; the region validates the power address as its
//     version does (Shape): on the 3.4 shape an address with a scheme
//     ("https://...") fails with HTTP 500, on later shapes it is stored.
//     What a node signals, or StoreBMCConfig, is stored unvalidated;
//   - op=commission is refused with 400 unless the machine is New, Ready,
//     Failed commissioning or Broken, and while the region has no boot image
//     (WithoutBootImages); Step moves Commissioning machines to Ready (New
//     for an enlistment);
//   - GET machines/ carries no power parameters; op=power_parameters gives
//     them per machine or in bulk, keyed by system_id, to admins only (403
//     for NonAdminAPIKey);
//   - machine JSON has hardware_uuid (null when unknown), interface_set with
//     each interface's mac_address, and boot_interface, as MaaS 3.x shows
//     them;
//   - a machine has a current commissioning script set (Machine's
//     Commissioning) once it enlisted with commission=true, was
//     commissioned, or a node signalled COMMISSIONING; each of these makes
//     a new one (a commission's bmc-config rows Skipped, with MaaS's line,
//     under skip_bmc_config; older sets are not kept). GET
//     nodes/{id}/results/current-commissioning/ serves it with
//     include_output (any value: base64 output, stdout, stderr, result)
//     and filters (a result's name, its script's tag, its id); a machine
//     with none is 400 with the region's "Unknown id" text;
//   - a node's signals (Signal), which MaaS lets anyone who knows a
//     system_id send: results are stored once per set (a second post is
//     500), dropped while the machine is New; COMMISSIONING moves a New
//     machine to Commissioning with a new set, OK ends a commissioning
//     (Ready, or New for an enlistment), FAILED fails it; a reported
//     hardware UUID another machine has is cleared on both;
//   - POST machines/ without a key is MaaS's anonymous enlistment: it takes
//     hostname, mac_addresses, power_type, power_parameters (JSON) and
//     commission (Commissioning, enlisting, with a new set), ignoring the
//     rest (hardware_uuid...). A MAC of a New or Commissioning machine
//     updates that machine's hostname and power settings and answers its
//     system_id; of a machine in another status, 400. Power parameters
//     such an update does not give are kept, as a PUT keeps them (the
//     real region was seen updating with all of them given only).
//
// What a real MaaS 3.4 region did for each of these is recorded in
// docs/maas-region.md.
//
// Faults (5xx, 409, malformed JSON, dropped connections) can be injected for
// the next N requests or for matching requests, a change can be made just
// before matching requests are handled (Before: another client's write
// between a reader's list and its write), and every request is recorded so
// tests can count what a client did.
//
// Rack answers the network boots of guests (sim/guest) and runs
// commissionings. An unknown guest is enlisted as MaaS's enlistment
// runner does it: the real bmc-config commissioning script runs on its
// SMBIOS first when the region's enlistment runs it (its "enlisting" tag,
// or any bmc-config script with enlist_commissioning off), the machine is
// created anonymously with commission=true and the script's power
// settings (without them, and the script's result failed, when the region
// refuses them), its results and firmware UUID are signalled, and it ends
// New with the enlistment's set current. A commissioning the region
// accepted powers the machine on with a PXE boot through a power driver
// it is given, waits for that boot, runs the script unless
// skip_bmc_config, powers the machine off and marks it Ready.
//
// Not modelled: the API beyond machines' reads, updates and commission, and
// resource pools (no deployment, tags, zones, networking, storage or
// events); DHCP, TFTP and boot images (a boot is what sim/guest tells;
// images are present or not); commissioning and testing scripts other than
// bmc-config, past script sets (GET nodes/{id}/results/), the hardware
// inventory's MACs and hardware_info, node tokens (Signal takes a
// system_id); the rack's RPC, power polling and driver queue; users other
// than the two fixed keys. New and the With* helpers are a test's: they
// fail the test given; a lab uses Start, Enlist and Close.
package maas
