"""The named fault schedules (docs/reliability.md §Schedules). Each is a function
`schedule(base_dir, long=False, namespaced=None) -> Result`: build a cluster, run the workload
under the faults, heal, converge and check. Durations are short for CI; `long=True`
(VREPL_CHAOS_LONG=1) repeats the fault cycle and holds each fault longer.

A schedule raises NemesisUnsupported when it needs the namespaced topology (or root) and
runs in the loopback fallback.
"""

from __future__ import annotations

import time
from typing import Callable

from vrepl.testing.chaos.harness import ChaosCluster, Result
from vrepl.testing.chaos.netns import NemesisUnsupported

SCHEDULES: dict[str, Callable[..., Result]] = {}
NEEDS_NETNS: set[str] = set()


def schedule(needs_netns: bool = False):
    def deco(fn):
        SCHEDULES[fn.__name__] = fn
        if needs_netns:
            NEEDS_NETNS.add(fn.__name__)
        return fn
    return deco


def _cluster(base_dir: str, namespaced: bool | None, needs_netns: bool = False, **kw) -> ChaosCluster:
    c = ChaosCluster(base_dir, namespaced=namespaced, **kw)
    if needs_netns and not c.namespaced:
        c.close()
        raise NemesisUnsupported("needs the namespaced topology (root, ip, nft)")
    return c


def _warm(c: ChaosCluster, seconds: float = 1.5) -> int:
    m = c.wait_master(timeout_s=15)
    c.start_workload()
    time.sleep(seconds)
    return m


def _others(c: ChaosCluster, m: int) -> list[int]:
    return [i for i in c.nodes if i != m]


def _cycles(long: bool) -> int:
    return 4 if long else 1


@schedule()
def kill_master(base_dir: str, long: bool = False, namespaced: bool | None = None) -> Result:
    """SIGKILL the master under load; a new master is elected; the old one restarts and follows."""
    with _cluster(base_dir, namespaced).start() as c:
        m = _warm(c)
        for _ in range(_cycles(long)):
            c.kill(m)
            new = c.wait_master(among=_others(c, m), timeout_s=15)
            time.sleep(2.0)
            c.restart(m)
            time.sleep(1.0)
            m = new
        return c.finish()


@schedule()
def pause_master(base_dir: str, long: bool = False, namespaced: bool | None = None) -> Result:
    """SIGSTOP the master for longer than the heartbeat timeout; it wakes deposed (its forwards
    are refused) and follows the new master."""
    with _cluster(base_dir, namespaced).start() as c:
        m = _warm(c)
        for _ in range(_cycles(long)):
            c.pause(m)
            new = c.wait_master(among=_others(c, m), timeout_s=15)
            time.sleep(1.5)
            c.resume(m)
            c.wait_for(f"n{m} follows", lambda: c.role(m) == "slave", 15)
            time.sleep(1.0)
            m = new
        return c.finish()


@schedule(needs_netns=True)
def isolate_master_minority(base_dir: str, long: bool = False, namespaced: bool | None = None) -> Result:
    """Partition the master alone from the other two while clients (who reach everybody) keep
    writing to it: it cannot confirm, steps down; the majority elects; nothing confirmed is lost."""
    with _cluster(base_dir, namespaced, needs_netns=True).start() as c:
        m = _warm(c)
        for _ in range(_cycles(long)):
            c.mark(f"isolate n{m}")
            c.topo.partition([f"n{m}"], [f"n{i}" for i in _others(c, m)])
            new = c.wait_master(among=_others(c, m), timeout_s=15)
            time.sleep(4.0 if long else 2.5)
            c.heal()
            c.wait_for(f"n{m} follows", lambda: c.role(m) == "slave", 20)
            time.sleep(1.0)
            m = new
        return c.finish()


def isolate_past_flush_age(c: ChaosCluster, m: int, seconds: float) -> list[str]:
    """Cut n<m> (the master) from every other node for `seconds` while the clients reach
    everyone; the harness itself writes twice to n<m> just after the cut (records only n<m>
    will hold). Heal; returns the keys of the harness's writes to n<m>."""
    others = _others(c, m)
    c.mark(f"isolate n{m} for {seconds} s")
    c.topo.partition([f"n{m}"], [f"n{i}" for i in others])
    t_end = time.monotonic() + seconds
    keys = [f"{c.tag}-isolated-n{m}-{len(c.marks)}-{k}" for k in range(2)]
    for key in keys:
        c.write(m, key, wait=False)
    c.wait_master(among=others, timeout_s=15)
    time.sleep(max(0.0, t_end - time.monotonic()))
    c.heal()
    return keys


@schedule(needs_netns=True)
def isolate_master_past_flush_age(base_dir: str, long: bool = False, namespaced: bool | None = None) -> Result:
    """Partition the master from both slaves for 6 s (12 s long), longer than the nodes'
    max_memtable_age_ms (1 s), while clients reach it: it steps down holding records no
    other replica has and archives its memtable while cut off; on heal those records must
    be cut and every replica must hold every acknowledged write, rows identical (issue 13)."""
    with _cluster(base_dir, namespaced, needs_netns=True).start() as c:
        m = _warm(c)
        new = m
        for _ in range(2 if long else 1):
            isolate_past_flush_age(c, m, 12.0 if long else 6.0)
            new = c.wait_master(timeout_s=20)
            c.wait_for(f"n{m} follows", lambda: c.role(m) == "slave", 20)
            time.sleep(1.0)
            m = new
        return c.finish()


