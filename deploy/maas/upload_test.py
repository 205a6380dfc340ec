"""Tests for upload.sh, with a fake maas CLI first on PATH.

    python3 -m unittest discover -s deploy/maas -p '*_test.py' -v
"""

import os
import subprocess
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
UPLOAD = os.path.join(HERE, "upload.sh")

# The fake maas records its arguments and a copy of the uploaded script, and
# answers "node-script read" as if the script existed when EXISTS is set.
FAKE_MAAS = textwrap.dedent("""\
    #!/bin/sh
    echo "$*" >> "$LOG"
    for arg in "$@"; do
      case $arg in script@=*) cp "${arg#script@=}" "$UPLOADED" ;; esac
    done
    if [ "$2" = node-script ] && [ "$3" = read ] && [ -z "${EXISTS:-}" ]; then exit 2; fi
    exit 0
""")


class UploadTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        bin_dir = os.path.join(self.dir.name, "bin")
        os.mkdir(bin_dir)
        maas = os.path.join(bin_dir, "maas")
        with open(maas, "w", encoding="utf-8") as f:
            f.write(FAKE_MAAS)
        os.chmod(maas, 0o755)
        self.log = os.path.join(self.dir.name, "log")
        self.uploaded = os.path.join(self.dir.name, "uploaded")
        self.env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"],
                        LOG=self.log, UPLOADED=self.uploaded)

    def upload(self, *args, exists=False):
        env = dict(self.env, EXISTS="1" if exists else "")
        return subprocess.run([UPLOAD, *args], env=env, capture_output=True, text=True, check=False)

    def calls(self):
        with open(self.log, encoding="utf-8") as f:
            return [line.split() for line in f]

    def test_creates_the_script_with_the_domain(self):
        result = self.upload("admin", "bmc.example.org")
        self.assertEqual(result.returncode, 0, result.stderr)
        calls = self.calls()
        self.assertEqual(calls[-1][:4], ["admin", "node-scripts", "create", "name=50-virtmetal-bmc-config"])
        with open(self.uploaded, encoding="utf-8") as f:
            script = f.read()
        self.assertIn('BMC_DOMAIN = "bmc.example.org"', script)
        self.assertNotIn("@VIRTMETAL_BMC_DOMAIN@", script)

    def test_updates_an_existing_script(self):
        result = self.upload("admin", "bmc.example.org", exists=True)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(self.calls()[-1][:4], ["admin", "node-script", "update", "50-virtmetal-bmc-config"])

    def test_refuses_what_is_not_a_domain(self):
        for domain in ["", "BMC.example.org", "a/b", ".example.org", "x; rm -rf /"]:
            with self.subTest(domain=domain):
                result = self.upload("admin", domain)
                self.assertEqual(result.returncode, 64)
                self.assertFalse(os.path.exists(self.log), "maas was called")


if __name__ == "__main__":
    unittest.main()
