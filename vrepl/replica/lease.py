"""Arbitrator lease rules as a pure table (docs/design.md §5).

Owns: the decision an arbitrator makes for one vgroup: grant or refuse support for a node
as master of an epoch, with a lease counted in the owner's time unit (`LeaseTable.unit`).
The standalone arbitrator process (arbitrator/), the simulator and the scenario tests share
it, so the guarantee is written once: at most one node holds a
live lease per vgroup, a lease is granted for one epoch to one node only, and epochs granted
never go back. Also the margin rule both sides apply (`required_arbitrator_lease_ms`,
`lease_margin_refusal`): how much longer than the master's own count the arbitrator's lease
must be.
Must not: do I/O or read a clock (`now` comes from the caller, in the table's unit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# docs/design.md §5 "The margin". The master counts its lease on its clock from when it SENT
# the request and acts on its end at its next tick; the arbitrator counts on its own clock
# from when it ANSWERED. Clock rates differ (crystal error about 1e-4, NTP slewing up to
# 5e-4 per clock): 1 % is ten times the worst pair. The allowance covers how late the
# master's I/O loop may run the tick that ends its lease (GC, an fsync on the loop, a long
# batch; 4 ticks of the default 100 ms).
DEFAULT_CLOCK_DRIFT_RATIO = 0.01
DEFAULT_LEASE_ALLOWANCE_MS = 400


def required_arbitrator_lease_ms(replica_lease_ms: int, clock_drift_ratio: float, lease_allowance_ms: int) -> int:
    """The shortest arbitrator lease that safely backs a master assuming `replica_lease_ms`:
    replica_lease_ms x (1 + clock_drift_ratio) + lease_allowance_ms, rounded up."""
    # round() first: 2000 x 1.01 is 2020.0000000000002 in binary floating point.
    return math.ceil(round(replica_lease_ms * (1 + clock_drift_ratio), 6)) + lease_allowance_ms


def lease_margin_refusal(
    arbitrator_lease_ms: int, replica_lease_ms: int, clock_drift_ratio: float, lease_allowance_ms: int
) -> str | None:
    """Why an arbitrator lease of `arbitrator_lease_ms` cannot back a master assuming
    `replica_lease_ms` (one line, both numbers and the rule), or None when it can."""
    need = required_arbitrator_lease_ms(replica_lease_ms, clock_drift_ratio, lease_allowance_ms)
    if arbitrator_lease_ms >= need:
        return None
    return (
        f"an arbitrator lease of {arbitrator_lease_ms} ms cannot back a replica lease of {replica_lease_ms} ms:"
        f" it must be at least {need} ms ({replica_lease_ms} ms x (1 + clock_drift_ratio {clock_drift_ratio:g})"
        f" + lease_allowance_ms {lease_allowance_ms})"
    )


@dataclass(slots=True)
class _Lease:
    epoch: int
    node: int
    expires_at: int  # in the table's unit


class LeaseTable:
    """Per-vgroup leases; `request` returns None when granted, else the refusal reason.

    Time is whatever unit the owner counts in, named by `unit` and used for every duration and
    instant the table is given or says: the arbitrator process counts milliseconds of its
    monotonic clock ("ms"), the scenario tests their network's ticks ("ticks"), the
    simulator its time units. A table never mixes two.
    """

    __slots__ = ("lease_length", "unit", "_by_vgroup")

    def __init__(self, lease_length: int, unit: str = "ticks") -> None:
        self.lease_length = lease_length  # how long a grant holds, in `unit`
        self.unit = unit  # named in refusal reasons ("another 40 ms")
        self._by_vgroup: dict[int, _Lease] = {}

    def request(self, vgroup_id: int, node: int, epoch: int, now: int) -> str | None:
        """Grant (or renew) `node` as master of `epoch` at time `now` (in `unit`)."""
        held = self._by_vgroup.get(vgroup_id)
        if held is not None:
            if epoch < held.epoch:
                return f"vg{vgroup_id} e{epoch} is older than granted e{held.epoch}"
            if epoch == held.epoch and node != held.node:
                return f"vg{vgroup_id} e{epoch} was granted to n{held.node}"
            if node != held.node and held.expires_at > now:
                left = held.expires_at - now
                return f"vg{vgroup_id} lease held by n{held.node} for e{held.epoch} for another {left} {self.unit}"
        self._by_vgroup[vgroup_id] = _Lease(epoch, node, now + self.lease_length)
        return None

    def holder(self, vgroup_id: int, now: int) -> tuple[int, int] | None:
        """(node, epoch) of the lease live at `now` (in `unit`), if any."""
        held = self._by_vgroup.get(vgroup_id)
        if held is None or held.expires_at <= now:
            return None
        return held.node, held.epoch

    def restore(self, vgroup_id: int, node: int, epoch: int, now: int) -> None:
        """Reload a grant remembered across an arbitrator restart.

        The lease is taken as live for a full lease from `now`: the arbitrator cannot know when
        it was last renewed, and the master may still hold it. Only that node can renew it
        until then, so a restart never hands a second node a lease for the same time.
        """
        held = self._by_vgroup.get(vgroup_id)
        if held is None or epoch >= held.epoch:
            self._by_vgroup[vgroup_id] = _Lease(epoch, node, now + self.lease_length)

    def granted(self) -> dict[int, tuple[int, int]]:
        """vgroup -> (node, epoch) of the latest grant, live or not (what to persist)."""
        return {vg: (lease.node, lease.epoch) for vg, lease in self._by_vgroup.items()}