@schedule(needs_netns=True)
def split_clients_with_minority(base_dir: str, long: bool = False, namespaced: bool | None = None) -> Result:
    """Split halves, 3 nodes as 1|2: the master and the clients on the minority side, both
    slaves on the other. The clients only reach the deposed master: nothing may be confirmed
    there; the majority elects; after the heal everything converges."""
    with _cluster(base_dir, namespaced, needs_netns=True).start() as c:
        m = _warm(c)
        others = _others(c, m)
        c.mark(f"split n{m}+clients | rest")
        c.topo.partition([f"n{m}", "cl"], [f"n{i}" for i in others])
        c.wait_master(among=others, timeout_s=15)
        time.sleep(5.0 if long else 3.0)
        return c.finish()


@schedule(needs_netns=True)
def one_way_master_out(base_dir: str, long: bool = False, namespaced: bool | None = None) -> Result:
    """One-way partition: the master's packets to the slaves are dropped, theirs to it arrive."""
    with _cluster(base_dir, namespaced, needs_netns=True).start() as c:
        m = _warm(c)
        for _ in range(_cycles(long)):
            c.mark(f"one-way n{m} -> rest")
            for i in _others(c, m):
                c.topo.block(f"n{m}", f"n{i}")
            new = c.wait_master(among=_others(c, m), timeout_s=15)
            time.sleep(2.5)
            c.heal()
            time.sleep(2.0)
            m = new
        return c.finish()


@schedule(needs_netns=True)
def bridge_partition(base_dir: str, long: bool = False, namespaced: bool | None = None) -> Result:
    """Bridge (majorities overlap): the master is cut from one slave only; the other slave
    sees both. Nothing confirmed may be lost whatever the nodes decide."""
    with _cluster(base_dir, namespaced, needs_netns=True).start() as c:
        m = _warm(c)
        a, _b = _others(c, m)
        c.mark(f"bridge: cut n{m} - n{a}")
        c.topo.cut(f"n{m}", f"n{a}")
        time.sleep(6.0 if long else 4.0)
        return c.finish()


@schedule(needs_netns=True)
def packet_drop_10(base_dir: str, long: bool = False, namespaced: bool | None = None) -> Result:
    """10 % of the packets between nodes (and clients) dropped at random for a while."""
    with _cluster(base_dir, namespaced, needs_netns=True).start() as c:
        _warm(c)
        c.mark("drop 10%")
        c.topo.drop_percent(10, [*(f"n{i}" for i in c.nodes), "cl"])
        time.sleep(20.0 if long else 6.0)
        return c.finish()


def _kill_damage_restart(base_dir: str, how: str, nbytes: int, long: bool, namespaced: bool | None) -> Result:
    with _cluster(base_dir, namespaced).start() as c:
        m = _warm(c)
        for _ in range(_cycles(long)):
            c.kill(m)
            c.damage_wal(m, how, nbytes)
            new = c.wait_master(among=_others(c, m), timeout_s=15)
            time.sleep(1.5)
            c.start_node(m)
            c.wait_for(f"n{m} follows", lambda: c.role(m) == "slave", 20)
            assert "torn tail" in c.node_log(m), f"n{m} did not report repairing its WAL tail"
            time.sleep(1.0)
            m = new
        return c.finish()


@schedule()
def kill_truncate_wal_restart(base_dir: str, long: bool = False, namespaced: bool | None = None) -> Result:
    """SIGKILL the master, cut 100 bytes off its WAL tail (a torn write), restart it: the torn
    tail is truncated at start-up and the node follows."""
    return _kill_damage_restart(base_dir, "truncate", 100, long, namespaced)


@schedule()
def kill_corrupt_wal_restart(base_dir: str, long: bool = False, namespaced: bool | None = None) -> Result:
    """SIGKILL the master, flip a bit in the last record of its WAL (5 bytes before the end:
    a write torn with garbage), restart it: the bad last record is dropped as a torn tail."""
    return _kill_damage_restart(base_dir, "corrupt", 5, long, namespaced)


@schedule()
def kill_corrupt_wal_rebuild(base_dir: str, long: bool = False, namespaced: bool | None = None) -> Result:
    """SIGKILL the master and flip a bit 300 bytes before its WAL's end (valid records follow:
    corruption, not a torn write). The node must refuse to start, naming file and offset; the
    operator removes its WAL (the promise file stays) and it is rebuilt from the master."""
    with _cluster(base_dir, namespaced).start() as c:
        m = _warm(c)
        c.kill(m)
        c.damage_wal(m, "corrupt", 300)
        new = c.wait_master(among=_others(c, m), timeout_s=15)
        code, line = c.start_failure(m)
        assert code == 1 and "corrupt at offset" in line, (code, line)
        c.wipe_wal(m)
        c.start_node(m)
        c.wait_for(f"n{m} follows n{new}", lambda: c.role(m) == "slave", 20)
        time.sleep(1.0)
        return c.finish()


