"""Regression test of issue 13: an isolated master that archives its unconfirmed records.

The scenario as reported, with the shipped `vrepl node` (3 replicas, quorum 2, default
settings but `max_memtable_age_ms = 1000`), in network namespaces with nftables partitions:
clients write all the time; the master's links to both slaves are cut for 6 s while the
clients still reach it, so it steps down holding records no other replica has (two of them
written by this test straight after the cut) and, a second later, its memtable's age limit
archives them into Parquet files; the slaves elect a new master that confirms new writes at
those same versions. Then:

1. heal, wait for one master and every log at the same end, read every table from every
   replica through the client API: every acknowledged write on every replica, at the version
   and epoch it was confirmed at, replicas identical row for row;
2. stop the new master (SIGKILL): the remaining two (quorum 2 of 3 tolerates one down) elect
   a master, confirm a write, and both must still return every acknowledged write;
3. restart it, converge, read all three again, stop them and compare the WALs too.

Before the fix (issue 13) the old master truncated its WAL below its archived version, logged
CRITICAL, carried on as a slave and kept serving its own discarded rows: phase 1 finds the
acknowledged writes of the new epoch missing (or at the old epoch's version) on it.
"""

from __future__ import annotations

import json
import time

import pytest

from vrepl.testing.chaos.harness import ChaosCluster
from vrepl.testing.chaos.netns import namespaces_available
from vrepl.testing.chaos.schedules import isolate_past_flush_age

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(namespaces_available() is not None,
                                 reason=f"needs network namespaces: {namespaces_available()}")]

ISOLATION_S = 6.0
# The reporter's settings: everything default but the memtable's age limit.
VNODE = {"max_memtable_age_ms": 1000}


def test_isolated_master_archiving_unconfirmed_records_loses_no_acknowledged_write(tmp_path, no_leftovers):
    findings: list[str] = []
    with ChaosCluster(str(tmp_path), namespaced=True, vnode=VNODE, node={}).start() as c:
        old = c.wait_master(timeout_s=20)
        c.start_workload()
        time.sleep(2.0)
        isolated_keys = isolate_past_flush_age(c, old, ISOLATION_S)

        # 1. After the heal: every replica.
        conv = c.converge(timeout_s=40)
        new = conv["master"]
        c.mark("phase 1 read")
        hist = {op["key"]: op for op in c.history()}
        # The scenario happened: the old master took writes it could not confirm.
        assert [hist.get(k, {}).get("status") for k in isolated_keys] == ["unknown"] * 2, \
            [hist.get(k) for k in isolated_keys]
        v1 = c.check(c.read_rows())
        assert v1.ok > 0 and v1.replicas_read == 3, v1.summary()
        if not v1.safe:
            findings.append(f"after the heal (old master n{old}, new master n{new}): {v1.problems()}")

        # 2. The new master down: the remaining two must still serve every acknowledged write.
        rest = [i for i in c.nodes if i != new]
        c.kill(new)
        c.wait_master(among=rest, timeout_s=20)
        c.settle(among=rest, timeout_s=40)
        v2 = c.check(c.read_rows(among=rest))
        assert v2.replicas_read == 2, v2.summary()
        if not v2.safe:
            findings.append(f"with n{new} down (n{rest[0]}, n{rest[1]} left): {v2.problems()}")

        # 3. Everyone back; rows and WALs.
        res = c.finish(timeout_s=40)
        if not res.safe:
            findings.append(f"after restarting n{new}: {res.verdict.problems()}"
                            f" masters in one epoch: {res.masters_in_one_epoch}")
        print(json.dumps({"old_master": old, "new_master": new, "phase1": v1.summary(),
                          "phase2": v2.summary(), "final": res.summary()}))
    assert not findings, "\n".join(findings) + f"\n(logs: {c.dir})"
