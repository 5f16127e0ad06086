"""Transactions on three real `vrepl node` processes on 127.0.0.1 (docs/transactions.md,
docs/client-api.md §Transactions): staged rows are invisible on every replica until the
publish record is applied, then visible at one version everywhere; labels answer retries;
refusals carry their reasons; a silent loader's transaction is aborted by the master's
clock; a master failover between staging and publish loses nothing (the new master finds
the staged rows in its log); labels are answered after a restart of every node."""
from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vrepl.client import Client
from vrepl.client_txn import TransactionError
from vrepl.node.local import LocalCluster

pytestmark = pytest.mark.timeout(120)

VG = 1


@pytest.fixture
def cluster(make_local_cluster):
    # conftest's 3-node vgroup 1 (quorum 2) with these vnode and transaction settings
    return lambda vnode=None, **txn: make_local_cluster(vnode=vnode, txn=txn or None,
                                                        http={"write_timeout_ms": 3000})


def rows_of(c: LocalCluster, node: int, table: str) -> list[tuple]:
    return [(r["ts"], r["_version"], r.get("x")) for r in c.replica_rows(node, table)]


def call(c: LocalCluster, node: int, method: str, path: str, body: bytes | None = None):
    cl = Client([c.nodes[node].http])
    try:
        return cl.request(c.nodes[node].http, method, f"/v1/vgroups/{VG}/{path}", body)
    finally:
        cl.close()


def test_invisible_until_published_then_everywhere_at_one_version(cluster):
    c = cluster()
    with c.client() as cl:
        txn = cl.transaction(VG, "load-1").begin()
        assert txn.state == "PREPARE" and txn.id
        txn.put([["cpu", 1, {"x": 1.0}], ["cpu", 2, {"x": 2.0}]])
        txn.put([["mem", 1, {"x": 10}]])
        cl.write(VG, [["other", 1, {"x": 5}]])      # a plain write meanwhile is visible
        for n in c.nodes:
            c.wait_for(f"n{n} has the plain write", lambda n=n: rows_of(c, n, "other"), 10)
            assert rows_of(c, n, "cpu") == [] and rows_of(c, n, "mem") == []
        shown = txn.show()
        assert shown["state"] == "PREPARE" and shown["tables"] == ["cpu", "mem"]
        assert shown["rows"] == 3 and "loader" in shown["waits_on"]
        txn.precommit()
        assert txn.state == "PRECOMMITTED"
        done = txn.commit()
        v = txn.visible_version
        assert done["state"] == "VISIBLE" and v > txn.id
        for n in c.nodes:
            c.wait_for(f"n{n} publishes", lambda n=n: len(rows_of(c, n, "cpu")) == 2, 10)
            assert rows_of(c, n, "cpu") == [(1, v, 1.0), (2, v, 2.0)]
            assert rows_of(c, n, "mem") == [(1, v, 10)]
            code, doc = call(c, n, "GET", f"txn/{txn.id}")
            assert code == 200 and doc["state"] == "VISIBLE" and doc["visible_version"] == v
            # Reads carry the version they saw; "as of" a version before the publish leaves
            # the transaction out, as of the publish shows all of it.
            doc = cl.read(VG, "cpu", node=c.nodes[n].http)
            assert doc["visible_version"] >= v
            before = cl.read(VG, "cpu", node=c.nodes[n].http, as_of=v - 1)
            assert before["rows"] == [] and before["left_out"] == 2
            assert len(cl.read(VG, "cpu", node=c.nodes[n].http, as_of=v)["rows"]) == 2
        # A retried job: the same label answers the original transaction, loads nothing.
        again = cl.transaction(VG, "load-1")
        with again:
            again.put([["cpu", 3, {"x": 3.0}]])
        assert again.already_done and again.id == txn.id and again.visible_version == v
        assert len(rows_of(c, c.master(), "cpu")) == 2
        # Committing again answers the outcome; aborting a visible one is refused.
        assert txn.commit()["duplicate"] is True
        with pytest.raises(TransactionError, match="txn_visible"):
            txn.abort()


