"""Validate the replicas of one or more vgroups: `validate()`.

Owns: the order of the job (driver reads and checks files and WALs, then Spark compares
rows and epochs) and the Report it returns. The package exports it as
`vrepl.spark.validate`; `python -m vrepl.spark.validate` is the command line's file
(vrepl/spark/validate.py, above cli.py). docs/validation.md.
Must not: print anything but the report and one-line errors, write into a replica
directory, or import the command line (cli.py imports this module).

    report = validate({1: ["/data/n1", "/data/n2", "/data/n3"]}, spark=spark)
    report.exit_code   # 0 agree, 1 differences (report.checks[...].findings say where)
"""
from __future__ import annotations

import sys
import time
from typing import Any, Mapping, Sequence

from vrepl import wal as _wal
from vrepl.errors import InputError, SparkJobError
from vrepl.spark import checks as C
from vrepl.spark.inputs import ReplicaData, load_replicas
from vrepl.spark.model import CHECKS, ROW_KINDS, Finding, make_specs
from vrepl.spark.report import CheckResult, Report

DEFAULT_BUCKET_MS = 3_600_000      # digest bucket: one hour of ts per (table, bucket)
DEFAULT_EXAMPLES = 10              # first examples kept per check
DEFAULT_MAX_DIFF_ROWS = 100_000    # row diffs written to row_diffs.parquet (counts stay exact)


def validate(replica_dirs_by_vgroup: Mapping[int, Sequence[str]], spark: Any = None, *,
             master: str | None = None, bucket_ms: int = DEFAULT_BUCKET_MS,
             examples: int = DEFAULT_EXAMPLES, max_diff_rows: int = DEFAULT_MAX_DIFF_ROWS,
             max_record_bytes: int = _wal.DEFAULT_MAX_RECORD_BYTES,
             spark_conf: Mapping[str, str] | None = None, log_level: str = "WARN",
             log_path: str | None = None) -> Report:
    """Run every check over the replicas of each vgroup and return the Report.

    `spark` None starts a quiet session on `master` (None = Spark's default, local[*]) and
    stops it afterwards; a given session is used and left running. Raises InputError
    (exit 2) when an input cannot be read at all, SparkJobError when Spark fails; damaged
    or differing data is never an exception, it is in the report.
    """
    if bucket_ms < 1:
        raise InputError(f"bucket_ms must be positive, got {bucket_ms}")
    if examples < 0 or max_diff_rows < 0:
        raise InputError("examples and max_diff_rows must be >= 0")
    try:
        specs = make_specs({int(k): list(v) for k, v in replica_dirs_by_vgroup.items()})
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if not specs:
        raise InputError("no replica directories given")
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    replicas = load_replicas(specs, max_record_bytes)
    timings["driver_checks"] = time.perf_counter() - t0

    results = {name: CheckResult(name) for name in CHECKS}
    _driver_findings(replicas, results, examples)

    t1 = time.perf_counter()
    if spark is None:
        spark = active_session()       # one already running in this process is reused
    own = spark is None
    if own:
        from vrepl.spark.session import start_session
        spark = start_session(master, log_level=log_level, conf=spark_conf, log_path=log_path)
    timings["spark_start"] = time.perf_counter() - t1
    used_master = spark_master(spark)
    known = [(df.path, f"{r.spec.label()}: {df.entry.name}") for r in replicas
             for df in r.files]
    try:
        report = _spark_checks(spark, replicas, results, bucket_ms, examples, max_diff_rows,
                               timings, known)
    finally:
        if own:
            spark.stop()
    report.master = used_master
    report.spark_log = getattr(spark, "vrepl_log_path", None)
    timings["total"] = time.perf_counter() - t0
    return report


def active_session() -> Any:
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return None
    return SparkSession.getActiveSession()


def spark_master(spark: Any) -> str | None:
    try:
        return spark.sparkContext.master
    except Exception:
        return None


def _driver_findings(replicas: list[ReplicaData], results: dict[str, CheckResult],
                     examples: int) -> None:
    files = results["files"]
    versions = results["versions"]
    files.counts = {"files": sum(len(r.files) for r in replicas),
                    "bytes": sum(df.entry.size for r in replicas for df in r.files)}
    versions.counts = {"wal_records": sum(r.wal.count for r in replicas),
                       "replicas": len(replicas)}
    exact: dict[str, int] = {}
    for r in replicas:
        for f in r.findings:
            results[f.check].add(f, examples)
        fs, counts = C.wal_version_findings(r.spec, r.wal)
        for f in fs:
            versions.add(f, examples)
        for kind in ("wal_gap", "wal_duplicate", "wal_epoch_backwards"):
            exact[kind] = exact.get(kind, 0) + counts[kind]
        for f in C.coverage_findings(r):
            versions.add(f, examples)
    for kind, n in exact.items():
        if n > versions.kinds.get(kind, 0):
            versions.kinds[kind] = n       # findings were capped; the count is exact
    by_vg: dict[int, list[ReplicaData]] = {}
    for r in replicas:
        by_vg.setdefault(r.spec.vgroup, []).append(r)
    for vg, reps in by_vg.items():
        for f in C.vgroup_findings(vg, reps):
            results[f.check].add(f, examples)
    results["schemas"].counts = {"tables": len({(r.spec.vgroup, t) for r in replicas
                                                for t in r.schemas})}


