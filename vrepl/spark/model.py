"""What the validation job works on and what it finds: replica specs and findings.

Owns: `ReplicaSpec` (which directory is which replica of which vgroup), `Finding` (one
difference or defect, with a stable one-line `describe()`) and the names of the checks (its
errors, InputError and SparkJobError, are in vrepl/errors.py). Must not: read files or touch
Spark.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CHECKS = ("rows", "files", "versions", "epochs", "schemas")
# What the rows check finds per (vgroup, table, ts) key (docs/validation.md §rows).
ROW_KINDS = ("missing", "extra", "differing", "duplicate")


@dataclass(frozen=True)
class ReplicaSpec:
    vgroup: int
    replica: int       # 1-based position in the vgroup's list; replica 1 breaks ties
    path: str          # the replica's data path (holds data/ and wal/)

    def label(self) -> str:
        return f"vgroup {self.vgroup} replica {self.replica} ({self.path})"


@dataclass
class Finding:
    """One difference or defect. `check` is one of CHECKS; `kind` a stable short name."""

    check: str
    kind: str
    message: str                 # one line, names vgroup, replica and file where it can
    vgroup: int | None = None
    replica: int | None = None
    file: str | None = None      # relative to the replica's data path
    details: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        where = []
        if self.vgroup is not None:
            where.append(f"vgroup {self.vgroup}")
        if self.replica is not None:
            where.append(f"replica {self.replica}")
        prefix = " ".join(where)
        return f"{self.check}/{self.kind}: {prefix + ': ' if prefix else ''}{self.message}"

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"check": self.check, "kind": self.kind, "message": self.message}
        for name in ("vgroup", "replica", "file"):
            value = getattr(self, name)
            if value is not None:
                doc[name] = value
        doc.update(self.details)
        return doc


def parse_vgroup_arg(text: str) -> tuple[int, list[str]]:
    """`ID=DIR[,DIR...]` -> (id, dirs); ValueError with the reason when malformed."""
    vg, sep, dirs = text.partition("=")
    if not sep:
        raise ValueError(f"--vgroup {text!r}: expected ID=DIR[,DIR...]")
    try:
        vgroup = int(vg)
    except ValueError:
        raise ValueError(f"--vgroup {text!r}: vgroup id {vg!r} is not an integer") from None
    if vgroup < 1:
        raise ValueError(f"--vgroup {text!r}: vgroup id must be >= 1")
    paths = [d for d in dirs.split(",")]
    if not paths or any(not p for p in paths):
        raise ValueError(f"--vgroup {text!r}: empty replica directory in the list")
    return vgroup, paths


def make_specs(groups: dict[int, list[str]]) -> list[ReplicaSpec]:
    """ReplicaSpecs in (vgroup, replica) order; ValueError if a directory is given twice."""
    import os
    seen: dict[str, str] = {}
    specs = []
    for vgroup in sorted(groups):
        paths = groups[vgroup]
        if not paths:
            raise ValueError(f"vgroup {vgroup}: no replica directories")
        for i, p in enumerate(paths, 1):
            path = p[len("file://"):] if p.startswith("file://") else p
            if "://" in path:
                raise ValueError(f"vgroup {vgroup} replica {i}: {p}: only local paths and"
                                 f" file:// URIs are read (the manifest and WAL are read by"
                                 f" the driver); mount the storage on the driver and workers")
            key = os.path.realpath(path)
            if key in seen:
                raise ValueError(f"{p}: given twice ({seen[key]} and vgroup {vgroup}"
                                 f" replica {i})")
            seen[key] = f"vgroup {vgroup} replica {i}"
            specs.append(ReplicaSpec(vgroup, i, os.path.abspath(path)))
    return specs
