"""The file side of a node's self-restore (vrepl/node/selfrestore.py, docs/operations.md §A
vgroup that needs a restore): the start-up check for a WAL that ends below the archived
version, and the swap of a pulled copy, finished by roll_forward() after a crash at any
point, that never touches the promise file."""
from __future__ import annotations

import os

import pytest

from vrepl.node import selfrestore as S
from vrepl.vnode import Vnode, VnodeConfig
from vrepl.vnode.rows import encode_rows
from vrepl.wal import WalOptions, WalWriter

pytestmark = pytest.mark.timeout(60)


def make_vgroup(path: str, records: int, archive_upto: int | None, truncate_after: int | None,
                tag: str) -> None:
    """A vgroup directory: `records` WAL records (epoch 1) of table t, archived up to
    `archive_upto` (None: nothing), the WAL cut after `truncate_after` (None: not cut)."""
    w = WalWriter(os.path.join(path, "wal"), WalOptions(durability="fsync"))
    for i in range(records):
        w.append(encode_rows([["t", i, {"tag": tag}]]), 1)
    v = Vnode(path, VnodeConfig())
    v.recover()
    if archive_upto is not None:
        v.flush(up_to_version=archive_upto)
    v.close(up_to_version=0)
    if truncate_after is not None:
        w.truncate_after(truncate_after)
    w.close()
    with open(os.path.join(path, "promise"), "wb") as fh:
        fh.write(b"promise of " + tag.encode())


def test_wal_below_archive_only_for_a_non_empty_wal_ending_below_it(tmp_path):
    ok, bad, empty = (str(tmp_path / n) for n in ("ok", "bad", "empty"))
    make_vgroup(ok, 5, 3, None, "ok")
    assert S.wal_below_archive(ok) is None and S.wal_end(ok) == (1, 5)
    make_vgroup(bad, 5, 5, 2, "bad")
    assert S.wal_below_archive(bad) == ("the WAL ends at v2, below the archived version v5:"
                                        " archived files hold versions the log no longer has")
    os.makedirs(os.path.join(empty, "wal"))
    assert S.wal_below_archive(empty) is None and S.wal_end(empty) == (0, 0)


def _tags(path: str) -> list[str]:
    v = Vnode(path, VnodeConfig())
    v.recover()
    rows = [r["tag"] for r in v.query("t", 0, 100)]
    v.close(up_to_version=0)
    return rows


@pytest.mark.parametrize("crash_after", [0, 1, 2, 3])
def test_swap_replaces_data_and_wal_keeps_the_promise_and_survives_a_crash(tmp_path, monkeypatch,
                                                                           crash_after):
    path = str(tmp_path / "vg1")
    make_vgroup(path, 4, 4, 1, "wrong")
    make_vgroup(S.copy_path(path), 6, 2, None, "right")
    os.unlink(os.path.join(S.copy_path(path), "promise"))
    os.makedirs(os.path.join(path, ".vrepl-restore"))        # the live restore's staging
    real_replace = os.replace
    moves = []

    def replace(src, dst):
        if len(moves) == crash_after:
            raise OSError("crash")
        moves.append((src, dst))
        real_replace(src, dst)

    monkeypatch.setattr(S.os, "replace", replace)
    with pytest.raises(OSError, match="crash"):
        S.swap(path)
    assert len(moves) == crash_after
    assert os.path.exists(os.path.join(S.staging_path(path), S.READY))
    monkeypatch.setattr(S.os, "replace", real_replace)
    # The next start (or the next attempt) finishes the swap.
    assert S.roll_forward(path).startswith("swapped in the restored copy")
    assert S.roll_forward(path) is None
    assert not os.path.exists(S.staging_path(path))
    assert not os.path.exists(os.path.join(path, ".vrepl-restore"))
    assert S.wal_below_archive(path) is None and S.wal_end(path) == (1, 6)
    assert _tags(path) == ["right"] * 6
    with open(os.path.join(path, "promise"), "rb") as fh:
        assert fh.read() == b"promise of wrong"


def test_an_incomplete_copy_is_left_for_the_next_pull(tmp_path):
    path = str(tmp_path / "vg1")
    make_vgroup(path, 3, 3, 1, "wrong")
    os.makedirs(os.path.join(S.copy_path(path), "data"))
    assert S.roll_forward(path) is None                      # no READY: nothing moves
    assert os.path.isdir(S.copy_path(path)) and _tags(path) == ["wrong"] * 3
