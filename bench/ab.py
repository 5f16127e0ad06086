"""A/B runs of one benchmark command against two source trees, in turn (A B A B ...).

    python bench/ab.py --a . --b ../old-checkout --pairs 5 \
        --figure 'records/s=throughput median ([\\d,.]+)' \
        --figure 'p50 ms=latency over \\d+: p50 ([\\d.]+) ms' \
        -- python bench/bench_replication.py --records 300000 --rounds 1 --failovers 0

Each run executes the command with its working directory and PYTHONPATH set to one tree (so
`python bench/x.py` and every node process it starts import that tree's `vrepl`; each tree
needs its extensions built: `python setup.py build_ext --inplace`). Taking the two sides in
turn keeps their ratio meaningful while the machine's speed drifts (docs/benchmarks.md
§One driver). Figures come from the command's output: a JSON object on its last line gives every
numeric leaf (`throughput.rows_per_s`), `--figure NAME=REGEX` takes the first group of a
regex match. Every run also gives its wall seconds and the CPU seconds of all its processes
(the children's rusage).

It owns nothing else: no thresholds, no pass or fail; it prints each figure's median on
both sides, the ratio of medians, and the median of the pair-by-pair ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, help="source tree A (the new one)")
    p.add_argument("--b", required=True, help="source tree B (the baseline)")
    p.add_argument("--pairs", type=int, default=5, help="A B pairs to run (default 5)")
    p.add_argument("--figure", action="append", default=[], metavar="NAME=REGEX",
                   help="a figure read from the output: the regex's first group (commas dropped)")
    p.add_argument("--json-out", help="also write every run's figures to this file")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        p.error("give the command after --")
    return args


def figures_of(output: str, patterns: list[tuple[str, re.Pattern]]) -> dict[str, float]:
    found: dict[str, float] = {}
    lines = output.strip().splitlines()
    if lines:
        try:
            doc = json.loads(lines[-1])
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            _flatten(doc, "", found)
    for name, rx in patterns:
        m = rx.search(output)
        if m:
            found[name] = float(m.group(1).replace(",", ""))
    return found


def _flatten(node, prefix: str, out: dict[str, float]) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            _flatten(v, f"{prefix}{k}.", out)
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        out[prefix[:-1]] = float(node)


def run_once(tree: str, command: list[str], patterns) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(command, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False)
    wall_s = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"ab: {command[0]} in {tree} exited {proc.returncode}:\n{proc.stdout[-2000:]}")
    found = figures_of(proc.stdout, patterns)
    found["wall_s"] = wall_s
    found["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    patterns = []
    for spec in args.figure:
        name, sep, rx = spec.partition("=")
        if not sep:
            sys.exit(f"ab: --figure {spec!r}: NAME=REGEX expected")
        patterns.append((name, re.compile(rx)))
    runs: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    for i in range(args.pairs):
        for side in ("a", "b"):
            runs[side].append(run_once(getattr(args, side), args.command, patterns))
            print(f"pair {i + 1}/{args.pairs} {side.upper()}: "
                  + ", ".join(f"{k} {v:,.4g}" for k, v in sorted(runs[side][-1].items())), flush=True)
    names = sorted(set.intersection(*(set(r) for r in runs["a"] + runs["b"])))
    print(f"\n{'figure':<42} {'A median':>14} {'B median':>14} {'A/B':>7} {'pairs A/B':>10}")
    summary = {}
    for name in names:
        a = [r[name] for r in runs["a"]]
        b = [r[name] for r in runs["b"]]
        ma, mb = statistics.median(a), statistics.median(b)
        # A figure that is 0 on B (bytes sent by a round with nothing new) has no ratio: nan,
        # and the medians still print.
        pair_ratios = [x / y for x, y in zip(a, b) if y]
        pair = statistics.median(pair_ratios) if pair_ratios else float("nan")
        ratio = ma / mb if mb else float("nan")
        summary[name] = {"a": a, "b": b, "ratio_of_medians": ratio, "median_pair_ratio": pair}
        print(f"{name:<42} {ma:>14,.4g} {mb:>14,.4g} {ratio:>7.3f} {pair:>10.3f}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"command": args.command, "a": args.a, "b": args.b, "figures": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
