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
//     parameters on one of them changes them for all; a PUT that changes the
//     power type away from a shared row (power_type=manual) moves the
//     machine to a fresh row of its own and leaves the others untouched.
//     PUT merges power_parameters_<key> fields into the row's parameters.
//     Every password a machine's row ever gave it is kept (PasswordsHeld),
//     so a test sees a secret that reached a machine even for a moment;
//   - the region validates the power address as its version does (Shape):
//     on the 3.4 shape an address with a scheme ("https://...") fails with
//     HTTP 500, on later shapes it is stored;
//   - op=commission is refused with 400 unless the machine is New, Ready,
//     Failed commissioning or Broken, and while the region has no boot image
//     (WithoutBootImages); Step moves Commissioning machines to Ready;
//   - GET machines/ carries no power parameters; op=power_parameters gives
//     them per machine or in bulk, keyed by system_id, to admins only (403
//     for NonAdminAPIKey);
//   - machine JSON has hardware_uuid (null when unknown), interface_set with
//     each interface's mac_address, and boot_interface, as MaaS 3.x shows
//     them;
//   - each machine has a current commissioning script set (Machine's
//     Commissioning): the rack stores the bmc-config script's result there
//     at enlistment and at each commissioning, a commission replaces it
//     (the bmc-config result skipped with skip_bmc_config), and GET
//     nodes/{id}/results/current-commissioning/ serves it with
//     include_output (base64 output, stdout, stderr, result) and filters
//     (script names), 404 for a machine with none. This model is to be
//     confirmed on a real MaaS 3.4 region;
//   - POST machines/ without a key is MaaS's anonymous enlistment: it takes
//     hostname, mac_addresses, power_type and power_parameters (JSON) and
//     makes a New machine with no script results (storing those needs the
//     machine's own credentials). MAC uniqueness is not checked.
//
// Faults (5xx, 409, malformed JSON, dropped connections) can be injected for
// the next N requests or for matching requests, a change can be made just
// before matching requests are handled (Before: another client's write
// between a reader's list and its write), and every request is recorded so
// tests can count what a client did.
//
// Rack answers the network boots of guests (sim/guest) and runs
// commissionings: an unknown guest is enlisted as New with its MACs and
// firmware UUID, and the real bmc-config commissioning script runs on its
// SMBIOS (its stdout, with the machine proof, stored as its result); a commissioning the region accepted powers the machine on with a
// PXE boot through a power driver it is given, waits for that boot, runs
// the script unless skip_bmc_config, powers the machine off and marks it
// Ready.
//
// Not modelled: the API beyond machines' reads, updates and commission, and
// resource pools (no deployment, tags, zones, networking, storage or
// events); DHCP, TFTP and boot images (a boot is what sim/guest tells;
// images are present or not); commissioning and testing scripts other than
// bmc-config; the rack's RPC, power polling and driver queue; users other
// than the two fixed keys. New and the With* helpers are a test's: they
// fail the test given; a lab uses Start, Enlist and Close.
package maas
