"""Every flag of every command has a help text (`vrepl`, its subcommands at every depth,
`python -m vrepl.restore`, `vrepl-arbitrator`), and `vrepl node --help` / `vrepl demo --help`
say what the command does and where the docs are."""
from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from arbitrator.main import build_parser as arbitrator_parser
from vrepl.cli import build_parser as vrepl_parser
from vrepl.restore.cli import build_parser as restore_parser


def walk(parser: argparse.ArgumentParser, path: str):
    """(command path, parser) for the parser and every subparser below it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, f"{path} {name}")


def undocumented(parser: argparse.ArgumentParser) -> list[str]:
    out = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if not action.help or action.help == argparse.SUPPRESS:
            out.append("/".join(action.option_strings) or action.dest)
    return out


PARSERS = [("vrepl", vrepl_parser()), ("python -m vrepl.restore", restore_parser()),
           ("vrepl-arbitrator", arbitrator_parser())]


def test_the_walk_finds_every_command():
    names = {path for path, _ in walk(vrepl_parser(), "vrepl")}
    assert {"vrepl node", "vrepl demo", "vrepl wal demo", "vrepl restore", "vrepl replay",
            "vrepl validate", "vrepl status", "vrepl bench"} <= names


def test_the_check_sees_a_flag_without_help():
    p = argparse.ArgumentParser()
    p.add_argument("--documented", help="says what it does")
    p.add_argument("--bare")
    assert undocumented(p) == ["--bare"]


@pytest.mark.parametrize("prog,parser", PARSERS, ids=[p for p, _ in PARSERS])
def test_every_flag_has_help(prog, parser):
    missing = {path: bad for path, sub in walk(parser, prog) if (bad := undocumented(sub))}
    assert not missing, f"flags without help: {missing}"


@pytest.mark.parametrize("command", ["node", "demo"])
def test_node_and_demo_help_describe_and_point_to_the_docs(command):
    p = subprocess.run([sys.executable, "-P", "-m", "vrepl.cli", command, "--help"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())
    assert "docs/operations.md" in text
    assert "exit" in text.lower()
    if command == "node":
        assert "node.example.toml" in text and "vrepl-node.service" in text
    else:
        assert "Spark" in text and "--no-spark" in text
