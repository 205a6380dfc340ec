#!/usr/bin/python3
"""Ironic's Redfish flows, run through sushy against one BMC.

The conformance tests (conformance/ironic_test.go) run this with Debian's
python3-sushy and check what it printed and what the backend ended up
with. Each flow calls sushy's public API the way Ironic's redfish and
redfish-virtualmedia drivers do:

  deploy   power off, eject what is inserted (best effort), insert the ISO
           in the CD, set the boot mode when it differs, one-time boot from
           the CD, power on; then inspection.
  syncmode Ironic's boot-mode re-sync: read the mode, set the node's mode
           when it differs, read it back.
  inspect  what Ironic's redfish inspection reads.

It prints one JSON object on stdout and exits non-zero when a step fails.
The password comes from the environment (REDFISH_PASSWORD), not argv.
"""

import argparse
import json
import os
import sys
import time
import warnings

import sushy
from sushy import exceptions
from sushy import utils
from sushy.resources.manager import virtual_media

# Ironic's boot modes and sushy's.
BOOT_MODES = {'uefi': sushy.BOOT_SOURCE_MODE_UEFI,
              'bios': sushy.BOOT_SOURCE_MODE_BIOS}

GIB = 1 << 30
POWER_TIMEOUT = 120  # seconds; Ironic's [conductor]power_state_change_timeout is 60


def val(v):
    """An enum's Redfish value ("Legacy"), anything else as it is."""
    return getattr(v, 'value', v)


def wait_power(system, want):
    deadline = time.monotonic() + POWER_TIMEOUT
    while True:
        system.refresh()
        if system.power_state == want:
            return
        if time.monotonic() > deadline:
            raise RuntimeError('power state %s after %ss, want %s'
                               % (system.power_state, POWER_TIMEOUT, want))
        time.sleep(0.2)


def set_power(system, want, reset):
    # Ironic's node_power_action: nothing to do when already there.
    system.refresh()
    if system.power_state == want:
        return False
    system.reset_system(reset)
    wait_power(system, want)
    return True


def media_collection(system):
    """The system's VirtualMedia, as Ironic finds it.

    Newer sushy has System.virtual_media and Ironic prefers it over the
    managers'; sushy 4.3.3 (Debian's) only reaches virtual media through
    Manager.virtual_media, so the same collection class is built from the
    system's own link, which is what the newer property does.
    """
    if hasattr(system, 'virtual_media'):
        return system.virtual_media
    path = utils.get_sub_resource_path_by(system, 'VirtualMedia')
    return virtual_media.VirtualMediaCollection(
        system._conn, path, redfish_version=system.redfish_version,
        registries=system.registries)


def eject_all(system, log):
    # Ironic's eject_vmedia: every inserted device, errors logged, not fatal.
    for media in media_collection(system).get_members():
        if not media.inserted:
            continue
        try:
            media.eject_media()
            log.append({'step': 'eject', 'media': media.path})
        except exceptions.SushyError as e:
            log.append({'step': 'eject', 'media': media.path, 'error': str(e)})


def insert_cd(system, image, log):
    # Ironic's _insert_vmedia: the first device that takes a CD.
    for media in media_collection(system).get_members():
        if sushy.VirtualMediaType.CD not in media.media_types:
            continue
        if media.inserted and media.image == image:
            log.append({'step': 'insert', 'media': media.path, 'already': True})
            return
        media.insert_media(image, inserted=True, write_protected=True)
        log.append({'step': 'insert', 'media': media.path})
        return
    raise RuntimeError('no virtual media device takes a CD')


def sync_boot_mode(system, wanted, log):
    """Ironic's boot_mode_utils.sync_boot_mode with the node's mode set."""
    system.refresh()
    before = system.boot.mode
    desired = BOOT_MODES[wanted]
    changed = before != desired
    if changed:
        system.set_system_boot_options(mode=desired)
        system.refresh()
    after = system.boot.mode
    log.append({'step': 'boot_mode', 'before': val(before), 'after': val(after), 'set': changed})
    if after != desired:
        raise RuntimeError('boot mode %s after setting %s' % (after, desired))


def set_boot_cd_once(system, log):
    # Ironic's redfish set_boot_device(CDROM, persistent=False): Enabled is
    # sent only when it differs from what the system has.
    system.refresh()
    enabled = sushy.BOOT_SOURCE_ENABLED_ONCE
    if system.boot.enabled == enabled:
        enabled = None
    system.set_system_boot_options(sushy.BOOT_SOURCE_TARGET_CD, enabled=enabled)
    system.refresh()
    log.append({'step': 'boot_device', 'target': val(system.boot.target),
                'enabled': val(system.boot.enabled), 'sent_enabled': enabled is not None})


