"""`vrepl validate`: the command line of the validation job (docs/validation.md).

Owns: the options, the exit codes (0 agree, 1 differences, 2 usage or input error, 3
interrupted) and what the operator sees: the summary table, or one line on stderr. Must
not: check anything itself (validate.py does).

vrepl/cli.py registers it with `add_parser(subparsers)`; `python -m vrepl.spark.validate`
and spark-submit (vrepl/spark/submit.py) run `main()`.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Sequence

from vrepl.argparsing import OneLineArgumentParser
from vrepl.errors import InputError, SparkJobError
from vrepl.exitcodes import EXIT_INTERRUPTED, EXIT_USAGE
from vrepl.spark.model import parse_vgroup_arg
from vrepl.spark.validation import (DEFAULT_BUCKET_MS, DEFAULT_EXAMPLES, DEFAULT_MAX_DIFF_ROWS,
                                  validate)

DESCRIPTION = ("Check that the replicas of one or more vgroups hold the same data (rows, file"
               " checksums, WAL versions, epochs) with Spark; exit 0 agree, 1 differences,"
               " 2 usage or input error.")
EPILOG = """examples:
  vrepl validate /data/n1/vnode2 /data/n2/vnode2 /data/n3/vnode2
  vrepl validate --vgroup 2=/a/n1/v2,/a/n2/v2,/a/n3/v2 --vgroup 3=/a/n1/v3,/a/n2/v3 \\
      --master spark://127.0.0.1:7077 --out /tmp/report
  vrepl validate --ship /edge/data/vg1 /centre/n1/data/vg1
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("replicas", nargs="*", metavar="DIR",
                   help="data directories of the replicas of one vgroup (vgroup 1);"
                        " or use --vgroup")
    p.add_argument("--vgroup", action="append", default=[], metavar="ID=DIR[,DIR...]",
                   help="a vgroup and its replicas' data directories; repeat per vgroup."
                        " Replica 1 (the first) breaks ties")
    p.add_argument("--ship", nargs=2, default=None, metavar=("SENDER_DIR", "RECEIVER_DIR"),
                   help="instead of replicas: prove that the receiving vgroup's directory holds"
                        " exactly the rows the `vrepl ship` sender (its --data directory) shipped,"
                        " per table and bucket (docs/ship.md §11)")
    p.add_argument("--ship-state", default=None, metavar="NAME",
                   help="with --ship: the sender's receiver state directory (<data>/ship/NAME)"
                        " when it ships to several receivers")
    p.add_argument("--master", default=None,
                   help="Spark master (default: Spark's own, local[*]; under spark-submit,"
                        " spark-submit's)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="where report.json and row_diffs.parquet go"
                        " (default ./vrepl-validate-YYYYmmdd-HHMMSS)")
    p.add_argument("--bucket-ms", type=int, default=DEFAULT_BUCKET_MS, metavar="MS",
                   help=f"time bucket of the row digests (default {DEFAULT_BUCKET_MS} ms)")
    p.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES, metavar="N",
                   help=f"first examples shown per check (default {DEFAULT_EXAMPLES})")
    p.add_argument("--max-diff-rows", type=int, default=DEFAULT_MAX_DIFF_ROWS, metavar="N",
                   help="row diffs written to row_diffs.parquet; counts stay exact"
                        f" (default {DEFAULT_MAX_DIFF_ROWS})")
    p.add_argument("--max-record-bytes", type=int, default=16 * 1024 * 1024,
                   help="largest WAL record payload accepted (default 16 MiB)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark setting, e.g. spark.executor.memory=4g (repeatable)")
    p.add_argument("--log-level", default="WARN",
                   choices=["ERROR", "WARN", "INFO", "DEBUG"],
                   help="Spark's log level; the log goes to <out>/spark.log (default WARN)")
    p.add_argument("--json", action="store_true",
                   help="print report.json on stdout instead of the table")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `validate` on vrepl's subparsers."""
    p = subparsers.add_parser("validate", help="check that replicas hold the same data (Spark)",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def _err(message: str) -> None:
    print(f"vrepl: error: {message}", file=sys.stderr)


def _groups(args: argparse.Namespace) -> dict[int, list[str]]:
    if args.replicas and args.vgroup:
        raise InputError("give replica directories either as arguments or with --vgroup,"
                         " not both")
    if not args.replicas and not args.vgroup:
        raise InputError("no replica directories: give DIR... or --vgroup ID=DIR,...")
    if args.replicas:
        return {1: list(args.replicas)}
    groups: dict[int, list[str]] = {}
    for text in args.vgroup:
        try:
            vg, dirs = parse_vgroup_arg(text)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        if vg in groups:
            raise InputError(f"--vgroup {vg} given twice")
        groups[vg] = dirs
    return groups


def _conf(args: argparse.Namespace) -> dict[str, str]:
    out = {}
    for text in args.conf:
        k, sep, v = text.partition("=")
        if not sep or not k:
            raise InputError(f"--conf {text!r}: expected KEY=VALUE")
        out[k] = v
    return out


def _ship_report(args: argparse.Namespace) -> Any:
    """`vrepl validate --ship SENDER_DIR RECEIVER_DIR` (docs/ship.md §11): the ShipReport."""
    from vrepl.spark.shipcheck import validate_ship
    if args.replicas or args.vgroup:
        raise InputError("--ship compares a sender with a receiver: give no replica directories")
    if args.examples < 0:
        raise InputError("--examples must be >= 0")
    log_path = None
    if args.out:
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            raise InputError(f"--out {args.out}: exists and is not a directory")
        os.makedirs(args.out, exist_ok=True)
        log_path = os.path.join(args.out, "spark.log")
    report = validate_ship(args.ship[0], args.ship[1], state=args.ship_state, master=args.master,
                           examples=args.examples, spark_conf=_conf(args),
                           log_level=args.log_level, log_path=log_path)
    if args.out:
        import json
        with open(os.path.join(args.out, "ship_report.json"), "w", encoding="utf-8") as fh:
            json.dump(report.to_json(), fh, indent=1)
    return report


def _report(args: argparse.Namespace) -> Any:
    """The replicas' validation: the Report, written to --out."""
    groups = _groups(args)
    conf = _conf(args)
    for name in ("bucket_ms", "max_record_bytes"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be positive")
    if args.examples < 0 or args.max_diff_rows < 0:
        raise InputError("--examples and --max-diff-rows must be >= 0")
    out = args.out or time.strftime("vrepl-validate-%Y%m%d-%H%M%S")
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError(f"--out {out}: exists and is not a directory")
    os.makedirs(out, exist_ok=True)
    report = validate(groups, master=args.master, bucket_ms=args.bucket_ms,
                      examples=args.examples, max_diff_rows=args.max_diff_rows,
                      max_record_bytes=args.max_record_bytes, spark_conf=conf,
                      log_level=args.log_level, log_path=os.path.join(out, "spark.log"))
    report.write(out)
    return report


def run(args: argparse.Namespace) -> int:
    """Run the validation from parsed arguments (`--ship`: a sender against its receiver);
    returns the exit code: 0 agree, 1 differences, 2 usage or input error, 3 interrupted."""
    try:
        report = _ship_report(args) if getattr(args, "ship", None) else _report(args)
    except (InputError, SparkJobError) as exc:
        _err(str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        _err("interrupted")
        return EXIT_INTERRUPTED
    except OSError as exc:
        _err(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))
        return EXIT_USAGE
    if args.json:
        import json
        print(json.dumps(report.to_json(), indent=1))
    else:
        report.print()
    return report.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m vrepl.spark.validate ...` / `spark-submit submit.py ...`: the options of
    `vrepl validate`; under spark-submit the master is spark-submit's."""
    parser = OneLineArgumentParser(prog="vrepl.spark.validate", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))
