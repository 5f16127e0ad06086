"""The process's one WAL thread (vrepl/transport/walflush.py) running the jobs of many WAL
stores (vrepl/transport/storage.py), and many sync instances in one process sharing it
(docs/perf.md §Many vgroups): per-store order, failure isolation, draining on close, one
hand-off of a round's completions per event loop, and connections whose receive buffers
start small and still take frames far larger than they start with."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Callable

import pytest

from vrepl import _core  # noqa: F401  (built extensions)
from vrepl._core import record as rec
from vrepl.config import ReplicaAddress, SyncConfig
from vrepl.replica import ConfirmStatus
from vrepl.child import free_ports
from vrepl.sync import SyncCallbacks, SyncInstance
from vrepl.transport import walflush
from vrepl.transport.node import READ_CHUNK_BYTES, READ_MIN_BYTES
from vrepl.transport.storage import INLINE_FAST_MAX_BYTES, INLINE_MAX_COMMIT_S, WalStore
from vrepl.wal import MSG_TYPE_DATA, read_records

pytestmark = pytest.mark.timeout(60)
SECRET = b"unit-secret"


def wal_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("vrepl-wal")]


class Events:
    """What a store reports, in order, with the thread each report came from."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []
        self.cond = threading.Condition()

    def add(self, *item) -> None:
        with self.cond:
            self.seen.append((*item, threading.current_thread().name))
            self.cond.notify_all()

    def wait(self, pred, timeout_s: float = 10.0) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: pred(self.seen), timeout_s), self.seen


def open_store(path, ev: Events) -> WalStore:
    store = WalStore(str(path), on_durable=lambda v: ev.add("durable", v),
                     on_truncated=lambda e, v: ev.add("truncated", v),
                     on_error=lambda exc: ev.add("error", type(exc).__name__))
    store.open()
    return store


def block(first: int, n: int, epoch: int = 1) -> bytes:
    return rec.encode_batch(MSG_TYPE_DATA, first, epoch, [b"r%d" % (first + i) for i in range(n)])


def test_sixteen_stores_share_one_wal_thread_and_keep_their_own_order(tmp_path):
    events = [Events() for _ in range(16)]
    stores = [open_store(tmp_path / f"vg{i}", ev) for i, ev in enumerate(events)]
    try:
        assert wal_threads() == ["vrepl-wal"]
        for first in (1, 11, 21):
            for store in stores:
                store.append(first, first + 9, block(first, 10))
        stores[3].truncate_after(25)
        stores[3].append(26, 26, block(26, 1))
        for i, ev in enumerate(events):
            end = 26 if i == 3 else 30
            ev.wait(lambda seen, end=end: any(s[:2] == ("durable", end) for s in seen))
        assert wal_threads() == ["vrepl-wal"]
        for i, ev in enumerate(events):
            assert {s[2] for s in ev.seen} == {"vrepl-wal"}
            kinds = [s[:2] for s in ev.seen]
            durable = [v for k, v in kinds if k == "durable"]
            if i != 3:
                assert durable == sorted(durable) and durable[-1] == 30
        # The store that was cut: every durable report for the earlier appends first, then
        # the truncation, then the append after it.
        kinds = [s[:2] for s in events[3].seen]
        cut = kinds.index(("truncated", 25))
        assert all(k == "durable" and v <= 30 for k, v in kinds[:cut])
        assert ("durable", 30) in kinds[:cut] and kinds[cut + 1:] == [("durable", 26)]
    finally:
        for store in stores:
            store.close()
    assert wal_threads() == []      # the last store closed stops the thread
    for i in range(16):
        versions = [r.version for r in read_records(str(tmp_path / f"vg{i}" / "wal"))]
        assert versions == (list(range(1, 27)) if i == 3 else list(range(1, 31)))


