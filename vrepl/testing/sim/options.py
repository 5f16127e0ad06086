"""Options of one simulated run: cluster shape, phase lengths and the fault model's rates.

Owns: `SimOptions` (every knob, with the defaults the CI seeds use), the named profiles
(`calm`, `default`, `harsh`, and `isolation`, the "flush during isolation" family) and
`repro_args()`, which turns options back into the command
line that reproduces a run. Rates are probabilities per simulated tick unless the name says
otherwise; times are in ticks unless they end in `_units` (1 tick = UNITS_PER_TICK units).
Must not: hold state of a run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

UNITS_PER_TICK = 10  # simulated time resolution: a tick is 10 units; latencies are in units
FLUSH_LIMITS = ("committed", "applied")  # how far the simulated app may archive its memtable


@dataclass(frozen=True)
class SimOptions:
    replicas: int = 3
    quorum: int = 0  # 0 = majority (the replica's default)
    arbitrator: bool | None = None  # None: used when the replica count is even
    safety_ticks: int = 400  # ticks under faults
    liveness_ticks: int = 600  # budget to elect and converge after every fault healed
    faults: bool = True  # False: a calm run driven only by a test's script

    # Workload: every tick each master gets a write with this probability (1-3 records).
    write_rate: float = 0.6
    batch_rate: float = 0.2  # share of submissions sent as AppForwardBatch

    # Network (units). Every message: latency_units_min..max; a share is slow.
    latency_units_min: int = 1
    latency_units_max: int = 8
    slow_message_rate: float = 0.02
    slow_latency_units_max: int = 250
    conn_loss_rate: float = 0.002  # per message: it and the rest of its connection are lost
    reconnect_ticks: int = 10  # the transport retries a missing connection this often

    # Storage (units): fsync latency; a slow disk multiplies it.
    fsync_units_min: int = 1
    fsync_units_max: int = 6
    slow_disk_rate: float = 0.004
    slow_disk_units_max: int = 400
    app_units_max: int = 12  # the app applies a forwarded record within this (AppAcked)

    # The app's archive (docs/simulation.md §App): each node's app flushes its memtable with
    # this probability per tick, up to the flush limit: "committed" (the commit version,
    # docs/embedding.md §Commit index) or "applied" (everything applied: the rule of issue 13,
    # which loses acknowledged writes).
    flush_rate: float = 0.05
    flush_limit: str = "committed"

    # Clocks: each node ticks every UNITS_PER_TICK +- drift units.
    clock_drift_units: int = 1

    # Node faults (per tick).
    crash_rate: float = 0.004
    crash_mid_step_share: float = 0.4  # of crashes: in the middle of an action list
    restart_rate: float = 0.06  # per down node
    pause_rate: float = 0.002
    resume_rate: float = 0.04  # per paused node
    torn_tail_share: float = 0.5  # of crashes: part of the un-fsynced tail survives

    # Network faults (per tick).
    partition_rate: float = 0.01
    heal_rate: float = 0.03
    isolate_master_share: float = 0.0  # of partitions: cut the master off from its majority
    link_slow_rate: float = 0.005

    # Arbitrator faults (per tick).
    arbitrator_crash_rate: float = 0.003
    arbitrator_restart_rate: float = 0.05
    arbitrator_link_cut_rate: float = 0.006
    arbitrator_forgets: bool = False  # a restarted arbitrator loses its lease table

    # Restore (docs/simulation.md §Restore): a follower this many versions or more behind is
    # brought up by a restore session instead of the in-band stream; each session step may
    # have its sync connection cut.
    restore: bool = True
    restore_min_lag_versions: int = 8
    restore_cut_rate: float = 0.01
    # Of the sessions whose follower lacks only what the master's archive holds (its WAL
    # could have been recycled below the archive): the share that runs the files phase.
    restore_files_share: float = 0.5

    trace_len: int = 60  # events kept for the failure report

    @property
    def arbitrator_used(self) -> bool:
        used = self.replicas % 2 == 0 if self.arbitrator is None else self.arbitrator
        return used and self.replicas % 2 == 0

    @property
    def quorum_effective(self) -> int:
        return self.quorum or self.replicas // 2 + 1

    @property
    def lossy(self) -> bool:
        """quorum < majority: confirmed writes may be lost (counted, not failed)."""
        return self.quorum_effective < self.replicas // 2 + 1

    def with_(self, **changes) -> "SimOptions":
        return dataclasses.replace(self, **changes)


CALM = dict(
    crash_rate=0.0, pause_rate=0.0, partition_rate=0.0, restore_cut_rate=0.0, link_slow_rate=0.0, conn_loss_rate=0.0,
    slow_disk_rate=0.0, slow_message_rate=0.0, arbitrator_crash_rate=0.0, arbitrator_link_cut_rate=0.0,
)
HARSH = dict(
    crash_rate=0.01, pause_rate=0.006, partition_rate=0.03, heal_rate=0.04, conn_loss_rate=0.005,
    slow_disk_rate=0.01, slow_message_rate=0.05, arbitrator_crash_rate=0.006,
    arbitrator_link_cut_rate=0.01,
)
# The "flush during isolation" family (issue 13): partitions mostly cut the master off from its
# majority (and its arbitrator) for long periods (heal 0.01/tick: ~100 ticks, while the
# master steps down after 20), and the apps flush often; fewer crashes, so a deposed master
# usually keeps its memtable until it rejoins.
ISOLATION = dict(
    partition_rate=0.02, heal_rate=0.01, isolate_master_share=0.8, flush_rate=0.3, crash_rate=0.002,
    pause_rate=0.001,
)
PROFILES: dict[str, dict] = {"calm": CALM, "default": {}, "harsh": HARSH, "isolation": ISOLATION}

# Options the CLI exposes (name -> type); repro_args() prints the ones that differ.
CLI_FIELDS = (
    "replicas", "quorum", "safety_ticks", "liveness_ticks", "write_rate", "crash_rate", "pause_rate",
    "partition_rate", "conn_loss_rate", "slow_disk_rate", "flush_rate",
    "flush_limit",
)


def make_options(profile: str = "default", **overrides) -> SimOptions:
    return SimOptions(**{**PROFILES[profile], **overrides})


def repro_args(opts: SimOptions, profile: str = "default") -> list[str]:
    """Command-line arguments that rebuild `opts` (beyond --seed)."""
    base = make_options(profile)
    out = [] if profile == "default" else ["--profile", profile]
    for name in CLI_FIELDS:
        value = getattr(opts, name)
        if value != getattr(base, name):
            out += [f"--{name.replace('_', '-')}", str(value)]
    if opts.arbitrator is not None and opts.arbitrator != base.arbitrator:
        out.append("--arbitrator" if opts.arbitrator else "--no-arbitrator")
    if opts.arbitrator_forgets:
        out.append("--arbitrator-forgets")
    return out
