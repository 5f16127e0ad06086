"""free_ports (vrepl/child.py): ports for child servers that an outgoing connection cannot
take first (below the kernel's ephemeral range) and that one process never hands out twice
in a row."""
from __future__ import annotations

import socket

from vrepl.child import LOOPBACK, free_ports


def ephemeral_low() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
        return int(fh.read().split()[0])


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    ports = free_ports(20)
    assert len(set(ports)) == 20
    low = ephemeral_low()
    if low - 10000 >= 4096:
        assert all(10000 <= p < low for p in ports), ports
    for p in ports:
        with socket.socket() as s:
            s.bind((LOOPBACK, p))


def test_a_port_is_not_handed_out_again_soon():
    seen: set[int] = set()
    for _ in range(50):
        got = free_ports(10)
        assert not seen & set(got)
        seen |= set(got)


def test_a_port_in_use_is_skipped(monkeypatch):
    import vrepl.child as child

    lo, hi = child._listen_port_range()
    if not lo:
        return  # no room below the ephemeral range here: the kernel picks (bind to 0)
    with socket.socket() as held:
        free = next(p for p in range(lo + 7, hi) if p not in child._HANDED_OUT and p + 1 not in child._HANDED_OUT)
        held.bind((LOOPBACK, free))
        held.listen()
        picks = iter([free, free, free + 1])

        class Picker:
            def randrange(self, a: int, b: int) -> int:
                return next(picks)

        monkeypatch.setattr(child, "_PICK", Picker())
        assert free_ports(1) == [free + 1]
