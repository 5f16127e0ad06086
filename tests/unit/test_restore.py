"""Restore pieces without I/O or with local files only: the sync protocol's codec (fed whole
and refused when malformed), name confinement, the per-node limiter, the swap journal, and
the replica's restore events (docs/restore.md; docs/design.md §4.3)."""
from __future__ import annotations

import os
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vrepl._core import record as _rec
from vrepl.errors import FrameError
from vrepl.replica import (
    ForwardBatch,
    LogRebased,
    PeerRestoreCaughtUp,
    PeerRestoring,
    Received,
    Replica,
    RestoreBegun,
    RestoredRecords,
    RestoreEnded,
    Role,
    Send,
    StreamWalFrom,
    SyncRequest,
    SyncStart,
)
from vrepl.replica.forward import PeerState
from vrepl.replica import Config
from vrepl.restore import protocol as P
from vrepl.restore.errors import UnsafeName
from vrepl.restore.limiter import RestoreLimiter
from vrepl.restore.paths import confined, name_refusal
from vrepl.restore.receiver import Staging, recover_interrupted_swap

pytestmark = pytest.mark.timeout(30)


def roundtrip(msg):
    frame = P.encode(msg)
    return P.decode(_rec.decode_record(frame, 0, P.MAX_FRAME_PAYLOAD_BYTES))


