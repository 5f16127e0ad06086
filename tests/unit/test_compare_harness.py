"""The peer-comparison harness (bench/compare): its pure parts, and one small real run.

Percentiles, summaries, ratios and the generated markdown are checked exactly; the smoke test
runs the real command against Redis for under a second of load and checks that it measured,
wrote its JSON and left no process behind. It is skipped when redis-server is not installed
(the harness itself would install it; the test suite does not).
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from bench.compare import report  # noqa: E402
from bench.compare.drivers.redis_driver import encode_command  # noqa: E402
from bench.compare.stats import (fmt_rate, fmt_ratio, fmt_us, markdown_table,  # noqa: E402
                                 percentile, ratio, summarize_latencies_ns,
                                 summarize_throughput)
from bench.compare.workload import make_key, make_value  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_percentile_is_nearest_rank():
    values = list(range(1, 5001))
    assert percentile(values, 50) == 2500
    assert percentile(values, 99) == 4950
    assert percentile(values, 99.9) == 4995      # an observed value, not an interpolation
    assert percentile(values, 100) == 5000
    assert percentile([7], 99.9) == 7
    assert percentile(list(range(1, 1001)), 99.9) == 999   # no float rounding up to 1000
    assert percentile([1, 2, 3, 4], 50) == 2


@pytest.mark.parametrize("bad", [0, -1, 100.1])
def test_percentile_rejects_out_of_range(bad):
    with pytest.raises(ValueError):
        percentile([1, 2], bad)


def test_percentile_of_nothing_raises():
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summarize_latencies_in_microseconds():
    s = summarize_latencies_ns([3000, 1000, 2000, 4000])
    assert s == {"count": 4, "mean_us": 2.5, "min_us": 1.0, "max_us": 4.0,
                 "p50_us": 2.0, "p99_us": 4.0, "p999_us": 4.0}
    assert summarize_latencies_ns([]) == {"count": 0}


def test_summarize_throughput_sums_client_rates():
    clients = [{"writes": 1000, "batches": 10, "elapsed_s": 1.0},
               {"writes": 1000, "batches": 10, "elapsed_s": 2.0, "errors": 1}]
    s = summarize_throughput(clients, 1.0)
    assert s["writes_per_s"] == 1500
    assert (s["writes"], s["batches"], s["errors"], s["clients"]) == (2000, 20, 1, 2)


def test_ratio_and_formatting():
    assert ratio(4.0, 2.0) == 2.0
    assert ratio(None, 2.0) is None and ratio(1.0, None) is None and ratio(1.0, 0) is None
    assert fmt_ratio(None) == "n/a"
    assert (fmt_ratio(2.0), fmt_ratio(12.34), fmt_ratio(1234.0)) == ("2.00x", "12.3x", "1,234x")
    assert (fmt_us(87.2), fmt_us(1250.0), fmt_us(2.5e6), fmt_us(None)) == \
        ("87 µs", "1.25 ms", "2.5 s", "n/a")
    assert fmt_rate(1234567.8) == "1,234,568" and fmt_rate(None) == "n/a"


def test_markdown_table_shape():
    t = markdown_table(["a", "b"], [["x", "1"], ["y|z", "2"]])
    assert t.splitlines() == ["| a | b |", "|---|---:|", "| x | 1 |", "| y\\|z | 2 |"]
    with pytest.raises(ValueError):
        markdown_table(["a", "b"], [["only one"]])


def test_keys_are_16_bytes_and_unique():
    keys = {make_key(c, i) for c in range(8) for i in range(1000)}
    assert len(keys) == 8000 and {len(k) for k in keys} == {16}
    assert len(make_value(100)) == 100


def test_resp_encoding():
    assert encode_command(b"SET", b"k", b"") == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"


def _results(vrepl_measured: bool) -> dict:
    def measured(p50, p99, rate):
        return {"setting": {"description": "d", "per_write": True},
                "latency": {"count": 10, "p50_us": p50, "p99_us": p99, "p999_us": p99,
                            "errors": 0},
                "throughput": {"writes_per_s": rate, "errors": 0}}
    vrepl = ({"is_vrepl": True, "skipped": None, "modes": {"fsync": measured(100, 400, 8e5)}}
             if vrepl_measured else
             {"is_vrepl": True, "skipped": "vrepl driver not available yet", "modes": {}})
    return {
        "meta": {"command": "python -m bench.compare --quick", "machine": "2 cores",
                 "started_at": "now",
                 "params": {"quick": True, "latency_count": 10, "latency_warmup": 1,
                            "clients": 8, "batch": 100, "value_size": 100, "duration_s": 2.0,
                            "warmup_s": 0.5, "modes": ["fsync"]}},
        "systems": {"vrepl-client": vrepl,
                    "vrepl-lib": {"is_vrepl": True, "skipped": "vrepl driver not available yet",
                                  "modes": {}},
                    "redis": {"is_vrepl": False, "skipped": None, "version": "7",
                              "modes": {"fsync": measured(200, 800, 2e5),
                                        "nofsync": {"error": "RuntimeError: boom\nmore"}}},
                    "etcd": {"is_vrepl": False, "skipped": "etcd not found", "modes": {}}},
        "leftover_processes": [],
    }


def _row(md: str, *starts: str) -> str:
    return next(line for line in md.splitlines() if line.startswith("| " + " | ".join(starts)))


def test_report_without_vrepl_says_so_and_ratios_are_na():
    md = report.render_markdown(_results(vrepl_measured=False))
    row = _row(md, "fsync per write / batch", "redis")
    assert "200 µs" in row and "800 µs" in row and row.endswith("| n/a / n/a | n/a / n/a |")
    assert "| not measured |" in _row(md, "fsync per write / batch", "vrepl-client")
    assert "| not measured |" in _row(md, "no fsync", "redis")
    assert "- vrepl-client: skipped: vrepl driver not available yet" in md
    assert "- redis: failed: RuntimeError: boom" in md
    assert "- etcd: skipped: etcd not found" in md
    assert "Leftover processes after the run: none." in md


def test_report_ratios_are_vrepl_over_peer_in_the_same_mode():
    md = report.render_markdown(_results(vrepl_measured=True))
    lat = _row(md, "fsync per write / batch", "redis", "200 µs")
    assert "| 0.50x / 0.50x | n/a / n/a | n/a / n/a |" in lat
    thr = _row(md, "fsync per write / batch", "redis", "200,000")
    assert thr.endswith("| 4.00x | n/a | n/a | n/a | n/a |")


def test_report_has_a_ratio_column_per_vrepl_shape():
    res = _results(vrepl_measured=True)
    res["systems"]["vrepl-lib-1rec"] = {
        "is_vrepl": True, "skipped": None,
        "modes": {"fsync": {"setting": {"description": "d", "per_write": True},
                            "latency": {"count": 10, "p50_us": 300, "p99_us": 400,
                                        "p999_us": 500, "errors": 0},
                            "throughput": {"writes_per_s": 1.2e6, "errors": 0}}}}
    md = report.render_markdown(res)
    header = next(line for line in md.splitlines()
                  if line.startswith("| fsync | system | writes/s"))
    assert header.endswith("| vrepl-client / peer | vrepl-client-arrow / peer"
                           " | vrepl-client-lp / peer | vrepl-lib / peer | vrepl-lib-1rec / peer |")
    thr = _row(md, "fsync per write / batch", "redis", "200,000")
    assert thr.endswith("| 4.00x | n/a | n/a | n/a | 6.00x |")


def test_packed_writes_round_trip_and_reject_truncation():
    from bench.compare.vrepl_lib_node import pack_writes, unpack_writes
    from bench.compare.workload import make_key, make_value
    items = [(make_key(2, i), make_value(100, seed=i)) for i in range(100)] + [(b"k", b"")]
    record = pack_writes(items)
    assert len(record) == sum(4 + len(k) + len(v) for k, v in items)
    assert unpack_writes(record) == [k + v for k, v in items]
    assert unpack_writes(b"") == []
    with pytest.raises(ValueError, match="truncated"):
        unpack_writes(record[:-1])


def test_update_doc_replaces_only_the_generated_section(tmp_path):
    doc = tmp_path / "compare.md"
    doc.write_text(f"# Title\nprose before\n\n{report.BEGIN}\nold\n{report.END}\nprose after\n")
    report.update_doc(doc, "new table\n")
    report.update_doc(doc, "newer table\n")
    text = doc.read_text()
    assert text == (f"# Title\nprose before\n\n{report.BEGIN}\nnewer table\n{report.END}\n"
                    "prose after\n")


@pytest.mark.slow  # seconds: outside the `-m "not slow"` loop
@pytest.mark.skipif(shutil.which("redis-server") is None,
                    reason="redis-server not installed (apt-get install redis-server); the "
                           "harness installs it itself, the test suite does not")
def test_smoke_redis_run_measures_and_leaves_nothing(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.compare", "--systems", "redis", "--modes", "nofsync",
         "--count", "50", "--warmup", "10", "--duration", "0.3", "--warmup-s", "0.1",
         "--clients", "2", "--batch", "10", "--no-docs", "--no-install",
         "--workdir", str(tmp_path), "--json", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    mode = res["systems"]["redis"]["modes"]["nofsync"]
    assert mode["latency"]["count"] == 50 and mode["latency"]["errors"] == 0
    assert mode["throughput"]["writes_per_s"] > 0 and mode["throughput"]["errors"] == 0
    assert res["leftover_processes"] == []
    assert not any(p.name.startswith("vrepl-compare-") for p in tmp_path.iterdir())


def test_vrepl_drivers_are_plugged_in_first():
    from bench.compare.run import all_drivers
    names = [d.name for d in all_drivers()]
    assert names[:6] == ["vrepl-client", "vrepl-client-arrow", "vrepl-client-lp", "vrepl-lib",
                         "vrepl-lib-1rec", "vrepl-lib-threads"]
    assert all(d.is_vrepl for d in all_drivers()[:6])
    assert not any(d.is_vrepl for d in all_drivers()[6:])


def test_vrepl_client_rows_carry_the_key_as_table_and_ts():
    import base64
    from bench.compare.drivers.vrepl_driver import _fsync_setting, _row
    from bench.compare.workload import make_key
    b64 = base64.b64encode(b"\x00\xffvalue")
    row = json.loads(_row(make_key(3, 12345), b64))
    assert row == ["c03", 12345, {"v": b64.decode()}]
    assert json.loads(_row(make_key(0, 0), b64))[1] == 0
    assert _fsync_setting(True).per_write is True
    assert "group commit" in _fsync_setting(True).description


@pytest.mark.slow  # seconds of CPU: outside the `-m "not slow"` loop
@pytest.mark.timeout(200)
def test_smoke_vrepl_drivers_measure_and_leave_nothing(tmp_path):
    out = tmp_path / "v.json"
    shm_before = {p.name for p in Path("/dev/shm").glob("vrepl-compare-*")}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.compare", "--systems",
         "vrepl-client,vrepl-lib,vrepl-lib-1rec,vrepl-lib-threads",
         "--modes", "nofsync", "--count", "30", "--warmup", "5", "--duration", "0.3",
         "--warmup-s", "0.1", "--clients", "2", "--batch", "10", "--no-docs", "--no-install",
         "--workdir", str(tmp_path), "--json", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=190)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    for name in ("vrepl-client", "vrepl-lib", "vrepl-lib-1rec", "vrepl-lib-threads"):
        mode = res["systems"][name]["modes"]["nofsync"]
        assert mode["latency"]["count"] == 30 and mode["latency"]["errors"] == 0, name
        assert mode["throughput"]["writes_per_s"] > 0 and mode["throughput"]["errors"] == 0
    # The batch shapes: vrepl-lib logs a record per write, vrepl-lib-1rec one per batch of 10
    # (warm-up batches included in records_forwarded, not in writes).
    one = res["systems"]["vrepl-lib-1rec"]["modes"]["nofsync"]
    for name in ("vrepl-lib", "vrepl-lib-threads"):
        lib = res["systems"][name]["modes"]["nofsync"]
        assert lib["latency"]["records_forwarded"] == 35 == one["latency"]["records_forwarded"]
        assert lib["throughput"]["records_forwarded"] >= lib["throughput"]["writes"]
        assert lib["throughput"]["records_forwarded"] % 10 == 0
    assert 0 < one["throughput"]["records_forwarded"] * 10 - one["throughput"]["writes"]
    assert one["throughput"]["records_forwarded"] * 10 < 3 * one["throughput"]["writes"] + 1000
    assert res["leftover_processes"] == []
    assert not any(p.name.startswith("vrepl-compare-") for p in tmp_path.iterdir())
    shm_after = {p.name for p in Path("/dev/shm").glob("vrepl-compare-*")}
    assert not shm_after - shm_before, "tmpfs data directories left behind"


class _Inst:
    """Just enough of a SyncInstance for the writers' bookkeeping."""

    def roles(self):
        return {"last_version": 41}


