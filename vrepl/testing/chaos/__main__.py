"""Run chaos schedules and print their figures (docs/reliability.md).

    python -m vrepl.testing.chaos [--runs N] [--long] [--loopback] [--json OUT] [--keep DIR] [SCHEDULE ...]
    python -m vrepl.testing.chaos --list

Each run prints one JSON line (schedule, run, verdict counts, times); the exit code is 1 if
any run lost a confirmed write, diverged or had two masters in one epoch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import traceback

from vrepl.testing.chaos.netns import NemesisUnsupported
from vrepl.testing.chaos.schedules import SCHEDULES


def table(path: str) -> str:
    """One row per schedule: runs, writes confirmed / unknown, lost, recovery times (max)."""
    rows: dict[str, list[dict]] = {}
    with open(path) as fh:
        for line in fh:
            if line.strip():
                r = json.loads(line)
                rows.setdefault(r["schedule"], []).append(r)
    out = ["| schedule | runs | safe | confirmed | unknown (survived) | lost | lost, quorum 1 | "
           "two masters/epoch | first ok after fault, s (max) | converged after heal, s (max) | "
           "longest write gap, s (max) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, rs in rows.items():
        done = [r for r in rs if "ok" in r]
        bad = len(rs) - sum(1 for r in done if r["safe"])
        mx = lambda k: max((r[k] for r in done if r.get(k) is not None), default=None)  # noqa: E731
        fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
        out.append(
            f"| {name} | {len(rs)} | {len(rs) - bad}/{len(rs)} | {sum(r['ok'] for r in done)} | "
            f"{sum(r['unknown'] for r in done)} ({sum(r['unknown_present'] for r in done)}) | "
            f"{sum(r['lost'] + r['moved'] for r in done)} | {sum(r['lost_allowed'] for r in done)} | "
            f"{sum(len(r['masters_in_one_epoch']) for r in done)} | {fmt(mx('first_ok_after_fault_s'))} | "
            f"{fmt(mx('converged_s'))} | {fmt(mx('longest_gap_s'))} |")
    return "\n".join(out)


def _run_dir(keep: str | None):
    if keep is None:
        return tempfile.TemporaryDirectory(prefix="vrepl-chaos-run-")
    os.makedirs(keep, exist_ok=True)
    return contextlib.nullcontext(tempfile.mkdtemp(prefix="run-", dir=keep))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vrepl.testing.chaos")
    ap.add_argument("schedules", nargs="*")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--long", action="store_true")
    ap.add_argument("--loopback", action="store_true", help="do not use network namespaces")
    ap.add_argument("--json", help="append every run's figures to this file")
    ap.add_argument("--keep", metavar="DIR", help="keep every run's directory (logs, history, rows) under DIR")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--table", metavar="JSONL", help="print a Markdown table of the figures in JSONL")
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    if args.list:
        for name, fn in SCHEDULES.items():
            print(f"{name}: {(fn.__doc__ or '').split(chr(10))[0]}")
        return 0
    names = args.schedules or list(SCHEDULES)
    unknown = [n for n in names if n not in SCHEDULES]
    if unknown:
        ap.error(f"unknown schedule(s): {', '.join(unknown)}")
    bad = 0
    for name in names:
        for run in range(args.runs):
            t0 = time.monotonic()
            with _run_dir(args.keep) as d:
                try:
                    res = SCHEDULES[name](d, long=args.long, namespaced=False if args.loopback else None)
                    row = {"schedule": name, "run": run, "safe": res.safe, **res.summary()}
                    if not res.safe:
                        bad += 1
                        row["problems"] = res.verdict.problems()
                except NemesisUnsupported as exc:
                    row = {"schedule": name, "run": run, "skipped": str(exc)}
                except Exception as exc:
                    bad += 1
                    row = {"schedule": name, "run": run, "error": f"{type(exc).__name__}: {exc}"}
                    traceback.print_exc(file=sys.stderr)
            row["wall_s"] = round(time.monotonic() - t0, 1)
            line = json.dumps(row)
            print(line, flush=True)
            if args.json:
                with open(args.json, "a") as fh:
                    fh.write(line + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
