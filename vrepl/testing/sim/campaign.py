"""Running seeds: one (`run_seed`) or many (`run_campaign`), with the failure report.

Owns: `SeedResult` (what one run produced: ok or the failure, its kind, the repro command and
the trace tail), the summary of a campaign (runs, confirmed writes, losses, recovery time
percentiles, failures by kind) and its text rendering. A campaign may fan out over worker
processes; each seed is still one World with its own PRNG, so results do not depend on the
number of workers.
Must not: change what a seed does (options come in whole, from the caller).
"""

from __future__ import annotations

import contextlib
import shlex
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from vrepl.replica import InvariantViolation
from vrepl.testing.sim.checker import SafetyViolation
from vrepl.testing.sim.fixes import assumed_fixes
from vrepl.testing.sim.options import SimOptions, repro_args
from vrepl.testing.sim.world import LivenessFailure, SimError, Stats, World


@dataclass
class SeedResult:
    seed: int
    ok: bool
    stats: Stats
    kind: str = ""  # safety / liveness / invariant / sim / crash
    message: str = ""
    trace: list[str] = field(default_factory=list)
    command: str = ""
    trace_hash: str = ""
    seconds: float = 0.0

    def report(self) -> str:
        if self.ok:
            return f"seed {self.seed}: ok"
        lines = [
            f"seed {self.seed}: {self.kind.upper()} FAILURE: {self.message}",
            f"reproduce: {self.command}",
            f"last {len(self.trace)} events:",
        ]
        lines += [f"  {t}" for t in self.trace]
        return "\n".join(lines)


def command_for(seed: int, opts: SimOptions, profile: str = "default", fixes: bool = False) -> str:
    args = ["python", "-m", "vrepl.testing.sim", "--seed", str(seed), *repro_args(opts, profile)]
    if fixes:
        args.append("--assume-fixes")
    return shlex.join(args)


def run_seed(seed: int, opts: SimOptions, profile: str = "default", fixes: bool = False) -> SeedResult:
    t0 = time.perf_counter()
    world = World(seed, opts)
    kind = message = ""
    ctx = assumed_fixes() if fixes else contextlib.nullcontext()
    with ctx:
        try:
            world.run()
        except SafetyViolation as exc:
            kind, message = "safety", str(exc)
        except LivenessFailure as exc:
            kind, message = "liveness", str(exc)
        except InvariantViolation as exc:  # the core's own always-on checks (WindowInvariantError too)
            kind, message = "invariant", f"{type(exc).__name__}: {exc}"
        except SimError as exc:
            kind, message = "sim", str(exc)
        except Exception as exc:  # noqa: BLE001 - any crash of the core is a finding
            kind, message = "crash", f"{type(exc).__name__}: {exc}"
    r = world.restores
    world.stats.restores, world.stats.restores_ok, world.stats.restores_failed = r.started, r.ended_ok, r.failed
    world.stats.restores_with_files, world.stats.restore_files_sent = r.with_files, r.files_sent
    world.stats.restores_files_changed = r.files_changed
    if not kind:
        world.stats.lost = len(world.history.lost)
    return SeedResult(
        seed=seed,
        ok=not kind,
        stats=world.stats,
        kind=kind,
        message=message,
        trace=list(world.trace) if kind else [],
        command=command_for(seed, opts, profile, fixes),
        trace_hash=world.trace_hash(),
        seconds=time.perf_counter() - t0,
    )


def _run_chunk(args) -> list[SeedResult]:
    seeds, opts, profile, fixes = args
    return [run_seed(s, opts, profile, fixes) for s in seeds]


