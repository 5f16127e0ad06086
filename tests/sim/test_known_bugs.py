"""Core bugs the simulator found, each as the schedule that shows it (docs/simulation.md
§Findings). Fixed ones are plain regression tests (all of them, now); an open one would be
xfail(strict=True): when vrepl/replica is fixed it passes, strict xfail turns that into a
failure, and the marker (and any KNOWN_BUGS entry in test_seeds.py) must go.
`python -m vrepl.testing.sim --assume-fixes` runs with the proposed fixes patched in.
"""

from __future__ import annotations

import pytest
from simhelp import calm, one_master, wait_for

from vrepl.replica import Config, Replica
from vrepl.replica.history import EpochHistory
from vrepl.testing.sim import make_options, run_seed


def elect(w, ticks=150):
    assert wait_for(w, lambda: one_master(w) is not None, ticks)
    return one_master(w)


def test_restarted_master_must_not_reuse_its_epoch():
    """Finding 1 (fixed): a restarted master reused its promised epoch after its WAL lost the
    records it wrote in it, so a slave holding one of them differed at the same (epoch, version)."""
    for seed in range(1, 20):  # a cold start whose first master is not the last replica
        w = calm(3, seed)
        w.workload_on = False
        m = elect(w)
        if m.node < 2 and not m.wal:
            break
    epoch = m.replica.promised_epoch
    y = 2  # the node that helps m again: a later index, so m stays the candidate on a tie
    z = next(n for n in w.node_ids if n not in (m.node, y))
    w.run_ticks(5)
    w.cut(m.node, y)
    w.stall_disk(m.node, 100)
    (v,) = w.submit(m, 1)  # reaches z only; m never makes it durable
    assert wait_for(w, lambda: len(w.nodes[z].wal) == v and w.nodes[z].durable == v, 20)
    w.crash(m.node, torn=False)
    assert not m.wal
    w.heal()
    w.partition((z,), (m.node, y))
    w.restart(m.node)
    m2 = elect(w)
    assert m2.node == m.node
    # The fix: a restarted master announces a new epoch. Today it is master of `epoch` again
    # and its next write is a different record at (epoch, v1) than the one z holds.
    assert m2.replica.promised_epoch > epoch
    w.submit(m2, 1)
    w.run_ticks(10)
    w.run_liveness()


def test_node_truncating_its_wal_must_not_become_master():
    """Finding 2 (fixed): a node whose TruncateWalAfter had not completed could win an election
    with the log end it was discarding; TruncateDone then rewound a master's log."""
    w = calm(3, 2)
    w.workload_on = False
    m = elect(w)
    x, y = [n for n in w.node_ids if n != m.node]
    w.submit(m, 3)
    assert wait_for(w, lambda: all(sn.durable == 3 for sn in w.nodes.values()) and not m.outstanding, 50)
    w.cut(m.node, y)
    w.stall_disk(m.node, 200)
    w.submit(m, 7)  # reaches x only, never durable on m: unconfirmed
    assert wait_for(w, lambda: len(w.nodes[x].wal) == 10, 20)
    w.crash(m.node, torn=False)
    w.heal()
    w.partition((x,), (m.node, y))
    w.restart(m.node)
    new = elect(w)
    w.stall_disk(x, 300)  # x's truncation will take a while
    w.heal()
    assert wait_for(w, lambda: w.nodes[x].truncating > 0, 100)
    w.crash(new.node)  # x (still advertising v10) and the other node (v3) elect
    w.run_ticks(100)
    w.run_liveness()


@pytest.mark.slow  # seconds of CPU: outside the `-m "not slow"` loop
def test_a_replica_never_starts_without_the_epoch_history_of_its_wal():
    """Finding 3 (fixed by removal): `EpochHistory.conservative` described a WAL whose epoch
    history was not known as one epoch; a follower restarted so answered a TruncateRequest
    for an older epoch by cutting records it shared with its master, confirmed ones included
    (`--seed 10 --profile harsh --conservative-history-share 0.3`: 23 of 300 harsh runs). There
    is no stand-in now: a non-empty log without its history is refused, and the harsh seeds of
    the old test pass with every restart's history exact (the simulator's only kind now)."""
    with pytest.raises(ValueError, match="a non-empty log needs its epoch_history"):
        Replica(Config(vgroup_id=1, replicas=(1, 2, 3), self_index=0, last_epoch=3, last_version=9))
    assert not hasattr(EpochHistory, "conservative")
    opts = make_options("harsh", replicas=3)
    bad = [r for r in (run_seed(s, opts, "harsh") for s in range(40)) if not r.ok]
    assert not bad, "\n\n".join(r.report() for r in bad[:2])


@pytest.mark.slow
def test_a_forward_appended_from_the_stream_leaves_no_stale_sync_cache_entry():
    """Finding 6 (fixed: Follower._append pops a cached copy of what it appends; the exact
    case is tests/scenario/test_peer_input_scenarios.py): n0 cached the live forward v305 before its SyncStart; the restore's WAL
    stream appended v305 (Follower._take_forward appends v = last + 1 but leaves a cached copy
    of v; _drain_cache pops only last + 1 on), so len(cache) stays 1 and update_role keeps
    it syncing: recovery takes 421 ticks instead of 32 (with the cached copy popped on
    append). The seed is a schedule of the campaign of 2026-11-24 (it moves when the
    simulator's or the core's messages change)."""
    r = run_seed(500030, make_options("default", replicas=3), "default")
    assert r.ok, r.report()
    assert r.stats.recovery_ticks < 150, f"recovered in {r.stats.recovery_ticks} ticks"