@schedule(needs_netns=True)
def disk_full_slave(base_dir: str, long: bool = False, namespaced: bool | None = None) -> Result:
    """A slave's data directory (a 2 MiB tmpfs) fills up: its WAL append fails, it stops
    replicating; the master goes on with the other slave; space is freed, the slave restarts
    and catches up."""
    with _cluster(base_dir, namespaced, needs_netns=True, disk_kib=2048).start() as c:
        m = _warm(c)
        s = _others(c, m)[0]
        c.fill_disk(s)
        c.wait_for(f"n{s} stops on the full disk", lambda: "replication stopped" in c.node_log(s), 10)
        c.wait_for("the master confirms again", lambda: c.current_master() == m, 5)
        time.sleep(4.0 if long else 2.0)
        c.free_disk(s)
        c.restart(s)
        time.sleep(1.0)
        return c.finish()


@schedule()
def successive_elections(base_dir: str, long: bool = False, namespaced: bool | None = None) -> Result:
    """Kill the master three times under load (each time right after the new one is elected
    and the old one restarted)."""
    with _cluster(base_dir, namespaced).start() as c:
        m = _warm(c, 1.0)
        for _ in range(6 if long else 3):
            c.kill(m)
            new = c.wait_master(among=_others(c, m), timeout_s=15)
            time.sleep(0.7)
            c.restart(m)
            m = new
            time.sleep(0.5)
        return c.finish()


@schedule()
def confirmed_write_then_kill(base_dir: str, long: bool = False, namespaced: bool | None = None) -> Result:
    """A write is confirmed, and the master is killed the moment the confirmation arrives; the
    write must be on the new master and on every replica after recovery."""
    with _cluster(base_dir, namespaced).start() as c:
        m = _warm(c, 1.0)
        for k in range(5 if long else 2):
            rec = c.write(m, f"confirmed-{c.run.rsplit('-', 1)[-1]}-{k}")
            c.kill(m)
            assert rec["status"] == "ok", rec
            new = c.wait_master(among=_others(c, m), timeout_s=15)
            time.sleep(0.5)
            c.restart(m)
            m = new
            time.sleep(0.5)
        return c.finish()


@schedule(needs_netns=True)
def replica2_arbitrator_link_cut(base_dir: str, long: bool = False, namespaced: bool | None = None) -> Result:
    """2 replicas (quorum 1) + arbitrator; the direct link between the replicas is cut while
    both reach the arbitrator: exactly one master throughout, the same one."""
    with _cluster(base_dir, namespaced, needs_netns=True, n=2, quorum=1, arbitrator=True).start() as c:
        m = _warm(c)
        s = 3 - m
        c.mark("cut n1 - n2")
        c.topo.cut("n1", "n2")
        t_end = time.monotonic() + (10.0 if long else 5.0)
        while time.monotonic() < t_end:
            if c.role(s) == "master":
                raise AssertionError(f"n{s} became master while n{m} holds the lease: {c.role_summary()}")
            time.sleep(0.05)
        assert c.current_master() == m, c.role_summary()
        return c.finish()


@schedule()
def arbitrator_restart_master_down(base_dir: str, long: bool = False, namespaced: bool | None = None) -> Result:
    """2 replicas (quorum 1) + arbitrator: the master is killed, then the arbitrator restarts
    while the master is down; the survivor must still be elected (after the remembered lease),
    and the old master rejoins as slave. Quorum 1: writes confirmed by the dead master alone
    may be lost; they are counted, not failures (docs/reliability.md §Quorum 1)."""
    with _cluster(base_dir, namespaced, n=2, quorum=1, arbitrator=True).start() as c:
        m = _warm(c)
        s = 3 - m
        c.kill(m)
        assert c.arb is not None
        c.mark("arbitrator restart")
        c.arb.kill()
        c.start_arbitrator()
        c.wait_master(among=[s], timeout_s=20)
        time.sleep(1.5)
        c.restart(m)
        return c.finish(allow_loss=True)


@schedule(needs_netns=True)
def quorum1_isolated_master(base_dir: str, long: bool = False, namespaced: bool | None = None) -> Result:
    """What quorum 1 (asynchronous replication) loses: 3 replicas, quorum 1; the master is
    partitioned from both slaves while clients still reach it. Until it notices (heartbeat
    timeout, 2 s) it confirms writes on its own WAL alone; the majority elects a new master
    and writes; after the heal the old master's suffix is truncated. Those confirmed writes
    are counted as lost_allowed; replicas must still converge to identical logs."""
    with _cluster(base_dir, namespaced, needs_netns=True, quorum=1).start() as c:
        m = _warm(c)
        c.mark(f"isolate n{m} (quorum 1)")
        c.topo.partition([f"n{m}"], [f"n{i}" for i in _others(c, m)])
        c.wait_master(among=_others(c, m), timeout_s=15)
        time.sleep(2.0)
        return c.finish(allow_loss=True)
