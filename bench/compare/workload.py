"""The two workloads, generic over a Client: the same loops run for every system.

`latency_loop` and `throughput_loop` only need a Client; `run_client_processes` runs one
throughput loop per client process (multiprocessing, spawn context: each client has its own
interpreter and GIL, like an application's independent clients would), starts them together
and sums their rates. `latency_loop_async`, `throughput_loop_async` and
`run_client_coroutines` run the same workloads (one generator per workload holds the
timing and counting for both) for writers that are coroutines on an event loop. Keys are
unique per client and write; values are fixed random bytes of the requested size, the same
for every system.
"""
from __future__ import annotations

import multiprocessing as mp
import time
import traceback

from .stats import summarize_latencies_ns, summarize_throughput

KEY_BYTES = 16


def make_key(client: int, seq: int) -> bytes:
    """A 16-byte key, unique per (client, seq): b"c03-000000012345"."""
    return b"c%02d-%012d" % (client % 100, seq % 10**12)


def make_value(size: int, seed: int = 0) -> bytes:
    rnd = bytes((i * 131 + seed * 17 + 7) % 251 for i in range(251))
    return (rnd * (size // len(rnd) + 1))[:size]


def _note_error(kinds: dict, exc: Exception) -> None:
    """Count failed writes by kind (at most 5 kinds kept), so the JSON says why they failed."""
    kind = f"{type(exc).__name__}: {str(exc)[:100]}"
    if kind in kinds or len(kinds) < 5:
        kinds[kind] = kinds.get(kind, 0) + 1


async def _drive_async(plan, write):
    """Run a workload plan with a writer that is a coroutine function. A plan is a
    generator that yields (strict, args) for each write to make, is sent None or the
    write's exception, and returns its figures; a strict write's failure (a warm-up write)
    stops the run."""
    step = next(plan)
    while True:
        strict, args = step
        result = None
        try:
            await write(*args)
        except Exception as exc:
            if strict:
                raise
            result = exc
        try:
            step = plan.send(result)
        except StopIteration as stop:
            return stop.value


def _drive(plan, write):
    """_drive_async with a blocking writer: the coroutine never suspends, so one send()
    runs it to the end, with no event loop (about a microsecond per write)."""
    async def write_now(*args):
        write(*args)

    coro = _drive_async(plan, write_now)
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("a blocking writer suspended the workload")


def _latency_plan(spec):
    """Workload (a) as a plan (see _drive_async): warm-up writes, then spec.count writes, each
    timed from its yield to the resume."""
    value = make_value(spec.value_size)
    errors = 0
    kinds: dict = {}
    for i in range(spec.warmup):
        yield True, (make_key(0, i), value)
    lat_ns = []
    clock = time.perf_counter_ns
    limit_ns = clock() + int(spec.time_limit_s * 1e9)
    truncated = False
    for i in range(spec.warmup, spec.warmup + spec.count):
        if clock() > limit_ns:
            truncated = True
            break
        key = make_key(0, i)
        t0 = clock()
        exc = yield False, (key, value)
        t1 = clock()
        if exc is not None:
            errors += 1
            _note_error(kinds, exc)
            continue
        lat_ns.append(t1 - t0)
    out = summarize_latencies_ns(lat_ns)
    out["errors"] = errors
    out["error_kinds"] = kinds
    out["truncated"] = truncated
    return out


def latency_loop(client, spec) -> dict:
    """Workload (a): warm-up writes, then spec.count writes timed one by one."""
    return _drive(_latency_plan(spec), client.write_one)


async def latency_loop_async(write_one, spec) -> dict:
    """latency_loop for a writer that is a coroutine function write_one(key, value)."""
    return await _drive_async(_latency_plan(spec), write_one)


def _throughput_plan(spec, client_id: int):
    """Workload (b) for one client as a plan (see _drive_async): batches for warmup_s (uncounted),
    then for duration_s; returns the client's figures."""
    value = make_value(spec.value_size, seed=client_id)
    seq = 0
    errors = 0
    kinds: dict = {}

    def batch():
        nonlocal seq
        items = [(make_key(client_id, seq + j), value) for j in range(spec.batch)]
        seq += spec.batch
        return items

    clock = time.perf_counter
    end_warmup = clock() + spec.warmup_s
    while clock() < end_warmup:
        yield True, (batch(),)
    t0 = clock()
    end = t0 + spec.duration_s
    batches = 0
    while True:
        exc = yield False, (batch(),)
        if exc is not None:
            errors += 1
            _note_error(kinds, exc)
        else:
            batches += 1
        now = clock()
        if now >= end:
            break
    elapsed = now - t0
    return {"client": client_id, "batches": batches, "writes": batches * spec.batch,
            "elapsed_s": elapsed, "errors": errors, "error_kinds": kinds}


def throughput_loop(client, spec, client_id: int, start_at: float | None = None) -> dict:
    """Workload (b) for one client: batches for warmup_s (uncounted), then for duration_s.
    start_at is a time.time() at which to begin, so clients in several processes start
    together (time.time, unlike perf_counter, is comparable across processes)."""
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.time()))
    return _drive(_throughput_plan(spec, client_id), client.write_batch)


