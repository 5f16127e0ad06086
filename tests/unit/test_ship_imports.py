"""`vrepl ship` starts without pyarrow or numpy (issue 16): the sender process needs neither,
and importing them cost it 0.45-0.55 CPU s per start (docs/ship.md §12). Checked in fresh
interpreters, since this test process has both loaded long before: the modules a command
imports are what `python -X importtime` reports and what `sys.modules` holds after it.
The other commands keep their parsers: `vrepl --help` lists every command."""
from __future__ import annotations

import subprocess
import sys

from vrepl.child import python_argv
from vrepl.cli import build_parser

HEAVY = ("numpy", "pyarrow")
# The sender's modules: the command's entry and everything a round runs.
SENDER_MODULES = ("vrepl.ship.cli", "vrepl.ship.sender", "vrepl.ship.select", "vrepl.ship.state",
                  "vrepl.ship.stream", "vrepl.ship.protocol", "vrepl.ship.round", "vrepl.ship.errors")


def imported_by_importtime(stderr: str) -> set[str]:
    """The modules `-X importtime` reports: lines `import time: self | cumulative | name`."""
    out = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":
                out.add(name)
    return out


def test_ship_help_imports_neither_pyarrow_nor_numpy():
    proc = subprocess.run(python_argv("-X", "importtime", "-m", "vrepl.cli", "ship", "--help"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage: vrepl ship" in proc.stdout and "--once" in proc.stdout
    imported = imported_by_importtime(proc.stderr)
    assert "vrepl.ship.cli" in imported           # the report is read right
    assert not {m for m in imported if m.split(".")[0] in HEAVY}, \
        sorted(m for m in imported if m.split(".")[0] in HEAVY)[:5]


def test_the_senders_modules_load_no_vnode_wal_pyarrow_or_numpy():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in SENDER_MODULES)
            + "print(' '.join(sorted(sys.modules)))\n")
    proc = subprocess.run(python_argv("-c", code), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded = set(proc.stdout.split())
    assert set(SENDER_MODULES) <= loaded
    roots = {m.split(".")[0] for m in loaded}
    assert not roots & set(HEAVY), sorted(roots & set(HEAVY))
    # What brought them in before: the vnode package, the WAL, the restore command and
    # receiver, the validation job, and the WAL scan's numpy arrays (vrepl._core.record).
    assert not {m for m in loaded if m.startswith(("vrepl.vnode", "vrepl.wal", "vrepl.spark"))
                or m in ("vrepl.restore.cli", "vrepl.restore.receiver", "vrepl._core.record",
                         "vrepl._core.framebuf")}


def subcommands(parser) -> list[str]:
    (action,) = [a for a in parser._actions if a.dest == "command"]
    return list(action.choices)


def test_every_command_is_listed_and_a_named_command_builds_its_own_parser():
    everything = subcommands(build_parser())
    assert everything == ["validate", "restore", "replay", "ship", "ship-owner", "txn", "wal", "node",
                          "status", "demo", "bench"]
    assert subcommands(build_parser("ship")) == ["ship", "ship-owner", "wal", "node", "status", "demo",
                                                 "bench"]
    assert subcommands(build_parser("validate"))[0] == "validate"
    assert subcommands(build_parser("wal")) == ["wal", "node", "status", "demo", "bench"]
    # A mistyped command gets argparse's list of every choice, as before.
    assert subcommands(build_parser("shp")) == everything


def test_vrepl_help_lists_every_command():
    out = subprocess.run(python_argv("-m", "vrepl.cli", "--help"), capture_output=True, text=True,
                         timeout=120, check=True).stdout
    for name in ("validate", "restore", "replay", "ship", "ship-owner", "txn", "wal", "node", "status",
                 "demo", "bench"):
        assert f"\n    {name} " in out, name