@dataclass
class Summary:
    opts: SimOptions
    runs: int = 0
    failures: list[SeedResult] = field(default_factory=list)
    writes_submitted: int = 0
    confirmed_ok: int = 0
    lost: int = 0
    runs_with_loss: int = 0
    elections: int = 0
    crashes: int = 0
    partitions: int = 0
    flushes: int = 0
    archived: int = 0
    restores: int = 0
    restores_ok: int = 0
    restores_failed: int = 0
    restores_with_files: int = 0
    restore_files_sent: int = 0
    restores_files_changed: int = 0
    recovery_ticks: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, r: SeedResult) -> None:
        self.runs += 1
        s = r.stats
        self.writes_submitted += s.writes_submitted
        self.confirmed_ok += s.confirmed_ok
        self.elections += s.elections
        self.crashes += s.crashes
        self.partitions += s.partitions
        self.flushes += s.flushes
        self.archived += s.archived
        self.restores += s.restores
        self.restores_ok += s.restores_ok
        self.restores_failed += s.restores_failed
        self.restores_with_files += s.restores_with_files
        self.restore_files_sent += s.restore_files_sent
        self.restores_files_changed += s.restores_files_changed
        if r.ok:
            self.lost += s.lost
            self.runs_with_loss += 1 if s.lost else 0
            self.recovery_ticks.append(s.recovery_ticks)
        else:
            self.failures.append(r)

    def percentile(self, p: float) -> int:
        xs = sorted(self.recovery_ticks)
        if not xs:
            return -1
        return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]

    def as_dict(self) -> dict:
        kinds: dict[str, int] = {}
        for f in self.failures:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        return {
            "replicas": self.opts.replicas,
            "quorum": self.opts.quorum_effective,
            "arbitrator": self.opts.arbitrator_used,
            "flush_limit": self.opts.flush_limit,
            "runs": self.runs,
            "failed_runs": len(self.failures),
            "failures_by_kind": kinds,
            "failed_seeds": [f.seed for f in self.failures][:50],
            "writes_submitted": self.writes_submitted,
            "confirmed_ok": self.confirmed_ok,
            "confirmed_lost": self.lost,
            "runs_with_loss": self.runs_with_loss,
            "elections": self.elections,
            "crashes": self.crashes,
            "partitions": self.partitions,
            "app_flushes": self.flushes,
            "app_rows_archived": self.archived,
            "restores": self.restores,
            "restores_ok": self.restores_ok,
            "restores_failed": self.restores_failed,
            "restores_with_files": self.restores_with_files,
            "restore_files_sent": self.restore_files_sent,
            "restores_files_changed": self.restores_files_changed,
            "recovery_ticks_p50": self.percentile(50),
            "recovery_ticks_p99": self.percentile(99),
            "recovery_ticks_max": max(self.recovery_ticks, default=-1),
            "seconds": round(self.seconds, 1),
        }

    def render(self) -> str:
        d = self.as_dict()
        lines = [
            f"replicas {d['replicas']} quorum {d['quorum']} arbitrator {'yes' if d['arbitrator'] else 'no'}:"
            f" {d['runs']} runs, {d['failed_runs']} failed {d['failures_by_kind'] or ''}",
            f"  writes submitted {d['writes_submitted']}, confirmed ok {d['confirmed_ok']},"
            f" confirmed then lost {d['confirmed_lost']} (in {d['runs_with_loss']} runs)",
            f"  elections {d['elections']}, crashes {d['crashes']}, partitions {d['partitions']}",
            f"  app flushes {d['app_flushes']} (flush limit {d['flush_limit']}), rows archived {d['app_rows_archived']}",
            f"  restore sessions {d['restores']}: {d['restores_ok']} ended ok, {d['restores_failed']} failed;"
            f" {d['restores_with_files']} with a files phase ({d['restore_files_sent']} files sent,"
            f" {d['restores_files_changed']} stopped by a file changed on the source)",
            f"  ticks to recover after healing: p50 {d['recovery_ticks_p50']}, p99 {d['recovery_ticks_p99']},"
            f" max {d['recovery_ticks_max']}",
            f"  {d['seconds']} s",
        ]
        if d["failed_seeds"]:
            lines.append(f"  failed seeds: {' '.join(map(str, d['failed_seeds']))}")
        return "\n".join(lines)


def run_campaign(seeds: range, opts: SimOptions, *, profile: str = "default", fixes: bool = False,
                 jobs: int = 1, on_result=None) -> Summary:
    """Run every seed; `on_result(result)` is called as results arrive (in seed order)."""
    t0 = time.perf_counter()
    summary = Summary(opts)
    seeds = list(seeds)
    if jobs <= 1:
        chunks = [[s] for s in seeds]
        results = map(_run_chunk, ((c, opts, profile, fixes) for c in chunks))
    else:
        size = max(1, min(50, len(seeds) // (jobs * 4) or 1))
        chunks = [seeds[i : i + size] for i in range(0, len(seeds), size)]
        pool = ProcessPoolExecutor(jobs)
        results = pool.map(_run_chunk, ((c, opts, profile, fixes) for c in chunks))
    try:
        for chunk in results:
            for r in chunk:
                summary.add(r)
                if on_result is not None:
                    on_result(r)
    finally:
        if jobs > 1:
            pool.shutdown(cancel_futures=True)
    summary.seconds = time.perf_counter() - t0
    return summary


__all__ = ["SeedResult", "Summary", "command_for", "run_campaign", "run_seed"]
