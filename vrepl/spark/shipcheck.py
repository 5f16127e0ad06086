"""`vrepl validate --ship SENDER_DIR RECEIVER_DIR`: does the receiver hold exactly the rows
the sender shipped? (docs/ship.md §11; issue 16 Deliver 5).

Owns: reading the sender's state (`<SENDER_DIR>/ship/uuid.txt`, the last-shipped list
`last_local_files.txt` of one receiver state directory) and both manifests on the driver;
the file-level comparison (the list's keys against the receiver's archived files whose
origin is `ship/<uuid>`); the Spark comparison of rows per (table, ts) — the sender's rows of
the listed files against the receiver's rows of that origin, each side resolved by the rank
rule (docs/vnode.md §9.4) — aggregated per table and bucket; the report and its exit code.
Must not: import pyspark at import time, read the WAL (rows not archived yet are not
compared), or write into either directory.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from vrepl.errors import InputError, SparkJobError
from vrepl.spark.checks import canonical_columns
from vrepl.spark.read import load_manifest, read_files
from vrepl.spark.validation import active_session
from vrepl.vnode.files import Manifest

SHIP_DIR = "ship"
UUID_FILE = "uuid.txt"
LAST_LIST = "last_local_files.txt"
ORIGIN_PREFIX = "ship/"
KINDS = ("missing", "extra", "different")


@dataclass
class BucketDiff:
    table: str
    bucket: int
    sender_rows: int = 0
    receiver_rows: int = 0
    missing: int = 0        # shipped, not on the receiver
    extra: int = 0          # on the receiver (from this sender), not shipped
    different: int = 0      # on both, another _version, _epoch or value

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class ShipReport:
    sender: str
    receiver: str
    uuid: str
    state_dir: str
    seq: int
    shipped_files: int
    receiver_files: int
    not_shipped_yet: int
    missing_files: list[str] = field(default_factory=list)   # "table bucket size magic"
    extra_files: list[str] = field(default_factory=list)
    buckets: list[BucketDiff] = field(default_factory=list)   # every (table, bucket) compared
    examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def differing(self) -> list[BucketDiff]:
        return [b for b in self.buckets if b.missing or b.extra or b.different]

    @property
    def exit_code(self) -> int:
        return 1 if self.differing or self.missing_files or self.extra_files else 0

    def to_json(self) -> dict[str, Any]:
        return {"sender": self.sender, "receiver": self.receiver, "uuid": self.uuid,
                "state_dir": self.state_dir, "last_round": self.seq,
                "shipped_files": self.shipped_files, "receiver_files": self.receiver_files,
                "not_shipped_yet": self.not_shipped_yet, "missing_files": self.missing_files,
                "extra_files": self.extra_files, "equal": self.exit_code == 0,
                "rows": {"sender": sum(b.sender_rows for b in self.buckets),
                         "receiver": sum(b.receiver_rows for b in self.buckets),
                         **{k: sum(getattr(b, k) for b in self.buckets) for k in KINDS}},
                "buckets": [b.to_json() for b in self.differing],
                "examples": self.examples}

    def print(self, out: Any = None) -> None:
        out = out or sys.stdout
        doc = self.to_json()
        rows = doc["rows"]
        print(f"sender {self.uuid} ({self.sender}, state {self.state_dir}, round {self.seq}):"
              f" {self.shipped_files} files shipped, {rows['sender']} rows;"
              f" receiver {self.receiver}: {self.receiver_files} files of this sender,"
              f" {rows['receiver']} rows", file=out)
        if self.not_shipped_yet:
            print(f"  ({self.not_shipped_yet} files of the sender are not shipped yet: not"
                  " compared)", file=out)
        for k in self.missing_files:
            print(f"file missing on the receiver: {k}", file=out)
        for k in self.extra_files:
            print(f"file on the receiver the sender did not ship: {k}", file=out)
        if self.differing:
            print(f"{'table':<24} {'bucket':>8} {'sender':>10} {'receiver':>10} {'missing':>8}"
                  f" {'extra':>8} {'different':>9}", file=out)
            for b in self.differing:
                print(f"{b.table:<24} {b.bucket:>8} {b.sender_rows:>10} {b.receiver_rows:>10}"
                      f" {b.missing:>8} {b.extra:>8} {b.different:>9}", file=out)
        for e in self.examples:
            print(f"{e['kind']}: table {e['table']} ts {e['ts']} (bucket {e['bucket']}):"
                  f" sender {e['sender']}, receiver {e['receiver']}", file=out)
        if self.exit_code == 0:
            print(f"result: the receiver holds exactly the rows the sender shipped"
                  f" ({len({b.table for b in self.buckets})} tables, {len(self.buckets)}"
                  f" buckets, {rows['sender']} rows)", file=out)
        else:
            print(f"result: DIFFERENT: {len(self.differing)} buckets differ ({rows['missing']}"
                  f" rows missing, {rows['extra']} extra, {rows['different']} different),"
                  f" {len(self.missing_files)} files missing, {len(self.extra_files)} extra",
                  file=out)


def _read_text(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        raise InputError(f"{path}: no {what}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read {what}: {exc}") from None


def sender_state(sender: str, state: str | None) -> tuple[str, str, int, list[tuple]]:
    """(uuid, state directory name, last round seq, [(table, bucket, size, magic, name)])
    of the sender's last-shipped list; InputError naming what is missing."""
    root = os.path.join(sender, SHIP_DIR)
    uuid = _read_text(os.path.join(root, UUID_FILE), "sender UUID (has it shipped?)").strip()
    if len(uuid) != 32 or any(c not in "0123456789abcdef" for c in uuid):
        raise InputError(f"{os.path.join(root, UUID_FILE)}: not a sender UUID")
    dirs = sorted(d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, LAST_LIST)))
    if state is None:
        if not dirs:
            raise InputError(f"{root}: no receiver state directory (nothing shipped yet)")
        if len(dirs) > 1:
            raise InputError(f"{root}: several receiver state directories ({', '.join(dirs)}):"
                             " name one with --ship-state")
        state = dirs[0]
    elif state not in dirs:
        raise InputError(f"{root}/{state}: no {LAST_LIST} (state directories: {', '.join(dirs) or 'none'})")
    text = _read_text(os.path.join(root, state, LAST_LIST), "last-shipped list")
    lines = text.split("\n")
    if not lines[0].startswith("# vrepl ship last_local_files") or len(lines) < 3 \
            or not lines[-2].startswith("# end "):
        raise InputError(f"{root}/{state}/{LAST_LIST}: not a complete file list")
    head = dict(p.split("=", 1) for p in lines[0].split() if "=" in p)
    entries = []
    for line in lines[1:-2]:
        parts = line.split("\t")
        try:
            entries.append((parts[0], int(parts[1]), int(parts[2]), int(parts[3]), parts[5]))
        except (IndexError, ValueError):
            raise InputError(f"{root}/{state}/{LAST_LIST}: malformed line {line[:80]!r}") from None
    return uuid, state, int(head.get("seq", "0")), entries


