"""The restore flow inside running sync instances (docs/restore.md): a follower that was
down while the master wrote, flushed and recycled its WAL is restored (files + WAL + sync
cache) and becomes slave with identical data; a restore while the master writes at full
speed loses and duplicates nothing; a file rewritten mid-restore restarts the session.
Three instances in this process on 127.0.0.1, real sockets, real files."""
from __future__ import annotations

import threading
import time

import pytest

from vrepl.restore.config import RestoreConfig
from vrepl.child import wait_for
from vrepl.testing.vnodeapp import VnodeApp, make_configs

pytestmark = pytest.mark.timeout(60)


def rows_for(k0: int, n: int, table: str = "t") -> list:
    return [[table, 1_000 + k, {"v": k, "s": f"row{k}"}] for k in range(k0, k0 + n)]


def start_group(tmp_path, restore: RestoreConfig, indexes=(0, 1, 2), **opts):
    # Three instances share this process's GIL with a writer at full speed: a generous
    # heartbeat timeout keeps a busy I/O thread from looking like a dead peer.
    opts.setdefault("heartbeat_timeout_ticks", 100)
    opts.setdefault("forward_timeout_ticks", 100)
    cfgs = make_configs(tmp_path, **opts)
    apps = {i: VnodeApp(cfgs[i], restore=restore).start() for i in indexes}
    return cfgs, apps


def master_of(apps) -> VnodeApp:
    return wait_for("a master", lambda: next((a for a in apps.values() if a.role() == "master"), None))


def stop_all(apps) -> None:
    for a in apps.values():
        try:
            a.stop()
        except Exception:
            pass


def test_follower_down_while_master_writes_and_recycles_is_restored(tmp_path):
    rc = RestoreConfig(min_lag_versions=1, retry_interval_ms=200)
    cfgs, apps = start_group(tmp_path, rc, max_wal_file_bytes=16 * 1024)
    try:
        m = master_of(apps)
        wait_for("slaves", lambda: all(a.role() in ("master", "slave") for a in apps.values()))
        last = m.write(rows_for(10_000, 100))  # every replica has some data
        m.wait_confirmed(last)
        down = next(i for i, a in apps.items() if a is not m)
        wait_for("the follower has the first rows", lambda: apps[down].last_version() == last)
        apps[down].stop()
        del apps[down]
        for k in range(0, 3000, 100):
            last = m.write(rows_for(k, 100))
            if k % 1000 == 900:
                m.wait_confirmed(last)
                m.flush()
        assert m.wait_confirmed(last).describe() == "ok"
        m.flush()
        wait_for("the master's WAL recycled", lambda: m.inst.wal_first_version() > 1)
        for k in range(3000, 3500, 100):  # some records only in the WAL
            last = m.write(rows_for(k, 100))
        m.wait_confirmed(last)
        back = VnodeApp(cfgs[down], restore=rc).start()
        apps[down] = back
        wait_for("restored slave", lambda: back.role() == "slave" and back.last_version() == m.last_version())
        assert back.rows("t") == m.rows("t")
        st = back.inst.restore_status()["counters"]
        assert st["receiver_ok"] >= 1 and st["files_received"] >= 1
        assert ("ok", "") in back.restores
        # It follows live forwards afterwards.
        last = m.write(rows_for(5000, 10))
        m.wait_confirmed(last)
        wait_for("live forward after restore", lambda: back.last_version() == last)
    finally:
        stop_all(apps)


