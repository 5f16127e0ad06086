"""`vrepl replay` to a version held by a no-op record (docs/restore.md §8; the first version
of every mastership is one, docs/vnode.md §2): it applies, archives the rows before it and
exits 0, rather than taking the archived version, which a flush of no rows does not move,
for "the WAL ended early"."""
from __future__ import annotations

import json
import subprocess
import sys

from vrepl import wal
from vrepl.vnode import Vnode
from vrepl.vnode.rows import NOOP_PAYLOAD


def _replay(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vrepl.cli", "replay", "--no-progress", *args],
                          capture_output=True, text=True, timeout=60)


def test_replay_ending_in_noops(tmp_path):
    wal_dir = tmp_path / "wal"
    w = wal.WalWriter(str(wal_dir), wal.WalOptions(group_commit_ms=0))
    w.append(NOOP_PAYLOAD, epoch=1)                                               # v1
    w.append(b"VRB\x01" + json.dumps([["t", 1000, {"v": 1}]]).encode(), epoch=1)   # v2
    w.append(NOOP_PAYLOAD, epoch=2)                                               # v3
    w.close()
    to_one = _replay("--wal", str(wal_dir), "--data", str(tmp_path / "d1"), "--to-version", "1")
    assert to_one.returncode == 0, to_one.stderr
    assert "replayed v1..v1 (1 records)" in to_one.stdout
    full = _replay("--wal", str(wal_dir), "--data", str(tmp_path / "d2"))
    assert full.returncode == 0, full.stderr
    assert "replayed v1..v3 (3 records)" in full.stdout
    v = Vnode(str(tmp_path / "d2"))
    try:
        assert v.archived_version == 3
        assert [r["v"] for r in v.query("t", 0, 1 << 40)] == [1]
    finally:
        v.close()