def _key_text(k: tuple) -> str:
    return f"{k[0]} {k[1]} {k[2]} {k[3]:#010x}"


def check_ship(spark: Any, sender: str, receiver: str, *, state: str | None = None,
               examples: int = 10) -> ShipReport:
    """Compare what the sender shipped with what the receiver holds (see the module doc)."""
    uuid, state_name, seq, listed = sender_state(sender, state)
    sm, rm = load_manifest(sender), load_manifest(receiver)
    if (sm.precision, sm.file_span_ms) != (rm.precision, rm.file_span_ms):
        raise InputError(f"the sender's vnode has precision {sm.precision} and file_span_ms"
                         f" {sm.file_span_ms}, the receiver's {rm.precision} and {rm.file_span_ms}")
    by_name = {f.name: f for f in sm.files}
    s_files = []
    for table, bucket, size, magic, name in listed:
        f = by_name.get(name)
        if f is None or (f.table, f.bucket, f.size, f.magic) != (table, bucket, size, magic):
            raise InputError(f"{sender}: the shipped file {name} ({_key_text((table, bucket, size, magic))})"
                             " is no longer in the sender's archive (a flush replaced it since the last"
                             " round): run a round (vrepl ship --once) and validate again")
        s_files.append(f)
    shipped = {(f.table, f.bucket, f.size, f.magic) for f in s_files}
    origin = ORIGIN_PREFIX + uuid
    r_files = [f for f in rm.files if f.origin == origin]
    held = {(f.table, f.bucket, f.size, f.magic) for f in r_files}
    report = ShipReport(sender, receiver, uuid, state_name, seq, len(s_files), len(r_files),
                        sum(1 for f in sm.files if (f.table, f.bucket, f.size, f.magic) not in shipped),
                        [_key_text(k) for k in sorted(shipped - held)],
                        [_key_text(k) for k in sorted(held - shipped)])
    tables = sorted({f.table for f in s_files} | {f.table for f in r_files})
    cols = canonical_columns([sm.schemas.get(t, {}) for t in tables] + [rm.schemas.get(t, {}) for t in tables])
    report.buckets, report.examples = _compare_rows(spark, sender, sm, s_files, receiver, rm, r_files,
                                                    cols, examples)
    return report