def test_restore_while_master_writes_at_full_speed(tmp_path):
    """Opaque 128-byte records (no vnode work) so the writer really runs at full speed."""
    from vrepl.wal import read_records

    rc = RestoreConfig(min_lag_versions=1, retry_interval_ms=200, switch_lag_versions=500)
    cfgs = make_configs(tmp_path, heartbeat_timeout_ticks=100, forward_timeout_ticks=100,
                        max_wal_file_bytes=256 * 1024)
    apps = {i: VnodeApp(cfgs[i], restore=rc, raw=True).start() for i in range(3)}
    stop = threading.Event()
    try:
        m = master_of(apps)
        wait_for("slaves", lambda: all(a.role() in ("master", "slave") for a in apps.values()))
        down = next(i for i, a in apps.items() if a is not m)
        apps.pop(down).stop()
        sent: dict[int, bytes] = {}
        state = {"next": m.last_version() + 1}

        def put(n: int) -> None:
            # As fast as the master takes them, keeping at most 20 000 unconfirmed (below
            # max_inflight_forwards, so no forward is ever refused).
            v = state["next"]
            for k in range(n):
                payload = (b"%012d" % (v + k)) * 10 + b"x" * 8
                m.write_raw(v + k, payload)
                sent[v + k] = payload
            state["next"] = v + n
            if v + n - 20_000 > 1:
                assert m.wait_confirmed(v + n - 20_000).describe() == "ok"

        while state["next"] < 100_000:
            put(1000)
        m.wait_confirmed(state["next"] - 1)

        def writer() -> None:
            while not stop.is_set():
                put(100)

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        back = VnodeApp(cfgs[down], restore=rc, raw=True).start()
        apps[down] = back
        wait_for("the restored follower becomes slave", lambda: back.role() == "slave", timeout_s=40)
        wait_for("the session's end", lambda: back.inst.restore_status()["counters"]["receiver_ok"] >= 1)
        time.sleep(0.3)  # it keeps up as a slave while the master writes
        assert back.role() == "slave"
        stop.set()
        t.join(10)
        last = state["next"] - 1
        m.wait_confirmed(last)
        # last_version moves when the replica accepts a batch, before the driver has written
        # it; the WAL holds it once the durable version reaches it (what the slave acks).
        wait_for("the slave has every record", lambda: back.last_version() == last
                 and back.inst.stats()["wal"]["durable_version"] >= last)
        # No loss, no duplicate: the WAL holds each version once, with the master's payload.
        recs = read_records(f"{back.cfg.data_path}/wal")
        assert [r.version for r in recs] == list(range(1, last + 1))
        assert all(r.payload == sent[r.version] for r in recs if r.version in sent)
        assert back.inst.restore_status()["counters"]["receiver_ok"] >= 1
    finally:
        stop.set()
        stop_all(apps)


def test_file_rewritten_mid_restore_restarts_and_succeeds(tmp_path, monkeypatch):
    from vrepl.restore import sender as S

    rc = RestoreConfig(min_lag_versions=1, retry_interval_ms=200)
    cfgs, apps = start_group(tmp_path, rc, max_wal_file_bytes=16 * 1024)
    try:
        m = master_of(apps)
        wait_for("slaves", lambda: all(a.role() in ("master", "slave") for a in apps.values()))
        down = next(i for i, a in apps.items() if a is not m)
        apps.pop(down).stop()
        last = 0
        for k in range(0, 2000, 100):
            last = m.write(rows_for(k, 100, "a") + rows_for(k, 100, "b"))
            # One record per WAL append, so the 16 KiB WAL files rotate and the flush can
            # recycle all but the last: writes queued together land in one block, one file.
            m.wait_confirmed(last)
        m.flush()
        wait_for("the WAL recycled below the flush", lambda: m.inst.wal_first_version() > 1)
        real_send = S.DiskSource.send_file
        fired = []

        def send_then_flush(self, io, index, name, size):
            real_send(self, io, index, name, size)
            if not fired:
                fired.append(name)
                # A flush rewrites the file just sent (same table and time bucket).
                v = m.write(rows_for(5000, 10, "a") + rows_for(5000, 10, "b"))
                m.wait_confirmed(v)
                m.flush()

        monkeypatch.setattr(S.DiskSource, "send_file", send_then_flush)
        back = VnodeApp(cfgs[down], restore=rc).start()
        apps[down] = back
        wait_for("restored slave after a restart",
                 lambda: back.role() == "slave" and back.last_version() == m.last_version(), timeout_s=30)
        assert fired
        st = m.inst.restore_status()["counters"]
        assert st["sender_failed"] >= 1 and st["sender_ok"] >= 1
        assert back.rows("a") == m.rows("a") and back.rows("b") == m.rows("b")
    finally:
        stop_all(apps)
