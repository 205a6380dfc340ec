"""Tests for virtmetal-bmc-config.py, run as MAAS would run it.

    python3 -m unittest discover -s deploy/maas -p '*_test.py' -v

Each test runs the script in a subprocess with a fake dmidecode first on
PATH and a temporary BMC_CONFIG_PATH, after filling in the domain the way
README.md tells operators to.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "virtmetal-bmc-config.py")
PLACEHOLDER = "@VIRTMETAL_BMC_DOMAIN@"
DOMAIN = "bmc.example.org"


def read_yaml(path):
    """Read the flat `key: "json string"` YAML the script writes."""
    result = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            key, sep, value = line.rstrip("\n").partition(": ")
            if not sep:
                raise AssertionError(f"not a YAML pair: {line!r}")
            result[key] = json.loads(value)
    return result


class BMCConfigScriptTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)
        self.bin = os.path.join(self.dir, "bin")
        os.mkdir(self.bin)
        self.bmc_config_path = os.path.join(self.dir, "bmc-config.yaml")
        self.result_path = os.path.join(self.dir, "result.yaml")
        with open(SCRIPT, encoding="utf-8") as f:
            source = f.read()
        self.assertEqual(source.count(PLACEHOLDER), 1, "the deploy step replaces exactly one placeholder")
        self.script = os.path.join(self.dir, "deployed.py")
        with open(self.script, "w", encoding="utf-8") as f:
            f.write(source.replace(PLACEHOLDER, DOMAIN))

    def fake_dmidecode(self, manufacturer, serial, exit_code=0, preamble="", asset="Not Specified"):
        """Install a dmidecode that answers -s with the given strings."""
        answers = json.dumps({"system-manufacturer": manufacturer, "system-serial-number": serial, "chassis-asset-tag": asset})
        path = os.path.join(self.bin, "dmidecode")
        with open(path, "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(f"""\
                #!{sys.executable}
                import sys
                if {exit_code}:
                    print("/dev/mem: Permission denied", file=sys.stderr)
                    sys.exit({exit_code})
                if sys.argv[1:2] != ["-s"]:
                    sys.exit("fake dmidecode supports only -s")
                sys.stdout.write({preamble!r})
                print({answers}[sys.argv[2]])
                """))
        os.chmod(path, 0o755)

    def run_script(self, script=None, bmc_config_path=True, path=None):
        env = {
            "PATH": path if path is not None else self.bin + os.pathsep + os.environ.get("PATH", ""),
            "RESULT_PATH": self.result_path,
        }
        if bmc_config_path:
            env["BMC_CONFIG_PATH"] = self.bmc_config_path
        return subprocess.run(
            [sys.executable, script or self.script],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def assert_skipped(self, proc):
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertFalse(os.path.exists(self.bmc_config_path), "BMC config must not be written")
        self.assertEqual(read_yaml(self.result_path), {"status": "skipped"})
        os.remove(self.result_path)  # so the next subtest proves its own

    def test_virtmetal_vm(self):
        self.fake_dmidecode("KubeVirt", "vm-0.tenant-a")
        proc = self.run_script()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        config = read_yaml(self.bmc_config_path)
        password = config.pop("power_pass")
        self.assertEqual(
            config,
            {
                "power_type": "redfish",
                "power_address": "vm-0.tenant-a.bmc.example.org",
                "power_user": "virtmetal-placeholder",
                "node_id": "vm-0",
            },
        )
        self.assertFalse(os.path.exists(self.result_path), "a configured BMC is not a skipped script")
        # MAAS refuses empty Redfish credentials (docs/maas-region.md, 4):
        # a placeholder password, random for every run.
        self.assertGreaterEqual(len(password), 32)
        self.assertNotEqual(password, self.run_password(), "two runs wrote the same password")

    def run_password(self):
        os.remove(self.bmc_config_path)
        proc = self.run_script()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return read_yaml(self.bmc_config_path)["power_pass"]

    def test_machine_proof_is_reported(self):
        proof = "vmp1-" + "0123456789abcdef" * 2
        self.fake_dmidecode("KubeVirt", "vm-0.tenant-a", asset=proof)
        proc = self.run_script()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(
            [line for line in proc.stdout.splitlines() if line.startswith("virtmetal-machine-proof")],
            [f"virtmetal-machine-proof: {proof}"],
        )
        self.assertTrue(os.path.exists(self.bmc_config_path))

    def test_asset_tag_without_proof_form_is_not_reported(self):
        for asset in ["Not Specified", "vmp1-" + "0123456789ABCDEF" * 2, "vmp1-0123", "a secret of the user", ""]:
            with self.subTest(asset=asset):
                self.fake_dmidecode("KubeVirt", "vm-0.tenant-a", asset=asset)
                proc = self.run_script()
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.assertNotIn("virtmetal-machine-proof", proc.stdout)
                if asset:
                    self.assertNotIn(asset, proc.stdout + proc.stderr, "only a proof's form is ever printed")
                os.remove(self.bmc_config_path)

    def test_proof_of_other_kubevirt_vms_is_not_read(self):
        self.fake_dmidecode("KubeVirt", "", asset="vmp1-" + "0123456789abcdef" * 2)
        proc = self.run_script()
        self.assertNotIn("virtmetal-machine-proof", proc.stdout)
        self.assert_skipped(proc)

    def test_dotted_vm_name_splits_at_last_dot(self):
        self.fake_dmidecode("KubeVirt", "web.prod.tenant-a")
        proc = self.run_script()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        config = read_yaml(self.bmc_config_path)
        self.assertEqual(config["power_address"], "web.prod.tenant-a.bmc.example.org")
        self.assertEqual(config["node_id"], "web.prod")

    def test_dmidecode_comment_lines_are_ignored(self):
        self.fake_dmidecode("KubeVirt", "vm-0.ns", preamble="# SMBIOS 3.5 present but unsupported.\n")
        proc = self.run_script()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(read_yaml(self.bmc_config_path)["node_id"], "vm-0")

    def test_physical_server_untouched(self):
        for bmc_config_path in (True, False):
            with self.subTest(bmc_config_path=bmc_config_path):
                self.fake_dmidecode("Dell Inc.", "7XJ2KQ3")
                self.assert_skipped(self.run_script(bmc_config_path=bmc_config_path))

    def test_kubevirt_vm_without_serial_is_not_ours(self):
        for serial in ("", "Not Specified", "None"):
            with self.subTest(serial=serial):
                self.fake_dmidecode("KubeVirt", serial)
                self.assert_skipped(self.run_script())

    def test_malformed_serial_fails_loudly(self):
        serials = [
            "vm-0",  # no namespace
            "vm-0.Tenant",  # upper case
            "vm_0.ns",  # underscore
            ".ns",  # empty VM name
            "vm-0.",  # empty namespace
            "-vm.ns",  # leading hyphen
            "vm..x.ns",  # empty label
            "vm-0." + "n" * 64,  # namespace too long
            "a" * 64 + ".ns",  # VM label too long for DNS
            ("a" * 60 + ".") * 4 + "ns",  # host name beyond 253
        ]
        for serial in serials:
            with self.subTest(serial=serial):
                self.fake_dmidecode("KubeVirt", serial)
                proc = self.run_script()
                self.assertEqual(proc.returncode, 1, proc.stdout)
                self.assertIn("ERROR:", proc.stderr)
                self.assertIn("<vm>.<namespace>", proc.stderr)
                self.assertFalse(os.path.exists(self.bmc_config_path))

    def test_no_bmc_config_path(self):
        self.fake_dmidecode("KubeVirt", "vm-0.ns")
        proc = self.run_script(bmc_config_path=False)
        self.assertEqual(proc.returncode, os.EX_CONFIG)
        self.assertIn("BMC_CONFIG_PATH", proc.stderr)

    def test_domain_not_filled_in(self):
        self.fake_dmidecode("KubeVirt", "vm-0.ns")
        proc = self.run_script(script=SCRIPT)
        self.assertEqual(proc.returncode, os.EX_CONFIG)
        self.assertIn("BMC_DOMAIN", proc.stderr)
        self.assertFalse(os.path.exists(self.bmc_config_path))

    def test_existing_bmc_config_is_kept(self):
        with open(self.bmc_config_path, "w", encoding="utf-8") as f:
            f.write("power_type: ipmi\n")
        self.fake_dmidecode("KubeVirt", "vm-0.ns")
        proc = self.run_script()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(self.bmc_config_path, encoding="utf-8") as f:
            self.assertEqual(f.read(), "power_type: ipmi\n")

    def test_dmidecode_missing_or_failing_skips(self):
        with self.subTest("missing"):
            self.assert_skipped(self.run_script(path=self.bin))
        with self.subTest("failing"):
            self.fake_dmidecode("KubeVirt", "vm-0.ns", exit_code=1)
            self.assert_skipped(self.run_script())

    def test_maas_metadata_header(self):
        """Read the header the way MAAS's script form does."""
        with open(SCRIPT, encoding="utf-8") as f:
            lines = f.read().splitlines()
        self.assertTrue(lines[0].startswith("#!/"), "MAAS requires a shebang")
        start = lines.index("# --- Start MAAS 1.0 script metadata ---")
        end = lines.index("# --- End MAAS 1.0 script metadata ---")
        metadata = {}
        for line in lines[start + 1 : end]:
            key, sep, value = line.split("#", 1)[1].strip().partition(": ")
            self.assertTrue(sep, f"not a key: value line: {line!r}")
            metadata[key] = value
        self.assertEqual(metadata["name"], "50-virtmetal-bmc-config")
        self.assertEqual(metadata["script_type"], "commissioning")
        self.assertEqual(metadata["parallel"], "disabled")
        # "enlisting": with MAAS's default enlist_commissioning=true only
        # such scripts run at enlistment (docs/maas-region.md, 1).
        self.assertEqual({tag.strip() for tag in metadata["tags"].split(",")}, {"bmc-config", "enlisting"})
        self.assertRegex(metadata["timeout"], r"^\d\d:\d\d:\d\d$")
        self.assertTrue(metadata["title"] and metadata["description"])


if __name__ == "__main__":
    unittest.main()
