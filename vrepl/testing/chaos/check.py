"""The verdict of a chaos run: what the clients were told against what every replica holds.
Pure functions of their inputs (no processes, no files), unit-tested in
tests/chaos/test_harness.py.

Inputs: the history (one dict per write, vrepl/testing/chaos/workload.py), the rows every
replica returned through the client API (`GET /v1/vgroups/{id}/rows`, archived files and
memtable alike), and, when the nodes were stopped, every replica's WAL records.

Checks on the rows (docs/reliability.md §What is checked):
  lost         an ok write whose row is missing on a replica (must be empty for quorum >= majority)
  moved        an ok write whose row carries another _version or _epoch than the answer
               gave (a duplicate answer too gives the record's own epoch)
  altered      a row whose table, ts or values differ from what its write sent
  phantom      a row no client wrote, or whose write was told "nothing was written"
  duplicated   one write's key in two rows of one replica
  diverged     replicas whose rows differ (ts, values, _version, _epoch), table by table
  unreadable   a replica that did not answer the read
Checks on the WALs:
  gaps         a log whose versions are not contiguous (it may start above 1: recycled)
  phantom, duplicated   as above, per record (a write applied twice shows here: its
               retried copy overwrites the same ts in the rows)
  moved        an ok write whose confirmed version is in a log that holds another record there
  diverged     logs that differ over the versions they share, or end at different versions
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vrepl.vnode.ingest import decode_rows

Record = tuple[int, int, bytes]  # (epoch, version, payload)
Rows = dict[str, list[dict]]     # table -> rows of one replica, in ts order
META = ("ts", "_version", "_epoch")
MAX_LISTED = 8


@dataclass
class Verdict:
    ok: int = 0
    fail: int = 0
    unknown: int = 0
    unknown_present: int = 0          # unknown writes that did survive
    rows: int = 0                     # rows on the reference replica
    records: int = 0                  # records in the reference log
    replicas_read: int = 0
    lost: list[str] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)
    altered: list[str] = field(default_factory=list)
    phantom: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    diverged: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    lost_allowed: list[str] = field(default_factory=list)  # quorum < majority: keys of lost/moved ok writes

    PROBLEMS = ("lost", "moved", "altered", "phantom", "duplicated", "diverged", "unreadable", "gaps")

    @property
    def safe(self) -> bool:
        return not any(getattr(self, name) for name in self.PROBLEMS)

    def problems(self) -> str:
        parts = []
        for name in self.PROBLEMS:
            items = getattr(self, name)
            if items:
                more = f" ... (+{len(items) - MAX_LISTED})" if len(items) > MAX_LISTED else ""
                parts.append(f"{name} ({len(items)}): {'; '.join(items[:MAX_LISTED])}{more}")
        return "; ".join(parts) or "none"

    def summary(self) -> dict:
        return {"ok": self.ok, "fail": self.fail, "unknown": self.unknown,
                "unknown_present": self.unknown_present, "rows": self.rows, "records": self.records,
                "replicas_read": self.replicas_read,
                **{name: len(getattr(self, name)) for name in self.PROBLEMS},
                "lost_allowed": len(self.lost_allowed)}


def payload_keys(payload: bytes) -> list[str | None]:
    """The `k` value of every row of a record (None for a row without one)."""
    return [row[2].get("k") if isinstance(row[2], dict) else None for row in decode_rows(payload)]


def _describe_op(op: dict) -> str:
    where = f"{op.get('table')} ts {op.get('ts')}"
    if op["status"] == "ok":
        return f"{op['key']} v{op['version']} e{op['epoch']} ({where})"
    return f"{op['key']} ({where})"


def check(history: list[dict], rows: dict[int, Rows | dict[str, str]],
          logs: dict[int, list[Record]] | None = None, allow_loss: bool = False) -> Verdict:
    """history: the writes; rows: node -> {table: rows} (or {"error": reason} if the node
    did not answer); logs: node -> its WAL records, when read. allow_loss (quorum 1): lost
    and moved ok writes are counted in lost_allowed, not failures of the run."""
    v = Verdict()
    by_key: dict[str, dict] = {}
    for op in history:
        by_key[op["key"]] = op
        v.ok += op["status"] == "ok"
        v.fail += op["status"] == "fail"
        v.unknown += op["status"] == "unknown"
        if op.get("refused"):
            v.phantom.append(f"{op['key']} was refused as bad input: {op.get('detail')}")
    readable: dict[int, Rows] = {}
    for node, tables in sorted(rows.items()):
        if "error" in tables:
            v.unreadable.append(f"n{node}: {tables['error']}")
        else:
            readable[node] = tables  # type: ignore[assignment]
    v.replicas_read = len(readable)
    present: dict[int, set[str]] = {}
    for node, tables in readable.items():
        present[node] = _check_replica_rows(v, node, tables, by_key)
    if readable:
        ref = min(readable, key=lambda n: (-sum(map(len, readable[n].values())), n))
        v.rows = sum(map(len, readable[ref].values()))
        v.unknown_present = sum(1 for k in present[ref] if by_key[k]["status"] == "unknown")
        for node in sorted(readable):
            if node != ref:
                _compare_rows(v, node, readable[node], ref, readable[ref])
    if logs:
        _check_logs(v, logs, by_key)
    if allow_loss:
        # Every lost and moved item starts "n<node> <key> ...": count distinct keys.
        v.lost_allowed = sorted({item.split()[1] for item in v.lost + v.moved})
        v.lost, v.moved = [], []
    return v


def _check_replica_rows(v: Verdict, node: int, tables: Rows, by_key: dict[str, dict]) -> set[str]:
    """The row checks of one replica; returns the keys it holds."""
    where: dict[str, dict] = {}
    for table, rows in sorted(tables.items()):
        for row in rows:
            key = row.get("k")
            desc = f"n{node} {table} ts {row.get('ts')} v{row.get('_version')}"
            op = by_key.get(key) if isinstance(key, str) else None
            if op is None or op["status"] == "fail":
                why = f"{op['status']}: {op.get('detail', '')}" if op else "never sent"
                v.phantom.append(f"{desc} {key!r} ({why})")
                continue
            if key in where:
                v.duplicated.append(f"{desc} {key} (also at ts {where[key]['ts']})")
                continue
            where[key] = row
            sent = {c: x for c, x in row.items() if c not in META and x is not None}
            if table != op["table"] or row["ts"] != op["ts"] or sent != op["values"]:
                v.altered.append(f"{desc}: holds {sent} at {table} ts {row['ts']}, written"
                                 f" {op['values']} at {op['table']} ts {op['ts']}")
    for key, op in by_key.items():
        if op["status"] != "ok":
            continue
        row = where.get(key)
        if row is None:
            v.lost.append(f"n{node} {_describe_op(op)}")
        elif row["_version"] != op["version"] or row["_epoch"] != op["epoch"]:
            v.moved.append(f"n{node} {key} confirmed v{op['version']} e{op['epoch']}, row holds"
                           f" v{row['_version']} e{row['_epoch']}")
    return set(where)


def _compare_rows(v: Verdict, node: int, mine: Rows, ref: int, theirs: Rows) -> None:
    for table in sorted(set(mine) | set(theirs)):
        a = {r["ts"]: r for r in mine.get(table, [])}
        b = {r["ts"]: r for r in theirs.get(table, [])}
        differ = sorted(ts for ts in set(a) | set(b) if a.get(ts) != b.get(ts))
        if differ:
            ts = differ[0]
            v.diverged.append(f"{table}: n{node} vs n{ref}: {len(differ)} rows differ, first ts {ts}:"
                              f" {_short(a.get(ts))} vs {_short(b.get(ts))}")


def _short(row: dict | None) -> str:
    if row is None:
        return "none"
    return f"v{row['_version']} e{row['_epoch']} k={row.get('k')!r}"


def _check_logs(v: Verdict, logs: dict[int, list[Record]], by_key: dict[str, dict]) -> None:
    ref = min(logs, key=lambda n: (-(logs[n][-1][1] if logs[n] else 0), -len(logs[n]), n))
    v.records = len(logs[ref])
    for node, log in sorted(logs.items()):
        versions = [ver for _, ver, _ in log]
        if versions and versions != list(range(versions[0], versions[-1] + 1)):
            v.gaps.append(f"n{node} WAL: versions {versions[0]}..{versions[-1]} not contiguous"
                          f" ({len(versions)} records)")
        at: dict[int, list[str | None]] = {}
        seen: dict[str, int] = {}
        for _epoch, ver, payload in log:
            try:
                keys = payload_keys(payload)
            except Exception as exc:   # a record the vnode cannot decode is a phantom too
                v.phantom.append(f"n{node} WAL v{ver}: undecodable payload ({exc})")
                continue
            at[ver] = keys
            for key in keys:
                op = by_key.get(key) if isinstance(key, str) else None
                if op is None or op["status"] == "fail":
                    why = f"{op['status']}: {op.get('detail', '')}" if op else "never sent"
                    v.phantom.append(f"n{node} WAL v{ver} {key!r} ({why})")
                    continue
                if key in seen:
                    v.duplicated.append(f"n{node} {key} WAL: at v{seen[key]} and v{ver} (applied twice)")
                seen[key] = ver
        if versions:
            for key, op in by_key.items():
                if op["status"] == "ok" and versions[0] <= op["version"] <= versions[-1] \
                        and key not in at.get(op["version"], ()):
                    v.moved.append(f"n{node} {key} WAL: confirmed v{op['version']}, the record"
                                   f" there holds {at.get(op['version'])}")
        if node != ref:
            _compare_logs(v, node, log, ref, logs[ref])


def _compare_logs(v: Verdict, node: int, mine: list[Record], ref: int, theirs: list[Record]) -> None:
    if not mine or not theirs:
        if mine != theirs:
            v.diverged.append(f"n{node} WAL vs n{ref}: {len(mine)} vs {len(theirs)} records")
        return
    a = {ver: (e, p) for e, ver, p in mine}
    b = {ver: (e, p) for e, ver, p in theirs}
    differ = sorted(ver for ver in set(a) & set(b) if a[ver] != b[ver])
    if differ:
        ver = differ[0]
        v.diverged.append(f"n{node} WAL vs n{ref}: {len(differ)} records differ from v{ver}"
                          f" (e{a[ver][0]} vs e{b[ver][0]})")
    if mine[-1][1] != theirs[-1][1]:
        v.diverged.append(f"n{node} WAL ends at v{mine[-1][1]}, n{ref} at v{theirs[-1][1]}")