def _spark_checks(spark: Any, replicas: list[ReplicaData], results: dict[str, CheckResult],
                  bucket_ms: int, examples: int, max_diff_rows: int,
                  timings: dict[str, float], known: list[tuple[str, str]]) -> Report:
    from vrepl.spark.job import Frames, Plan
    from vrepl.spark.session import quiet_python_loggers, spark_error_line
    from vrepl.spark.txncheck import txn_presence
    quiet_python_loggers()
    plan = Plan(replicas, bucket_ms)
    step = "building the job"
    try:
        frames = Frames(spark, plan)
        step = "comparing rows"
        t = time.perf_counter()
        rows = frames.compare_rows(max_diff_rows)
        timings["rows"] = time.perf_counter() - t
        step = "checking transactions"
        t = time.perf_counter()
        txn_found, txn_counts = ([], {}) if frames.rows is None else txn_presence(
            spark, frames.rows, replicas, {r.spec.vgroup: plan.precision_of(r)
                                           for r in replicas})
        timings["txns"] = time.perf_counter() - t
        step = "comparing epochs"
        t = time.perf_counter()
        epochs = frames.compare_epochs(examples)
        timings["epochs"] = time.perf_counter() - t
        timings["compare"] = timings["rows"] + timings["epochs"]
    except (KeyboardInterrupt, InputError, SparkJobError):
        raise
    except Exception as exc:   # Py4JJavaError, AnalysisException...: one line, no trace
        raise SparkJobError(f"Spark job failed while {step}:"
                            f" {spark_error_line(exc, known)}") from None

    rc = results["rows"]
    rc.counts = {"rows": sum(rows.rows_per_replica.values()), "buckets": rows.buckets,
                 "buckets_differing": rows.buckets_differing}
    rc.notes = rows.not_compared
    rc.by_replica = [{"vgroup": vg, "replica": rep, "kind": kind, "rows": n}
                     for (vg, rep, kind), n in sorted(rows.per_replica.items())]
    for kind in ROW_KINDS:
        if rows.counts[kind]:
            rc.kinds[kind] = rows.counts[kind]
    if rows.diffs is not None:
        for d in rows.diffs.slice(0, examples).to_pylist():
            rc.findings.append(_row_finding(d))
    ec = results["epochs"]
    ec.counts = {"versions_with_pairs": 0}
    if epochs.conflicts:
        ec.kinds["two_epochs"] = epochs.conflicts
    ec.findings.extend(epochs.examples[:examples])
    vc = results["versions"]
    vc.counts.update(txn_counts)
    for f in txn_found:
        vc.add(f, examples)
    for r in replicas:
        rng = epochs.row_versions.get((r.spec.vgroup, r.spec.replica))
        if rng is not None:
            for f in C.archived_row_version_findings(r, *rng):
                vc.add(f, examples)

    vgroups: dict[int, list[dict[str, Any]]] = {}
    for r in replicas:
        vgroups.setdefault(r.spec.vgroup, []).append({
            "replica": r.spec.replica, "path": r.spec.path,
            "archived_version": r.archived_version, "last_version": r.last_version,
            "wal_records": r.wal.count,
            "wal_first_version": int(r.wal.versions.min()) if r.wal.count else 0,
            "wal_last_version": int(r.wal.versions.max()) if r.wal.count else 0,
            "wal_rows_replayed": len(r.wal_rows),
            "files": len(r.files),
            "rows": rows.rows_per_replica.get((r.spec.vgroup, r.spec.replica), 0)})
    del ec.counts["versions_with_pairs"]
    ec.counts["replicas"] = len(replicas)
    return Report(vgroups, results, examples, timings, row_diffs=rows.diffs)


def _row_finding(d: dict[str, Any]) -> Finding:
    kind = d["kind"]
    where = f"table {d['table']!r} ts {d['ts']}"
    if kind == "missing":
        msg = (f"{where}: missing (replica {d['ref_replica']} has version {d['ref_version']}"
               f" epoch {d['ref_epoch']} {d['ref_values']})")
    elif kind == "extra":
        msg = (f"{where}: extra row (version {d['version']} epoch {d['epoch']}"
               f" {d['values']}; most replicas do not have it)")
    elif kind == "duplicate":
        msg = (f"{where}: held more than once by this replica (another copy: version {d['version']}"
               f" epoch {d['epoch']} {d['values']}); a vnode holds one row per table and ts")
    else:
        msg = (f"{where}: version {d['version']} epoch {d['epoch']} {d['values']}; replica"
               f" {d['ref_replica']} has version {d['ref_version']} epoch {d['ref_epoch']}"
               f" {d['ref_values']}")
    details = {k: d[k] for k in ("table", "ts", "version", "epoch", "values", "ref_replica",
                                 "ref_version", "ref_epoch", "ref_values")}
    return Finding("rows", kind, msg, d["vgroup"], d["replica"], None, details)

