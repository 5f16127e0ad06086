"""Restore sessions in the simulation: the simulator's `Restorer` port (docs/simulation.md
§Restore, docs/restore.md).

Owns: `SimRestorer` (one per node: the driver's `Restorer`, wired when the run restores) and
`RestoreSession`, the WAL phase of one retrieve session from a master to a follower, stepped
on simulated time: the follower begins (waiting while its SyncStart has not arrived), the
master's WAL is read from the version the follower asks for and fed to it block by block
while it grows (the last-WAL tail), the master switches the follower to live forwards
(SYNC_CACHE) near its log end, the stream covers the switch point and the follower ends the
restore. Every question to a replica and every event goes through the production driver's
`ReplicaRestore` (vrepl/driver/restoring.py), as production's sessions do from their
threads. A session fails when either process crashes, when the connection it runs over is
cut, or when a replica refuses a step; both sides are then told (PeerRestoreFailed,
RestoreEnded not ok), as production's sessions tell them.
Must not: read or write a replica's state except through the driver, or use anything random
but the world's PRNG. The session code of production (vrepl/restore/sender.py, receiver.py:
files phase, sockets, inotify) is not what runs here (docs/simulation.md §Not done).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from vrepl.driver import WAIT
from vrepl.testing.records import encode_block
from vrepl.testing.sim.ports import SimNode

SWITCH_LAG_VERSIONS = 2  # the stream this close to the master's log end: live forwards start
BEGIN_WAIT_UNITS = 200  # a follower that has not matched its log by then: the session fails


class RestoreWorld(Protocol):
    """What sessions need from the world (vrepl/testing/sim/world.py)."""

    now: int
    nodes: dict[int, SimNode]

    def session_alive(self, session: "RestoreSession") -> str | None: ...

    def session_blocked(self, session: "RestoreSession") -> bool: ...

    def schedule_session(self, session: "RestoreSession", delay: int) -> None: ...

    def call_driver(self, sn: SimNode, what: str, call: Callable[..., Any], *args: Any) -> Any: ...

    def latency(self, src: int, dst: int) -> int: ...

    def chunk_records(self) -> int: ...

    def note(self, text: str) -> None: ...

    def conn_gen(self, a: int, b: int) -> int: ...


@dataclass
class RestoreSession:
    master: int
    follower: int
    master_inc: int
    follower_inc: int
    gen: int  # the generation of the connection the session runs over
    epoch: int
    state: str = "begin"  # begin -> wal -> done
    began_at: int = 0
    sent: int = 0  # the last version the follower has
    prev_epoch: int = 0
    target: int | None = None  # the switch point (SYNC_CACHE): stream up to here, then end

    def describe(self) -> str:
        return f"restore n{self.master}->n{self.follower} e{self.epoch}"


class SimRestorer:
    """The `Restorer` port of one simulated master."""

    def __init__(self, world: "SessionRunner", sn: SimNode) -> None:
        self.w = world
        self.sn = sn

    def start_sender(self, node: int, first_version: int, last_version: int) -> None:
        self.w.start_session(self.sn, node)


class SessionRunner:
    """Starts and steps the restore sessions of one world."""

    def __init__(self, world: RestoreWorld) -> None:
        self.w = world
        self.sessions: dict[tuple[int, int], RestoreSession] = {}
        self.started = 0
        self.ended_ok = 0
        self.failed = 0

    def start_session(self, m: SimNode, follower: int) -> None:
        w = self.w
        s = RestoreSession(m.node, follower, m.inc, w.nodes[follower].inc, w.conn_gen(m.node, follower),
                           m.replica.promised_epoch if m.replica else 0, began_at=w.now)
        self.sessions[(m.node, follower)] = s  # a session running for it is replaced
        self.started += 1
        w.note(f"{s.describe()} starts")
        w.schedule_session(s, w.latency(m.node, follower))

    def step(self, s: RestoreSession) -> None:
        w = self.w
        if self.sessions.get((s.master, s.follower)) is not s or s.state == "done":
            return
        why = w.session_alive(s)
        if why:
            self._fail(s, why)
            return
        if w.session_blocked(s):
            w.schedule_session(s, 10)  # TCP retransmits until the partition heals or a side gives up
            return
        m, f = w.nodes[s.master], w.nodes[s.follower]
        if s.state == "begin":
            self._begin(s, m, f)
        else:
            self._stream(s, m, f)

    def _begin(self, s: RestoreSession, m: SimNode, f: SimNode) -> None:
        w = self.w
        refusal = w.call_driver(f, f"{s.describe()}: begin", f.driver.restore.begin_refusal, s.master, s.epoch)
        if not self._alive(s):
            return
        if refusal == WAIT:
            if w.now - s.began_at > BEGIN_WAIT_UNITS:
                self._fail(s, "the follower never matched its log with the master")
            else:
                w.schedule_session(s, 5)
            return
        if refusal:
            self._fail(s, refusal)
            return
        first = f.driver.restore.wal_from(0)
        upto = m.driver.restore.history_upto(first - 1)
        if isinstance(upto, str):
            self._fail(s, upto)
            return
        s.prev_epoch, _ = upto
        s.sent = first - 1
        s.state = "wal"
        w.note(f"{s.describe()} begun: WAL from v{first}")
        w.schedule_session(s, w.latency(s.master, s.follower))

    def _stream(self, s: RestoreSession, m: SimNode, f: SimNode) -> None:
        """One block of the WAL phase: read what the master's WAL holds after `sent` (as
        written: the page cache is readable), feed it, switch near the end, end at the
        switch point."""
        w = self.w
        why = m.driver.restore.stop_reason(s.follower, s.epoch)
        if why:
            self._fail(s, why)
            return
        end = m.replica.last_version
        if s.target is not None:
            end = min(end, s.target)
        recs = m.wal[s.sent: min(end, s.sent + w.chunk_records())]
        if recs:
            block, scan = encode_block(recs)
            why = w.call_driver(f, f"{s.describe()}: v{recs[0].version}..v{recs[-1].version}",
                                f.driver.restore.feed, s.master, block, scan, s.prev_epoch)
            if not self._alive(s):
                return
            if why:
                self._fail(s, why)
                return
            s.sent, s.prev_epoch = recs[-1].version, recs[-1].epoch
        if s.target is None and m.replica.last_version - s.sent <= SWITCH_LAG_VERSIONS:
            target = w.call_driver(m, f"{s.describe()}: sync cache", m.driver.restore.caught_up, s.follower)
            if not self._alive(s):
                return
            s.target = target
            w.note(f"{s.describe()}: live forwards after v{target}")
        if s.target is not None and s.sent >= s.target:
            done = w.call_driver(f, f"{s.describe()}: end at v{s.sent}", f.driver.restore.end, s.master, s.sent)
            if not self._alive(s):
                return
            if isinstance(done, str):
                self._fail(s, done)
                return
            s.state = "done"
            self.ended_ok += 1
            del self.sessions[(s.master, s.follower)]
            w.note(f"{s.describe()} done at v{done}")
            return
        w.schedule_session(s, w.latency(s.master, s.follower))

    def _alive(self, s: RestoreSession) -> bool:
        """After a call into a driver (which may crash its process): go on?"""
        why = self.w.session_alive(s)
        if why:
            self._fail(s, why)
            return False
        return self.sessions.get((s.master, s.follower)) is s

    def _fail(self, s: RestoreSession, reason: str) -> None:
        """Both sides hear of it, each if its process still runs the session."""
        w = self.w
        if self.sessions.get((s.master, s.follower)) is s:
            del self.sessions[(s.master, s.follower)]
        if s.state == "done":
            return
        s.state = "done"
        self.failed += 1
        w.note(f"{s.describe()} fails: {reason}")
        m, f = w.nodes[s.master], w.nodes[s.follower]
        if m.up and m.inc == s.master_inc:
            w.call_driver(m, f"{s.describe()} failed", m.driver.restore.sender_failed, s.follower, reason)
        if f.up and f.inc == s.follower_inc:
            w.call_driver(f, f"{s.describe()} failed", f.driver.restore.receiver_failed, s.master, reason)
