"""The disk and WAL nemesis of a chaos run (the mixin DiskFaults of ChaosCluster,
vrepl/testing/chaos/harness.py; docs/reliability.md).

Owns: filling a node's tmpfs until writes fail and freeing it, damaging the tail of a dead
node's last WAL file (truncate, flip a bit; tools/walfault.py), and wiping a dead node's
WAL (the operator's answer to a corrupt one).
The cluster's state it uses (nodes, data directories, marks) lives on ChaosCluster.
Must not: touch a running node's WAL, or anything outside the run's directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from vrepl import wal
from vrepl.child import python_argv
from vrepl.testing.chaos.netns import NemesisUnsupported


class DiskFaults:
    def fill_disk(self, i: int) -> None:
        if not self.disk_kib:
            raise NemesisUnsupported("no tmpfs: create the cluster with disk_kib")
        self.mark(f"disk full n{i}")
        path = os.path.join(self.data[i], "filler")
        try:
            with open(path, "wb") as fh:
                while True:
                    fh.write(b"\0" * 65536)
        except OSError:
            pass
        try:
            with open(path, "ab") as fh:
                while True:
                    fh.write(b"\0" * 512)
                    fh.flush()
        except OSError:
            pass

    def free_disk(self, i: int) -> None:
        self.mark(f"disk freed n{i}")
        try:
            os.unlink(os.path.join(self.data[i], "filler"))
        except FileNotFoundError:
            pass

    def damage_wal(self, i: int, how: str, nbytes: int = 100) -> str:
        """truncate: cut nbytes off the last WAL file; corrupt: flip a bit nbytes before its
        end (tools/walfault.py). The node must be dead."""
        assert not self.nodes[i].alive(), "damage a WAL only between a kill and a restart"
        files = wal.list_wal_files(self.wal_dir(i))
        last = files[-1].path
        size = os.path.getsize(last)
        tool = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tools", "walfault.py")
        if how == "truncate":
            argv = ["truncate", self.wal_dir(i), str(min(nbytes, size))]
        else:
            argv = ["flip", self.wal_dir(i), os.path.basename(last), str(max(0, size - nbytes))]
        if os.path.exists(tool):
            out = subprocess.run(python_argv(tool, *argv), capture_output=True, text=True, timeout=30)
            text = (out.stdout + out.stderr).strip()
        else:  # installed without the tools/ directory: same operation inline
            if how == "truncate":
                os.truncate(last, size - min(nbytes, size))
            else:
                with open(last, "r+b") as fh:
                    fh.seek(max(0, size - nbytes))
                    b = fh.read(1)
                    fh.seek(max(0, size - nbytes))
                    fh.write(bytes([b[0] ^ 1]))
            text = f"{last}: {how} {nbytes}"
        self.mark(f"wal {how} n{i}")
        return text

    def wipe_wal(self, i: int) -> None:
        """The operator's answer to a corrupt WAL: remove it (the promise file and the
        archived files stay, so the node still refuses epochs older than it promised) and let
        the master stream the log back."""
        assert not self.nodes[i].alive()
        shutil.rmtree(self.wal_dir(i))
        self.mark(f"wal wiped n{i}")
