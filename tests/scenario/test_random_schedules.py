"""Seeded random schedules over the scenario network: a safety phase under faults (message
reordering across links, cuts, crashes, restarts with lost unsynced WAL tails, slow WALs),
then a liveness phase after every fault is healed. On failure the seed is in the test id;
rerun with `-k "seed_N"`. A small stand-in for the simulator of the simulation issue.
"""

from __future__ import annotations

import random

import pytest
from simnet import Net

from vrepl.replica import Role

SEEDS = range(40)


def check_safety(net: Net) -> None:
    by_epoch: dict[int, int] = {}
    for m in net.masters():
        epoch = net.nodes[m].replica.promised_epoch
        assert epoch not in by_epoch, f"two masters n{by_epoch[epoch]} n{m} in e{epoch}"
        by_epoch[epoch] = m
        # Leader completeness: a master holds every record confirmed in an older epoch.
        wal = net.nodes[m].wal
        for v, rec in net.confirmed.items():
            if rec.epoch < epoch:
                assert len(wal) >= v and wal[v - 1] == rec, f"master n{m} e{epoch} lacks confirmed {rec.describe()}"


def run_schedule(seed: int, n: int) -> None:
    rng = random.Random(seed)
    net = Net(n, forward_timeout_ticks=15)
    net.start()
    next_version = {node: 1 for node in net.node_ids}
    for _ in range(400):
        op = rng.random()
        up = [x for x in net.node_ids if net.nodes[x].up]
        if op < 0.45:
            queues = sorted(k for k, q in net.queues.items() if q)
            if queues:
                src, dst = rng.choice(queues)
                net.deliver(src, dst, count=rng.randint(1, 3))
            net.settle()
        elif op < 0.65:
            for m in net.masters():
                v = net.nodes[m].replica.last_version + 1
                net.forward(m, v, b"s%d-n%d-v%d" % (seed, m, v))
                next_version[m] = v + 1
        elif op < 0.8:
            net.tick(1, run=False)
            net.settle()
        elif op < 0.85:
            a, b = rng.sample(list(net.node_ids), 2)
            net.cut(a, b)
        elif op < 0.9:
            a, b = rng.sample(list(net.node_ids), 2)
            net.heal(a, b)
        elif op < 0.93 and len(up) > 1:
            victim = rng.choice(up)
            net.crash(victim)
        elif op < 0.97:
            down = [x for x in net.node_ids if not net.nodes[x].up]
            if down:
                net.restart(rng.choice(down))
        else:
            node = rng.choice(up)
            net.nodes[node].auto_persist = not net.nodes[node].auto_persist
            if net.nodes[node].auto_persist:
                net.persist(node)
            net.settle()
        check_safety(net)

    # Liveness: heal everything; the group must elect one master and converge.
    net.cut_links.clear()
    for node in net.node_ids:
        net.nodes[node].auto_persist = True
        if net.nodes[node].up:
            net.persist(node)
        else:
            net.restart(node)
    net.run()
    for _ in range(200):
        net.tick(1)
        check_safety(net)
        if len(net.masters()) == 1 and all(net.nodes[x].role == Role.SLAVE for x in net.node_ids if x not in net.masters()):
            break
    masters = net.masters()
    assert len(masters) == 1, f"no single master after healing: {[net.nodes[x].replica.describe() for x in net.node_ids]}"
    m = masters[0]
    v = net.nodes[m].replica.last_version + 1
    net.forward(m, v, b"final")
    net.run()
    assert net.nodes[m].confirms.get(v) is not None and net.confirmed.get(v) is not None
    wals = {x: net.nodes[x].versions() for x in net.node_ids}
    assert all(w == wals[m] for w in wals.values()), wals
    check_safety(net)


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed_{s}" for s in SEEDS])
@pytest.mark.parametrize("n", [3, 5])
def test_random_schedule_is_safe_and_live(seed, n):
    run_schedule(seed, n)
