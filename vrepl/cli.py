"""The `vrepl` command line.

Owns: argument parsing, exit codes and what the operator sees (one clear line on stderr for
an error, never a traceback; progress on long work). The work itself lives in the library
modules (vrepl.wal, ...); this module only calls them and prints.

Exit codes (vrepl/exitcodes.py, docs/operations.md): 0 success / clean, 1 the data is corrupt
or a check found differences, 2 usage or input error (missing path, bad argument), 3
interrupted, 8 in use (`vrepl node`: another process holds the data directory or listens on
an address). Each command imports its modules when it runs, so that `vrepl --version` is
quick and a source tree whose extensions are not built gets its one line (main()).
"""
from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import vrepl
from vrepl.argparsing import OneLineArgumentParser, host_port, host_port_list
from vrepl.errors import (CliError, ConfigError, DirInUseError, ListenError, VreplError,
                          WalCorruptError, WalError)
from vrepl.exitcodes import EXIT_FAILED, EXIT_IN_USE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from vrepl.renamed import print_one_line
from vrepl.untrusted import printable


def _err(message: str) -> None:
    # A message may quote text from the network (a node's answer): one line, escaped.
    print(f"vrepl: error: {printable(message)}", file=sys.stderr)


def _preview(payload: bytes, limit: int = 32) -> str:
    text = payload[:limit]
    shown = "".join(chr(b) if 32 <= b < 127 else "." for b in text)
    return shown + ("..." if len(payload) > limit else "")


# ---------------------------------------------------------------------------------------------
# wal dump / verify / repair / demo

def _require_dir(path: str) -> str:
    if not os.path.exists(path):
        raise CliError(f"{path}: no such directory")
    if not os.path.isdir(path):
        raise CliError(f"{path}: not a directory")
    return path


def cmd_wal_dump(args: argparse.Namespace) -> int:
    from vrepl import wal

    reader = wal.WalReader(_require_dir(args.dir), max_record_bytes=args.max_record_bytes)
    out = sys.stdout
    count = 0
    for blk in reader.iter_blocks(args.from_version):
        name = os.path.basename(blk.file.path)
        for off in blk.scan.offsets:
            rec = wal._rec.decode_record(blk.data, int(off), args.max_record_bytes)
            file_off = blk.offset + int(off)
            if args.json:
                out.write(json.dumps({
                    "version": rec.version, "epoch": rec.epoch, "msg_type": rec.msg_type,
                    "schema_version": rec.schema_version, "length": len(rec.payload),
                    "file": name, "offset": file_off,
                    "payload_b64": base64.b64encode(rec.payload).decode(),
                }) + "\n")
            else:
                out.write(f"{rec.version:>10} epoch={rec.epoch:<6} type={rec.msg_type:<3} "
                          f"len={len(rec.payload):<7} {name}@{file_off:<10} "
                          f"{_preview(rec.payload)}\n")
            count += 1
    if not args.json:
        print(f"# {count} records", file=sys.stderr)
    return EXIT_OK


def _verify_wal_dir(args: argparse.Namespace):
    """`wal verify`'s and `wal repair`'s first step: every byte of every file (corruption
    raises, exit 1); a directory without any WAL file is refused, exit 2."""
    from vrepl import wal

    state = wal.verify(_require_dir(args.dir), args.max_record_bytes)
    if not state.files:
        # Nothing was verified: most likely the wrong directory (docs/wal-format.md).
        raise CliError(f"{args.dir}: no WAL file found (no NNNNNNNNNNNN.wal)", EXIT_USAGE)
    return state


def cmd_wal_verify(args: argparse.Namespace) -> int:
    state = _verify_wal_dir(args)
    files = len(state.files)
    if state.torn_tail is not None:
        t = state.torn_tail
        print(f"{t.describe()}; repairable with 'vrepl wal repair {args.dir}'", file=sys.stderr)
        return EXIT_FAILED
    print(f"{args.dir}: clean: {files} files, versions {state.first_version}.."
          f"{state.last_version}")
    return EXIT_OK


def cmd_wal_repair(args: argparse.Namespace) -> int:
    from vrepl import wal

    # Every byte first: corruption anywhere (a sealed file too, which repair()'s quick
    # inspection takes from its index) is raised, exit 1, and nothing is cut
    # (docs/wal-format.md: repair refuses to touch it, never skips it silently).
    _verify_wal_dir(args)
    tail = wal.repair(args.dir, args.max_record_bytes)
    if tail is None:
        print(f"{args.dir}: nothing to repair (no torn tail)")
    else:
        print(f"{args.dir}: truncated {os.path.basename(tail.path)} at offset {tail.offset}"
              f" ({tail.reason}); last good version {tail.last_good_version}")
    return EXIT_OK


