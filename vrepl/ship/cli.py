"""`vrepl ship` and `vrepl ship-owner` (docs/ship.md §8).

Owns: the two commands' parsers (`add_parsers(subparsers)`, registered by vrepl/cli.py), the
sender process's life: its OS lock (one `vrepl ship` per data directory and receiver: a
`flock` on the receiver's state directory, dropped by the kernel when the process dies),
the schedule (`--once`, `--period SECONDS`, `--on-flush`: a round when the vnode's manifest
changes, inotify), retries of a failed round with exponential backoff, the progress bar
(rich, on a terminal), one summary line per round, and the exit codes. `vrepl ship-owner`
asks a node to release or transfer a table (POST /v1/vgroups/{id}/ship/owners).

Exit codes (docs/ship.md §8.2): 0 done, 1 a file is corrupt (kept failing its checksum, or
the sender's own copy is damaged), 2 usage (bad argument, no secret, not a vnode directory,
unusable state directory), 3 interrupted, 4 the receiver is unreachable, not the master, busy
or broke off (after --retries), 5 a hostile name was refused, 6 no space left on the
receiver, 8 another `vrepl ship` runs for this data directory and receiver, or this sender
UUID is shipping from elsewhere (a clone), 9 the receiver refused the round (a table owned by
another source, a type conflict, another precision or file span, a cloned sender).
Text from the receiver is escaped before it is printed (vrepl/untrusted.py).
Must not: write into the vnode's directory outside `<data>/ship/`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from vrepl.argparsing import host_port
from vrepl.dirlock import DirInUseError, lock_dir
from vrepl.endpoint import parse_endpoint
from vrepl.errors import CliError, ConfigError
from vrepl.secretfile import read_secret
from vrepl.ship.errors import EXIT_IN_USE, EXIT_INTERRUPTED, EXIT_OK, EXIT_PEER, EXIT_USAGE, ShipError
from vrepl.ship.select import vnode_dir_refusal
from vrepl.ship.sender import RoundResult, Sender, SenderOptions
from vrepl.ship.state import SenderDir
from vrepl.untrusted import printable

SECRET_ENV = "VREPL_SHIP_SECRET"
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
ON_FLUSH_POLL_S = 1.0

log = logging.getLogger("vrepl.ship")


def _err(message: str) -> None:
    print(f"vrepl: error: {printable(message)}", file=sys.stderr)


def add_parsers(sub: Any) -> None:
    s = sub.add_parser(
        "ship",
        help="ship a vnode's sealed archived files to a receiving vrepl node",
        description="Ship the sealed archived files of one vnode directory to a"
        " vgroup of a receiving vrepl node (docs/ship.md). Each round ships the files"
        " deleted and added since the last round the receiver confirmed.",
        epilog="exit codes: 0 done, 1 a file is corrupt or was given up, 2 usage, 3 interrupted,"
        " 4 receiver unreachable/not master/busy/broke off (after --retries), 5 hostile name,"
        " 6 receiver disk full, 8 another vrepl ship runs for this directory and receiver (or"
        " this UUID ships from elsewhere), 9 refused (owner or type conflict, a clone, other precision"
        " or file span). docs: docs/ship.md",
    )
    s.add_argument(
        "--to",
        required=True,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="the receiving vgroup's nodes, at their replication port; the master is found",
    )
    s.add_argument(
        "--data",
        required=True,
        metavar="DIR",
        help="the vnode directory to ship (holds data/manifest.json; e.g. <data_dir>/vg1)",
    )
    s.add_argument("--vgroup", type=int, default=1, metavar="N", help="receiving vgroup id (default 1)")
    s.add_argument(
        "--sender-id",
        type=int,
        required=True,
        metavar="N",
        help="this sender's id, as the receiver's [[ship.senders]] names it",
    )
    s.add_argument("--secret-file", metavar="FILE", help=f"file holding this sender's secret (default: ${SECRET_ENV})")
    mode = s.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="one round, then exit (the default)")
    mode.add_argument("--period", type=float, metavar="SECONDS", help="a round every SECONDS, until stopped")
    mode.add_argument(
        "--on-flush",
        action="store_true",
        help="a round each time the vnode archives new files (its manifest changes), until stopped",
    )
    s.add_argument(
        "--retries",
        type=int,
        default=5,
        metavar="N",
        help="retry a failed round N times with backoff from 0.5 s doubling to 30 s (default 5)",
    )
    s.add_argument(
        "--file-retries",
        type=int,
        default=5,
        metavar="N",
        help="sends of one file that fails its checksum before it is given up for the round (default 5)",
    )
    s.add_argument("--timeout", type=float, default=60.0, metavar="S", help="I/O timeout in seconds (default 60)")
    s.add_argument("--uuid", metavar="UUID", help="set this sender's UUID (32 hex digits), e.g. after losing uuid.txt")
    s.add_argument(
        "--resync",
        action="store_true",
        help="reconcile with the receiver's list of this sender's files even if the digests agree",
    )
    s.add_argument("--bind", metavar="ADDR", help="source address of the connection")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.set_defaults(func=run_ship)

    o = sub.add_parser("ship-owner", help="show, release or transfer the owner of a shipped table on a receiver")
    o.add_argument(
        "--node", required=True, type=host_port, metavar="HOST:PORT", help="the receiving node's HTTP address"
    )
    o.add_argument("--vgroup", type=int, default=1, metavar="N", help="vgroup id (default 1)")
    o.add_argument("table", nargs="?", help="the table (omit to list every owner)")
    act = o.add_mutually_exclusive_group()
    act.add_argument(
        "--release", action="store_true", help="the table has no owner; the next sender to ship it gets it"
    )
    act.add_argument("--to", dest="owner", metavar="UUID", help="transfer the table to this sender UUID (or 'local')")
    o.add_argument("--token-file", metavar="FILE", help="bearer token of the node's HTTP API")
    o.set_defaults(func=run_owner)


def _options(args: argparse.Namespace) -> SenderOptions:
    secret = read_secret(args.secret_file, SECRET_ENV, "sender secret")
    try:
        addresses = [parse_endpoint(a.strip()) for a in args.to.split(",") if a.strip()]
    except (ConfigError, ValueError) as exc:
        raise CliError(f"--to {args.to!r}: {exc}", EXIT_USAGE) from None
    if not addresses:
        raise CliError("--to names no address", EXIT_USAGE)
    for name in ("retries", "file_retries", "vgroup", "sender_id"):
        if getattr(args, name) < (0 if name in ("retries", "vgroup") else 1):
            raise CliError(f"--{name.replace('_', '-')} is out of range: {getattr(args, name)}", EXIT_USAGE)
    if args.period is not None and args.period <= 0:
        raise CliError("--period must be positive", EXIT_USAGE)
    if args.timeout <= 0:
        raise CliError("--timeout must be positive", EXIT_USAGE)
    if not os.path.isdir(args.data):
        raise CliError(f"--data {args.data}: not a directory", EXIT_USAGE)
    why = vnode_dir_refusal(args.data)  # before anything is written under <data>/ship/
    if why is not None:
        raise CliError(f"--data {why}", EXIT_USAGE)
    return SenderOptions(
        data=args.data,
        addresses=addresses,
        receiver=args.to.split(",")[0].strip(),
        sender_id=args.sender_id,
        secret=secret,
        vgroup=args.vgroup,
        uuid=args.uuid,
        resync=args.resync,
        file_retries=args.file_retries,
        io_timeout_s=args.timeout,
        bind=args.bind,
    )


class _Bar:
    """The rich progress bar of a round: files and bytes, with the rate."""

    def __init__(self, enabled: bool) -> None:
        self.progress = None
        if enabled and (sys.stderr.isatty() or os.environ.get("VREPL_FORCE_PROGRESS")):
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self.progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
        self.bytes_task: Any = None
        self.files_task: Any = None

    def __call__(self, kind: str, n: int) -> None:
        p = self.progress
        if p is None:
            return
        if kind == "total_bytes":
            if self.bytes_task is None:
                p.start()
                self.bytes_task = p.add_task("bytes", total=n)
            else:
                p.update(self.bytes_task, total=n, completed=0)
        elif kind == "total_files":
            if self.files_task is None:
                self.files_task = p.add_task("files", total=n)
            else:
                p.update(self.files_task, total=n, completed=0)
        elif kind == "file_bytes" and self.bytes_task is not None:
            p.advance(self.bytes_task, n)
        elif kind == "files" and self.files_task is not None:
            p.advance(self.files_task, n)

    def stop(self) -> None:
        if self.progress is not None and self.bytes_task is not None:
            self.progress.stop()
        self.bytes_task = self.files_task = None


def run_ship(args: argparse.Namespace) -> int:
    try:
        opt = _options(args)
    except CliError as exc:
        _err(str(exc))
        return exc.code
    sdir = SenderDir(opt.data, opt.receiver, opt.vgroup, fsync=opt.fsync)
    try:
        os.makedirs(sdir.path, exist_ok=True)
    except OSError as exc:
        _err(f"{sdir.path}: {exc.strerror}")
        return EXIT_USAGE
    try:
        lock = lock_dir(sdir.path, f"vrepl ship --to {opt.receiver}")
    except DirInUseError as exc:
        _err(f"another vrepl ship runs for {opt.data} and {opt.receiver}: {exc}")
        return EXIT_IN_USE
    stop = {"now": False}

    def on_term(signum: int, frame: Any) -> None:
        stop["now"] = True
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        return _loop(args, opt, stop)
    except KeyboardInterrupt:
        _err("interrupted: what the receiver confirmed is kept; the next round continues from there")
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, old)
        lock.release()


def _loop(args: argparse.Namespace, opt: SenderOptions, stop: dict[str, bool]) -> int:
    forever = args.period is not None or args.on_flush
    watcher = _FlushWatch(opt.data) if args.on_flush else None
    code = EXIT_OK
    while True:
        started = time.monotonic()
        code = _round_with_retries(args, opt)
        if not forever or stop["now"]:
            return code
        if code not in (EXIT_OK, EXIT_PEER):  # an operator must act first
            return code
        if watcher is not None:
            watcher.wait()
        else:
            time.sleep(max(0.0, args.period - (time.monotonic() - started)))


def _round_with_retries(args: argparse.Namespace, opt: SenderOptions) -> int:
    backoff = BACKOFF_FIRST_S
    attempt = 0
    while True:
        bar = _Bar(not args.no_progress)
        sender = Sender(opt, progress=bar)
        try:
            res = sender.run_round()
        except ShipError as exc:
            bar.stop()
            if exc.retry and attempt < args.retries:
                attempt += 1
                log.warning("ship: round failed (%s); retry %d of %d in %.1f s", exc, attempt, args.retries, backoff)
                print(
                    f"vrepl ship: round failed: {printable(str(exc))}; retry {attempt} of {args.retries}"
                    f" in {backoff:.1f} s",
                    file=sys.stderr,
                )
                time.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
                continue
            _err(str(exc))
            return exc.exit_code
        except ConfigError as exc:
            bar.stop()
            _err(str(exc))
            return EXIT_USAGE
        bar.stop()
        _summary(res, sender)
        return EXIT_OK


def _summary(res: RoundResult, sender: Sender) -> None:
    for note in res.repaired:
        print(f"vrepl ship: recovered: {note}", file=sys.stderr)
    who = f" (sender {sender.uuid})" if sender.uuid else ""  # no uuid yet: nothing archived
    print(f"vrepl ship: {res.describe()}{who}", flush=True)


class _FlushWatch:
    """Waits until the vnode's manifest changes (a flush archived files): inotify on the
    data directory where available, else a poll of the manifest's identity."""

    def __init__(self, data: str) -> None:
        self.dir = os.path.join(data, "data")
        self.path = os.path.join(self.dir, "manifest.json")
        self.ino: Any = None
        self.seen = self._ident()
        try:
            from inotify_simple import INotify, flags

            self.ino = INotify()
            self.ino.add_watch(self.dir, flags.MOVED_TO | flags.CLOSE_WRITE | flags.CREATE)
        except (ImportError, OSError):
            self.ino = None

    def _ident(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def wait(self) -> None:
        while True:
            now = self._ident()
            if now != self.seen:
                self.seen = now
                return
            if self.ino is not None:
                self.ino.read(timeout=int(ON_FLUSH_POLL_S * 1000))
            else:
                time.sleep(ON_FLUSH_POLL_S)


def run_owner(args: argparse.Namespace) -> int:
    try:
        host, port = parse_endpoint(args.node)
    except (ConfigError, ValueError) as exc:
        _err(f"--node {args.node!r}: {exc}")
        return EXIT_USAGE
    url = f"http://{host}:{port}/v1/vgroups/{args.vgroup}/ship/owners"
    headers = {"Content-Type": "application/json"}
    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as fh:
                headers["Authorization"] = "Bearer " + fh.read().strip()
        except OSError as exc:
            _err(f"{args.token_file}: {exc.strerror}")
            return EXIT_USAGE
    if args.table is None:
        if args.release or args.owner:
            _err("--release and --to need a table")
            return EXIT_USAGE
        req = urllib.request.Request(url, headers=headers)
    else:
        if not (args.release or args.owner):
            _err("give --release or --to UUID with a table")
            return EXIT_USAGE
        body = json.dumps({"table": args.table, "owner": None if args.release else args.owner}).encode()
        req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        # The node's answer is {"error": one-line reason, "code": ...} (docs/client-api.md).
        try:
            doc = json.loads(exc.read())
            reason = f"{doc['error']} ({doc.get('code', exc.code)})"
        except (ValueError, TypeError, KeyError, OSError):
            reason = f"HTTP {exc.code} {exc.reason}"
        _err(f"{args.node}: {reason}")
        return EXIT_USAGE if exc.code in (400, 404) else EXIT_PEER
    except urllib.error.URLError as exc:
        why = exc.reason
        _err(f"{args.node}: unreachable: {why.strerror if isinstance(why, OSError) and why.strerror else why}")
        return EXIT_PEER
    except (OSError, ValueError) as exc:
        _err(f"{args.node}: {exc}")
        return EXIT_PEER
    for table, owner in sorted(doc.get("owners", {}).items()):
        print(f"{printable(table)}\t{printable(owner) or '(released)'}")
    return EXIT_OK
