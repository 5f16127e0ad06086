"""Kill -9 at every transaction kill point (vrepl/killpoints.py, docs/transactions.md §7) with
real `vrepl node` processes on 127.0.0.1: every node is armed, so each master that reaches
the step SIGKILLs itself there; the test restarts each victim once, without the kill point.
A loader (the Python client's Transaction, which follows the master and repeats a step
whose outcome is unknown) runs one transaction over two tables, step by step or as one
request (client.load: the records forwarded back to back); if it gives up, it runs the
job again under the same label, as a retried job does. Meanwhile a reader polls every
replica: a transaction is never partially visible. At the end every replica holds the
transaction's rows exactly once, all at its publish version, every replica answers its
label (after the restarts), and nothing stays staged. The `files` mode puts ta's rows as a
whole Parquet file (docs/transactions.md §4.1) and passes the file points too."""
from __future__ import annotations

import glob
import os
import signal
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import vrepl.node.txnhost  # noqa: F401  (registers the transaction kill points)
from vrepl import killpoints
from vrepl.client import Client
from vrepl.errors import ClientError
from vrepl.node.local import LocalCluster

pytestmark = pytest.mark.timeout(180)

VG = 1
POINTS = sorted(killpoints.registered("txn."))
FILE_POINTS = ["txn.master.after_file_stage", "txn.master.after_files"]   # only file puts
A = [["ta", i, {"x": i}] for i in range(1, 21)]
B = [["tb", i, {"y": float(i)}] for i in range(1, 11)]


def died_by_kill(c: LocalCluster, n: int) -> bool:
    p = c.nodes[n].proc
    return p is not None and p.poll() == -signal.SIGKILL


def counts(c: LocalCluster, n: int, again: bool = False) -> tuple[int, int] | None:
    """(rows of ta, rows of tb) on replica n. Two reads are not one snapshot: with `again`,
    ta is read again after tb, and a sample where it changed (the publish fell between
    the reads) is None."""
    cl = Client([c.nodes[n].http], timeout_s=2, request_timeout_s=2)
    try:
        a = len(cl.read(VG, "ta", node=c.nodes[n].http)["rows"])
        b = len(cl.read(VG, "tb", node=c.nodes[n].http)["rows"])
        if again and len(cl.read(VG, "ta", node=c.nodes[n].http)["rows"]) != a:
            return None
        return a, b
    finally:
        cl.close()


def a_parquet() -> bytes:
    """A's rows as a Parquet file (ts, x)."""
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"ts": pa.array([r[1] for r in A], pa.int64()),
                             "x": pa.array([r[2]["x"] for r in A], pa.int64())}), sink)
    return sink.getvalue().to_pybytes()


def run_job(c: LocalCluster, step: str, mode: str = "steps") -> dict:
    with Client(c.endpoints, timeout_s=20) as cl:
        if mode == "load":          # one request: begin, both tables in batch 0, publish
            return cl.load(VG, "kp-job", A + B)
        txn = cl.transaction(VG, "kp-job").begin()
        if mode == "files":         # A as a whole Parquet file (docs/transactions.md §4.1)
            txn.put_file(a_parquet(), table="ta", seq=0)
        else:
            txn.put(A, seq=0)
        txn.put(B, seq=1)
        if step.endswith("abort"):
            txn.abort("test")
            return txn.last
        txn.precommit()
        return txn.commit()


# The one-request load (docs/client-api.md §Transactions) passes the same points but the
# pre-commit and abort ones.
# File puts pass the two file points besides the others but the abort (the `files` mode).
CASES = [(p, "steps") for p in POINTS if p not in FILE_POINTS] + [
    (p, "load") for p in POINTS if p not in FILE_POINTS and not p.endswith(("precommit", "abort"))
] + [(p, "files") for p in POINTS if not p.endswith("abort")]


@pytest.mark.parametrize("point,mode", CASES)
def test_kill_at_every_transaction_step(tmp_path, monkeypatch, point, mode):
    assert len(POINTS) == 8
    c = LocalCluster(str(tmp_path / "c"), 3, vgroup=VG, http={"write_timeout_ms": 2000})
    try:
        monkeypatch.setenv(killpoints.ENV, point)
        c.start()
        monkeypatch.delenv(killpoints.ENV)
        c.wait_ready()
        c.wait_master(slaves=2)
        partial: list[str] = []
        stop = threading.Event()

        def reader() -> None:
            while not stop.is_set():
                for n in c.nodes:
                    try:
                        got = counts(c, n, again=True)
                    except (ClientError, OSError):
                        continue
                    if got is not None and got not in ((0, 0), (len(A), len(B))):
                        partial.append(f"n{n}: {got[0]} of ta, {got[1]} of tb")
                stop.wait(0.05)
        rd = threading.Thread(target=reader)
        rd.start()
        answer: dict = {}

        def loader() -> None:
            for _attempt in range(4):       # a job that fails is run again, same label
                try:
                    answer["doc"] = run_job(c, point, mode)
                    return
                except ClientError as exc:
                    answer.setdefault("errors", []).append(repr(exc))
        ld = threading.Thread(target=loader)
        ld.start()
        c.wait_for(f"a master dies at {point}",
                   lambda: any(died_by_kill(c, n) for n in c.nodes), 40, 0.05)
        restarted: set[int] = set()

        def revive() -> bool:
            for n in c.nodes:
                if c.nodes[n].proc.poll() is not None:
                    assert n not in restarted and died_by_kill(c, n), c.stderr_tail(n)
                    restarted.add(n)
                    c.start(n)
            return not ld.is_alive()
        c.wait_for("the loader finishes", revive, 120, 0.1)
        assert "doc" in answer, answer
        c.wait_for("every node up", lambda: all(c.status(n, 0.5) for n in c.nodes), 30)
        c.wait_master(slaves=2, timeout_s=30)
        doc = answer["doc"]
        want = (0, 0) if point.endswith("abort") else (len(A), len(B))
        assert doc["state"] == ("ABORTED" if point.endswith("abort") else "VISIBLE"), doc
        for n in c.nodes:
            c.wait_for(f"n{n} converges", lambda n=n: counts(c, n) == want, 30, 0.1)
            cl = Client([c.nodes[n].http])
            try:
                shown = cl._get(VG, "txn/label:kp-job", c.nodes[n].http)
                assert shown["state"] == doc["state"] and shown["txn"] == doc["txn"]
                rows = cl.read(VG, "ta", node=c.nodes[n].http)["rows"]
                if want[0]:     # a file's rows keep _version = the txn id (§4.1)
                    assert {r["_version"] for r in rows} == {
                        doc["txn"] if mode == "files" else doc["visible_version"]}
                st = c.vgroup_status(n)["txn"]
                c.wait_for(f"n{n} holds nothing staged", lambda n=n: (
                    c.vgroup_status(n)["txn"]["open"], c.vgroup_status(n)["txn"]["staged_bytes"],
                    c.vgroup_status(n)["txn"]["staged_file_bytes"],
                    glob.glob(os.path.join(c.nodes[n].dir, "data", f"vg{VG}", "ingest",
                                           "staged", "*", "*")))
                    == (0, 0, 0, []), 10, 0.1)
                assert st["states"]["VISIBLE" if want[0] else "ABORTED"] == 1
            finally:
                cl.close()
        stop.set()
        rd.join(10)
        assert partial == [], partial[:5]
        assert restarted
    finally:
        c.close()