def validate_ship(sender: str, receiver: str, spark: Any = None, *, state: str | None = None,
                  master: str | None = None, examples: int = 10,
                  spark_conf: dict[str, str] | None = None, log_level: str = "WARN",
                  log_path: str | None = None) -> ShipReport:
    """check_ship with a quiet session started on `master` (and stopped) when `spark` is
    None. InputError (exit 2) when an input cannot be read, SparkJobError when Spark fails;
    differences are in the report."""
    if examples < 0:
        raise InputError("examples must be >= 0")
    sender_state(sender, state)          # the usage errors before a JVM starts
    load_manifest(sender)
    load_manifest(receiver)
    if spark is None:
        spark = active_session()       # one already running in this process is reused
    own = spark is None
    if own:
        from vrepl.spark.session import start_session
        spark = start_session(master, app_name="vrepl-validate-ship", log_level=log_level,
                              conf=spark_conf, log_path=log_path)
    try:
        return check_ship(spark, sender, receiver, state=state, examples=examples)
    except (InputError, KeyboardInterrupt):
        raise
    except Exception as exc:            # py4j / AnalysisException: one line, exit 2
        from vrepl.spark.session import spark_error_line
        raise SparkJobError(f"the Spark job failed: {spark_error_line(exc)}") from None
    finally:
        if own:
            spark.stop()


def _side(spark: Any, path: str, m: Manifest, files: list, cols: dict[str, str], unit: str) -> Any:
    from pyspark.sql import functions as F
    df = read_files(spark, path, m, files, columns=cols)
    ts = F.unix_micros(F.col("ts")) if unit == "us" else F.unix_millis(F.col("ts"))
    # One string per row of everything compared besides the key: versions and values (a
    # null is "\\N", never equal to a value's text).
    sig = F.concat_ws("\x1f", *[F.coalesce(F.col(c).cast("string"), F.lit("\\N"))
                                for c in ("_version", "_epoch", *cols)])
    return df.select(F.col("table"), ts.alias("ts"), sig.alias("sig"))


def _compare_rows(spark: Any, sender: str, sm: Manifest, s_files: list, receiver: str, rm: Manifest,
                  r_files: list, cols: dict[str, str], examples: int) -> tuple[list[BucketDiff], list[dict]]:
    from pyspark.sql import functions as F
    unit = sm.precision
    span = sm.file_span_ms * (1000 if unit == "us" else 1)
    s = _side(spark, sender, sm, s_files, cols, unit).withColumnRenamed("sig", "s_sig")
    r = _side(spark, receiver, rm, r_files, cols, unit).withColumnRenamed("sig", "r_sig")
    j = s.join(r, ["table", "ts"], "full_outer")
    kind = (F.when(F.col("r_sig").isNull(), F.lit("missing"))
            .when(F.col("s_sig").isNull(), F.lit("extra"))
            .when(F.col("s_sig") != F.col("r_sig"), F.lit("different")))
    j = j.withColumn("bucket", F.floor(F.col("ts") / F.lit(span)).cast("long")).withColumn("kind", kind)
    j.cache()
    try:
        agg = (j.groupBy("table", "bucket")
               .agg(F.count("s_sig").alias("sender_rows"), F.count("r_sig").alias("receiver_rows"),
                    *[F.sum((F.col("kind") == k).cast("long")).alias(k) for k in KINDS])
               .orderBy("table", "bucket").collect())
        buckets = [BucketDiff(a["table"], a["bucket"], a["sender_rows"], a["receiver_rows"],
                              a["missing"] or 0, a["extra"] or 0, a["different"] or 0) for a in agg]
        ex = []
        if examples and any(b.missing or b.extra or b.different for b in buckets):
            for x in (j.filter(F.col("kind").isNotNull()).orderBy("table", "ts").limit(examples)
                      .collect()):
                ex.append({"kind": x["kind"], "table": x["table"], "ts": x["ts"], "bucket": x["bucket"],
                           "sender": _sig_text(x["s_sig"], cols), "receiver": _sig_text(x["r_sig"], cols)})
    finally:
        j.unpersist()
    return buckets, ex


def _sig_text(sig: str | None, cols: dict[str, str]) -> str:
    if sig is None:
        return "no row"
    vals = sig.split("\x1f")
    return json.dumps(dict(zip(("_version", "_epoch", *cols), vals)), ensure_ascii=True)
