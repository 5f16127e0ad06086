"""Command line of the simulator: `python -m vrepl.testing.sim --seed N` replays one run,
`--seeds K` runs a campaign of K seeds (docs/simulation.md §Running).

Exit status: 0 when every run passed, 1 when a run failed (its seed, the command that
reproduces it and the last events are printed), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from vrepl.testing.sim.campaign import run_campaign, run_seed
from vrepl.testing.sim.options import CLI_FIELDS, FLUSH_LIMITS, PROFILES, SimOptions, make_options


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m vrepl.testing.sim", description=__doc__.split("\n\n")[0])
    which = p.add_mutually_exclusive_group()
    which.add_argument("--seed", type=int, help="run this one seed (verbose report)")
    which.add_argument("--seeds", type=int, help="run a campaign of this many seeds")
    p.add_argument("--first-seed", type=int, default=0, help="first seed of a campaign (default 0)")
    p.add_argument("--profile", choices=sorted(PROFILES), default="default", help="fault rates (default: default)")
    defaults = SimOptions()
    for name in CLI_FIELDS:
        choices = FLUSH_LIMITS if name == "flush_limit" else None
        p.add_argument(f"--{name.replace('_', '-')}", type=type(getattr(defaults, name)), default=None,
                       choices=choices)
    arb = p.add_mutually_exclusive_group()
    arb.add_argument("--arbitrator", dest="arbitrator", action="store_true", default=None,
                     help="use an arbitrator (default: when the replica count is even)")
    arb.add_argument("--no-arbitrator", dest="arbitrator", action="store_false")
    p.add_argument("--arbitrator-forgets", action="store_true",
                   help="a restarted arbitrator loses its lease table (waits one lease before granting)")
    p.add_argument("--assume-fixes", action="store_true",
                   help="apply the proposed fixes of the core bugs found so far (vrepl/testing/sim/fixes.py)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes for a campaign (0 = all CPUs)")
    p.add_argument("--trace", action="store_true", help="--seed: print the whole event trace")
    p.add_argument("--json", action="store_true", help="print the campaign summary as JSON")
    p.add_argument("--stop-on-failure", action="store_true", help="campaign: stop at the first failure")
    return p.parse_args(argv)


def options_from(args: argparse.Namespace) -> SimOptions:
    overrides = {name: getattr(args, name) for name in CLI_FIELDS if getattr(args, name) is not None}
    if args.arbitrator is not None:
        overrides["arbitrator"] = args.arbitrator
    if args.arbitrator_forgets:
        overrides["arbitrator_forgets"] = True
    if args.trace:
        overrides["trace_len"] = 10**7
    return make_options(args.profile, **overrides)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    opts = options_from(args)
    if opts.replicas < 1 or opts.replicas > 9:
        print("--replicas must be in 1..9", file=sys.stderr)
        return 2
    if args.seeds is None:
        seed = 0 if args.seed is None else args.seed
        r = run_seed(seed, opts, args.profile, args.assume_fixes)
        s = r.stats
        if args.trace:
            print("\n".join(r.trace) if r.trace else "(trace kept only for failing runs; see --seed with a failure)")
        print(f"seed {seed}: {'ok' if r.ok else 'FAILED'} in {r.seconds:.2f}s; writes {s.writes_submitted},"
              f" confirmed ok {s.confirmed_ok}, failed {s.confirmed_failed}, timed out {s.confirmed_timed_out},"
              f" unknown {s.unknown}, lost {s.lost}; elections {s.elections} (max epoch {s.max_epoch}),"
              f" crashes {s.crashes}, pauses {s.pauses}, partitions {s.partitions}, connection losses"
              f" {s.conn_losses}, truncations {s.truncations}; app flushes {s.flushes} ({s.archived} rows archived,"
              f" limit {opts.flush_limit}); recovered in {s.recovery_ticks} ticks;"
              f" trace {r.trace_hash[:16]}")
        if not r.ok:
            print(r.report())
            return 1
        return 0
    jobs = args.jobs or os.cpu_count() or 1
    failed = []

    def on_result(r) -> None:
        if not r.ok:
            failed.append(r)
            print(r.report() if len(failed) <= 3 else f"seed {r.seed}: {r.kind} failure: {r.message.splitlines()[0]}"
                  f"\n  reproduce: {r.command}", flush=True)
            if args.stop_on_failure:
                raise KeyboardInterrupt

    seeds = range(args.first_seed, args.first_seed + args.seeds)
    try:
        summary = run_campaign(seeds, opts, profile=args.profile, fixes=args.assume_fixes, jobs=jobs,
                               on_result=on_result)
    except KeyboardInterrupt:
        return 1
    print(json.dumps(summary.as_dict(), indent=2) if args.json else summary.render())
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