async def throughput_loop_async(write_batch, spec, client_id: int) -> dict:
    """throughput_loop for a writer that is a coroutine function write_batch(items); the
    clients of one event loop start together, so there is no start_at."""
    return await _drive_async(_throughput_plan(spec, client_id), write_batch)


async def run_client_coroutines(write_batch, spec) -> dict:
    """Workload (b) with one coroutine per client on the running event loop (vrepl at
    library level with its writers on the instance's I/O loop)."""
    import asyncio
    results = await asyncio.gather(*[throughput_loop_async(write_batch, spec, i)
                                     for i in range(spec.clients)])
    return finish_throughput(list(results), spec)


def _client_main(factory, spec, client_id, start_at, queue, ready) -> None:
    try:
        client = factory()
        try:
            # Every client is built (its imports done: pyarrow's take a second of wall time
            # when 8 interpreters start at once on a loaded machine) before any of them
            # writes, so no client's start-up runs inside the others' warm-up or window.
            ready.wait(timeout=120)
            result = throughput_loop(client, spec, client_id, max(start_at, time.time()))
        finally:
            client.close()
        queue.put(("ok", result))
    except BaseException:
        queue.put(("error", f"client {client_id}: {traceback.format_exc(limit=5)}"))


def run_client_processes(factory, spec, start_delay_s: float = 1.5) -> dict:
    """One process per client, all starting at the same wall-clock instant (`start_delay_s`
    + 0.1 s per client from now, or when the last client is built if that is later);
    returns the summary of stats.summarize_throughput plus per-client figures."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    ready = ctx.Barrier(spec.clients)
    start_at = time.time() + start_delay_s + 0.1 * spec.clients
    procs = [ctx.Process(target=_client_main, args=(factory, spec, i, start_at, queue, ready),
                         daemon=True, name=f"bench-client-{i}")
             for i in range(spec.clients)]
    for p in procs:
        p.start()
    results, failures = [], []
    deadline = start_at + spec.warmup_s + spec.duration_s + 60
    try:
        for _ in procs:
            status, payload = queue.get(timeout=max(1.0, deadline - time.time()))
            (results if status == "ok" else failures).append(payload)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    if failures:
        raise RuntimeError("client process failed:\n" + "\n".join(failures))
    return finish_throughput(results, spec)


def run_client_threads(factory, spec) -> dict:
    """Workload (b) with one thread per client in this process, for systems whose writers
    must live in one process (the PySyncObj node, vrepl at library level)."""
    import threading
    results, failures = [], []
    start_at = time.time() + 0.2

    def body(i):
        try:
            client = factory()
            try:
                results.append(throughput_loop(client, spec, i, start_at))
            finally:
                client.close()
        except BaseException:
            failures.append(f"client {i}: {traceback.format_exc(limit=5)}")

    threads = [threading.Thread(target=body, args=(i,), daemon=True)
               for i in range(spec.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(spec.warmup_s + spec.duration_s + 60)
    if failures or len(results) != spec.clients:
        raise RuntimeError("client thread failed:\n" + "\n".join(failures or ["timeout"]))
    return finish_throughput(results, spec)


def finish_throughput(results: list[dict], spec) -> dict:
    out = summarize_throughput(results, spec.duration_s)
    out["batch"] = spec.batch
    out["value_size"] = spec.value_size
    kinds: dict = {}
    for r in results:
        for k, n in r.get("error_kinds", {}).items():
            kinds[k] = kinds.get(k, 0) + n
    out["error_kinds"] = kinds
    out["per_client_writes_per_s"] = [round(r["writes"] / r["elapsed_s"])
                                      for r in sorted(results, key=lambda r: r["client"])]
    return out
