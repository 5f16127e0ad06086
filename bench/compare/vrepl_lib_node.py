"""One vrepl replica at library level in its own process, driven by the harness over stdio.

Usage (by drivers/vrepl_driver.py only):
    python -m bench.compare.vrepl_lib_node CONFIG.json

The replica is vrepl.testing.node_runner's Runner: a SyncInstance with its own WAL (group
commit) and replication server, whose app on a slave acks every forwarded record at once
(write_to_cache_batch -> ack_forward, after the WAL append is durable: the sync instance
acks only durable records). The writers of both workloads run here, in the master's
process, calling `SyncInstance.forward_many()` (docs/embedding.md): a write is one record
(key + value); a single write is a run of one record, a batch of N writes is one
`forward_many()` call of N records (the library's equivalent of N pipelined SETs and one
WAIT), and the writer waits for all N together. With "batch_as_record" in the config (the
`vrepl-lib-1rec` system) a batch of N writes is ONE record instead, the N writes packed
with a 4-byte length before each (`pack_writes`): the shape of an etcd txn or a PySyncObj
`update`, one log entry per batch.

Where the writers run ("writers" in the config):
  "loop"     coroutines on the instance's I/O loop (the default): forward_many() runs
             directly and the confirmation resolves a future on the same thread, as the
             vrepl node serves its HTTP writes. No thread hand-off on the write path.
  "threads"  one thread per writer: forward_many() queues the records for the I/O thread,
             and the confirmation wakes the writer (a held Lock it releases): two
             hand-offs per batch, each a futex wake and a GIL transfer.
Confirmations arrive on the I/O thread (confirm_forward_range) and wake the writer whose
last record they cover.

Protocol: one JSON object per line on stdin, one JSON reply per line on stdout:
    {"cmd": "status"}                    -> {"role": "master" | "slave" | ...}
    {"cmd": "latency", "spec": {...}}    -> workload.latency_loop result
    {"cmd": "throughput", "spec": {...}} -> workload.run_client_coroutines (loop) or
                                            run_client_threads (threads) result
(both with "records_forwarded": the log entries the command added, warm-up included)
    {"cmd": "quit"}                      -> exits
Errors come back as {"error": "..."}.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import time

WRITERS = ("loop", "threads")
CONFIRM_TIMEOUT_S = 10.0


class Writers:
    """Versions for the writers and the wake-up of each one when its records are confirmed.
    Versions must reach forward_many() strictly in order. A waiter is [wake, error, first]:
    `wake` is what the confirmation releases (a held Lock for a thread, a Future for a
    coroutine), `error` says why its range was not confirmed."""

    def __init__(self, inst) -> None:
        self.inst = inst
        self.next_version = inst.roles()["last_version"] + 1
        self.waiters: dict[int, list] = {}      # last version -> [wake, error, first]
        self.wlock = threading.Lock()            # waiters: writer threads vs the I/O thread

    def on_confirm(self, first: int, last: int, status) -> None:
        """confirm_forward_range, on the I/O thread."""
        from vrepl.replica import ConfirmStatus
        ok = status == ConfirmStatus.OK
        with self.wlock:
            done = [v for v in self.waiters if v <= last]
            if not ok:   # a waiter whose range overlaps a failed range fails
                for v, w in self.waiters.items():
                    if w[2] <= last and v >= first:
                        w[1] = f"v{first}..v{last}: {status.describe()}"
            woken = [self.waiters.pop(v) for v in done]
        for w in woken:
            wake = w[0]
            if isinstance(wake, asyncio.Future):
                if not wake.done():
                    wake.set_result(None)
            else:
                wake.release()

    def _register(self, payloads: list[bytes], wake) -> tuple[int, int, list]:
        first = self.next_version
        last = first + len(payloads) - 1
        box = [wake, None, first]
        with self.wlock:
            self.waiters[last] = box
        return first, last, box

    def _forget(self, last: int) -> None:
        with self.wlock:
            self.waiters.pop(last, None)

    @staticmethod
    def _check(box: list) -> None:
        if box[1] is not None:
            raise RuntimeError(f"not confirmed: {box[1]}")


class ThreadWriters(Writers):
    """Writers are threads: one lock covers taking the versions and forwarding them."""

    def __init__(self, inst) -> None:
        super().__init__(inst)
        self.lock = threading.Lock()

    def forward(self, payloads: list[bytes]) -> None:
        from vrepl.sync import FlowControlError
        # A held lock that on_confirm releases: the cheapest one-shot wake-up in CPython
        # (an Event is a Condition: a lock, a waiter list and a second lock per wait).
        done = threading.Lock()
        done.acquire()
        with self.lock:
            first, last, box = self._register(payloads, done)
            while True:   # the whole batch in one call (docs/embedding.md, forward_many)
                try:
                    self.inst.forward_many(first, payloads)
                    break
                except FlowControlError:
                    time.sleep(0.0005)
            self.next_version = last + 1
        if not done.acquire(timeout=CONFIRM_TIMEOUT_S):
            self._forget(last)
            raise TimeoutError(f"v{first}..v{last} not confirmed within {CONFIRM_TIMEOUT_S:g} s")
        self._check(box)


class LoopWriters(Writers):
    """Writers are coroutines on the instance's I/O loop: one thread, so taking the
    versions and forwarding them cannot interleave."""

    async def forward(self, payloads: list[bytes]) -> None:
        from vrepl.sync import FlowControlError
        fut = asyncio.get_running_loop().create_future()
        first, last, box = self._register(payloads, fut)
        while True:
            try:
                self.inst.forward_many(first, payloads)
                break
            except FlowControlError:
                await asyncio.sleep(0.0005)
        self.next_version = last + 1
        try:
            await asyncio.wait_for(fut, CONFIRM_TIMEOUT_S)
        except asyncio.TimeoutError:
            self._forget(last)
            raise TimeoutError(f"v{first}..v{last} not confirmed within {CONFIRM_TIMEOUT_S:g} s")
        self._check(box)


def pack_writes(items: list[tuple[bytes, bytes]]) -> bytes:
    """N writes as one record: for each, its length (4 bytes, big-endian) then key + value."""
    out = []
    for k, v in items:
        out.append((len(k) + len(v)).to_bytes(4, "big"))
        out.append(k)
        out.append(v)
    return b"".join(out)


def unpack_writes(record: bytes) -> list[bytes]:
    """The inverse of pack_writes: the key + value of each write, in order."""
    out, pos = [], 0
    while pos < len(record):
        n = int.from_bytes(record[pos:pos + 4], "big")
        if pos + 4 + n > len(record):
            raise ValueError(f"packed writes truncated at byte {pos}")
        out.append(record[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out


def batch_records(items: list[tuple[bytes, bytes]], as_record: bool) -> list[bytes]:
    """The records of a batch: one per write, or one for the whole batch (pack_writes)."""
    return [pack_writes(items)] if as_record else [k + v for k, v in items]


def run_command(cmd: str, spec: dict, writers: Writers, as_record: bool, loop) -> dict:
    """One latency or throughput command, with the writers where they live."""
    from bench.compare.drivers.base import LatencySpec, ThroughputSpec
    from bench.compare.workload import (latency_loop, latency_loop_async,
                                        run_client_coroutines, run_client_threads)
    if isinstance(writers, LoopWriters):
        async def write_one(key: bytes, value: bytes) -> None:
            await writers.forward([key + value])

        async def write_batch(items: list[tuple[bytes, bytes]]) -> None:
            await writers.forward(batch_records(items, as_record))

        coro = (latency_loop_async(write_one, LatencySpec(**spec)) if cmd == "latency"
                else run_client_coroutines(write_batch, ThroughputSpec(**spec)))
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    class Client:
        def write_one(self, key: bytes, value: bytes) -> None:
            writers.forward([key + value])

        def write_batch(self, items: list[tuple[bytes, bytes]]) -> None:
            writers.forward(batch_records(items, as_record))

        def close(self) -> None:
            pass

    if cmd == "latency":
        return latency_loop(Client(), LatencySpec(**spec))
    return run_client_threads(Client, ThroughputSpec(**spec))


def main(argv: list[str]) -> int:
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
    import vrepl.testing.node_runner as nr

    from bench.compare.jsonline import serve

    nr.emit = lambda *a, **k: None     # stdout carries this protocol's replies only
    with open(argv[0]) as fh:
        conf = json.load(fh)
    writers_mode = conf.get("writers", "loop")
    if writers_mode not in WRITERS:
        print(json.dumps({"error": f"writers {writers_mode!r}: use one of {WRITERS}"}))
        return 2
    logging.basicConfig(level=logging.WARNING, handlers=[logging.FileHandler(conf["log_file"])],
                        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s %(message)s")
    runner = nr.Runner(conf)
    runner.start()
    writers: Writers | None = None
    as_record = bool(conf.get("batch_as_record"))

    def workload(msg: dict) -> dict:
        nonlocal writers
        if writers is None:
            kind = LoopWriters if writers_mode == "loop" else ThreadWriters
            writers = kind(runner.inst)
            runner.bench_hook = writers.on_confirm
        before = writers.next_version
        reply = run_command(msg["cmd"], msg["spec"], writers, as_record, runner.inst.loop)
        # Log entries this command added (warm-up included): shows the batch shape.
        reply["records_forwarded"] = writers.next_version - before
        return reply

    serve({"status": lambda msg: {"role": runner.inst.roles().get("role")},
           "latency": workload, "throughput": workload})
    try:
        runner.inst.stop()
    except Exception:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
