#!/usr/bin/env python3
#
# --- Start MAAS 1.0 script metadata ---
# name: 50-virtmetal-bmc-config
# title: Configure the Redfish BMC of a virtmetal KubeVirt VM
# description: Points MAAS power control of a KubeVirt VM at its virtmetal Redfish BMC, named after the VM's SMBIOS serial; leaves physical servers and other VMs alone.
# tags: bmc-config, enlisting
# script_type: commissioning
# parallel: disabled
# timeout: 00:01:00
# --- End MAAS 1.0 script metadata ---
"""MAAS commissioning script for virtmetal VMs.

MAAS's own bmc-config script skips virtual machines, so a KubeVirt VM would
enlist without power control. This script fills the gap: on a VM whose SMBIOS
system-manufacturer is "KubeVirt" and whose system-serial-number is
"<vm>.<namespace>" (virtmetal sets firmware.serial so), it writes the Redfish
power configuration to $BMC_CONFIG_PATH, which MAAS reads once the script
exits 0.

It writes no real credentials: the virtmetal reconciler copies the BMC's
user and password from the VM's Kubernetes Secret into MAAS before it does
anything else with the machine, so the script carries no per-VM secret and
no MAAS API key. It writes placeholders rather than empty strings because
MAAS refuses empty Redfish credentials: its enlistment then stores the
machine with no power settings at all (and fails this script), and the
machine never names its BMC. The user is a fixed name that says it is a
placeholder (PLACEHOLDER_USER); the password is random for every run, so
no two machines and no two runs share a guessable one.

It is tagged "enlisting" as well as "bmc-config": with MAAS's default
enlist_commissioning=true, enlistment runs MAAS's built-in scripts and
those tagged "enlisting" only, so without the tag the power settings and
the machine proof would reach MAAS only at the first commissioning.

It prints the VM's machine proof, "virtmetal-machine-proof: vmp1-<32 hex>",
read from the SMBIOS chassis asset tag, where virtmetal puts 128 random bits
only this VM's guest can read. MAAS stores this script's output, and the
virtmetal reconciler binds a machine to a VM (and hands it the VM's BMC
credentials) only when the output MAAS stored for that machine carries the
VM's proof: everything else a machine reports (serial, UUID, MACs) can be
derived from the VM's name or is broadcast, and MAAS enlistment is
anonymous. So the output is the binding secret: it is printed only when it
has the proof's form, and nothing else of the asset tag is.

Outcomes:
  exit 0, nothing written  not a KubeVirt VM (physical servers untouched),
                           dmidecode unavailable, a KubeVirt VM without a
                           serial (not a virtmetal VM), or another script
                           already configured the BMC;
  exit 0, config written   a virtmetal VM;
  exit 1, message          a KubeVirt VM whose serial is set but is not
                           "<vm>.<namespace>": the VM was meant for virtmetal
                           but could never be powered by MAAS, so
                           commissioning fails where operators look;
  exit 78 (EX_CONFIG)      BMC_DOMAIN was not filled in at deploy time, or
                           MAAS gave no BMC_CONFIG_PATH (the script must be
                           uploaded with parallel: disabled).
"""

import json
import os
import re
import secrets
import subprocess
import sys

# DEPLOY STEP: the DNS domain under which virtmetal serves each VM's BMC,
# as in <vm>.<namespace>.<domain>. Replace the placeholder before
# uploading the script to MAAS (see README.md in this directory).
BMC_DOMAIN = "@VIRTMETAL_BMC_DOMAIN@"

MANUFACTURER = "KubeVirt"
POWER_TYPE = "redfish"
# What MAAS stores as the Redfish user until the reconciler writes the BMC's
# real one (MAAS refuses an empty user). The reconciler knows this name.
PLACEHOLDER_USER = "virtmetal-placeholder"
DMIDECODE_TIMEOUT_SECONDS = 60

# Values dmidecode prints for an SMBIOS string nobody set.
UNSET_SERIALS = {"", "not specified", "none", "to be filled by o.e.m."}

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

# The machine proof's form (internal/bmcspec) and the line that reports it.
MACHINE_PROOF = re.compile(r"^vmp1-[0-9a-f]{32}$")
PROOF_REPORT_KEY = "virtmetal-machine-proof"


class ConfigError(Exception):
    """The deployment of this script is wrong (exit EX_CONFIG)."""


class SerialError(Exception):
    """The VM's serial cannot name a virtmetal BMC (exit 1)."""


def is_dns_label(value):
    return bool(DNS_LABEL.match(value))


