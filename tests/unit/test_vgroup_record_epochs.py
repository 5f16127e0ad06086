"""A slave vgroup applies each forwarded record with the epoch that wrote it
(vrepl/node/vgroup.py `_write_to_cache_batch`): one history lookup per batch when the batch
has one epoch, per record when it spans an epoch change."""

from __future__ import annotations


from vrepl.node.ingest import Rounds
from vrepl.node.vgroup import VgroupHost
from vrepl.replica.history import EpochHistory


class FakeVnode:
    def __init__(self) -> None:
        self.applied: list[tuple[int, int, bytes]] = []

    def write_to_cache(self, version: int, epoch: int, payload: bytes) -> None:
        self.applied.append((version, epoch, payload))

    def flush_due(self, up_to_version=None):
        return None

    def first_unstaged_ingest(self):
        return None      # no round of ingested files waits for its files here


class FakeSync:
    """The SyncInstance calls the apply path uses: record_epoch() answers from an epoch history."""

    def __init__(self, pairs) -> None:
        self.history = EpochHistory(pairs)
        self.acks: list[tuple] = []
        self.committed_version = 0

    def record_epoch(self, version: int) -> int:
        return int(self.history.epoch_at(version))

    def ack_forward(self, version, *status) -> None:
        self.acks.append((version, *status))


def host(pairs) -> VgroupHost:
    h = VgroupHost.__new__(VgroupHost)  # no node config or files: only the apply path runs
    h.vnode, h.sync = FakeVnode(), FakeSync(pairs)
    h.id, h.node_id, h.epoch, h.role = 3, 2, 9, "slave"
    h.flushing = h.stopping = False
    h.state = "serving"
    h.counters = {"apply_errors": 0}
    h.rounds = Rounds(h)
    return h


def test_batch_within_one_epoch_gets_that_epoch():
    h = host(((1, 1), (4, 5), (6, 9)))
    h._write_to_cache_batch(5, (b"a", b"b", b"c", b"d"))
    assert [(v, e) for v, e, _ in h.vnode.applied] == [(5, 4), (6, 4), (7, 4), (8, 4)]
    assert h.sync.acks == [(8,)]


def test_batch_spanning_epoch_changes_gets_each_records_epoch():
    h = host(((1, 1), (4, 5), (6, 9)))
    h._write_to_cache_batch(3, tuple(b"p%d" % v for v in range(3, 11)))
    assert [(v, e) for v, e, _ in h.vnode.applied] == [
        (3, 1), (4, 1), (5, 4), (6, 4), (7, 4), (8, 4), (9, 6), (10, 6)]
    assert [p for _, _, p in h.vnode.applied] == [b"p%d" % v for v in range(3, 11)]
    assert h.sync.acks == [(10,)]
