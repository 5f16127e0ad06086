"""The staging fsync fault hook (VREPL_FAULT_STAGE_FSYNC, docs/vnode.md §9.5): its value's
rule, and that it fails exactly the N-th fsync of a staging batch, once, like a real fsync
error (the files stay where they were), while every other staging is made durable."""
from __future__ import annotations

import errno
import os

import pytest

from vrepl.vnode import staging as S
from vrepl.vnode import stagingfault as F


@pytest.fixture
def fresh_hook(monkeypatch):
    """The hook as a new process sees it: not read yet."""
    monkeypatch.setattr(F, "_fault_read", False)
    monkeypatch.setattr(F, "_fault", [])


def test_parse_fault():
    assert F.parse_fault("") is None
    assert F.parse_fault("ENOSPC") == (errno.ENOSPC, 1)
    assert F.parse_fault("EIO@3") == (errno.EIO, 3)
    for bad in ("NOSUCH", "ENOPE", "EIO@x", "EIO@0", "errno"):
        with pytest.raises(ValueError, match=F.FAULT_ENV):
            F.parse_fault(bad)


def _files(tmp_path, n: int, tag: str) -> list[tuple[str, int]]:
    out = []
    for k in range(n):
        p = tmp_path / f"{tag}{k}.src"
        p.write_bytes(os.urandom(100))
        out.append((str(p), k))
    return out


def test_the_nth_staging_fsync_fails_once(tmp_path, monkeypatch, fresh_hook):
    monkeypatch.setenv(F.FAULT_ENV, "ENOSPC@2")
    S.stage_files(str(tmp_path), "a" * 16, _files(tmp_path, 2, "a"))        # 1st: staged
    assert sorted(os.listdir(S.staged_round_path(str(tmp_path), "a" * 16))) == ["0.parquet", "1.parquet"]
    moves = _files(tmp_path, 3, "b")
    with pytest.raises(OSError) as info:                                    # 2nd: fails
        S.stage_files(str(tmp_path), "b" * 16, moves)
    assert info.value.errno == errno.ENOSPC and info.value.filename == moves[0][0]
    assert all(os.path.exists(src) for src, _ in moves)                     # nothing moved
    S.stage_files(str(tmp_path), "b" * 16, moves)                           # 3rd: staged (once)
    assert sorted(os.listdir(S.staged_round_path(str(tmp_path), "b" * 16))) == [
        "0.parquet", "1.parquet", "2.parquet"]


def test_unset_never_fails(tmp_path, monkeypatch, fresh_hook):
    monkeypatch.delenv(F.FAULT_ENV, raising=False)
    for k in range(3):
        S.stage_files(str(tmp_path), f"{k:016x}", _files(tmp_path, 2, f"c{k}"))
    assert F._fault == []
