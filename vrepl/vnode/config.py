"""Settings of the reference vnode (docs/vnode.md §limits), each with a name and a default.

Owns: VnodeConfig and config_invalid(). Must not: read files or the environment; the node
process maps its TOML section onto these names.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from vrepl._core import record as _rec
from vrepl.renamed import renamed_settings

PRECISIONS = {"ms": 1_000, "us": 1_000_000}   # units per second

MS_PER_DAY = 86_400_000
DEFAULT_FILE_SPAN_MS = 10 * MS_PER_DAY          # TDengine's default days-per-file is 10
# 9999-12-31T23:59:59.999 UTC in ms: a timestamp every tool (Spark, pandas) can render.
_TS_MAX_MS = 253_402_300_799_999


# Limits renamed to `max_<what>_<unit>` (vrepl/renamed.py): {old name: new name}.
RENAMED_VNODE_SETTINGS = {
    "memtable_max_bytes": "max_memtable_bytes",
    "memtable_max_rows": "max_memtable_rows",
    "memtable_max_age_ms": "max_memtable_age_ms",
    "dedup_max_entries": "max_dedup_entries",
}


@renamed_settings(RENAMED_VNODE_SETTINGS)
@dataclass(frozen=True)
class VnodeConfig:
    precision: str = "ms"                    # "ms" or "us": unit of every ts
    max_rows_per_batch: int = 10_000         # rows in one write request
    max_row_bytes: int = 16 * 1024           # estimated bytes of one row (TDengine 2.0: 16 KiB)
    max_batch_bytes: int = 4 * 1024 * 1024   # estimated bytes of one batch
    max_payload_bytes: int = _rec.DEFAULT_MAX_PAYLOAD_BYTES  # encoded batch = one WAL record
    max_columns_per_table: int = 1024        # value columns of one table
    max_tables: int = 100_000                # tables of one vnode
    ts_min: int | None = None                # None: 0 (1970-01-01); in the precision's unit
    ts_max: int | None = None                # None: 9999-12-31 in the precision's unit
    file_span_ms: int = DEFAULT_FILE_SPAN_MS # time range of one archived file set
    max_memtable_bytes: int = 64 * 1024 * 1024  # flush when the memtable holds this much
    max_memtable_rows: int = 1_000_000       # ... or this many rows
    max_memtable_age_ms: int = 60_000        # ... or its oldest unflushed row is this old
    max_confirmations: int = 100_000         # confirm_forward statuses kept for waiters
    max_dedup_entries: int = 200_000         # request ids remembered for retried writes
    fsync: bool = True                       # fsync archived files and the manifest

    @property
    def units_per_ms(self) -> int:
        return PRECISIONS[self.precision] // 1000

    @property
    def ts_lo(self) -> int:
        return 0 if self.ts_min is None else self.ts_min

    @property
    def ts_hi(self) -> int:
        return _TS_MAX_MS * self.units_per_ms if self.ts_max is None else self.ts_max

    @property
    def file_span(self) -> int:
        """The file span in ts units."""
        return self.file_span_ms * self.units_per_ms


def config_invalid(cfg: VnodeConfig) -> str | None:
    """Why a configuration is refused, or None."""
    if cfg.precision not in PRECISIONS:
        return f"precision {cfg.precision!r} is not one of {sorted(PRECISIONS)}"
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        if f.name in ("precision", "fsync", "ts_min", "ts_max"):
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            return f"{f.name} must be a positive integer, got {v!r}"
    for name in ("ts_min", "ts_max"):
        v = getattr(cfg, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                              or not -2**63 < v < 2**63):
            return f"{name} must be an int64 or unset, got {v!r}"
    if cfg.ts_lo > cfg.ts_hi:
        return f"ts_min {cfg.ts_lo} is above ts_max {cfg.ts_hi}"
    if cfg.max_payload_bytes > _rec.MAX_PAYLOAD_LIMIT_BYTES:
        return f"max_payload_bytes {cfg.max_payload_bytes} is above the WAL limit"
    if cfg.max_row_bytes > cfg.max_batch_bytes:
        return f"max_row_bytes {cfg.max_row_bytes} is above max_batch_bytes {cfg.max_batch_bytes}"
    return None