def test_abort_refusals_and_reuse_after_abort(cluster):
    c = cluster(max_running=2)
    with c.client() as cl:
        with pytest.raises(RuntimeError, match="boom"):
            with cl.transaction(VG, "job") as txn:
                txn.put([["t", 1, {"x": 1}]])
                raise RuntimeError("boom")
        assert txn.show()["state"] == "ABORTED"
        assert "RuntimeError" in txn.show()["reason"]
        with pytest.raises(TransactionError, match="txn_aborted.*cannot be committed"):
            txn.commit()
        # A label whose transaction aborted may be used again: a new transaction.
        with cl.transaction(VG, "job") as txn2:
            txn2.put([["t", 2, {"x": 2}]])
        assert txn2.id != txn.id and txn2.state == "VISIBLE"
        assert [r[0] for r in rows_of(c, c.master(), "t")] == [2]
        # Bad rows are refused, the transaction stays open; a schema conflict too.
        t3 = cl.transaction(VG, "bad").begin()
        with pytest.raises(TransactionError, match="bad_rows"):
            t3.put([["t", "not a ts", {"x": 1}]])
        with pytest.raises(TransactionError, match="bad_rows.*int"):
            t3.put([["t", 5, {"x": "text"}]])
        assert t3.show()["state"] == "PREPARE" and t3.show()["rows"] == 0
        # Too many running: refused at begin with the reason.
        t4 = cl.transaction(VG, "second").begin()
        with pytest.raises(TransactionError, match="too_many_txns.*max_running 2"):
            cl.transaction(VG, "third").begin()
        t3.abort("no longer needed")
        t4.abort()
        assert cl.transaction(VG, "third").begin().state == "PREPARE"
        code, doc = call(c, c.master(), "POST", "txn", b'{"label": "a/b"}')
        assert code == 400 and doc["code"] == "bad_txn"
        code, doc = call(c, c.master(), "POST", "txn/99999/commit", b"")
        assert code == 404 and doc["code"] == "no_txn"


def test_silent_loader_is_aborted_by_the_masters_clock(cluster):
    c = cluster()
    with c.client() as cl:
        txn = cl.transaction(VG, "silent", timeout_ms=1500).begin()
        txn.put([["s", 1, {"x": 1}]])
        c.wait_for("the timeout abort", lambda: txn.show()["state"] == "ABORTED", 10, 0.2)
        doc = txn.show()
        assert doc["reason"].startswith("timeout") and doc["rows"] == 1
        for n in c.nodes:
            code, doc = call(c, n, "GET", f"txn/{txn.id}")
            assert doc["state"] == "ABORTED" and rows_of(c, n, "s") == []
        st = c.vgroup_status(c.master())["txn"]
        assert st["aborts"] == {"timeout": 1} and st["states"]["ABORTED"] == 1
        code, _ = call(c, c.master(), "POST", "txn", b'{"label": "x", "timeout_ms": 0}')
        assert code == 400
    with urllib.request.urlopen(f"http://{c.nodes[c.master()].http}/metrics") as resp:
        text = resp.read().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples[("vrepl_txn_aborts_total", (("reason", "timeout"), ("vgroup", "1")))] == 1
    assert samples[("vrepl_txns", (("state", "ABORTED"), ("vgroup", "1")))] == 1
    assert samples[("vrepl_txn_refusals_total", (("code", "bad_txn"), ("vgroup", "1")))] == 1
    assert samples[("vrepl_txn_staged_bytes", (("vgroup", "1"),))] == 0


