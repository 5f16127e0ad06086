"""Restore sessions in the simulation: the simulator's `Restorer` port, running production's
session code (docs/simulation.md §Restore, docs/restore.md).

Owns: `SimRestorer` (one per node: the driver's `Restorer`, wired when the run restores),
`SessionRunner` and `RestoreSession`: one retrieve session from a master to a follower is
production's `Sender.session()` and `Receiver.session()` (vrepl/restore/sender.py,
receiver.py), two generators stepped on simulated time over a simulated sync connection
(vrepl/testing/sim/restore_io.py: the real protocol codec) and the simulated nodes' ports
(vrepl/testing/sim/restore_ports.py: the app's files, the WAL, the driver's
`ReplicaRestore`). The files phase runs when the master's archive covers what the follower
lacks (the simulator's stand-in for a WAL recycled below the archive) in
`restore_files_share` of those sessions. A session fails when either process crashes, when
the connection it runs over is cut, or when either side's code raises (a refused step, a
file changed on the source mid-restore, bad data); both sides are then told
(PeerRestoreFailed, RestoreEnded not ok), as production's sessions tell them.
Must not: read or write a replica's state except through the driver, or use anything random
but the world's PRNG.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from vrepl.errors import FrameError
from vrepl.restore.errors import FilesChanged, RestoreError
from vrepl.restore.receiver import Receiver
from vrepl.restore.sender import Sender, SenderOptions
from vrepl.testing.sim.ports import SimNode
from vrepl.testing.sim.restore_io import RECV, SimPipe, SimSessionIO
from vrepl.testing.sim.restore_ports import SimSink, SimSource, SimSourceStore, SimStaging

SWITCH_LAG_VERSIONS = 2  # the stream this close to the master's log end: live forwards start
WAL_WAIT_S = 10.0  # records the switch promised that never become readable: fail after this


class RestoreWorld(Protocol):
    """What sessions need from the world (vrepl/testing/sim/world.py)."""

    now: int
    nodes: dict[int, SimNode]

    def session_alive(self, session: "RestoreSession") -> str | None: ...

    def session_blocked(self, session: "RestoreSession") -> bool: ...

    def schedule_session(self, session: "RestoreSession", time: int) -> None: ...

    def call_driver(self, sn: SimNode, what: str, call: Callable[..., Any], *args: Any) -> Any: ...

    def latency(self, src: int, dst: int) -> int: ...

    def chunk_records(self) -> int: ...

    def note(self, text: str) -> None: ...

    def conn_gen(self, a: int, b: int) -> int: ...

    def files_share_drawn(self) -> bool: ...


@dataclass
class _Side:
    """One side's generator and what it waits for (RECV, a wake time, or nothing yet)."""

    name: str
    gen: Any
    io: SimSessionIO
    inbound: SimPipe
    wake: int | None = 0  # None: waiting for bytes
    finished: bool = False
    result: Any = None


@dataclass
class RestoreSession:
    master: int
    follower: int
    master_inc: int
    follower_inc: int
    gen: int  # the generation of the connection the session runs over
    epoch: int
    files: bool = False
    state: str = "begin"  # begin -> begun | files -> wal -> done
    began_at: int = 0
    sides: list[_Side] = field(default_factory=list)
    scheduled: set = field(default_factory=set)
    sender: Sender | None = None

    def describe(self) -> str:
        return f"restore n{self.master}->n{self.follower} e{self.epoch}"


class SimRestorer:
    """The `Restorer` port of one simulated master."""

    def __init__(self, world: "SessionRunner", sn: SimNode) -> None:
        self.w = world
        self.sn = sn

    def start_sender(self, node: int, first_version: int, last_version: int) -> None:
        self.w.start_session(self.sn, node, first_version)


