"""Remove what chaos runs left behind: network namespaces named `vrepl-chaos-*` (after killing,
by pid, the processes still inside them) and tmpfs mounts made by a run.

Usage:
  python tools/chaos_cleanup.py            # runs whose owner process is gone (safe while others run)
  python tools/chaos_cleanup.py --all      # every chaos run, including live ones
  python tools/chaos_cleanup.py --run NAME # one run (vrepl-chaos-<pid>-<hex>)
  python tools/chaos_cleanup.py --dry-run  # list only
Exit code 0; prints what it removed. Touches nothing whose name lacks the prefix; chaos runs
never put anything in the root network namespace, so there is nothing to remove there.
"""
from __future__ import annotations

import argparse
import sys

from vrepl.testing.chaos.netns import cleanup, leftovers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="chaos_cleanup")
    ap.add_argument("--all", action="store_true", help="also runs whose owner is still alive")
    ap.add_argument("--run", help="only this run")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    stale_only = not (args.all or args.run)
    found = leftovers(stale_only, args.run) if args.dry_run else cleanup(stale_only, args.run)
    verb = "would remove" if args.dry_run else "removed"
    for kind in ("mounts", "netns"):
        for name in found[kind]:
            print(f"{verb} {kind[:-1] if kind == 'mounts' else 'netns'} {name}")
    if not found["mounts"] and not found["netns"]:
        print("nothing to clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