def test_a_failing_store_stops_alone(tmp_path):
    bad_ev, good_ev = Events(), Events()
    bad, good = open_store(tmp_path / "bad", bad_ev), open_store(tmp_path / "good", good_ev)
    try:
        bad.append(5, 5, block(5, 1))          # does not continue the log (it is empty)
        bad.append(1, 1, block(1, 1))          # queued after the failure: never written
        good.append(1, 3, block(1, 3))
        bad_ev.wait(lambda seen: any(s[0] == "error" for s in seen))
        good_ev.wait(lambda seen: ("durable", 3, "vrepl-wal") in seen)
        good.append(4, 4, block(4, 1))
        good_ev.wait(lambda seen: ("durable", 4, "vrepl-wal") in seen)
        assert [s[:2] for s in bad_ev.seen] == [("error", "VersionError")]
    finally:
        bad.close(timeout_s=2)
        good.close()
    assert read_records(str(tmp_path / "bad" / "wal")) == []
    assert [r.version for r in read_records(str(tmp_path / "good" / "wal"))] == [1, 2, 3, 4]


@pytest.mark.parametrize("defer_wake", [False, True])
def test_close_writes_what_was_queued(tmp_path, defer_wake):
    ev = Events()
    store = open_store(tmp_path / "s", ev)
    store.defer_wake = defer_wake  # True: nothing was handed over before close
    for first in range(1, 200, 10):
        store.append(first, first + 9, block(first, 10))
    began = time.monotonic()
    store.close()
    assert time.monotonic() - began < 5  # not the close timeout (10 s)
    assert [r.version for r in read_records(str(tmp_path / "s" / "wal"))] == list(range(1, 201))
    assert ("durable", 200) in [s[:2] for s in ev.seen]


def test_a_deferred_store_runs_a_small_batch_inline_without_waking_the_wal_thread(tmp_path):
    """With defer_wake (max_wal_inline_sync_bytes > 0) a queued append waits for the end of
    the batch: run_inline makes it durable on the calling thread and the WAL thread runs no
    round for it (woken for nothing, it took the GIL from the loop during the inline
    fdatasync, docs/perf.md §15); a batch too large to run inline is handed over by kick()."""
    ev = Events()
    store = open_store(tmp_path / "s", ev)
    store.defer_wake = True
    flusher = walflush._shared
    try:
        rounds = flusher.rounds
        store.append(1, 1, block(1, 1))
        time.sleep(0.2)
        assert ev.seen == [] and flusher.rounds == rounds      # queued, not handed over
        assert store.run_inline(4096)
        assert ev.seen == [("durable", 1, threading.current_thread().name)]
        assert flusher.rounds == rounds
        store.append(2, 101, block(2, 100))                    # 100 records: above 1 KiB
        assert not store.run_inline(1024)
        time.sleep(0.2)
        assert len(ev.seen) == 1 and flusher.rounds == rounds  # still waiting for the kick
        store.kick()
        ev.wait(lambda seen: ("durable", 101, "vrepl-wal") in seen)
        assert flusher.rounds > rounds
        store.kick()                                           # nothing queued: a no-op
    finally:
        store.close()
    assert [r.version for r in read_records(str(tmp_path / "s" / "wal"))] == list(range(1, 102))


class Posting:
    """A store whose jobs post completions to an event loop the way the sync instance does."""

    def __init__(self, loop, out: list, fail_first: bool = False) -> None:
        self.loop, self.out, self.fail_first = loop, out, fail_first

    def take_jobs(self):
        return [1, 2]

    def run_jobs(self, jobs) -> None:
        for j in jobs:
            def cb(j=j):
                if self.fail_first and j == 1:
                    raise RuntimeError("boom")
                self.out.append((id(self), j, threading.current_thread().name))
            assert walflush.collect(self.loop, cb)

    def jobs_done(self) -> None:
        pass


def test_a_round_hands_its_completions_to_the_loop_once_in_order():
    loop = asyncio.new_event_loop()
    errors: list = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(str(ctx.get("exception"))))
    wakeups = []
    real = loop.call_soon_threadsafe
    loop.call_soon_threadsafe = lambda *a, **k: (wakeups.append(a[0]), real(*a, **k))[1]  # type: ignore[method-assign]
    t = threading.Thread(target=loop.run_forever, name="test-loop", daemon=True)
    t.start()
    out: list = []
    flusher = walflush.WalFlusher(name="vrepl-wal-test")
    try:
        a, b = Posting(loop, out, fail_first=True), Posting(loop, out)
        assert not walflush.collect(loop, lambda: None)     # not on a WAL thread in a round
        flusher.schedule(a)
        flusher.schedule(b)
        deadline = time.monotonic() + 5
        while len(out) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        assert out == [(id(a), 2, "test-loop"), (id(b), 1, "test-loop"), (id(b), 2, "test-loop")]
        assert errors == ["boom"]
        assert len(wakeups) <= 2 and flusher.rounds <= 2   # one hand-off per round, not per job
    finally:
        flusher.release()                     # not the shared one: its only user stops it
        loop.call_soon_threadsafe(loop.stop)
        t.join(5)
        loop.close()