def test_lib_writers_wake_exactly_the_confirmed_waiters_and_mark_failed_ranges():
    import asyncio
    import threading
    from bench.compare.vrepl_lib_node import LoopWriters, ThreadWriters
    from vrepl.replica import ConfirmStatus

    async def scenario():
        w = LoopWriters(_Inst())
        loop = asyncio.get_running_loop()
        boxes = []
        for n in (2, 3, 1):   # ranges 42..43, 44..46, 47
            fut = loop.create_future()
            boxes.append((fut, w._register([b"x"] * n, fut)))
            w.next_version = boxes[-1][1][1] + 1
        w.on_confirm(42, 44, ConfirmStatus.OK)       # covers 42..43 only as a whole range
        assert boxes[0][0].done() and not boxes[1][0].done() and not boxes[2][0].done()
        w.on_confirm(45, 47, ConfirmStatus.FAILED)   # overlaps 44..46 and 47
        assert boxes[1][0].done() and boxes[2][0].done()
        assert boxes[0][1][2][1] is None
        assert "failed" in boxes[1][1][2][1] and "failed" in boxes[2][1][2][1]
        assert w.waiters == {}

    asyncio.run(scenario())
    t = ThreadWriters(_Inst())
    held = threading.Lock()
    held.acquire()
    first, last, box = t._register([b"a", b"b"], held)
    assert (first, last) == (42, 43)
    t.on_confirm(42, 42, ConfirmStatus.OK)
    assert held.locked()                              # its last record is not confirmed yet
    t.on_confirm(43, 43, ConfirmStatus.OK)
    assert not held.locked() and box[1] is None



