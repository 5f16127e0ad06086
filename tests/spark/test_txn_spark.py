"""The Spark writer (vrepl/spark/write.py, docs/transactions.md §12) against three real
`vrepl node` processes, on local[2]: a DataFrame is loaded in one transaction (every row at
one publish version), a job run again with the same label loads nothing twice, a failing
job aborts its transaction and leaves nothing visible, and a retried task (a partition
staged twice) does not double rows."""
from __future__ import annotations

import pytest

import vrepl.spark
from vrepl.errors import BadRequestError, WriteInputError
from vrepl.node.local import LocalCluster
from vrepl.spark.write import _stage_partition

pytestmark = pytest.mark.timeout(240)
VG = 1


@pytest.fixture
def cluster(tmp_path):
    c = LocalCluster(str(tmp_path / "c"), 3, vgroup=VG)
    c.start()
    c.wait_ready()
    c.wait_master(slaves=2)
    yield c
    c.close()


def test_spark_writer_loads_once_and_aborts_on_failure(spark, cluster):
    c = cluster
    df = spark.createDataFrame([(f"t{i % 3}", i, float(i), f"h{i % 5}" if i % 7 else None)
                                for i in range(1, 2001)],
                               ["table", "ts", "x", "host"]).repartition(4)
    df = df.selectExpr("*", "cast(ts as decimal(12, 2)) / 4 as d")      # a decimal: as float
    done = vrepl.spark.write(df, c.endpoints, VG, "spark-1", batch_rows=300)
    v = done["visible_version"]
    assert done["state"] == "VISIBLE" and done["rows"] == 2000
    for n in c.nodes:
        c.wait_for(f"n{n} has the load", lambda n=n: sum(
            len(c.replica_rows(n, t)) for t in ("t0", "t1", "t2")) == 2000, 20)
        got = [r for t in ("t0", "t1", "t2") for r in c.replica_rows(n, t)]
        assert {r["_version"] for r in got} == {v} and len(got) == 2000
        assert all(r["d"] == r["ts"] / 4 and r["x"] == float(r["ts"]) for r in got)
        assert all(r.get("host") == (f"h{r['ts'] % 5}" if r["ts"] % 7 else None) for r in got)
    again = vrepl.spark.write(df, c.endpoints, VG, "spark-1")      # the job run again
    assert again["duplicate"] is True and again["visible_version"] == v
    assert len(c.replica_rows(c.master(), "t0")) == len([i for i in range(1, 2001) if i % 3 == 0])

    def boom(row):
        if row.ts == 1500:
            raise ValueError("bad row")
        return row
    # a column the vnode has no type for: refused on the driver, nothing begun
    arr = spark.createDataFrame([("u", 1, [1, 2])], ["table", "ts", "xs"])
    with pytest.raises(WriteInputError, match="column 'xs' is ArrayType"):
        vrepl.spark.write(arr, c.endpoints, VG, "spark-arr")
    with c.client() as cl, pytest.raises(BadRequestError, match="no_txn|404"):
        cl._get(VG, "txn/label:spark-arr", None)

    bad = spark.createDataFrame([("u", i, 1.0) for i in range(1, 2001)], ["table", "ts", "x"])
    bad = bad.rdd.map(boom).toDF(["table", "ts", "x"]).repartition(2)
    with pytest.raises(Exception):
        vrepl.spark.write(bad, c.endpoints, VG, "spark-2", batch_rows=100)
    with c.client() as cl:
        shown = cl._get(VG, "txn/label:spark-2", None)
        assert shown["state"] == "ABORTED" and "spark job failed" in shown["reason"]
    assert c.replica_rows(c.master(), "u") == []


def test_a_retried_task_does_not_double_rows(cluster):
    c = cluster

    lines = [f'{{"a":{i},"b":"r","c":{{"x":{i}}}}}' for i in range(1, 101)]
    with c.client() as cl:
        txn = cl.transaction(VG, "retried").begin()
    for _attempt in range(2):     # the same partition staged twice (a retried task)
        assert _stage_partition(3, iter(lines), c.endpoints, VG, txn.id, "retried", 30, {},
                                puts_in_flight=3) == 100
    with c.client() as cl:
        t = cl.transaction(VG, "retried")
        t.id = txn.id
        assert t.show()["rows"] == 100
        assert t.commit()["rows"] == 100
    assert len(c.replica_rows(c.master(), "r")) == 100
