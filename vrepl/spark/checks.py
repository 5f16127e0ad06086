"""Pure checks on what the driver read: WAL versions, version coverage, schemas across replicas.

Owns: the definitions of the versions check (docs/validation.md §versions) and of the
schema comparison, as functions of arrays and dicts that return Findings. Must not: read
files or touch Spark (the row and epoch comparisons over archived data are in job.py).

Definitions (docs/validation.md):
* WAL versions: in file order every record's version is the previous one + 1. A step of 0
  or below is a duplicate (the version was seen before); a step above 1 is a gap (the
  versions in between are in no WAL record). Epochs never decrease along the log.
* Coverage, per replica, with A = the manifest's archived_version and W = first..last of the
  WAL: versions 1..A are owned by the archived files, A+1..last by the WAL. "Every version
  exactly once" means: no archived file (manifest min/max_version) and no archived row
  (`_version`) claims a version above A or below 1; the WAL, if it has records above A,
  starts at or before A+1; the WAL does not end below A. WAL records at or below A are
  allowed (not yet recycled) and are cross-checked by the epochs check only. Versions
  replaced by later writes to the same ts are legitimately absent from the archived rows,
  so the archive is not required to show every version 1..A.
* Across the replicas of a vgroup: the last versions (max(A, WAL last)) are equal.
* Ingested files (docs/vnode.md §9.4) carry their origin's versions: they are outside the
  coverage rule (and their rows outside the epochs check); their `ingest_version` lies in
  1..A instead.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from vrepl.spark.inputs import ReplicaData, WalScan
from vrepl.spark.model import Finding, ReplicaSpec

MAX_FINDINGS_PER_KIND = 1000     # per replica and kind: the counts stay exact


def _range_text(lo: int, hi: int) -> str:
    return f"version {lo}" if lo == hi else f"versions {lo}..{hi}"


def wal_version_findings(spec: ReplicaSpec, wal: WalScan) -> tuple[list[Finding], dict]:
    """Gaps, duplicates and backwards epochs in one replica's WAL; (findings, counts).

    Counts are exact; at most MAX_FINDINGS_PER_KIND findings of each kind are kept.
    """
    v = wal.versions
    out: list[Finding] = []
    counts = {"wal_gap": 0, "wal_duplicate": 0, "wal_epoch_backwards": 0, "missing_versions": 0,
              "duplicate_records": 0}
    if len(v) == 0:
        return out, counts
    if v[0] < 1:
        out.append(Finding("versions", "wal_bad_version", f"{wal.where(0)}: version {v[0]}"
                           f" (versions start at 1)", spec.vgroup, spec.replica,
                           wal.files[int(wal.file_index[0])], {"version": int(v[0])}))
    step = np.diff(v)
    for i in np.nonzero(step > 1)[0]:
        lo, hi = int(v[i]) + 1, int(v[i + 1]) - 1
        counts["wal_gap"] += 1
        counts["missing_versions"] += hi - lo + 1
        if counts["wal_gap"] <= MAX_FINDINGS_PER_KIND:
            out.append(Finding("versions", "wal_gap",
                               f"{_range_text(lo, hi)} missing: version {int(v[i])} at"
                               f" {wal.where(i)} is followed by {int(v[i + 1])} at"
                               f" {wal.where(i + 1)}", spec.vgroup, spec.replica,
                               wal.files[int(wal.file_index[i + 1])],
                               {"missing_from": lo, "missing_to": hi}))
    for i in np.nonzero(step <= 0)[0]:
        ver = int(v[i + 1])
        counts["wal_duplicate"] += 1
        counts["duplicate_records"] += 1
        if counts["wal_duplicate"] > MAX_FINDINGS_PER_KIND:
            continue
        seen = np.nonzero(v[:i + 1] == ver)[0]
        if len(seen):
            text = f"duplicates the record at {wal.where(int(seen[0]))}"
        else:
            text = f"follows version {int(v[i])} (versions go backwards)"
        out.append(Finding("versions", "wal_duplicate", f"version {ver} at {wal.where(i + 1)} "
                           + text, spec.vgroup, spec.replica,
                           wal.files[int(wal.file_index[i + 1])], {"version": ver}))
    e = wal.epochs
    for i in np.nonzero(np.diff(e) < 0)[0]:
        counts["wal_epoch_backwards"] += 1
        if counts["wal_epoch_backwards"] <= MAX_FINDINGS_PER_KIND:
            out.append(Finding("versions", "wal_epoch_backwards",
                               f"epoch goes from {int(e[i])} (version {int(v[i])}) back to"
                               f" {int(e[i + 1])} (version {int(v[i + 1])}) at"
                               f" {wal.where(i + 1)}", spec.vgroup, spec.replica,
                               wal.files[int(wal.file_index[i + 1])],
                               {"version": int(v[i + 1])}))
    return out, counts


def coverage_findings(r: ReplicaData) -> list[Finding]:
    """Archived versions plus the WAL cover 1..last exactly once (module doc)."""
    spec = r.spec
    a = r.archived_version
    out = []
    for df in r.files:
        f = df.entry
        if f.ingest_version:
            # An ingested file's rows carry their origin's versions (docs/vnode.md §9.4): the
            # record that added it is what must lie in 1..A.
            if not 1 <= f.ingest_version <= a:
                out.append(Finding("versions", "ingest_version_out_of_range",
                                   f"{f.name}: ingested by version {f.ingest_version}, outside"
                                   f" 1..{a} (the archived version)", spec.vgroup,
                                   spec.replica, f.name,
                                   {"ingest_version": f.ingest_version, "archived_version": a}))
            continue
        if f.max_version > a or f.min_version < 1:
            out.append(Finding("versions", "file_version_out_of_range",
                               f"{f.name}: the manifest gives it versions {f.min_version}.."
                               f"{f.max_version}, outside 1..{a} (the archived version)",
                               spec.vgroup, spec.replica, f.name,
                               {"min_version": f.min_version, "max_version": f.max_version,
                                "archived_version": a}))
    if r.wal.count:
        first, last = int(r.wal.versions.min()), int(r.wal.versions.max())
        if last > a and first > a + 1:
            out.append(Finding("versions", "coverage_gap",
                               f"{_range_text(a + 1, first - 1)} are neither archived"
                               f" (archived version {a}) nor in the WAL (it starts at {first})",
                               spec.vgroup, spec.replica, None,
                               {"missing_from": a + 1, "missing_to": first - 1}))
        if last < a:
            out.append(Finding("versions", "wal_behind_archive",
                               f"the WAL ends at version {last}, below the archived version"
                               f" {a} (the log was cut under archived rows)", spec.vgroup,
                               spec.replica, None, {"wal_last": last, "archived_version": a}))
    return out


def archived_row_version_findings(r: ReplicaData, min_version: int, max_version: int,
                                  rows_above: int) -> list[Finding]:
    """Archived rows (`_version`) outside 1..archived_version (from the Spark pass)."""
    a = r.archived_version
    if rows_above == 0 and min_version >= 1:
        return []
    return [Finding("versions", "row_version_out_of_range",
                    f"{rows_above} archived rows carry versions outside 1..{a} (the archived"
                    f" version); they span {min_version}..{max_version}", r.spec.vgroup,
                    r.spec.replica, None, {"rows": rows_above, "min_version": min_version,
                                           "max_version": max_version, "archived_version": a})]


def vgroup_findings(vgroup: int, replicas: list[ReplicaData]) -> list[Finding]:
    """Comparisons across the replicas of one vgroup: last versions, precision, schemas."""
    out = []
    lasts = {r.spec.replica: r.last_version for r in replicas}
    if len(set(lasts.values())) > 1:
        text = ", ".join(f"replica {k}: {v}" for k, v in lasts.items())
        out.append(Finding("versions", "last_version_differs",
                           f"replicas end at different versions ({text})", vgroup, None, None,
                           {"last_versions": {str(k): v for k, v in lasts.items()}}))
    with_manifest = [r for r in replicas if r.has_manifest]
    shapes = {r.spec.replica: (r.manifest.precision, r.manifest.file_span_ms)
              for r in with_manifest}
    if len(set(shapes.values())) > 1:
        text = ", ".join(f"replica {k}: {p}, file_span_ms {s}" for k, (p, s) in shapes.items())
        out.append(Finding("schemas", "precision_mismatch",
                           f"manifests disagree on precision or file span ({text})", vgroup))
    out.extend(schema_findings(vgroup, [(r.spec.replica, r.schemas) for r in replicas]))
    out.extend(txn_findings(vgroup, replicas))
    return out


def txn_findings(vgroup: int, replicas: list[ReplicaData]) -> list[Finding]:
    """The replicas agree on every finished transaction they all hold (docs/transactions.md
    §12): the same label, outcome, publish version and rows (a transaction is published
    whole at one version on each replica, so agreeing here and on rows is agreeing on it)."""
    out = []
    ids = set.intersection(*(set(r.txns) for r in replicas)) if replicas else set()
    for tid in sorted(ids):
        seen = {r.spec.replica: r.txns[tid] for r in replicas}
        if len(set(seen.values())) > 1:
            text = "; ".join(f"replica {k}: {s} at v{v} ({n} rows)"
                             for k, (_l, s, v, n) in seen.items())
            out.append(Finding("versions", "txn_outcome_differs",
                               f"transaction {tid} ({seen[replicas[0].spec.replica][0]}) differs:"
                               f" {text}", vgroup, None, None, {"txn": tid}))
    return out


def schema_findings(vgroup: int, schemas: Iterable[tuple[int, dict[str, dict[str, str]]]]
                    ) -> list[Finding]:
    """One finding per table whose columns or types differ between replicas.

    A table that is absent from a replica is not a schema difference (the rows check shows
    its rows as missing); a column one replica has and another lacks is.
    """
    schemas = list(schemas)
    tables = sorted({t for _, s in schemas for t in s})
    out = []
    for table in tables:
        present = [(rep, s[table]) for rep, s in schemas if table in s]
        if len({tuple(sorted(c.items())) for _, c in present}) <= 1:
            continue
        cols = sorted({c for _, cs in present for c in cs})
        diffs = []
        for c in cols:
            types = {rep: cs.get(c) for rep, cs in present}
            if len(set(types.values())) > 1:
                diffs.append(f"{c}: " + ", ".join(f"replica {rep} {t or 'absent'}"
                                                  for rep, t in types.items()))
        out.append(Finding("schemas", "table_schema_mismatch",
                           f"table {table!r}: " + "; ".join(diffs), vgroup, None, None,
                           {"table": table,
                            "schemas": {str(rep): cs for rep, cs in present}}))
    return out


def canonical_columns(per_replica: list[dict[str, str]]) -> dict[str, str]:
    """The columns rows of a table are compared on: the union over replicas, sorted by
    name; a column whose type differs between replicas is compared as a string."""
    out: dict[str, str] = {}
    for cols in per_replica:
        for c, t in cols.items():
            prev = out.get(c)
            out[c] = t if prev is None or prev == t else "str*"
    return dict(sorted(out.items()))