def test_master_failover_between_staging_and_publish_and_labels_after_restart(cluster):
    c = cluster()
    m = c.master()
    with c.client() as cl:
        txn = cl.transaction(VG, "fail-over").begin()
        txn.put([["f", i, {"x": i}] for i in range(1, 6)])
        txn.precommit()
    c.kill(m, signal.SIGKILL)
    m2 = c.wait_master(slaves=1, timeout_s=20, exclude=m)
    assert m2 != m
    with c.client() as cl:
        code, doc = call(c, m2, "GET", "txn/label:fail-over")
        assert code == 200 and doc["state"] == "PRECOMMITTED" and doc["rows"] == 5
        t2 = cl.transaction(VG, "fail-over")
        t2.id = doc["txn"]
        assert t2.commit()["state"] == "VISIBLE"
        v = t2.visible_version
    c.start(m)
    c.wait_master(slaves=2, timeout_s=20)
    for n in c.nodes:
        c.wait_for(f"n{n} has the load", lambda n=n: len(rows_of(c, n, "f")) == 5, 20)
        assert {r[1] for r in rows_of(c, n, "f")} == {v}
    # Every node restarts: the label is still answered, the rows are there once.
    c.stop_all()
    c.start()
    c.wait_ready()
    c.wait_master(slaves=2, timeout_s=20)
    with c.client() as cl:
        again = cl.transaction(VG, "fail-over").begin()
        assert again.already_done and again.visible_version == v
    for n in c.nodes:
        assert len(rows_of(c, n, "f")) == 5
        code, doc = call(c, n, "GET", "txn?open=1")
        assert code == 200 and doc["txns"] == []


def test_labels_survive_a_flush_and_restart(cluster, tmp_path):
    c = cluster()
    with c.client() as cl:
        with cl.transaction(VG, "flushed") as txn:
            txn.put([["g", 1, {"x": 1}]])
        v = txn.visible_version
        for i in range(3):                      # records after it, then a flush by restart
            cl.write(VG, [["h", i, {"x": i}]])
    m = c.master()
    c.stop_all()         # SIGTERM: the master's vnode flushes the committed prefix
    with open(f"{c.nodes[m].dir}/data/vg{VG}/data/txn_labels.json") as fh:
        doc = json.load(fh)
    assert [(d["label"], d["state"]) for d in doc["txns"]] == [("flushed", "VISIBLE")]
    c.start()
    c.wait_ready()
    c.wait_master(slaves=2, timeout_s=20)
    with c.client() as cl:
        t = cl.transaction(VG, "flushed").begin()
        assert t.already_done and t.visible_version == v
    for n in c.nodes:        # every replica answers it, from its labels file or its WAL
        code, shown = call(c, n, "GET", "txn/label:flushed")
        assert code == 200 and shown["state"] == "VISIBLE" and shown["visible_version"] == v
        assert rows_of(c, n, "g") == [(1, v, 1)]


def test_paused_loader_same_ts_big_batch_and_concurrent_begins(cluster):
    c = cluster(vnode={"max_payload_bytes": 1024 * 1024}, max_staged_bytes=64 * 1024 * 1024)
    with c.client() as cl:
        # A loader paused (SIGSTOP) holding a pre-committed transaction: the master's clock
        # aborts it; when the loader wakes up its commit is refused with the reason.
        held = cl.transaction(VG, "paused", timeout_ms=1200).begin()
        held.put([["p", 1, {"x": 1}]])
        held.precommit()
        c.wait_for("the timeout abort", lambda: held.show()["state"] == "ABORTED", 10, 0.2)
        with pytest.raises(TransactionError, match="txn_aborted.*timeout: still PRECOMMITTED"):
            held.commit()
        # Two transactions writing the same (table, ts): the one published later wins.
        first = cl.transaction(VG, "first").begin()
        second = cl.transaction(VG, "second").begin()
        first.put([["same", 7, {"x": 1}]])
        second.put([["same", 7, {"x": 2}]])
        second.commit()
        first.commit()
        assert first.visible_version > second.visible_version
        rows = rows_of(c, c.master(), "same")
        assert rows == [(7, first.visible_version, 1)]
        # A batch larger than one WAL record (max_payload_bytes 1 MiB here) is refused, the
        # transaction stays open and takes it in smaller batches.
        big = cl.transaction(VG, "big").begin()
        huge = [["big", i, {"s": "y" * 2000}] for i in range(1000)]
        with pytest.raises(TransactionError, match="above max_payload_bytes"):
            big.put(huge)
        big.put(huge[:100])
        assert big.commit()["rows"] == 100
    # Concurrent begins with one label: one transaction, both answered with it.
    import concurrent.futures
    m = c.master()

    def begin_once() -> dict:
        return call(c, m, "POST", "txn", b'{"label": "race"}')[1]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: begin_once(), range(4)))
    assert len({a["txn"] for a in answers}) == 1, answers
    assert sum(1 for a in answers if not a["duplicate"]) == 1


