"""Restore sessions in the simulation (docs/simulation.md §Restore): a follower far enough
behind is brought up by a restore session through the production driver's restore
operations; faults during the session (either side crashing, the connection cut) leave a
group that still converges with every confirmed write."""

from __future__ import annotations

import pytest
from simhelp import calm, one_master, wait_for

from vrepl.replica import Role


def lagging_follower(seed: int):
    """A 3-replica world whose follower f missed more records than restore_min_lag_versions
    while down, restarted: its master starts a restore session for it."""
    w = calm(3, seed, restore_min_lag_versions=5)
    assert wait_for(w, lambda: one_master(w) is not None, 120)
    m = one_master(w)
    f = next(sn for sn in w.nodes.values() if sn is not m)
    w.run_ticks(10)
    w.crash(f.node)
    assert wait_for(w, lambda: len(m.wal) >= len(f.wal) + 20, 200), "the master took no writes"
    w.restart(f.node)
    w.restores_before = w.restores.ended_ok, w.restores.failed  # a cold start may restore too
    return w, m, f


@pytest.mark.parametrize("seed", range(3))
def test_a_lagging_follower_is_restored_and_follows_live(seed):
    w, m, f = lagging_follower(seed)
    assert wait_for(w, lambda: w.restores.ended_ok > w.restores_before[0], 200), "no restore session ended"
    assert f.replica.counters["restores_begun"] >= 1
    assert f.replica.counters["restores_ended_ok"] >= 1
    w.workload_on = False
    assert wait_for(w, lambda: f.replica.role == Role.SLAVE and f.wal == m.wal, 200)
    final = w.run_liveness()
    assert f.wal == final.wal


@pytest.mark.parametrize("fault", ["crash_master", "crash_follower", "cut_connection"])
@pytest.mark.parametrize("seed", range(2))
def test_a_fault_during_restore_fails_the_session_and_the_group_converges(seed, fault):
    w, m, f = lagging_follower(seed)
    running = lambda: any(s.state == "wal" for s in w.restores.sessions.values())  # noqa: E731
    assert wait_for(w, running, 200), "no restore session reached its WAL phase"
    if fault == "crash_master":
        w.crash(m.node)
    elif fault == "crash_follower":
        w.crash(f.node)
    else:
        w._break(m.node, f.node, notify=True)  # the kernel resets the connection
    w.run_ticks(20)
    assert w.restores.failed > w.restores_before[1]
    final = w.run_liveness()  # raises unless one master, a confirmed probe and identical logs
    for sn in w.nodes.values():
        assert sn.wal == final.wal
