"""Arbitrator lease rules as a pure table (docs/design.md §5).

Owns: the decision an arbitrator makes for one vgroup: grant or refuse support for a node
as master of an epoch, with a lease in ticks. The standalone arbitrator process (arbitrator/)
and the scenario tests share it, so the guarantee is written once: at most one node holds a
live lease per vgroup, a lease is granted for one epoch to one node only, and epochs granted
never go back.
Must not: do I/O or read a clock (now_tick comes from the caller).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Lease:
    epoch: int
    node: int
    expires_tick: int


class LeaseTable:
    """Per-vgroup leases; `request` returns None when granted, else the refusal reason."""

    __slots__ = ("lease_ticks", "unit", "_by_vgroup")

    def __init__(self, lease_ticks: int, unit: str = "ticks") -> None:
        self.lease_ticks = lease_ticks
        self.unit = unit  # what a tick is, for refusal reasons: the arbitrator's are "ms"
        self._by_vgroup: dict[int, _Lease] = {}

    def request(self, vgroup_id: int, node: int, epoch: int, now_tick: int) -> str | None:
        held = self._by_vgroup.get(vgroup_id)
        if held is not None:
            if epoch < held.epoch:
                return f"vg{vgroup_id} e{epoch} is older than granted e{held.epoch}"
            if epoch == held.epoch and node != held.node:
                return f"vg{vgroup_id} e{epoch} was granted to n{held.node}"
            if node != held.node and held.expires_tick > now_tick:
                left = held.expires_tick - now_tick
                return f"vg{vgroup_id} lease held by n{held.node} for e{held.epoch} for another {left} {self.unit}"
        self._by_vgroup[vgroup_id] = _Lease(epoch, node, now_tick + self.lease_ticks)
        return None

    def holder(self, vgroup_id: int, now_tick: int) -> tuple[int, int] | None:
        """(node, epoch) of the live lease, if any."""
        held = self._by_vgroup.get(vgroup_id)
        if held is None or held.expires_tick <= now_tick:
            return None
        return held.node, held.epoch

    def restore(self, vgroup_id: int, node: int, epoch: int, now_tick: int) -> None:
        """Reload a grant remembered across an arbitrator restart.

        The lease is taken as live for a full lease from now: the arbitrator cannot know when
        it was last renewed, and the master may still hold it. Only that node can renew it
        until then, so a restart never hands a second node a lease for the same time.
        """
        held = self._by_vgroup.get(vgroup_id)
        if held is None or epoch >= held.epoch:
            self._by_vgroup[vgroup_id] = _Lease(epoch, node, now_tick + self.lease_ticks)

    def granted(self) -> dict[int, tuple[int, int]]:
        """vgroup -> (node, epoch) of the latest grant, live or not (what to persist)."""
        return {vg: (lease.node, lease.epoch) for vg, lease in self._by_vgroup.items()}
