"""Restore sessions in the simulation (docs/simulation.md §Restore): a follower far enough
behind is brought up by production's restore session code (vrepl/restore/sender.py,
receiver.py) over the simulated sync connection, app files and WAL, through the production
driver's restore operations; faults during the session (either side crashing, the
connection cut, a file changed on the source) leave a group that still converges with every
confirmed write."""

from __future__ import annotations

import pytest
from simhelp import calm, one_master, wait_for

from vrepl.replica import Role


def seeds(n: int) -> list:
    """range(n) as parameters, all but seed 0 marked slow (the inner loop runs seed 0)."""
    return [seed if seed == 0 else pytest.param(seed, marks=pytest.mark.slow) for seed in range(n)]


def lagging_follower(seed: int, files: bool = False):
    """A 3-replica world whose follower f missed more records than restore_min_lag_versions
    while down, restarted: its master starts a restore session for it. With `files`, the
    master's app archived what f lacks first and every such session runs the files phase."""
    w = calm(3, seed, restore_min_lag_versions=5, restore_files_share=1.0 if files else 0.0)
    assert wait_for(w, lambda: one_master(w) is not None, 120)
    m = one_master(w)
    f = next(sn for sn in w.nodes.values() if sn is not m)
    w.run_ticks(10)
    w.crash(f.node)
    assert wait_for(w, lambda: len(m.wal) >= len(f.wal) + 40, 300), "the master took no writes"
    if files:
        assert wait_for(w, lambda: m.app_commit > len(f.wal) + 20, 100), "the master committed nothing"
        w.app_flush(m)
    w.restart(f.node)
    w.restores_before = w.restores.ended_ok, w.restores.failed + w.restores.cancelled  # a cold start may restore too
    return w, m, f


def converge(w):
    final = w.run_liveness()  # raises unless one master, a confirmed probe and identical logs
    for sn in w.nodes.values():
        assert sn.wal == final.wal
    return final


@pytest.mark.parametrize("seed", seeds(3))
def test_a_lagging_follower_is_restored_and_follows_live(seed):
    w, m, f = lagging_follower(seed)
    assert wait_for(w, lambda: f.replica.counters["restores_ended_ok"] >= 1, 200), "f's restore never ended"
    assert f.replica.counters["restores_begun"] >= 1
    w.workload_on = False
    assert wait_for(w, lambda: f.replica.role == Role.SLAVE and f.wal == m.wal, 200)
    assert f.wal == converge(w).wal


@pytest.mark.parametrize("seed", seeds(3))
def test_the_files_phase_installs_the_masters_files_and_rebases_the_wal(seed):
    w, m, f = lagging_follower(seed, files=True)
    archived_then = len(m.archive)
    assert archived_then > len(f.wal)
    assert wait_for(w, lambda: f.replica.counters["restores_ended_ok"] >= 1, 300), "f's restore never ended"
    assert w.restores.with_files >= 1 and w.restores.files_sent >= 1
    # The follower's files are the master's (the same names and bytes at the swap), its
    # WAL was rebased on them (LogRebased) and the WAL phase continued after them.
    assert f.replica.counters["log_rebases"] >= 1
    assert len(f.archive) >= archived_then
    assert f.archive == m.archive[:len(f.archive)]
    assert f.wal[:archived_then] == m.wal[:archived_then]
    w.workload_on = False
    assert wait_for(w, lambda: f.replica.role == Role.SLAVE and f.wal == m.wal, 200)
    final = converge(w)
    w.check_app_final(f, final)


@pytest.mark.parametrize("seed", seeds(3))
def test_a_file_changed_on_the_source_mid_restore_restarts_the_session(seed):
    w, m, f = lagging_follower(seed, files=True)
    in_files = lambda: any(s.state == "files" for s in w.restores.sessions.values())  # noqa: E731
    assert wait_for(w, in_files, 200), "no restore session reached its files phase"
    # Once the sender has sent every data file (the manifest is next), the master's app
    # flushes: its last data file is rewritten (same name, new bytes) or a new one appears.
    flushed = False
    for _ in range(3000):
        s = next(iter(w.restores.sessions.values()), None)
        if not flushed and s is not None and s.state == "files" and m.app_commit > len(m.archive) \
                and s.sender.stats.files_checked >= len(m.files):
            w.app_flush(m)
            flushed = True
        if w.restores.files_changed:
            break
        w.run_until(w.now + 1)
    assert w.restores.files_changed >= 1, "no session saw a file change on the source"
    assert w.restores.failed + w.restores.cancelled > w.restores_before[1]
    assert wait_for(w, lambda: f.replica.counters["restores_ended_ok"] >= 1, 400), "no later session succeeded"
    final = converge(w)
    w.check_app_final(f, final)


@pytest.mark.parametrize("phase", ["files", "wal"])
@pytest.mark.parametrize("fault", ["crash_master", "crash_follower", "cut_connection"])
@pytest.mark.parametrize("seed", seeds(2))
def test_a_fault_during_restore_fails_the_session_and_the_group_converges(seed, fault, phase):
    w, m, f = lagging_follower(seed, files=phase == "files")
    running = lambda: any(s.state == phase for s in w.restores.sessions.values())  # noqa: E731
    assert wait_for(w, running, 200), f"no restore session reached its {phase} phase"
    if fault == "crash_master":
        w.crash(m.node)
    elif fault == "crash_follower":
        w.crash(f.node)
    else:
        w._break(m.node, f.node, notify=True)  # the kernel resets the connection
    w.run_ticks(20)
    # Failed, or cancelled: the follower resynced at once and a new session replaced it.
    assert w.restores.failed + w.restores.cancelled > w.restores_before[1]
    final = converge(w)
    for sn in w.nodes.values():
        w.check_app_final(sn, final)