class SessionRunner:
    """Starts and steps the restore sessions of one world."""

    def __init__(self, world: RestoreWorld) -> None:
        self.w = world
        self.sessions: dict[tuple[int, int], RestoreSession] = {}
        self.started = 0
        self.ended_ok = 0
        self.failed = 0
        self.with_files = 0
        self.files_sent = 0
        self.files_changed = 0  # sessions failed because a file changed on the source
        self.cancelled = 0  # replaced by a newer session for the same follower

    def start_session(self, m: SimNode, follower: int, first_version: int = 0) -> None:
        w = self.w
        # The files phase: when the master's archive holds what the follower lacks (its WAL
        # could have been recycled below the archive), in a share of those sessions.
        files = len(m.archive) >= first_version > 0 and w.files_share_drawn()
        s = RestoreSession(m.node, follower, m.inc, w.nodes[follower].inc, w.conn_gen(m.node, follower),
                           m.replica.promised_epoch if m.replica else 0, files=files, began_at=w.now)
        old = self.sessions.get((m.node, follower))
        if old is not None and old.state != "done":
            # The follower asked again (a new SyncRequest): production cancels the old one,
            # which tells neither replica (the new session supersedes it).
            # Its generators are dropped, not closed: this may run inside one of them (a
            # call into the master's driver that starts a session).
            old.state = "done"
            self.cancelled += 1
        self.sessions[(m.node, follower)] = s
        self.started += 1
        self.with_files += files
        f = w.nodes[follower]
        to_f, to_m = SimPipe(), SimPipe()
        clock = lambda: w.now  # noqa: E731
        m_io = SimSessionIO(clock, lambda: w.latency(m.node, follower), to_f)
        f_io = SimSessionIO(clock, lambda: w.latency(follower, m.node), to_m)
        opts = SenderOptions(live=True, files=files, switch_lag_versions=SWITCH_LAG_VERSIONS, wal_wait_s=WAL_WAIT_S)
        s.sender = Sender(SimSource(w, m, follower), opts, name=s.describe(), store=SimSourceStore(w, m))

        def on_state(state: str) -> None:
            s.state = state

        receiver = Receiver(SimSink(w, f, m.node, on_state), name=s.describe(), staging=lambda: SimStaging(f))
        s.sides = [_Side("sender", s.sender.session(m_io), m_io, to_m),
                   _Side("receiver", receiver.session(f_io), f_io, to_f)]
        w.note(f"{s.describe()} starts ({'files + WAL' if files else 'WAL'})")
        self._schedule(s, w.now + w.latency(m.node, follower))

    def _schedule(self, s: RestoreSession, time: int) -> None:
        if time not in s.scheduled:
            s.scheduled.add(time)
            self.w.schedule_session(s, time)

    def _current(self, s: RestoreSession) -> bool:
        return self.sessions.get((s.master, s.follower)) is s and s.state != "done"

    def step(self, s: RestoreSession) -> None:
        w = self.w
        s.scheduled.discard(w.now)
        if not self._current(s):
            return
        why = w.session_alive(s)
        if why:
            self._fail(s, why)
            return
        if w.session_blocked(s):
            self._schedule(s, w.now + 10)  # TCP retransmits until the partition heals or a side gives up
            return
        for side in s.sides:
            while side.inbound.q and side.inbound.q[0][0] <= w.now:
                side.io.inbuf += side.inbound.q.popleft()[1]
        for side in s.sides:
            if side.finished or not self._current(s):
                continue
            if (side.wake is None and side.io.inbuf) or (side.wake is not None and side.wake <= w.now):
                self._advance(s, side)
        if not self._current(s):
            return
        if all(side.finished for side in s.sides):
            s.state = "done"
            del self.sessions[(s.master, s.follower)]
            self.ended_ok += 1
            self.files_sent += s.sender.stats.files_sent if s.sender else 0
            w.note(f"{s.describe()} done at v{s.sides[1].result}")
            return
        times = [side.inbound.q[0][0] for side in s.sides if side.inbound.q]
        times += [side.wake for side in s.sides if side.wake is not None and not side.finished]
        if not times:
            self._fail(s, "both sides wait for the other (a protocol deadlock)")
            return
        self._schedule(s, max(w.now + 1, min(times)))

    def _advance(self, s: RestoreSession, side: _Side) -> None:
        """Run one side until it waits; its failure fails the session."""
        try:
            waited = side.gen.send(None)
        except StopIteration as done:
            side.finished, side.result, side.wake = True, done.value, None
            return
        except (RestoreError, FrameError) as exc:
            self.files_changed += isinstance(exc, FilesChanged)
            self._fail(s, f"{side.name}: {exc}")
            return
        side.wake = None if waited == RECV else self.w.now + int(waited)

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
        for side in s.sides:
            side.gen.close()
        if s.sender is not None:
            s.sender.close()
        m, f = w.nodes[s.master], w.nodes[s.follower]
        if m.up and m.inc == s.master_inc:
            w.call_driver(m, f"{s.describe()} failed", m.driver.restore.sender_failed, s.follower, reason[:200])
        if f.up and f.inc == s.follower_inc:
            w.call_driver(f, f"{s.describe()} failed", f.driver.restore.receiver_failed, s.master, reason[:200])
