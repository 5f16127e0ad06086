"""What one round of `vrepl ship` is given and what it reports (docs/ship.md §3).

Owns: `SenderOptions` (the sender's settings, from the CLI) and `RoundResult` (a round's
counts and its one-line description, which the CLI prints).
Must not: do any I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SenderOptions:
    data: str  # the vnode's directory (holds data/manifest.json)
    addresses: list[tuple[str, int]]  # the receiving vgroup's nodes (replication ports)
    receiver: str  # how the operator named them (--to): names the state dir
    sender_id: int
    secret: bytes
    vgroup: int = 1
    uuid: str | None = None  # --uuid: set the sender's UUID explicitly
    resync: bool = False  # reconcile by listing even when the digests agree
    file_retries: int = 5  # sends of one file whose checksum fails (seed: 5)
    offer_files: int = 1000  # entries per OFFER
    connect_timeout_s: float = 5.0
    io_timeout_s: float = 60.0
    fsync: bool = True
    bind: str | None = None  # source address of the connection (--bind)


@dataclass
class RoundResult:
    seq: int = 0
    round_id: int = 0
    receiver: str = ""
    deleted: int = 0  # files deleted on the sender since the last round
    new: int = 0  # new files this round
    new_bytes: int = 0
    sent_files: int = 0  # files whose bytes crossed the network
    sent_bytes: int = 0  # file bytes sent (a resumed file counts its rest)
    skipped: int = 0  # new files the receiver already held or had received
    loaded: int = 0  # files the receiver confirmed loaded
    removed: int = 0  # deletions the receiver confirmed
    retries: int = 0  # files sent again after a failed checksum
    reconciled: bool = False  # the digests differed: the list was taken from the receiver
    failed: list[str] = field(default_factory=list)  # files given up this round (reasons)
    repaired: list[str] = field(default_factory=list)  # what recovery did before the round
    seconds: float = 0.0
    nothing_new: bool = False
    manifest_unchanged: bool = False  # unchanged.json matched: the manifest was not parsed
    nothing_archived: bool = False  # the vnode has no manifest yet: no connection was made

    def describe(self) -> str:
        if self.nothing_archived:
            return f"round {self.seq} to {self.receiver}: nothing new (nothing archived yet: no data/manifest.json)"
        if self.nothing_new:
            how = "manifest unchanged" if self.manifest_unchanged else "manifest diffed"
            return f"round {self.seq} to {self.receiver}: nothing new ({self.seconds * 1000:.0f} ms, {how})"
        rate = self.sent_bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0
        text = (
            f"round {self.seq} to {self.receiver}: {self.loaded} of {self.new} new files loaded"
            f" ({self.sent_files} sent, {self.sent_bytes} B, {rate:.1f} MB/s; {self.skipped} already"
            f" there), {self.removed} of {self.deleted} deletions applied in {self.seconds:.2f} s"
        )
        if self.retries:
            text += f", {self.retries} files sent again"
        if self.reconciled:
            text += ", reconciled with the receiver's list"
        return text