def test_workload_loops_count_failures_the_same_blocking_and_async():
    import asyncio
    from bench.compare.drivers.base import LatencySpec, ThroughputSpec
    from bench.compare.workload import (latency_loop, latency_loop_async, run_client_coroutines,
                                        throughput_loop)

    class Flaky:
        def __init__(self):
            self.calls = 0

        def write_one(self, key, value):
            self.calls += 1
            if self.calls > 2 and self.calls % 3 == 0:   # the 2 warm-up writes succeed
                raise ConnectionError("boom")

        def write_batch(self, items):
            assert len(items) == 4 and len({k for k, _ in items}) == 4
            self.write_one(items[0][0], items[0][1])

    spec = LatencySpec(count=30, warmup=2, value_size=8)
    blocking = latency_loop(Flaky(), spec)
    flaky = Flaky()

    async def write_one(key, value):
        flaky.write_one(key, value)

    asynced = asyncio.run(latency_loop_async(write_one, spec))
    for out in (blocking, asynced):
        assert out["count"] == 20 and out["errors"] == 10
        assert out["error_kinds"] == {"ConnectionError: boom": 10}
    with pytest.raises(ConnectionError):    # a failed warm-up write stops the run
        latency_loop(Flaky(), LatencySpec(count=1, warmup=3, value_size=8))

    tspec = ThroughputSpec(clients=2, batch=4, value_size=8, duration_s=0.05, warmup_s=0.0)
    one = throughput_loop(Flaky(), tspec, client_id=1)
    assert one["batches"] > 0 and one["errors"] > 0 and one["writes"] == 4 * one["batches"]
    clients = [Flaky(), Flaky()]

    async def write_batch(items):
        clients[int(items[0][0][1:3])].write_batch(items)   # key b"c01-...": client 1

    both = asyncio.run(run_client_coroutines(write_batch, tspec))
    assert both["clients"] == 2 and both["writes"] > 0
    assert both["error_kinds"] and all(c.calls > 0 for c in clients)


def test_node_command_loop_answers_each_line_and_survives_bad_ones(monkeypatch):
    import io
    from bench.compare.jsonline import serve
    lines = ['{"cmd": "echo", "x": 1}\n', 'not json\n', '{"cmd": "nope"}\n',
             '{"cmd": "boom"}\n', '{"cmd": "echo", "x": 2}\n', '{"cmd": "quit"}\n',
             '{"cmd": "echo", "x": 3}\n']
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(lines)))
    monkeypatch.setattr(sys, "stdout", out)

    def boom(msg):
        raise ValueError("bad spec")

    serve({"echo": lambda msg: {"x": msg["x"]}, "boom": boom})
    replies = [json.loads(line) for line in out.getvalue().splitlines()]
    assert replies[0] == {"x": 1} and replies[4] == {"x": 2} and len(replies) == 5
    assert "JSONDecodeError" in replies[1]["error"]
    assert replies[2] == {"error": "unknown command 'nope'"}
    assert "ValueError: bad spec" in replies[3]["error"]
