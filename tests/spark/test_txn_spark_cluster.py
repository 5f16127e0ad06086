"""The Spark writer (vrepl/spark/write.py) on the standalone cluster of tools/spark_cluster.sh
(issue 17, Deliver 4): a driver process whose SparkSession's master is the cluster's URL
loads a DataFrame into three real `vrepl node` processes; the stages run in the worker's
executors (their own Python processes). Every replica then holds every row once at the
publish version, the transaction is VISIBLE, and the job run again with the same label
loads nothing. The script stops the master and worker by PID, also when the test fails.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from sparkdata import SKIP

from vrepl.child import free_port
from vrepl.node.local import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "spark_cluster.sh")
VG = 1
ROWS = 3000
TABLES = ("c0", "c1", "c2")

# The driver: a plain Python program with its SparkSession on the cluster (what a user's
# pipeline does), run twice with the same label. It prints each run's answer and the
# application's id (the worker keeps a directory per application it ran executors for).
DRIVER = """
import json, os, sys
from vrepl.spark.session import start_session, stop_jvm
import vrepl.spark
url, nodes, label, log, rows, vg = sys.argv[1:5] + [int(a) for a in sys.argv[5:7]]
spark = start_session(url, app_name="vrepl-write-test", log_path=log,
                      conf={"spark.executor.memory": "512m", "spark.executor.cores": "2"})
try:
    df = spark.createDataFrame(
        [(f"c{i % 3}", i, float(i), i * 7, f"h{i % 5}") for i in range(1, rows + 1)],
        ["table", "ts", "x", "n", "host"]).repartition(4)
    first = vrepl.spark.write(df, nodes, vg, label, batch_rows=400)
    again = vrepl.spark.write(df, nodes, vg, label, batch_rows=400)
    print(json.dumps({"first": first, "again": again, "master": spark.sparkContext.master,
                      "app": spark.sparkContext.applicationId}))
finally:
    spark.stop()
    stop_jvm()
"""


@pytest.fixture
def nodes(tmp_path):
    c = LocalCluster(str(tmp_path / "nodes"), 3, vgroup=VG)
    c.start()
    c.wait_ready()
    c.wait_master(slaves=2)
    yield c
    c.close()


@pytest.fixture
def spark_cluster(tmp_path):
    """(url, env, state dir) of a standalone master and worker started by the script;
    stopped after."""
    state = tmp_path / "spark"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    try:
        started = subprocess.run([SCRIPT, "start", "--dir", str(state), "--port",
                                  str(free_port()), "--cores", "2", "--memory", "1g"],
                                 capture_output=True, text=True, timeout=180, env=env)
        assert started.returncode == 0, started.stderr[-2000:]
        yield started.stdout.strip(), env, state
    finally:
        stopped = subprocess.run([SCRIPT, "stop", "--dir", str(state)], capture_output=True,
                                 text=True, timeout=60)
        assert stopped.returncode == 0, stopped.stderr


@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
def test_spark_writer_on_the_standalone_cluster(nodes, spark_cluster, tmp_path):
    c = nodes
    url, env, state = spark_cluster
    assert url.startswith("spark://127.0.0.1:")
    job = subprocess.run(
        [sys.executable, "-c", DRIVER, url, ",".join(c.endpoints), "cluster-1",
         str(tmp_path / "driver.log"), str(ROWS), str(VG)],
        capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
        env=dict(env, PYSPARK_DRIVER_PYTHON=sys.executable))
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-3000:]
    doc = json.loads(job.stdout.strip().splitlines()[-1])
    assert doc["master"] == url
    assert (state / "work" / doc["app"]).is_dir()      # the worker ran its executors
    first, again = doc["first"], doc["again"]
    v = first["visible_version"]
    assert first["state"] == "VISIBLE" and first["rows"] == ROWS
    assert again["duplicate"] is True and again["visible_version"] == v
    want = {t: {i for i in range(1, ROWS + 1) if f"c{i % 3}" == t} for t in TABLES}
    with c.client() as cl:
        shown = cl._get(VG, "txn/label:cluster-1", None)
        assert shown["state"] == "VISIBLE" and shown["rows"] == ROWS
        for n, node in c.nodes.items():
            c.wait_for(f"n{n} applied the publish", lambda ep=node.http: cl.read(
                VG, "c0", node=ep, limit=1)["visible_version"] >= v, 20)
            assert cl._get(VG, "txn/label:cluster-1", node.http)["state"] == "VISIBLE"
            for t in TABLES:
                got = c.replica_rows(n, t)
                assert sorted(r["ts"] for r in got) == sorted(want[t]), (n, t)   # each once
                assert {r["_version"] for r in got} == {v}
                assert all(r["x"] == float(r["ts"]) and r["n"] == r["ts"] * 7
                           and r["host"] == f"h{r['ts'] % 5}" for r in got)
