"""The simulated disks and apps of the simulator (docs/simulation.md §What is simulated, §App).

Owns: `SimDiskAndApp`, the part of `World` (vrepl/testing/sim/world.py, which inherits it)
behind each node's Storage and App ports: the WAL (appends readable at once, group-commit
fsync and truncation jobs completing in issue order, WAL reads for streams), the app (applies
in version order, acks after a delay, a memtable above an archive that survives crashes,
flushes up to the flush limit) and the checks a real WAL and vnode would make on what they
are asked to do.
Must not: execute a replica action (the driver does) or use randomness but the world's PRNGs.
"""
from __future__ import annotations

from collections import deque

from vrepl.replica import (
    AppAcked,
    Record,
    TruncateDone,
    WalPersisted,
)
from vrepl.testing.sim.checker import SafetyViolation
from vrepl.testing.sim.options import UNITS_PER_TICK
from vrepl.testing.sim.ports import SimError, SimNode
from vrepl.testing.sim.restore_ports import app_flushed


class SimDiskAndApp:
    """Each node's WAL and app: a mixin of `World` (its state lives there)."""

    # ================================================================== storage (WAL) and app

    def wal_append(self, sn: SimNode, records: list[Record]) -> None:
        """Storage.append: readable at once (page cache), durable at the next fsync job."""
        for rec in records:
            if rec.version != len(sn.wal) + 1:
                raise SimError(f"n{sn.node} WAL gap: appending {rec.describe()} after v{len(sn.wal)}")
            if sn.wal and rec.epoch < sn.wal[-1].epoch:
                raise SimError(f"n{sn.node} WAL epoch goes back: {rec.describe()} after {sn.wal[-1].describe()}")
            sn.wal.append(rec)
            self.history.on_append(sn.node, rec)
        # Group commit: an fsync not yet started takes every append queued so far.
        if sn.jobs and sn.jobs[-1][0] == "sync" and not (sn.job_running and len(sn.jobs) == 1):
            sn.jobs[-1][1] = len(sn.wal)
        else:
            sn.jobs.append(["sync", len(sn.wal)])
        self._start_job(sn)

    def wal_truncate(self, sn: SimNode, version: int) -> None:
        """Storage.truncate_after: a job behind the fsyncs already queued."""
        if version < sn.app_commit:
            raise SafetyViolation(f"n{sn.node} truncates its WAL after v{version}, below its commit version"
                                  f" v{sn.app_commit}")
        archived = len(sn.archive)
        if sn.restored_files_version and archived > len(sn.wal):
            archived = len(sn.wal)  # restored files beyond the WAL: not archived from it
        if version < archived:
            # Issue 13: the app archived records the group never confirmed; the WAL now cuts
            # them, and the node would go on serving the wrong rows.
            raise SafetyViolation(f"n{sn.node} truncates its WAL after v{version}, below its app's archived"
                                  f" version v{archived} (flush limit {self.opts.flush_limit}): archived"
                                  f" {sn.archive[version].describe()}..{sn.archive[-1].describe()} are cut")
        # The app drops what it applied or would apply from the discarded records.
        del sn.memtable[version - archived:]
        sn.app_q = deque((t, v) for t, v in sn.app_q if v <= version)
        sn.truncating += 1
        sn.jobs.append(["trunc", version])
        self._start_job(sn)

    def _start_job(self, sn: SimNode) -> None:
        if sn.job_running or not sn.jobs:
            return
        sn.job_running = True
        o = self.opts
        d = self.rng.randint(o.fsync_units_min, o.fsync_units_max)
        if self.now < sn.fsync_slow_until:
            d += self.rng.randint(0, o.slow_disk_units_max)
        self._push(max(self.now + d, sn.disk_stalled_until), "storage", (sn.node, sn.inc))

    def _on_storage(self, node: int, inc: int) -> None:
        sn = self.nodes[node]
        if not sn.up or sn.inc != inc:
            return
        sn.job_running = False
        kind, arg = sn.jobs.popleft()
        if kind == "sync":
            arg = min(arg, len(sn.wal))
            if arg > sn.durable:
                sn.durable = arg
                self._local(sn, WalPersisted(arg))
        else:
            dropped = sn.wal[arg:]
            del sn.wal[arg:]
            sn.durable = min(sn.durable, arg)
            self.stats.truncations += 1
            if dropped:
                self.history.on_truncate(node, arg, [x.wal[: x.durable] for x in self.nodes.values()], dropped)
            self._local(sn, TruncateDone(sn.wal[-1].epoch if sn.wal else 0, arg))
        self._start_job(sn)

    def wal_rebase(self, sn: SimNode, base_version: int, base_epoch: int) -> None:
        """Storage.rebase after a restore installed files up to `base_version`: production
        resets the WAL to continue after it; the simulated WAL (a list from v1) takes the
        restored files' records instead, durable (they are in fsynced files)."""
        have = len(sn.wal)
        if base_version > len(sn.archive) or have > base_version or sn.archive[:have] != sn.wal:
            raise SimError(f"n{sn.node} WAL rebase at v{base_version}: its WAL (v{have}) is not a prefix of its"
                           f" restored archive (v{len(sn.archive)})")
        for rec in sn.archive[have:base_version]:
            sn.wal.append(rec)
            self.history.on_append(sn.node, rec)
        if base_version and sn.wal[-1].epoch != base_epoch:
            raise SimError(f"n{sn.node} WAL rebase at e{base_epoch}v{base_version} but the files hold"
                           f" {sn.wal[-1].describe()}")
        sn.durable = max(sn.durable, base_version)
        sn.restored_files_version = 0
        self._trace(f"n{sn.node} WAL rebased on restored files at v{base_version}")

    def wal_read(self, sn: SimNode, reader: int, from_version: int) -> None:
        """Storage.read_wal: the next block (1-8 records, as written: the page cache is
        readable) comes back as a completion through the driver's wal_block."""
        self._local(sn, ("read", reader, from_version))

    def app_write(self, sn: SimNode, records: list[Record]) -> None:
        """App.write_to_cache: applied now, acked (AppAcked) after a delay, in order."""
        self._app_apply(sn, records)
        self._app(sn, records[-1].version)

    def _app(self, sn: SimNode, version: int) -> None:
        ready = max(sn.app_last, self.now + self.rng.randint(1, self.opts.app_units_max))
        sn.app_last = ready
        sn.app_q.append((ready, version))
        self._push(ready, "app", (sn.node, sn.inc))

    def _on_app(self, node: int, inc: int) -> None:
        sn = self.nodes[node]
        if not sn.up or sn.inc != inc or not sn.app_q or sn.app_q[0][0] > self.now:
            return
        if sn.paused:
            self._push(self.now + UNITS_PER_TICK, "app", (node, inc))
            return
        _, version = sn.app_q.popleft()
        self._local(sn, AppAcked(version), 0)

    # ------------------------------------------------------------------ the app's data

    def _app_recover(self, sn: SimNode) -> None:
        """Start-up: the app reloads its archive and replays its WAL above the archived
        version into the memtable (docs/vnode.md §6)."""
        archived = len(sn.archive)
        if sn.restored_files_version and sn.archive[:len(sn.wal)] == sn.wal:
            # A crash between a restore's swap and its WAL rebase (docs/restore.md §10): the
            # files are ahead of the WAL; the app serves them and skips what it holds.
            sn.memtable = []
            sn.app_commit = 0
            sn.commit_checked = 0
            return
        # A restore that swapped files and failed before its rebase leaves files the WAL has
        # since passed: from here on they are an ordinary archive (seed 3000199, 3 replicas).
        sn.restored_files_version = 0
        if archived > len(sn.wal) or sn.wal[:archived] != sn.archive:
            raise SafetyViolation(f"n{sn.node} starts with its app archived up to v{archived} but its WAL"
                                  f" ends at v{len(sn.wal)} or differs below it (flush limit"
                                  f" {self.opts.flush_limit}): the app archived records its WAL lost")
        sn.memtable = sn.wal[archived:]
        sn.app_commit = 0
        sn.commit_checked = 0

    def _app_apply(self, sn: SimNode, records) -> None:
        """The app applies records in version order; each must be its WAL's record there."""
        for rec in records:
            v = rec.version
            applied = len(sn.archive) + len(sn.memtable)
            if sn.restored_files_version and v <= applied and not sn.memtable:
                # Restored files ahead of the WAL: the vnode skips what it holds.
                if sn.archive[v - 1] != rec:
                    raise SafetyViolation(f"n{sn.node} app skips {rec.describe()} but its restored files hold"
                                          f" {sn.archive[v - 1].describe()} there")
                continue
            if v != applied + 1:
                raise SimError(f"n{sn.node} app applies v{v} after v{applied}")
            have = sn.wal[v - 1] if v <= len(sn.wal) else None
            if have != rec:
                raise SafetyViolation(f"n{sn.node} app applies {rec.describe()} {rec.payload!r} but its WAL has"
                                      f" {have.describe() if have else 'nothing'} at v{v}")
            sn.memtable.append(rec)

    def app_commit(self, sn: SimNode, version: int) -> None:
        """CommitAdvanced (notify_commit): the app may archive up to `version`; the checker
        learns which records are committed."""
        if version <= sn.app_commit:
            raise SimError(f"n{sn.node} commit goes back from v{sn.app_commit} to v{version}")
        if version > sn.durable:
            raise SafetyViolation(f"n{sn.node} commits v{version} but its WAL is durable only to v{sn.durable}")
        sn.app_commit = version
        self.history.on_commit(sn.node, sn.wal, sn.commit_checked, version)
        sn.commit_checked = version

    def app_flush(self, sn: SimNode) -> int:
        """Archive the memtable up to the flush limit; returns the archived version."""
        archived = len(sn.archive)
        applied = archived + len(sn.memtable)
        limit = applied if self.opts.flush_limit == "applied" else min(applied, sn.app_commit)
        if limit > archived:
            k = limit - archived
            app_flushed(sn, archived + 1, limit)
            sn.archive.extend(sn.memtable[:k])
            del sn.memtable[:k]
            sn.restored_files_version = 0  # the archive now grows from the WAL, as after a rebase
            self.stats.flushes += 1
            self.stats.archived += k
            self._trace(f"n{sn.node} FLUSH archived v{archived + 1}..v{limit}")
        return len(sn.archive)

    def app_rows(self, sn: SimNode) -> list[Record]:
        """What the app serves: archive + memtable."""
        return sn.archive + sn.memtable
