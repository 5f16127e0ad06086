"""Helpers for the simulator tests (docs/simulation.md): calm worlds the tests script."""

from __future__ import annotations

from vrepl.testing.sim import SimOptions, World


def calm(n: int = 3, seed: int = 1, **opts) -> World:
    """A started world without random faults: the test injects them."""
    w = World(seed, SimOptions(replicas=n, faults=False, **opts))
    w.start()
    return w


def wait_for(w: World, pred, ticks: int = 300, each=None) -> bool:
    for _ in range(ticks):
        if pred():
            return True
        w.run_ticks(1)
        if each is not None:
            each()
    return bool(pred())


def one_master(w: World):
    ms = w.masters()
    return ms[0] if len(ms) == 1 else None


def at_most_one_master(w: World) -> None:
    assert len(w.masters()) <= 1, [w.describe_node(sn) for sn in w.nodes.values()]
