"""Three node processes on loopback, real sockets, real signals (issue 3 §Tests).

Each node is `python -m vrepl.testing.node_runner` (one vgroup, its own WAL); the test drives
it over stdin and reads its JSON events. Timeouts are the defaults (tick 100 ms, heartbeat
timeout 20 ticks = 2 s) unless a test says otherwise.
"""

from __future__ import annotations

import signal
import time

import pytest

pytestmark = pytest.mark.timeout(60)

SIZE = 128


def wait_confirmed(c, node, last, timeout_s=15.0):
    c.wait_for(f"n{node} confirms v{last}", lambda: max(c.confirmed_ok(node), default=0) >= last, timeout_s)


def wait_wal_end(c, node, last, timeout_s=10.0):
    c.wait_for(f"n{node} WAL reaches v{last}", lambda: (c.wal(node) or [(0, 0, b"")])[-1][1] >= last, timeout_s)


def test_three_nodes_forward_and_all_wals_are_identical(make_cluster):
    c = make_cluster(3)
    m = c.wait_master(slaves=2)
    c.send(m, f"forward 3000 {SIZE}")
    wait_confirmed(c, m, 3000)
    for n in c.nodes:
        wait_wal_end(c, n, 3000)
    wals = {n: c.wal(n) for n in c.nodes}
    assert [v for _, v, _ in wals[m]] == list(range(1, 3001))
    assert wals[1] == wals[2] == wals[3]
    assert all(len(p) == SIZE for _, _, p in wals[m])


def test_kill_master_new_master_holds_every_confirmed_write_then_old_rejoins_as_slave(make_cluster):
    c = make_cluster(3)
    m = c.wait_master(slaves=2)
    c.send(m, f"forward 20000 {SIZE}")
    c.wait_for("some confirms", lambda: len(c.confirmed_ok(m)) >= 2000, 15)
    c.signal(m, signal.SIGKILL)
    killed_at = time.monotonic()
    confirmed = c.confirmed_ok(m)  # everything the dead master told its app was written
    others = [n for n in c.nodes if n != m]
    new = c.wait_master(among=others, timeout_s=5)
    took_s = time.monotonic() - killed_at
    assert took_s < 1.5, f"new master after {took_s:.2f} s"
    wal = {v: (e, p) for e, v, p in c.wal(new)}
    missing = [v for v in confirmed if v not in wal]
    assert not missing, f"confirmed versions lost: {missing[:5]}..."
    # The new master accepts forwards.
    before = time.monotonic()
    c.send(new, f"forward 100 {SIZE}")
    c.wait_for("new master confirms", lambda: any(e["status"] == "ok" for e in c.confirms(new, before)), 10)
    # The old master comes back and follows (truncating any suffix it alone had).
    c.start(m)
    c.wait_for(f"n{m} rejoins as slave", lambda: c.nodes[m].role() == "slave", 15)
    last = max(c.confirmed_ok(new))
    wait_wal_end(c, m, last)
    assert c.wal(m)[: last] == c.wal(new)[: last]


def test_sigstop_master_others_elect_then_the_old_master_is_refused_and_follows(make_cluster):
    c = make_cluster(3)
    m = c.wait_master(slaves=2)
    c.send(m, f"forward 500 {SIZE}")
    wait_confirmed(c, m, 500)
    c.signal(m, signal.SIGSTOP)
    stopped_at = time.monotonic()
    others = [n for n in c.nodes if n != m]
    new = c.wait_master(among=others, timeout_s=6)
    took_s = time.monotonic() - stopped_at
    # heartbeat timeout (2 s) + 0.5 s, plus scheduling slack of a loaded test machine
    assert took_s < 2.5 + 0.5, f"new master after {took_s:.2f} s"
    c.send(new, f"forward 200 {SIZE}")
    resumed_at = time.monotonic()
    c.signal(m, signal.SIGCONT)
    c.send(m, f"forward 50 {SIZE}")  # the deposed master still believes for a moment
    c.wait_for(f"n{m} follows", lambda: c.nodes[m].role() == "slave", 15)
    late = [e for e in c.confirms(m) if e["t"] >= resumed_at]
    assert late, "the old master's forwards got an answer"
    assert all(e["status"] != "ok" for e in late), late
    last = max(c.confirmed_ok(new))
    wait_wal_end(c, m, last)
    assert c.wal(m) == c.wal(new)[: len(c.wal(m))]
