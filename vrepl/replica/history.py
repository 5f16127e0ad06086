"""Epoch history of one replica's log: where each epoch's records start.

Owns: `EpochHistory`, a short ascending list of (epoch, first_version) pairs, and the two
questions the log-matching step asks of it (docs/design.md §4.3): "where does my epoch <= e
end?" and "which epoch wrote version v?". The same idea as Kafka's leader-epoch cache.
Must not: do I/O, or stand in for a history it was not given. The WAL owner rebuilds the
pairs at start-up by scanning record epochs (a replica refuses a non-empty log without them):
a guessed history, such as one epoch for the whole log, makes a follower cut records it
shares with its master, confirmed ones included (docs/simulation.md finding 3).
"""

from __future__ import annotations

from vrepl.replica.invariant import invariant


def history_invalid(pairs: tuple[tuple[int, int], ...], last_epoch: int, last_version: int) -> str | None:
    """Why `pairs` cannot be the epoch history of a log ending at (last_epoch, last_version)."""
    if last_version == 0:
        return None if not pairs else "an empty log has no epoch history"
    if not pairs:
        return "a non-empty log needs an epoch history"
    for (e0, v0), (e1, v1) in zip(pairs, pairs[1:]):
        if not (e0 < e1 and v0 < v1):
            return f"epoch history not strictly ascending at (e{e0},v{v0}) (e{e1},v{v1})"
    if pairs[0][0] < 1 or pairs[0][1] < 1:
        return "epochs and versions in the history start at 1"
    if pairs[-1][0] != last_epoch:
        return f"history ends in epoch {pairs[-1][0]} but the log ends in epoch {last_epoch}"
    if pairs[-1][1] > last_version:
        return f"history starts epoch {pairs[-1][0]} at v{pairs[-1][1]} beyond the log end v{last_version}"
    return None


class EpochHistory:
    """(epoch, first_version) pairs of a log, ascending; the log end is kept by the owner."""

    __slots__ = ("_pairs",)

    def __init__(self, pairs: tuple[tuple[int, int], ...] = ()) -> None:
        self._pairs: list[tuple[int, int]] = list(pairs)

    def pairs(self) -> tuple[tuple[int, int], ...]:
        return tuple(self._pairs)

    def note_append(self, epoch: int, version: int) -> None:
        """Record that `version` (the new log end) was written in `epoch`."""
        if self._pairs and self._pairs[-1][0] == epoch:
            return
        invariant(not self._pairs or epoch > self._pairs[-1][0], "epochs in a log only grow")
        invariant(not self._pairs or version > self._pairs[-1][1], "versions in a log only grow")
        self._pairs.append((epoch, version))

    def epoch_at(self, version: int) -> int:
        """Epoch of record `version` (0 for version 0, the empty prefix)."""
        found = 0
        for epoch, first in self._pairs:
            if first > version:
                break
            found = epoch
        return found

    def end_of_epoch_at_most(self, epoch: int, last_version: int) -> tuple[int, int]:
        """(e, end): the largest epoch e <= `epoch` in this log and its last version.
        (0, 0) when every record is from a newer epoch."""
        found = (0, 0)
        for i, (e, _first) in enumerate(self._pairs):
            if e > epoch:
                break
            end = self._pairs[i + 1][1] - 1 if i + 1 < len(self._pairs) else last_version
            found = (e, end)
        return found

    def truncate_after(self, version: int) -> None:
        """Forget epochs that start after `version` (the log was cut there)."""
        while self._pairs and self._pairs[-1][1] > version:
            self._pairs.pop()

    def describe(self) -> str:
        return " ".join(f"e{e}@v{v}" for e, v in self._pairs) or "empty"