class HandOffLoop:
    """An event loop stand-in for a round's hand-off: at the instant a round hands its
    completions over, it first does what the real loop might do then (`at_hand_off`, once),
    then runs them."""

    def __init__(self) -> None:
        self.at_hand_off: Callable[[], None] | None = None

    def call_soon_threadsafe(self, fn, *args) -> None:
        turn, self.at_hand_off = self.at_hand_off, None
        if turn is not None:
            turn()
        fn(*args)


def test_the_loop_cannot_run_a_store_inline_before_the_rounds_reports_reach_it(tmp_path):
    """A round's completions reach the loop in one call_soon_threadsafe at its end, an
    inline run's by call_soon. Were the store free for inline runs before that hand-off, the
    loop could cut the WAL and append again inline, and the round's stale "durable up to 5"
    would arrive after, marking the new v5 durable before its fdatasync. So the store stays
    held until the hand-off is done: the inline run declines and the reports keep order."""
    reports: list = []
    cond = threading.Condition()
    loop = HandOffLoop()

    def post(report) -> None:
        def deliver() -> None:
            with cond:
                reports.append(report)
                cond.notify_all()
        if not walflush.collect(loop, deliver):   # type: ignore[arg-type]
            deliver()                              # an inline run on "the loop" itself

    store = WalStore(str(tmp_path / "s"), on_durable=lambda v: post(("durable", v)),
                     on_truncated=lambda e, v: post(("truncated", v)),
                     on_error=lambda exc: post(("error", repr(exc))))
    store.open()
    store.defer_wake = True                        # nothing goes to the shared thread by itself
    inline_ran: list[bool] = []

    def loop_turn() -> None:
        store.truncate_after(3)
        store.append(4, 5, block(4, 2, epoch=2))
        inline_ran.append(store.run_inline(4096))

    loop.at_hand_off = loop_turn
    flusher = walflush.WalFlusher(name="vrepl-wal-test")
    try:
        store.append(1, 5, block(1, 5))
        flusher.run_round([store])                 # this thread plays the WAL thread's round
        assert inline_ran == [False]               # still held by the round at its hand-off
        with cond:                                 # the cut and the new v4-v5: the WAL thread
            assert cond.wait_for(lambda: len(reports) >= 3, 10), reports
        assert reports == [("durable", 5), ("truncated", 3), ("durable", 5)]
    finally:
        flusher.release()
        store.close()
    assert [(r.version, r.epoch) for r in read_records(str(tmp_path / "s" / "wal"))] == [
        (1, 1), (2, 1), (3, 1), (4, 2), (5, 2)]


