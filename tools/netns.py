"""Build, inspect and remove a chaos topology by hand (the same code the chaos tests use).

Usage (root):
  python tools/netns.py up [--nodes 3] [--arbitrator] [--dir DIR]   # prints the run name, addresses
  python tools/netns.py exec RUN MEMBER -- CMD ...                  # e.g. RUN n1 -- python -m ...
  python tools/netns.py cut RUN A B | block RUN SRC DST | drop RUN PERCENT M1 M2 ... | heal RUN | rules RUN
  python tools/netns.py down RUN
Members: n1..nN, cl (clients), arb. Nothing is added to the root namespace; `down` (or
tools/chaos_cleanup.py --run RUN) removes the namespaces and so every veth, bridge and rule.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from vrepl.testing.chaos.netns import PREFIX, Member, Topology, cleanup


def _attach(run: str) -> Topology:
    if not run.startswith(PREFIX):
        raise SystemExit(f"{run}: not a chaos run name")
    topo = Topology(run, "", True)
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(run + "-") and not name.endswith("-br"):
            member = name[len(run) + 1:]
            topo.members[member] = Member(member, Topology._host_of(member), name)
    topo.closed = True  # attaching never removes anything on exit
    return topo


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["exec"]:
        if len(argv) < 5 or argv[3] != "--":
            raise SystemExit(__doc__)
        topo = _attach(argv[1])
        cmd = [*topo.exec_prefix(argv[2]), *argv[4:]]
        os.execvp(cmd[0], cmd)
    ap = argparse.ArgumentParser(prog="netns.py")
    ap.add_argument("cmd", choices=["up", "down", "cut", "block", "drop", "heal", "rules"])
    ap.add_argument("args", nargs="*")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--arbitrator", action="store_true")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    a = ap.parse_args(argv)
    if a.cmd == "up":
        topo = Topology.create(a.dir, a.nodes, a.arbitrator, namespaced=True)
        from vrepl.testing.chaos import netns as _n
        _n._REGISTRY.remove(topo)  # keep it after this command exits
        print(topo.run)
        for m in topo.members.values():
            print(f"  {m.name:4} {m.host:12} netns {m.netns}")
        return 0
    topo = _attach(a.args[0])
    if a.cmd == "down":
        cleanup(stale_only=False, run=topo.run)
    elif a.cmd == "cut":
        topo.cut(a.args[1], a.args[2])
    elif a.cmd == "block":
        topo.block(a.args[1], a.args[2])
    elif a.cmd == "drop":
        topo.drop_percent(int(a.args[1]), a.args[2:])
    elif a.cmd == "heal":
        topo.heal()
    elif a.cmd == "rules":
        print(topo.rules())
    return 0


if __name__ == "__main__":
    sys.exit(main())
