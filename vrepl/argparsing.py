"""The argument parser of every vrepl command: a usage mistake is one line, exit 2.

Owns: `OneLineArgumentParser`, an `argparse.ArgumentParser` whose error is one line on stderr,
`<tool>: error: <command>: <reason> (see <tool> <command> --help)`, and exit code 2 (`EXIT_USAGE`,
docs/operations.md §Exit codes: every failure is one line). argparse's own error prints the
usage block first, several lines that scripts and the documented format do not expect.
Also `host_port`/`host_port_list`, the type of a `--node HOST:PORT` option, so that a malformed
address is such a usage line rather than a traceback.
Must not: import anything of vrepl but the exit codes, errors and `vrepl.endpoint` (the arbitrator and
every command use it).
"""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from vrepl.endpoint import parse_endpoint
from vrepl.errors import ConfigError
from vrepl.exitcodes import EXIT_USAGE


class OneLineArgumentParser(argparse.ArgumentParser):
    """`tool` names the process in the line ("vrepl", "vrepl-arbitrator"); subparsers made by
    `add_subparsers()` are of this class and inherit it."""

    def __init__(self, *args: object, tool: str = "vrepl", **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.tool = tool

    def add_subparsers(self, **kwargs: object) -> argparse._SubParsersAction:  # type: ignore[override]
        action = super().add_subparsers(**kwargs)  # type: ignore[arg-type]
        tool = self.tool
        make = action._parser_class

        def parser_class(*args: object, **kw: object) -> argparse.ArgumentParser:
            return make(*args, tool=tool, **kw)  # type: ignore[call-arg]

        action._parser_class = parser_class  # type: ignore[assignment]
        return action

    def error(self, message: str) -> NoReturn:
        reason = " ".join(message.split())  # argparse's messages may hold newlines
        command = self.prog[len(self.tool) + 1:] if self.prog.startswith(self.tool + " ") else ""
        where = f"{command}: " if command else ""
        sys.stderr.write(f"{self.tool}: error: {where}{reason} (see {self.prog} --help)\n")
        sys.exit(EXIT_USAGE)


def host_port(text: str) -> str:
    """argparse type of a `HOST:PORT` option: the text itself, checked (port 1..65535)."""
    try:
        parse_endpoint(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def host_port_list(text: str) -> str:
    """argparse type of a `HOST:PORT,...` option: the text itself, each address checked."""
    for item in text.split(","):
        if item:
            host_port(item)
    if not any(text.split(",")):
        raise argparse.ArgumentTypeError(f"no address in {text!r}")
    return text