def cmd_wal_demo(args: argparse.Namespace) -> int:
    """Write generated time-series rows to a WAL with group commit, then read and verify."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from vrepl import wal

    console = Console(stderr=False, soft_wrap=True)
    directory = args.dir or tempfile.mkdtemp(prefix="vrepl-wal-demo-")
    own_dir = args.dir is None
    try:
        opts = wal.WalOptions(max_file_bytes=args.max_file_mb * 1024 * 1024,
                              durability=args.durability, group_commit_ms=0)
        batch = args.batch
        rows = args.records
        console.print(f"[bold]vrepl WAL demo[/]: {rows:,} records of {args.payload_bytes} B in"
                      f" batches of {batch}, durability={opts.durability.value}, dir={directory}")
        payload_tail = b"x" * max(0, args.payload_bytes - 24)
        t0 = time.perf_counter()
        with wal.WalWriter(directory, opts) as writer, Progress(
                TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,}"
                                                                          "/{task.total:,}"),
                TimeRemainingColumn(), console=console, transient=not console.is_terminal) as bar:
            task = bar.add_task("writing", total=rows)
            ts = 1_700_000_000_000
            done = 0
            while done < rows:
                n = min(batch, rows - done)
                payloads = [(ts + done + i).to_bytes(8, "little") + b"sensor-0001\x00\x00\x00\x00\x00"
                            + payload_tail for i in range(n)]
                writer.append_batch(payloads, epoch=1)
                done += n
                bar.update(task, completed=done)
            files = len(writer.files)
        write_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        state = wal.verify(directory)
        seen = sum(1 for _ in wal.WalReader(directory).iter_records(1))
        read_s = time.perf_counter() - t1
        if seen != rows or state.last_version != rows:
            raise CliError(f"read back {seen} records, expected {rows}", EXIT_FAILED)
        console.print(f"wrote {rows:,} records into {files} files in {write_s:.2f} s "
                      f"({rows / write_s:,.0f} records/s, one fsync per batch)")
        console.print(f"verified and read back all {seen:,} records in {read_s:.2f} s "
                      f"({seen / read_s:,.0f} records/s): versions 1..{state.last_version},"
                      f" no torn tail")
        return EXIT_OK
    finally:
        if own_dir and not args.keep:
            shutil.rmtree(directory, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# node / status / demo / bench (docs/operations.md)

def cmd_node(args: argparse.Namespace) -> int:
    from vrepl.node.config import load_config
    from vrepl.node.server import run_node

    cfg = load_config(args.config)     # ConfigError: one line, exit 2
    try:
        return run_node(cfg)
    except DirInUseError as exc:
        raise CliError(f"node {cfg.node_id}: cannot start: {exc}", EXIT_IN_USE) from None
    except ListenError as exc:
        raise CliError(f"node {cfg.node_id}: cannot start: {exc}",
                       EXIT_IN_USE if exc.in_use else EXIT_FAILED) from None
    except OSError as exc:
        raise CliError(f"node {cfg.node_id}: cannot start: {exc.strerror or exc}"
                       f"{' (' + exc.filename + ')' if getattr(exc, 'filename', None) else ''}",
                       EXIT_FAILED) from None


def add_node_access_options(sp: argparse.ArgumentParser) -> None:
    """--token-file, --tls, --cacert, --insecure: how a command reaches nodes whose HTTP API
    requires a bearer token or serves HTTPS (docs/security.md §The HTTP API)."""
    g = sp.add_argument_group("token and TLS (docs/security.md)")
    g.add_argument("--token-file", metavar="PATH", help="file holding the bearer token the"
                   " nodes require (their http.token_file); sent as Authorization: Bearer")
    g.add_argument("--tls", action="store_true", help="talk HTTPS (nodes with http.tls_cert);"
                   " implied by --cacert and --insecure")
    g.add_argument("--cacert", metavar="PATH", help="CA certificate(s), PEM, to check the"
                   " nodes' certificates against (default: the system's CAs)")
    g.add_argument("--insecure", action="store_true", help="HTTPS without checking the"
                   " certificate (tests only: anyone on the path can read and change the"
                   " traffic)")


def node_access(args: argparse.Namespace) -> dict:
    """Client keyword arguments from add_node_access_options' flags; a token file that cannot
    be read or a CA file that cannot be loaded is a ConfigError (exit 2)."""
    from vrepl.client import client_ssl_context, read_token_file

    opts: dict = {}
    if args.token_file:
        try:
            opts["token"] = read_token_file(args.token_file)
        except ConfigError as exc:
            raise ConfigError(f"--token-file {exc}") from None
    if args.tls or args.cacert or args.insecure:
        opts["tls"] = client_ssl_context(args.cacert, verify=not args.insecure)
    return opts


def cmd_status(args: argparse.Namespace) -> int:
    from vrepl.node.demo import make_console
    from vrepl.node.statusview import fetch_status, run

    if args.watch is not None and not args.watch > 0:
        raise CliError(f"--watch must be a positive number of seconds, got {args.watch:g}")
    if args.count is not None and args.count < 1:
        raise CliError(f"--count must be positive, got {args.count}")
    if not args.timeout > 0:
        raise CliError(f"--timeout must be positive, got {args.timeout:g}")
    access = node_access(args)
    # The node named must answer: it is where the list of nodes comes from.
    seed = fetch_status(args.node, args.timeout, access)
    if seed["state"] != "up":
        raise CliError(f"{args.node}: {seed['state']}: {seed['error']}", EXIT_FAILED)
    run(args.node, args.timeout, as_json=args.json, watch_s=args.watch, count=args.count,
        console=make_console(), client_kw=access)
    return EXIT_OK


def cmd_txn(args: argparse.Namespace) -> int:
    from vrepl.node import txncli

    return txncli.cmd_txn(args, node_access(args))


def cmd_demo(args: argparse.Namespace) -> int:
    from vrepl.node.demo import run_demo

    return run_demo(args)


def cmd_bench(args: argparse.Namespace) -> int:
    from vrepl.node.loadgen import run_bench_cli

    access = node_access(args)
    if access and not args.nodes:
        raise CliError("--token-file, --tls, --cacert and --insecure go with --nodes (the local"
                       " cluster bench starts has no token and no TLS)")
    return run_bench_cli(args, access)


# ---------------------------------------------------------------------------------------------

NODE_DESCRIPTION = """\
Run one vrepl node in the foreground: it recovers every vgroup it hosts (archived files,
then the WAL), replicates them with its peers and serves the HTTP client API. It prints
one JSON "ready" line on stdout once it serves; logs go to log_file (default stderr).
SIGTERM or SIGINT stops it gracefully (writes in flight finish, every vnode flushes)."""


def _node_epilog() -> str:
    import vrepl.node
    here = os.path.dirname(os.path.abspath(vrepl.node.__file__))
    return f"""\