def test_a_slave_killed_between_staging_and_publish_catches_up(cluster):
    c = cluster()
    m = c.master()
    slave = next(n for n in c.nodes if n != m)
    with c.client() as cl:
        txn = cl.transaction(VG, "slave-down").begin()
        txn.put([["sd", i, {"x": i}] for i in range(1, 11)])
        c.kill(slave, signal.SIGKILL)
        txn.put([["sd", i, {"x": i}] for i in range(11, 21)])
        done = txn.commit()                 # the other slave makes the quorum
    c.start(slave)
    c.wait_master(slaves=2, timeout_s=20)
    c.wait_for("the slave catches up", lambda: len(rows_of(c, slave, "sd")) == 20, 20)
    assert {r[1] for r in rows_of(c, slave, "sd")} == {done["visible_version"]}
    code, doc = call(c, slave, "GET", "txn/label:slave-down")
    assert doc["state"] == "VISIBLE" and doc["rows"] == 20


def test_vrepl_txn_list_show_abort(cluster):
    import subprocess
    import sys

    c = cluster()
    node = c.nodes[next(iter(c.nodes))].http
    with c.client() as cl:
        t = cl.transaction(VG, "cli-job").begin()
        t.put([["c", 1, {"x": 1}], ["d", 2, {"x": 2}]])

    def vrepl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-P", "-m", "vrepl.cli", "txn", *args],
                              capture_output=True, text=True, timeout=60)
    out = vrepl("list", "--node", node)
    assert out.returncode == 0, out.stderr
    head, line = out.stdout.splitlines()[:2]
    assert head.split()[:4] == ["txn", "label", "state", "tables"]
    assert line.split()[:5] == [str(t.id), "cli-job", "PREPARE", "c,d", "2"]
    assert "loader" in line
    out = vrepl("show", "label:cli-job", "--node", node, "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["rows"] == 2
    out = vrepl("abort", str(t.id), "--node", node, "--reason", "operator says no")
    assert out.returncode == 0, out.stderr
    assert "ABORTED (client: operator says no)" in out.stdout
    out = vrepl("list", "--node", node, "--open")
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 1
    with c.client() as cl:
        done = cl.transaction(VG, "cli-done")
        with done:
            done.put([["c", 3, {"x": 3}]])
    out = vrepl("abort", "label:cli-done", "--node", node)
    assert out.returncode == 1 and "txn_visible" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = vrepl("show", "424242", "--node", node)
    assert out.returncode == 1 and "no_txn" in out.stderr
    out = vrepl("list", "--node", "127.0.0.1:1")
    assert out.returncode == 4 and out.stderr.startswith("vrepl: error:")


def test_one_request_load_everywhere_at_one_version_and_retries_answer_the_original(cluster):
    """POST .../txn with rows and "commit": true (client.load): begin, batch 0 and the
    publish in one request, answered VISIBLE once the publish is committed; a retry with
    the label answers the original; a refused load writes nothing; a load without commit
    stays open and is completed by a later one (a retry after an unknown outcome)."""
    c = cluster()
    rows = [["cpu", 1, {"x": 1.0}], ["mem", 2, {"x": 7}]]
    with c.client() as cl:
        done = cl.load(VG, "one-1", rows)
        v = done["visible_version"]
        assert done["state"] == "VISIBLE" and done["duplicate"] is False and done["rows"] == 2
        assert v == done["txn"] + 2 == done["version"]     # begin, rows, publish: 3 records
        for n in c.nodes:
            c.wait_for(f"n{n} publishes", lambda n=n: rows_of(c, n, "mem") != [], 10)
            assert rows_of(c, n, "cpu") == [(1, v, 1.0)] and rows_of(c, n, "mem") == [(2, v, 7)]
            code, doc = call(c, n, "GET", "txn/label:one-1")
            assert code == 200 and doc["state"] == "VISIBLE" and doc["visible_version"] == v
        again = cl.load(VG, "one-1", [["cpu", 9, {"x": 9.0}]])
        assert again["duplicate"] is True and again["txn"] == done["txn"]
        assert again["visible_version"] == v and len(rows_of(c, c.master(), "cpu")) == 1
        m = c.master()
        top = c.vgroup_status(m)["version"]
        code, doc = call(c, m, "POST", "txn", b'{"label":"one-2","rows":[["cpu",5,{"x":"s"}]],'
                         b'"commit":true}')
        assert code == 400 and doc["code"] == "bad_rows" and doc["outcome"] == "not_written"
        # Its one line says no transaction was begun (none is: no id to name, none open).
        assert doc["error"].startswith("begin: ") and "no transaction begun" in doc["error"]
        assert "stays open" not in doc["error"] and "transaction 1" not in doc["error"]
        code, doc = call(c, m, "POST", "txn", b'{"label":"one-2","rows":[],"commit":true}')
        assert code == 400 and doc["code"] == "bad_txn"
        code, doc = call(c, m, "POST", "txn", b'{"label":"one-2","commit":"yes"}')
        assert code == 400 and doc["code"] == "bad_txn"
        assert c.vgroup_status(m)["version"] == top
        assert call(c, m, "GET", "txn/label:one-2")[0] == 404
        # Rows without commit: begun with batch 0, open; the same request with commit
        # completes it (batch 0 not staged twice).
        code, doc = call(c, m, "POST", "txn", b'{"label":"one-3","rows":[["cpu",3,{"x":3.0}]]}')
        assert code == 200 and doc["state"] == "PREPARE" and doc["rows"] == 1
        for n in c.nodes:
            assert rows_of(c, n, "cpu") == [(1, v, 1.0)]
        done3 = cl.load(VG, "one-3", [["cpu", 3, {"x": 3.0}]])
        assert done3["state"] == "VISIBLE" and done3["txn"] == doc["txn"] and done3["rows"] == 1
        assert rows_of(c, m, "cpu") == [(1, v, 1.0), (3, done3["visible_version"], 3.0)]


def raw(c: LocalCluster, node: int, method: str, path: str, body: bytes | None = None
        ) -> tuple[int, dict]:
    """One exchange with the stdlib's HTTP client (not vrepl.client): (status, JSON)."""
    req = urllib.request.Request(f"http://{c.nodes[node].http}{path}", data=body,
                                 method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_every_step_refusal_says_not_written(cluster):
    """docs/client-api.md §Transactions: a step's refusals write nothing and say
    `"outcome": "not_written"` (but 504's unknown): no such transaction, a bad {txn}, no
    such vgroup, a step with the wrong method; reads (show, list) carry no outcome."""
    c = cluster()
    m = c.master()
    vgp = f"/v1/vgroups/{VG}"
    steps = [("POST", f"{vgp}/txn/99999/rows?seq=0", b'[["t", 1, {"x": 1}]]', 404, "no_txn"),
             ("POST", f"{vgp}/txn/label:nobody/commit", b"", 404, "no_txn"),
             ("POST", f"{vgp}/txn/99999/precommit", b"", 404, "no_txn"),
             ("POST", f"{vgp}/txn/99999/abort", b"", 404, "no_txn"),
             ("POST", f"{vgp}/txn/99999/file?table=t&seq=0", b"PAR1", 404, "no_txn"),
             ("POST", f"{vgp}/txn/nonsense/commit", b"", 400, "bad_txn"),
             ("POST", "/v1/vgroups/77/txn", b'{"label": "a"}', 404, "no_vgroup"),
             ("POST", "/v1/vgroups/77/txn/1/commit", b"", 404, "no_vgroup"),
             ("POST", "/v1/vgroups/77/txn/1/file?table=t&seq=0", b"PAR1", 404, "no_vgroup"),
             ("GET", f"{vgp}/txn/1/commit", None, 405, "bad_method")]
    for method, path, body, status, code in steps:
        got, doc = raw(c, m, method, path, body)
        assert (got, doc.get("code")) == (status, code), (method, path, doc)
        assert doc.get("outcome") == "not_written", (method, path, doc)
    for path, status, code in [(f"{vgp}/txn/99999", 404, "no_txn"),
                               ("/v1/vgroups/77/txn", 404, "no_vgroup")]:
        got, doc = raw(c, m, "GET", path)
        assert (got, doc.get("code")) == (status, code) and "outcome" not in doc, (path, doc)