def test_many_instances_in_one_process_use_one_wal_thread_and_small_read_buffers(tmp_path):
    """Four vgroups on three "nodes" (all in this process): one WAL thread, every link's
    receive buffer at its small start while idle, and a record of 600 KB (far above the
    4 KiB start and the 256 KiB read chunk) replicated intact."""
    ports = sorted(free_ports(3))
    replicas = tuple(ReplicaAddress(i + 1, "127.0.0.1", p) for i, p in enumerate(ports))
    confirms: dict[tuple[int, int], ConfirmStatus] = {}
    applied: dict[tuple[int, int], bytes] = {}
    cond = threading.Condition()
    insts: dict[tuple[int, int], SyncInstance] = {}

    def callbacks(vg: int, i: int) -> SyncCallbacks:
        def confirm(v, status):
            with cond:
                confirms[(vg, v)] = status
                cond.notify_all()

        def write(v, payload):
            applied[(vg, i, v)] = payload          # type: ignore[index]
            insts[(vg, i)].ack_forward(v)
        return SyncCallbacks(write_to_cache=write, confirm_forward=confirm)

    try:
        for vg in range(1, 5):
            for i in range(3):
                cfg = SyncConfig(vgroup_id=vg, replicas=replicas, self_index=i,
                                 data_path=str(tmp_path / f"n{i + 1}" / f"vg{vg}"), secret=SECRET)
                insts[(vg, i)] = SyncInstance(cfg, callbacks(vg, i)).start()
        assert wal_threads() == ["vrepl-wal"]
        masters = {}
        deadline = time.monotonic() + 20
        while len(masters) < 4 and time.monotonic() < deadline:
            for vg in range(1, 5):
                roles = {i: insts[(vg, i)].roles()["role"] for i in range(3)}
                if list(roles.values()).count("master") == 1 and list(roles.values()).count("slave") == 2:
                    masters[vg] = next(i for i, r in roles.items() if r == "master")
            time.sleep(0.05)
        assert len(masters) == 4, masters
        for key, inst in insts.items():
            hints = inst.io.call(lambda inst=inst: [c._read_hint for c in inst._links.conns.values()])
            assert hints and all(h == READ_MIN_BYTES for h in hints), (key, hints)
        big = bytes(range(256)) * 2400          # 614,400 bytes
        for vg, m in masters.items():
            insts[(vg, m)].forward(1, big)
            insts[(vg, m)].forward(2, b"small")
        with cond:
            assert cond.wait_for(lambda: len(confirms) == 8, 20), confirms
        assert set(confirms.values()) == {ConfirmStatus.OK}
        grown = []
        for vg, m in masters.items():
            for i in range(3):
                if i != m:
                    inst = insts[(vg, i)]
                    grown += inst.io.call(lambda inst=inst: [c._read_hint for c in inst._links.conns.values()])
        assert max(grown) == READ_CHUNK_BYTES
    finally:
        for inst in insts.values():
            inst.stop()
    assert wal_threads() == []
    for vg in range(1, 5):
        wals = [[r.payload for r in read_records(str(tmp_path / f"n{i + 1}" / f"vg{vg}" / "wal"))]
                for i in range(3)]
        assert wals[0] == wals[1] == wals[2] and wals[0][-2:] == [big, b"small"]


@pytest.mark.parametrize("inline_bytes, inline_commit_us", [(4096, 0), (0, 10_000_000)],
                         ids=["small-batches", "fast-storage"])
def test_inline_sync_replicates_small_and_large_batches(tmp_path, inline_bytes, inline_commit_us):
    """Inline sync on (LoopStorage: defer_wake, run_inline or kick at each batch's end).
    Small batches only (max_wal_inline_sync_bytes): one-record forwards are made durable on
    the I/O threads, a 600 KB record goes to the WAL thread. Fast storage
    (max_wal_inline_commit_us, here so high that this disk counts as fast): every batch,
    the 600 KB record too, runs on the I/O threads and the WAL thread runs no round for
    them. Either way every forward is confirmed OK, the three WALs are equal, and stopping
    does not wait out the close timeout."""
    ports = sorted(free_ports(3))
    replicas = tuple(ReplicaAddress(i + 1, "127.0.0.1", p) for i, p in enumerate(ports))
    confirms: dict[int, ConfirmStatus] = {}
    cond = threading.Condition()
    insts: dict[int, SyncInstance] = {}

    def callbacks(i: int) -> SyncCallbacks:
        def confirm(v, status):
            with cond:
                confirms[v] = status
                cond.notify_all()

        def write(v, payload):
            insts[i].ack_forward(v)
        return SyncCallbacks(write_to_cache=write, confirm_forward=confirm)

    big = bytes(range(256)) * 2400
    try:
        for i in range(3):
            cfg = SyncConfig(vgroup_id=1, replicas=replicas, self_index=i, secret=SECRET,
                             data_path=str(tmp_path / f"n{i + 1}"), max_wal_inline_sync_bytes=inline_bytes,
                             max_wal_inline_commit_us=inline_commit_us)
            insts[i] = SyncInstance(cfg, callbacks(i)).start()
        assert all(inst._storage.store.defer_wake for inst in insts.values())
        deadline = time.monotonic() + 20
        master = None
        while master is None and time.monotonic() < deadline:
            roles = {i: insts[i].roles()["role"] for i in range(3)}
            if sorted(roles.values()) == ["master", "slave", "slave"]:
                master = next(i for i, r in roles.items() if r == "master")
            time.sleep(0.05)
        assert master is not None
        rounds = walflush._shared.rounds
        for v in range(1, 41):
            insts[master].forward(v, b"row %d" % v)
            with cond:
                assert cond.wait_for(lambda v=v: v in confirms, 10), v
        insts[master].forward(41, big)
        insts[master].forward(42, b"after")
        with cond:
            assert cond.wait_for(lambda: len(confirms) == 42, 20), sorted(confirms)
        assert set(confirms.values()) == {ConfirmStatus.OK}
        if inline_commit_us:
            assert walflush._shared.rounds == rounds  # no job went to the WAL thread
        else:
            assert walflush._shared.rounds > rounds   # the 600 KB record did
    finally:
        began = time.monotonic()
        for inst in insts.values():
            inst.stop()
        assert time.monotonic() - began < 8
    wals = [[r.payload for r in read_records(str(tmp_path / f"n{i + 1}" / "wal"))] for i in range(3)]
    assert wals[0] == wals[1] == wals[2]
    assert wals[0][-3:] == [b"row 40", big, b"after"]


