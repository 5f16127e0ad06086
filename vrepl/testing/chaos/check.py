"""The verdict of a chaos run: the clients' history against every replica's WAL. Pure
functions of their inputs (no processes, no files), unit-tested in tests/chaos/test_check.py.

Checks (docs/reliability.md §What is checked):
  lost         an ok write missing from a replica's log (must be empty for quorum >= majority)
  moved        an ok write found at another version than the one confirmed
  phantom      a record in a log whose key no client ever sent, or sent and was told
               "nothing was written" (NM / ER / connection refused)
  duplicated   a key at two versions of one log
  diverged     replicas whose logs are not identical ((epoch, version, payload) for each record)
  gaps         a log whose versions are not 1..last
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vrepl.testing.chaos.node import key_of

Record = tuple[int, int, bytes]  # (epoch, version, payload)


@dataclass
class Verdict:
    ok: int = 0
    fail: int = 0
    unknown: int = 0
    unknown_present: int = 0          # unknown writes that did survive
    records: int = 0                  # records in the (reference) log
    lost: list[str] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)
    phantom: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    diverged: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    lost_allowed: list[str] = field(default_factory=list)  # quorum < majority: keys of lost/moved ok writes

    @property
    def safe(self) -> bool:
        return not (self.lost or self.moved or self.phantom or self.duplicated or self.diverged or self.gaps)

    def problems(self) -> str:
        parts = []
        for name in ("lost", "moved", "phantom", "duplicated", "diverged", "gaps"):
            items = getattr(self, name)
            if items:
                parts.append(f"{name} ({len(items)}): {', '.join(items[:8])}{' ...' if len(items) > 8 else ''}")
        return "; ".join(parts) or "none"

    def summary(self) -> dict:
        return {"ok": self.ok, "fail": self.fail, "unknown": self.unknown,
                "unknown_present": self.unknown_present, "records": self.records,
                "lost": len(self.lost), "moved": len(self.moved), "phantom": len(self.phantom),
                "duplicated": len(self.duplicated), "diverged": len(self.diverged), "gaps": len(self.gaps),
                "lost_allowed": len(self.lost_allowed)}


def check(history: list[dict], logs: dict[int, list[Record]], allow_loss: bool = False) -> Verdict:
    """history: the workload's records (key, status, version for ok); logs: node -> its WAL.
    allow_loss (quorum 1): lost ok writes are counted, not failures of the run."""
    v = Verdict()
    by_key: dict[str, dict] = {}
    for op in history:
        by_key[op["key"]] = op
        v.ok += op["status"] == "ok"
        v.fail += op["status"] == "fail"
        v.unknown += op["status"] == "unknown"
    ref_node = min(logs, key=lambda n: (-len(logs[n]), n)) if logs else None
    for node, log in sorted(logs.items()):
        versions = [ver for _, ver, _ in log]
        if versions != list(range(1, len(versions) + 1)):
            v.gaps.append(f"n{node}")
        where: dict[str, int] = {}
        for _epoch, ver, payload in log:
            key = key_of(payload)
            if key is None:
                v.phantom.append(f"n{node} v{ver} {payload[:20]!r}")
                continue
            if key in where:
                v.duplicated.append(f"n{node} {key} v{where[key]},v{ver}")
            where[key] = ver
            op = by_key.get(key)
            if op is None or op["status"] == "fail":
                why = f"{op['status']} {op.get('detail', '')}".strip() if op else "never sent"
                v.phantom.append(f"n{node} v{ver} {key} ({why})")
        for key, op in by_key.items():
            if op["status"] != "ok":
                continue
            if key not in where:
                v.lost.append(f"n{node} {key} v{op['version']}")
            elif where[key] != op["version"]:
                v.moved.append(f"n{node} {key} confirmed v{op['version']} found v{where[key]}")
        if node == ref_node:
            v.records = len(log)
            v.unknown_present = sum(1 for k, op in by_key.items() if op["status"] == "unknown" and k in where)
    if ref_node is not None:
        ref = logs[ref_node]
        for node, log in sorted(logs.items()):
            if log != ref:
                first = next((i for i, (a, b) in enumerate(zip(log, ref)) if a != b), min(len(log), len(ref)))
                v.diverged.append(f"n{node} vs n{ref_node} from v{first + 1} (len {len(log)} vs {len(ref)})")
    if allow_loss:
        # Distinct confirmed keys missing or moved on any replica.
        v.lost_allowed = sorted({item.split()[1] for item in v.lost + v.moved})
        v.lost, v.moved = [], []
    return v