MESSAGES = [
    P.SyncBegin(3, 100, P.FLAG_FILES | P.FLAG_LIVE, 7, 12345, 0),
    P.FileInfo(4, 99, 0xDEADBEEF, "data/t/b1-v3.parquet"),
    P.FileData(4, 99),
    P.FilesEnd(5),
    P.WalBegin(42, 2, ((1, 1), (2, 30))),
    P.WalData(1 << 33),
    P.WalEnd(77),
    P.Error("no space left"),
    P.FileAck(4, 1),
    P.WalRequest(42),
    P.Done(77),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_protocol_roundtrip(msg):
    assert roundtrip(msg) == msg
    assert msg.describe()


@given(st.integers(0, 2**63), st.integers(0, 2**64 - 1), st.integers(1, 2**32 - 1),
       st.text(min_size=1, max_size=200))
def test_file_info_roundtrip_any(index, size, magic, name):
    assert roundtrip(P.FileInfo(index, size, magic, name)) == P.FileInfo(index, size, magic, name)


def test_protocol_refuses_malformed():
    bad = _rec.decode_record(_rec.encode_record(P.SyncMsg.FILE_ACK, 1, 0, b"\x05"), 0, 1000)
    with pytest.raises(FrameError, match="need 5"):
        P.decode(bad)
    bad = _rec.decode_record(_rec.encode_record(P.SyncMsg.FILE_INFO, 1, 0, b"\x00" * 14 + b"\xff\x00"), 0, 1000)
    with pytest.raises(FrameError, match="FILE_INFO"):
        P.decode(bad)
    bad = _rec.decode_record(_rec.encode_record(90, 1, 0, b""), 0, 1000)
    with pytest.raises(FrameError, match="unknown sync message type 90"):
        P.decode(bad)


@pytest.mark.parametrize("name", ["", "/etc/passwd", "../x", "a/../../b", "a//b", "./a", "a/.", "x\x00y", "a\\b",
                                  ".vrepl-restore/files/x", "x" * 2000])
def test_hostile_names_refused(name):
    assert name_refusal(name) is not None


def test_symlink_components_refused(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "root").mkdir()
    os.symlink(tmp_path / "out", tmp_path / "root" / "lnk")
    with pytest.raises(UnsafeName, match="symlink"):
        confined(str(tmp_path / "root"), "lnk/f")
    assert confined(str(tmp_path / "root"), "data/f") == str(tmp_path / "root" / "data" / "f")


def test_limiter_queues_beyond_max_and_logs(caplog):
    lim = RestoreLimiter(2)
    assert lim.acquire("a", "a", lambda: False) and lim.acquire("b", "b", lambda: False)
    got = []
    t = threading.Thread(target=lambda: got.append(lim.acquire("c", "restore c", lambda: False)))
    with caplog.at_level("INFO", logger="vrepl.restore"):
        t.start()
        time.sleep(0.1)
        assert not got and lim.snapshot()["waiting"] == 1
        lim.release("a")
        t.join(2)
    assert got == [True] and lim.snapshot()["running"] == 2
    assert "queued behind 2 running restores (max_concurrent_restores 2)" in caplog.text
    cancelled = lim.acquire("d", "d", lambda: True)
    assert cancelled is False and lim.snapshot()["waiting"] == 0


def test_interrupted_swap_rolls_forward_or_is_abandoned(tmp_path):
    data = tmp_path / "d"
    (data / "data").mkdir(parents=True)
    (data / "data" / "old").write_bytes(b"old")
    s = Staging(str(data), fsync=False)
    for name in ("data/a", "data/manifest"):
        p = s.staged_path(name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as fh:
            fh.write(name.encode())
    # A crash after the journal was written, before anything moved: roll forward.
    import json
    with open(os.path.join(s.root, "swap.json"), "w") as fh:
        json.dump({"move": ["data/a", "data/manifest"], "remove": ["data/old"]}, fh)
    assert "finished" in recover_interrupted_swap(str(data), fsync=False)
    assert (data / "data" / "manifest").read_bytes() == b"data/manifest"
    assert not (data / "data" / "old").exists() and not (data / ".vrepl-restore").exists()
    # A moved file the app removed since (an orphan): the swap is abandoned, old data used.
    s = Staging(str(data), fsync=False)
    p = s.staged_path("data/m2")
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "wb") as fh:
        fh.write(b"m2")
    with open(os.path.join(s.root, "swap.json"), "w") as fh:
        json.dump({"move": ["data/gone", "data/m2"], "remove": []}, fh)
    assert "abandoned" in recover_interrupted_swap(str(data), fsync=False)
    assert not (data / "data" / "m2").exists()


# -- the replica's restore events --------------------------------------------------------------


def follower_and_master():
    """n1 master e1 of (n1, n2); returns (master, follower) after the follower's SyncRequest."""
    m = Replica(Config(vgroup_id=1, replicas=(1, 2), self_index=0, last_epoch=1, last_version=10,
                       epoch_history=((1, 1),), promised_epoch=2, promised_master=1))
    f = Replica(Config(vgroup_id=1, replicas=(1, 2), self_index=1, promised_epoch=2, promised_master=1))
    m.start()
    f.start()
    from vrepl.replica import PeerConnected, Heartbeat
    m.step(PeerConnected(2))
    f.step(PeerConnected(1))
    for _ in range(3):
        for a in m.step(Received(2, Heartbeat(f.view()))) + m.tick():
            pass
        f.step(Received(1, Heartbeat(m.view())))
    return m, f


def deliver(actions, to: Replica, sender: int):
    out = []
    for a in actions:
        if isinstance(a, Send):
            out += to.step(Received(sender, a.message))
    return out


def test_replica_restore_events_hold_live_forwards_then_sync_cache():
    m, f = follower_and_master()
    assert m.role == Role.MASTER and f.role == Role.SYNCING
    e = m.promised_epoch
    acts = m.step(Received(2, SyncRequest(e, 0, 0)))
    assert any(isinstance(a, StreamWalFrom) for a in acts)
    deliver([a for a in acts if isinstance(a, Send) and isinstance(a.message, SyncStart)], f, 1)
    assert f.sync_started
    m.step(PeerRestoring(2))
    assert m.peers[1].state == PeerState.RESTORING
    from vrepl.replica import AppForwardBatch
    acts = m.step(AppForwardBatch(11, (b"x",)))
    assert not any(isinstance(a, Send) and isinstance(a.message, ForwardBatch) for a in acts), "no live forward yet"
    # Follower: the restore begins; files rebase the log at v10; records come from the stream.
    f.step(RestoreBegun(1, e))
    assert f.restoring and f.role == Role.SYNCING
    f.step(LogRebased(1, 8, ((1, 1),)))
    assert (f.last_epoch, f.last_version) == (1, 8)
    f.step(RestoredRecords(1, ForwardBatch(e, 9, 1, (1, 1), (b"9", b"10"))))
    assert f.last_version == 10 and f.role == Role.SYNCING, "stays syncing while the restore runs"
    # Master switches: v12 goes live and waits in the follower's sync cache.
    m.step(PeerRestoreCaughtUp(2))
    assert m.peers[1].state == PeerState.REPLICATING
    acts = m.step(AppForwardBatch(12, (b"y",)))
    deliver(acts, f, 1)
    assert len(f.cache) == 1 and f.last_version == 10
    f.step(RestoredRecords(1, ForwardBatch(e, 11, 1, (e,), (b"x",))))
    assert f.last_version == 12 and not len(f.cache)
    acts = f.step(RestoreEnded(1, True))
    assert f.role == Role.SLAVE
    assert any(isinstance(a, Send) and a.message.describe().startswith("status") for a in acts), "broadcasts"


def test_replica_restore_failure_resyncs_and_overflow_ends_restoring():
    m, f = follower_and_master()
    e = m.promised_epoch
    acts = m.step(Received(2, SyncRequest(e, 0, 0)))
    deliver([a for a in acts if isinstance(a, Send)], f, 1)
    f.step(RestoreBegun(1, e))
    acts = f.step(RestoreEnded(1, False, "disk full"))
    assert not f.restoring and f.role == Role.SYNCING
    assert any(isinstance(a, Send) and isinstance(a.message, SyncRequest) for a in acts)
    # A RestoreBegun from a node it does not follow is refused.
    f2 = Replica(Config(vgroup_id=1, replicas=(1, 2), self_index=1))
    f2.start()
    f2.step(RestoreBegun(1, e))
    assert not f2.restoring
