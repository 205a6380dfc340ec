// Package ipmi is an IPMI-over-LAN BMC simulator for one machine. It answers
// RMCP presence pings, IPMI 1.5 sessions (MD5, and straight password only
// when enabled) and IPMI 2.0 RMCP+ sessions (cipher suites 3 and 17 by
// default), and maps the chassis commands onto the machine contract.
//
// RMCP+ is built in this package instead of taken from a library: the design
// card's IPMI library (vmware/goipmi) is an IPMI 1.5 client only, and the
// server side of RMCP+ (RAKP key exchange, HMAC-SHA1/HMAC-SHA256 keys,
// HMAC-SHA1-96/HMAC-SHA256-128 integrity, AES-CBC-128 confidentiality) needs
// nothing beyond Go's standard crypto. The wire formats follow the IPMI v2.0
// specification (rev 1.1); where freeipmi or ipmitool depend on a detail
// the specification leaves open, a comment says so.
//
// Serial over LAN (payload type 1) carries the machine's serial console
// (machine.ConsoleController) inside an RMCP+ session, sealed as its IPMI
// messages are; machine.ConsoleSessions keeps it to one client at a time
// across IPMI and Redfish. sol.go says how output is paced and bounded.
//
// One Server owns the session table, the boot-option and SOL parameters
// and the SOL payload of its machine; boot flags themselves live in the
// machine (BootOverride).
package ipmi
