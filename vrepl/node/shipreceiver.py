"""The receiving side of `vrepl ship`, inside `vrepl node` (docs/ship.md §3, §4.2, §5.2, §7).

Owns: `ShipService`, a node's ship acceptor (vrepl/transport/node.py hands it SHIP hellos and
their sockets): which sender ids exist and their secrets (`[[ship.senders]]` in node.toml),
one session thread per connection (vrepl/node/shipsession.py), one running session per
sender UUID, recovery of every sender directory at node start (vrepl/node/shipdirs.py), the
owner rule (`<vgroup path>/ship/owners.json`), status and metrics.

Where this departs from the seed (docs/ship.md §6): sync.log and load.log are fsynced; a file
is written in sync.log only once its whole-file checksum matched; a file is written in
load.log only once the ingest record naming it is committed (never "loaded" when skipped);
received files are named by their content key, never by the sender's name, so no name a
sender chooses becomes a path; the owner of a table is a sender UUID (never an address).
Must not: block the node's I/O thread (sessions run on their own threads), write into the
archive or the WAL (ingest does), or trust a byte the sender sent before checking it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter

from vrepl.node.config import ShipSenderConfig
from vrepl.node.shipdirs import (
    LOCAL_OWNER,
    ORIGIN_PREFIX,
    OWNERS_FILE,
    RECEIVER_DIR,
    SenderDirR,
    SenderStatus,
    read_manifest_of,
    recover,
)
from vrepl.node.shipsession import Session
from vrepl.ship.errors import ShipError
from vrepl.ship.state import ListSummary
from vrepl.ship.stream import ShipStream
from vrepl.transport import codec
from vrepl.vnode.files import write_atomic
from vrepl.vnode.rows import TABLE_NAME_RE

if TYPE_CHECKING:
    from vrepl.node.vgroup import VgroupHost

log = logging.getLogger("vrepl.ship")


class ShipService:
    """A node's ship receiver (see the module doc). Thread-safe; its sessions are threads."""

    def __init__(
        self,
        senders: dict[int, ShipSenderConfig],
        vgroups: "dict[int, VgroupHost]",
        registry: CollectorRegistry | None = None,
        fsync: bool = True,
    ) -> None:
        self.senders = senders
        self.vgroups = vgroups
        self.fsync = fsync
        self._lock = threading.Lock()
        self._active: dict[str, "Session"] = {}  # uuid -> running session
        self._owner_lock = threading.Lock()
        self.status_of: dict[str, SenderStatus] = {}
        self._stopping = False
        self._threads: set[threading.Thread] = set()
        reg = registry if registry is not None else CollectorRegistry()
        self.m_rounds = Counter(
            "vrepl_ship_rounds", "Ship rounds received, by outcome", ["vgroup", "outcome"], registry=reg
        )
        self.m_bytes = Counter(
            "vrepl_ship_received_bytes", "File bytes received from ship senders", ["vgroup"], registry=reg
        )
        self.m_files = Counter("vrepl_ship_loaded_files", "Files loaded from ship senders", ["vgroup"], registry=reg)
        self.m_retries = Counter(
            "vrepl_ship_bad_files",
            "Received files that failed their checksum (the sender sends them again)",
            ["vgroup"],
            registry=reg,
        )
        self.m_refusals = Counter("vrepl_ship_refusals", "Ship sessions refused, by reason", ["reason"], registry=reg)
        self.m_list_parsed = Counter(
            "vrepl_ship_list_parsed",
            "Rounds whose BEGIN needed a sender's files.txt parsed (it changed since the last round)",
            ["vgroup"],
            registry=reg,
        )
        # files.txt path -> (fingerprint, summary) of the last one parsed (SenderDirR.summary)
        self.list_memo: dict[str, tuple[str, ListSummary]] = {}

    # -- the transport's acceptor interface (I/O thread) -------------------------------------
    def hello_refusal(self, hello: codec.Hello) -> str | None:
        cfg = self.senders.get(hello.node)
        if cfg is None:
            self.m_refusals.labels("unknown_sender").inc()
            return f"ship hello from unknown sender id {hello.node} (not in [[ship.senders]])"
        if hello.vgroup_id not in self.vgroups:
            self.m_refusals.labels("unknown_vgroup").inc()
            return f"ship hello from sender {hello.node} for vg{hello.vgroup_id}, which this node does not host"
        if cfg.vgroups and hello.vgroup_id not in cfg.vgroups:
            self.m_refusals.labels("vgroup_not_allowed").inc()
            return f"sender {hello.node} may not ship into vg{hello.vgroup_id} (ship.senders vgroups)"
        if self._stopping:
            return "the node is stopping"
        return None

    def secret_for(self, hello: codec.Hello) -> bytes:
        cfg = self.senders.get(hello.node)
        # An unknown sender was refused by hello_refusal; a random secret never matches.
        return cfg.secret if cfg is not None else os.urandom(32)

    def on_connection(self, sock: socket.socket, hello: codec.Hello) -> None:
        if self._stopping:
            sock.close()
            return
        t = threading.Thread(
            target=self._run_session, args=(sock, hello), name=f"vrepl-ship-s{hello.node}", daemon=True
        )
        with self._lock:
            self._threads.add(t)
        t.start()

    def _run_session(self, sock: socket.socket, hello: codec.Hello) -> None:
        try:
            Session(self, ShipStream(sock, io_timeout_s=120.0), hello).run()
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    # -- life ----------------------------------------------------------------------------------
    def recover_all(self) -> None:
        """The seed's receiver recovery at node start: each sender directory of each vgroup.
        What needs the vgroup (loading) waits for that sender's next round."""
        for vg in self.vgroups.values():
            root = os.path.join(vg.path, RECEIVER_DIR)
            if not os.path.isdir(root):
                continue
            for name in sorted(os.listdir(root)):
                if len(name) == 32 and os.path.isdir(os.path.join(root, name)):
                    sd = SenderDirR(vg.path, name, self.fsync)
                    try:
                        done = recover(sd, None)
                    except ShipError as exc:
                        log.warning("ship %s vg%d: recovery waits for the next round: %s", name, vg.id, exc)
                        continue
                    if done:
                        log.info("ship %s vg%d: recovered: %s", name, vg.id, "; ".join(done))
                    st = self.status_of.setdefault(name, SenderStatus(name))
                    held = sd.files()
                    st.vgroup, st.files, st.last_round = vg.id, len(held.entries), held.seq

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping = True
        with self._lock:
            sessions = list(self._active.values())
            threads = list(self._threads)
        for s in sessions:
            s.stream.close()
        deadline = time.monotonic() + timeout_s
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def status(self) -> list[dict[str, Any]]:
        with self._lock:
            return [s.to_json() for s in sorted(self.status_of.values(), key=lambda s: s.uuid)]

    # -- owners (docs/ship.md §7) ----------------------------------------------------------------
    def owners_path(self, vg: "VgroupHost") -> str:
        return os.path.join(vg.path, RECEIVER_DIR, OWNERS_FILE)

    def read_owners(self, vg: "VgroupHost") -> dict[str, str]:
        try:
            with open(self.owners_path(vg), encoding="utf-8") as fh:
                doc = json.load(fh)
        except (OSError, ValueError):
            doc = {}
        return {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}

    def owners(self, vg: "VgroupHost") -> dict[str, str]:
        """table -> owner (a sender UUID or "local"): owners.json, completed by the archive
        (an ingested file names its origin; a flushed one was written here)."""
        own = self.read_owners(vg)
        m = read_manifest_of(vg.path)
        if m is not None:
            for f in m.files:
                if f.table in own:
                    continue
                origin = getattr(f, "origin", "")
                if origin.startswith(ORIGIN_PREFIX):
                    own[f.table] = origin[len(ORIGIN_PREFIX) :]
                elif not getattr(f, "ingest_version", 0):
                    own[f.table] = LOCAL_OWNER
        return own

    def set_owner(self, vg: "VgroupHost", table: str, owner: str | None) -> dict[str, str]:
        """The operator's release (owner None) or transfer of a table; the new owners."""
        if TABLE_NAME_RE.fullmatch(table) is None:
            raise ValueError(f"{table[:80]!r} is not a table name")
        if owner is not None and not (
            owner == LOCAL_OWNER or (len(owner) == 32 and all(c in "0123456789abcdef" for c in owner))
        ):
            raise ValueError(f"owner {owner[:40]!r} is not a sender UUID (32 hex digits) or 'local'")
        with self._owner_lock:
            own = self.read_owners(vg)
            # An explicit release is remembered as "" so the archive's origin does not
            # claim the table again; the next sender to ship it becomes its owner.
            own[table] = owner if owner is not None else ""
            os.makedirs(os.path.dirname(self.owners_path(vg)), exist_ok=True)
            write_atomic(self.owners_path(vg), json.dumps(own, sort_keys=True).encode(), self.fsync)
        return own

    def claim(self, vg: "VgroupHost", uuid: str, tables: list[str]) -> str | None:
        """First come, first served: claim `tables` for `uuid`, or say which one another
        source owns (nothing is claimed then)."""
        with self._owner_lock:
            own = self.owners(vg)
            for t in tables:
                o = own.get(t)
                if o and o != uuid:
                    who = "rows written on the receiver itself" if o == LOCAL_OWNER else f"sender {o}"
                    return (
                        f"table {t} belongs to {who} (a table has one source); an operator may"
                        f" release it: vrepl ship-owner --node HOST:PORT --vgroup {vg.id} {t} --release"
                    )
            explicit = self.read_owners(vg)
            changed = False
            for t in tables:
                if explicit.get(t) != uuid:
                    explicit[t] = uuid
                    changed = True
            if changed:
                os.makedirs(os.path.dirname(self.owners_path(vg)), exist_ok=True)
                write_atomic(self.owners_path(vg), json.dumps(explicit, sort_keys=True).encode(), self.fsync)
        return None