def largest_useful(sizes):
    # Ironic's _detect_local_gb: the first size of at least 4 GiB.
    return ([s for s in sizes if s >= 4 * GIB] or [0])[0]


def inspect(system):
    """What Ironic's redfish inspect interface reads, and what it makes of it.

    Storage as Ironic's _detect_local_gb reads it: SimpleStorage, then the
    Storage volumes, then the drives when no volume is large enough. Only
    SushyError is caught there: anything else fails the inspection.
    """
    system.refresh()
    out = {'boot_mode': val(system.boot.mode)}
    if system.memory_summary and system.memory_summary.size_gib:
        out['memory_mb'] = system.memory_summary.size_gib * 1024
    count, arch = system.processors.summary
    out['cpus'] = count
    out['cpu_arch'] = val(arch)
    out['processors'] = [{'id': p.identity, 'arch': val(p.processor_architecture),
                          'cores': p.total_cores, 'threads': p.total_threads}
                         for p in system.processors.get_members()]
    out['nics'] = {mac: val(state) for mac, state in system.ethernet_interfaces.summary.items()}
    simple = storage = 0
    try:
        if system.simple_storage and system.simple_storage.disks_sizes_bytes:
            simple = largest_useful(system.simple_storage.disks_sizes_bytes)
    except exceptions.SushyError as e:
        out['simple_storage_error'] = str(e)
    try:
        if system.storage and system.storage.volumes_sizes_bytes:
            storage = largest_useful(system.storage.volumes_sizes_bytes)
    except exceptions.SushyError as e:
        out['volumes_error'] = str(e)
    try:
        if not storage and system.storage and system.storage.drives_sizes_bytes:
            storage = largest_useful(system.storage.drives_sizes_bytes)
    except exceptions.SushyError as e:
        out['drives_error'] = str(e)
    local = min(simple, storage) if simple and storage else max(simple, storage)
    out['simple_storage_bytes'] = simple
    out['storage_bytes'] = storage
    out['local_gb'] = max(0, int(local / GIB - 1))
    # The BIOS and Secure Boot interfaces' reads.
    out['bios_attributes'] = dict(system.bios.attributes)
    sb = system.secure_boot
    out['secure_boot'] = {'enabled': sb.enabled, 'current_boot': val(sb.current_boot)}
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('flow', choices=['deploy', 'syncmode', 'inspect'])
    parser.add_argument('--url', required=True)
    parser.add_argument('--username', required=True)
    parser.add_argument('--system', required=True, help='the system path Ironic stores as redfish_system_id')
    parser.add_argument('--image', help='the deploy ISO, for deploy')
    parser.add_argument('--boot-mode', choices=sorted(BOOT_MODES), help="the node's boot mode")
    args = parser.parse_args()

    # Ironic's redfish_verify_ca=False: the BMC's certificate is self-signed.
    warnings.filterwarnings('ignore', message='Unverified HTTPS request')
    conn = sushy.Sushy(args.url, username=args.username,
                       password=os.environ['REDFISH_PASSWORD'], verify=False)
    log = []
    result = {'log': log}
    try:
        system = conn.get_system(args.system)
        if args.flow == 'deploy':
            set_power(system, sushy.POWER_STATE_OFF, sushy.RESET_FORCE_OFF)
            log.append({'step': 'power_off'})
            eject_all(system, log)
            insert_cd(system, args.image, log)
            if args.boot_mode:
                sync_boot_mode(system, args.boot_mode, log)
            set_boot_cd_once(system, log)
            set_power(system, sushy.POWER_STATE_ON, sushy.RESET_ON)
            log.append({'step': 'power_on'})
            result['media'] = [{'path': m.path, 'inserted': m.inserted, 'image': m.image}
                               for m in media_collection(system).get_members()]
            result['inspection'] = inspect(system)
        elif args.flow == 'syncmode':
            sync_boot_mode(system, args.boot_mode, log)
        else:
            result['inspection'] = inspect(system)
    except (exceptions.SushyError, RuntimeError) as e:
        result['error'] = '%s: %s' % (type(e).__name__, e)
    json.dump(result, sys.stdout, sort_keys=True)
    return 1 if 'error' in result else 0


if __name__ == '__main__':
    sys.exit(main())