exit codes: 0 stopped by SIGTERM/SIGINT, 1 could not start (a corrupt WAL or file, an
address not on this host), 2 bad configuration (one line naming the key), 8 in use (another
process holds the data directory, or listens on the HTTP or replication address).

example configuration: {os.path.join(here, "node.example.toml")}
systemd unit:          {os.path.join(here, "vrepl-node.service")}
docs: docs/operations.md (settings, exit codes, operations), docs/client-api.md (HTTP API)"""


DEMO_DESCRIPTION = """\
Start a 3-replica vgroup (quorum 2) as three `vrepl node` processes on 127.0.0.1 in a
temporary directory, write rows through the client API, SIGKILL the master and time the
election, keep writing through the new master, restart the old one until it caught up,
compare every replica row by row, stop the nodes, and end with the Spark validation of
the three replicas (needs Java 17+; skip it with --no-spark). Everything it started is
stopped and removed, also on Ctrl-C or failure."""

DEMO_EPILOG = """\
exit codes: 0 the replicas agree, 1 they differ or a step failed (one line says which),
2 the Spark validation cannot run here (no Java: apt-get install openjdk-17-jre-headless,
or --no-spark), 3 interrupted.
docs: docs/operations.md (`vrepl demo`), docs/validation.md (the Spark validation)"""


# The commands whose parsers live in the module that implements them, in the order
# `vrepl --help` lists them. Importing such a module loads its command's implementation: the
# validation job's package loads pyarrow and numpy, `vrepl restore` the vnode and the WAL.
# So build_parser() adds only the parsers of the command being run (`vrepl ship` starts
# without any of that, issue 16), and all of them when no command is named (`vrepl --help`
# lists every command; a mistyped name gets argparse's list of choices). It is the same rule
# as the cmd_* functions above, which import a command's modules when it runs; it dodges no
# import cycle (tests/unit/test_layering.py counts these imports like any other).

def _add_validate(sub: Any) -> None:
    # `vrepl validate` (the Spark job, docs/validation.md); pyspark itself is imported only
    # when a validation runs.
    from vrepl.spark import cli as spark_cli
    spark_cli.add_parser(sub)


def _add_restore(sub: Any) -> None:
    # `vrepl restore` and `vrepl replay` (docs/restore.md); each returns its exit code.
    from vrepl.restore.cli import add_parsers
    add_parsers(sub)


def _add_ship(sub: Any) -> None:
    # `vrepl ship` and `vrepl ship-owner` (docs/ship.md); each returns its exit code.
    from vrepl.ship.cli import add_parsers
    add_parsers(sub)


def _add_txn(sub: Any) -> None:
    # `vrepl txn list|show|abort` (docs/transactions.md).
    from vrepl.node import txncli
    txncli.add_parsers(sub, add_node_access_options, cmd_txn)


COMMAND_MODULES: tuple[tuple[tuple[str, ...], Callable[[Any], None]], ...] = (
    (("validate",), _add_validate),
    (("restore", "replay"), _add_restore),
    (("ship", "ship-owner"), _add_ship),
    (("txn",), _add_txn),
)
OWN_COMMANDS = frozenset({"wal", "node", "status", "demo", "bench"})   # defined below


def command_named(argv: Sequence[str]) -> str | None:
    """The command `argv` runs: its first word that is not an option (the top-level options
    take no value), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `vrepl` parser: with `command`, a command of COMMAND_MODULES or of this module,
    only that command's module is imported for its parser; otherwise every command's."""
    p = OneLineArgumentParser(prog="vrepl", description="vrepl: master-slave replication for"
                                " time-series vnodes (TDengine 2.0 style)")
    p.add_argument("--version", action="version", version=f"vrepl {vrepl.__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log library events to stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    known = OWN_COMMANDS.union(*(names for names, _ in COMMAND_MODULES))
    for names, add in COMMAND_MODULES:
        if command not in known or command in names:
            add(sub)

    w = sub.add_parser("wal", help="inspect, verify and repair a WAL directory")
    wsub = w.add_subparsers(dest="wal_command", metavar="WAL_COMMAND")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("dir", help="WAL directory")
        sp.add_argument("--max-record-bytes", type=int, default=16 * 1024 * 1024,
                        help="largest record payload accepted (default 16 MiB)")

    d = wsub.add_parser("dump", help="print the records of a WAL")
    common(d)
    d.add_argument("--from-version", type=int, default=1, metavar="N",
                   help="start at version N (default 1)")
    d.add_argument("--json", action="store_true", help="one JSON object per line")
    d.set_defaults(func=cmd_wal_dump)

    v = wsub.add_parser("verify", help="check every record; exit 0 clean, 1 corrupt or torn, 2 no WAL file")
    common(v)
    v.set_defaults(func=cmd_wal_verify)

    r = wsub.add_parser("repair", help="truncate a torn tail of the last WAL file")
    common(r)
    r.set_defaults(func=cmd_wal_repair)

    demo = wsub.add_parser("demo", help="write, verify and read back generated rows")
    demo.add_argument("--records", type=int, default=1_000_000, metavar="N",
                      help="records written (1000000)")
    demo.add_argument("--batch", type=int, default=1000, metavar="N",
                      help="records per append, one fsync each (1000)")
    demo.add_argument("--payload-bytes", type=int, default=128, metavar="B",
                      help="payload bytes per record (128)")
    demo.add_argument("--durability", choices=["fsync", "group", "none"], default="group",
                      help="when appends reach the disk: fsync each, group commit, or never"
                           " (group)")
    demo.add_argument("--max-file-mb", type=int, default=64, metavar="MB",
                      help="WAL file size before rotating to a new file (64)")
    demo.add_argument("--dir", help="WAL directory (default: a temporary one, removed after)")
    demo.add_argument("--keep", action="store_true", help="keep the temporary directory")
    demo.set_defaults(func=cmd_wal_demo)

    n = sub.add_parser("node", help="run a node (vnodes, replication, HTTP API)",
                       description=NODE_DESCRIPTION, epilog=_node_epilog(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    n.add_argument("--config", required=True, metavar="PATH",
                   help="the node's configuration file, node.toml (every setting and its"
                        " default: docs/operations.md)")
    n.set_defaults(func=cmd_node)

    st = sub.add_parser("status", help="every node of every vgroup: role, versions, lag, last"
                        " heard, arbitrator")
    st.add_argument("--node", required=True, type=host_port, metavar="HOST:PORT", help="any node's HTTP address")
    st.add_argument("--json", action="store_true", help="the cluster view as JSON (with each"
                    " node's status document); with --watch, one document per line")
    st.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for each node's"
                    " answer (3); a node that accepts but does not answer in time is 'stalled'")
    st.add_argument("--watch", type=float, nargs="?", const=2.0, default=None, metavar="SECONDS",
                    help="refresh in place every SECONDS (2 when not given) until Ctrl-C")
    st.add_argument("--count", type=int, default=None, metavar="N",
                    help="with --watch: stop after N refreshes (default: until Ctrl-C)")
    add_node_access_options(st)
    st.set_defaults(func=cmd_status)

    dm = sub.add_parser("demo", help="3 replicas on loopback: write, kill the master, recover,"
                        " compare", description=DEMO_DESCRIPTION, epilog=DEMO_EPILOG,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    dm.add_argument("--rows", type=int, default=30_000, help="rows written before and after"
                    " the failover, each (30000)")
    dm.add_argument("--batch", type=int, default=100, help="rows per write request (100)")
    dm.add_argument("--tables", type=int, default=4, help="tables written (4)")
    dm.add_argument("--dir", help="base directory (default: a temporary one, removed after)")
    dm.add_argument("--keep", action="store_true", help="keep the directory")
    dm.add_argument("--json", action="store_true", help="print the summary as JSON at the end")
    dm.add_argument("--no-spark", action="store_true", help="skip the closing Spark validation")
    dm.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", help="load generator: concurrent clients against a vgroup")
    b.add_argument("--nodes", type=host_port_list, help="HTTP addresses (host:port,...); default: start a local"
                   " 3-replica cluster (quorum 2) in a temporary directory")
    b.add_argument("--vgroup", type=int, default=1, metavar="N", help="vgroup written (1)")
    b.add_argument("--clients", type=int, default=16, help="concurrent clients (16)")
    b.add_argument("--batch", type=int, default=100, help="rows per request (100)")
    b.add_argument("--row-bytes", type=int, default=100, help="approximate JSON bytes per row (100)")
    b.add_argument("--duration", type=float, default=10.0, help="seconds (10)")
    b.add_argument("--warmup", type=float, default=1.0, help="seconds not measured (1)")
    b.add_argument("--json", action="store_true", help="print the result as JSON")
    add_node_access_options(b)
    b.set_defaults(func=cmd_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        import vrepl._core  # noqa: F401  (an unbuilt source tree: one line, exit 2)
    except ImportError as exc:
        _err(str(exc))
        return EXIT_USAGE
    print_one_line("vrepl")     # a setting given by its old name: one warning line
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(command_named(argv))
    args = parser.parse_args(argv)
    # The library logs what it does (a repair, say); the CLI prints its own one-line summary,
    # so library logs are shown only with --verbose.
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="vrepl: %(name)s: %(message)s", stream=sys.stderr)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    for name in ("from_version", "records", "batch", "payload_bytes", "max_file_mb",
                 "max_record_bytes", "rows", "tables", "clients", "row_bytes", "duration"):
        value = getattr(args, name, None)
        if value is not None and value < (1 if name != "payload_bytes" else 0):
            _err(f"--{name.replace('_', '-')} must be positive, got {value}")
            return EXIT_USAGE
    try:
        return args.func(args)
    except CliError as exc:
        _err(str(exc))
        return exc.code
    except ConfigError as exc:
        _err(str(exc))
        return EXIT_USAGE
    except VreplError as exc:
        _err(str(exc))
        if isinstance(exc, WalCorruptError):
            return EXIT_FAILED
        return EXIT_USAGE if isinstance(exc, WalError) else EXIT_FAILED
    except KeyboardInterrupt:
        _err("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `vrepl wal dump | head`: the reader went away; not an error of ours.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return EXIT_OK
    except OSError as exc:
        _err(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