def test_a_store_whose_commits_are_slow_leaves_them_to_the_wal_thread(tmp_path):
    """run_inline declines while the moving average of the store's group commits is above
    INLINE_MAX_COMMIT_S (a slow disk must not stall the loop), and takes them again once
    the commits are fast."""
    ev = Events()
    store = open_store(tmp_path / "s", ev)
    store.defer_wake = True
    try:
        store.commit_s_ewma = 10 * INLINE_MAX_COMMIT_S      # as after slow commits
        store.append(1, 1, block(1, 1))
        assert not store.run_inline(4096)
        store.kick()
        ev.wait(lambda seen: ("durable", 1, "vrepl-wal") in seen)
        assert store.commit_s_ewma < 10 * INLINE_MAX_COMMIT_S  # the WAL thread's commit counted
        store.commit_s_ewma = 0.0
        store.append(2, 2, block(2, 1))
        assert store.run_inline(4096)
        assert ev.seen[-1] == ("durable", 2, threading.current_thread().name)
    finally:
        store.close()


def test_on_fast_storage_batches_of_any_size_run_inline_with_hysteresis(tmp_path):
    """max_wal_inline_commit_us: while the store's group commits average at most
    fast_commit_s, run_inline takes a batch larger than max_bytes (up to
    INLINE_FAST_MAX_BYTES); once in, it stays in up to twice the bound, and comes back only
    at the bound. Outside it the small-batch rule alone applies. fast_commit_s = 0 is off."""
    ev = Events()
    store = open_store(tmp_path / "s", ev)
    store.defer_wake = True
    fast_s = 100e-6
    big = 100  # records: a block above the 1 KiB small-batch bound
    v = 0

    def queue(n: int) -> int:
        nonlocal v
        store.append(v + 1, v + n, block(v + 1, n))
        v += n
        return v

    def inline_with(ewma_s: float, fast: float = fast_s) -> bool:
        store.commit_s_ewma = ewma_s
        return store.run_inline(1024, fast)

    try:
        last = queue(big)
        assert not inline_with(0.0, fast=0.0)                 # off: too large for the small rule
        assert inline_with(50e-6) and store.fast_inline       # fast storage: any size
        assert ev.seen[-1] == ("durable", last, threading.current_thread().name)
        last = queue(big)
        assert inline_with(150e-6)                            # in: stays up to 2 x the bound
        last = queue(big)
        assert not inline_with(250e-6) and not store.fast_inline  # out above 2 x
        assert not inline_with(150e-6)                        # and not back in above the bound
        assert inline_with(90e-6)                             # back at the bound
        assert ev.seen[-1] == ("durable", last, threading.current_thread().name)
        last = queue(1)
        assert inline_with(500e-6)                            # small batch: the 1 ms rule
        huge = INLINE_FAST_MAX_BYTES // 1000 + 10             # records of ~1 KB: above 1 MiB
        store.append(v + 1, v + huge, rec.encode_batch(MSG_TYPE_DATA, v + 1, 1, [b"x" * 1000] * huge))
        v += huge
        assert not inline_with(10e-6)                         # too large even for fast storage
        store.kick()
        ev.wait(lambda seen: ("durable", v, "vrepl-wal") in seen)
    finally:
        store.close()
    assert [r.version for r in read_records(str(tmp_path / "s" / "wal"))] == list(range(1, v + 1))