def is_dns_subdomain(value):
    """RFC 1123 subdomain with DNS-sized labels, as VM names may have dots."""
    return len(value) <= 253 and all(is_dns_label(part) for part in value.split("."))


def dmidecode(keyword):
    """Return an SMBIOS string, or None when dmidecode cannot tell."""
    try:
        result = subprocess.run(
            ["dmidecode", "-s", keyword],
            capture_output=True,
            text=True,
            timeout=DMIDECODE_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        print(f"INFO: dmidecode -s {keyword} failed: {err}")
        return None
    if result.returncode != 0:
        print(f"INFO: dmidecode -s {keyword} exited {result.returncode}: {result.stderr.strip()}")
        return None
    # dmidecode may add comment lines, e.g. about newer SMBIOS versions.
    lines = [line.strip() for line in result.stdout.splitlines() if not line.startswith("#")]
    return lines[0] if lines else ""


def parse_serial(serial):
    """Split "<vm>.<namespace>" at its last dot; the namespace has none."""
    vm, dot, namespace = serial.rpartition(".")
    if not dot:
        raise SerialError(f"serial {serial!r} is not <vm>.<namespace>: no dot")
    if not is_dns_label(namespace):
        raise SerialError(f"serial {serial!r}: namespace {namespace!r} is not a DNS label")
    if not is_dns_subdomain(vm):
        raise SerialError(f"serial {serial!r}: VM name {vm!r} is not a DNS subdomain")
    return vm, namespace


def bmc_config(vm, namespace, domain):
    host = f"{vm}.{namespace}.{domain}"
    if len(host) > 253:
        raise SerialError(f"BMC host name {host!r} is longer than 253 characters")
    return {
        "power_type": POWER_TYPE,
        # The bare host: MaaS's redfish driver adds https:// itself, and
        # MaaS 3.4's region answers an address with a scheme with HTTP 500.
        "power_address": host,
        "power_user": PLACEHOLDER_USER,
        "power_pass": secrets.token_urlsafe(24),
        "node_id": vm,
    }


def write_yaml(path, mapping):
    """Write flat string pairs as YAML; JSON strings are YAML scalars."""
    with open(path, "w", encoding="utf-8") as out:
        for key, value in mapping.items():
            out.write(f"{key}: {json.dumps(value)}\n")


def skip(reason):
    """Leave the BMC alone and tell MAAS the script was skipped."""
    print(f"INFO: {reason}; nothing to configure")
    result_path = os.environ.get("RESULT_PATH")
    if result_path:
        write_yaml(result_path, {"status": "skipped"})
    return 0


def report_proof():
    """Print the VM's machine proof for MAAS to store, if it has one."""
    asset = dmidecode("chassis-asset-tag")
    if asset is not None and MACHINE_PROOF.match(asset):
        print(f"{PROOF_REPORT_KEY}: {asset}")
    else:
        print("INFO: the chassis asset tag holds no virtmetal machine proof")


def main():
    manufacturer = dmidecode("system-manufacturer")
    if manufacturer is None:
        return skip("cannot read SMBIOS")
    if manufacturer != MANUFACTURER:
        return skip(f"system-manufacturer is {manufacturer!r}, not {MANUFACTURER!r}")

    serial = dmidecode("system-serial-number")
    if serial is None or serial.lower() in UNSET_SERIALS:
        return skip("KubeVirt VM without a serial, so not a virtmetal VM")
    report_proof()

    bmc_config_path = os.environ.get("BMC_CONFIG_PATH")
    if not bmc_config_path:
        raise ConfigError("BMC_CONFIG_PATH is not set; upload this script with 'parallel: disabled'")
    if os.path.exists(bmc_config_path):
        return skip("another commissioning script configured the BMC already")
    if not is_dns_subdomain(BMC_DOMAIN):
        raise ConfigError(f"BMC_DOMAIN {BMC_DOMAIN!r} is not a DNS name; fill it in before uploading")

    vm, namespace = parse_serial(serial)
    config = bmc_config(vm, namespace, BMC_DOMAIN)
    write_yaml(bmc_config_path, config)
    print(f"INFO: Redfish BMC of VM {namespace}/{vm} is {config['power_address']} (node_id {vm})")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConfigError as err:
        print(f"ERROR: {err}", file=sys.stderr)
        sys.exit(os.EX_CONFIG)
    except SerialError as err:
        print(f"ERROR: {err}. virtmetal VMs need firmware.serial <vm>.<namespace>.", file=sys.stderr)
        sys.exit(1)
