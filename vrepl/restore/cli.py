"""`vrepl restore` and `vrepl replay` (docs/restore.md §CLI).

Owns: the two commands' parsers (`add_parsers(subparsers)`, registered by vrepl/cli.py),
`run_restore(args)` and `run_replay(args)`, their progress bars (rich) and exit codes. Each
failure is one line on stderr and a documented exit code; never a traceback.

    vrepl restore --from HOST:PORT --vgroup N --data DIR [--secret-file F] [--retries N]
        pull a complete copy of a replica (archived files + WAL) into an empty or stale
        directory; interrupted, it resumes (identical and already staged files are skipped)
    vrepl replay --wal DIR --data DIR [--to-version N]
        rebuild a vnode's archived data by replaying a WAL into it (after a crash, or to a
        point in time), flushing as it goes

Exit codes (vrepl/exitcodes.py, docs/operations.md §Exit codes): 0 done, 1 the data is corrupt or inconsistent (bad data
from the sender, a gap, a bad file, a file above max_file_bytes), 2 usage (bad argument,
missing directory, no secret, a WAL file that is not a regular file), 3 interrupted, 4 the
peer is unreachable, refused the connection or broke off, 5 a hostile file name was refused,
6 not enough disk space (the previous data is intact), 7 the source kept changing (retries
exhausted), 8 the data directory is in use by another process (vrepl/dirlock.py; nothing was
read or written). Text from the peer is escaped before it is printed (vrepl/untrusted.py).
Must not: touch the data directory before the transfer is verified (the receiver stages).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

from vrepl import wal as _wal
from vrepl.argparsing import OneLineArgumentParser
from vrepl.endpoint import parse_endpoint
from vrepl.dirlock import lock_dir
from vrepl.errors import (CliError, ConfigError, DirInUseError, FilesChanged, PeerError,
                          RestoreError, VreplError, WalCorruptError)
from vrepl.exitcodes import EXIT_FAILED, EXIT_IN_USE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from vrepl.restore.dirsink import DirSink
from vrepl.restore.receiver import Receiver, recover_interrupted_swap
from vrepl.restore.stream import connect_sync
from vrepl.secretfile import read_secret
from vrepl.transport.codec import RESTORE_TOOL_NODE_ID, ConnKind
from vrepl.untrusted import printable
from vrepl.vnode import Vnode

SECRET_ENV = "VREPL_SECRET"


def _err(message: str) -> None:
    # Messages may carry a peer's text (an ERROR reason): one line, escaped (vrepl/untrusted.py).
    print(f"vrepl: error: {printable(message)}", file=sys.stderr)


def _failure_text(exc: Exception, attempts: int) -> str:
    if isinstance(exc, FilesChanged):
        return f"the source kept changing ({attempts} attempts): {exc}"
    return str(exc)


def add_parsers(sub: Any) -> None:
    """Register `restore` and `replay` on the `vrepl` subparsers."""
    r = sub.add_parser("restore", help="pull a complete replica (files + WAL) from a node into a directory")
    r.add_argument("--from", dest="source", required=True, metavar="HOST:PORT", help="a node of the vgroup")
    r.add_argument("--vgroup", type=int, required=True, metavar="N", help="vgroup id")
    r.add_argument("--data", required=True, metavar="DIR", help="data directory to fill (empty or stale)")
    r.add_argument("--secret-file", metavar="FILE",
                   help=f"file holding the cluster secret (default: ${SECRET_ENV})")
    r.add_argument("--retries", type=int, default=5, metavar="N",
                   help="restart this many times when the source changes or the connection drops (default 5)")
    r.add_argument("--timeout", type=float, default=30.0, metavar="S", help="I/O timeout in seconds (default 30)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.set_defaults(func=run_restore)

    p = sub.add_parser("replay", help="rebuild a vnode's archived data by replaying a WAL")
    p.add_argument("--wal", required=True, metavar="DIR", help="WAL directory to read")
    p.add_argument("--data", required=True, metavar="DIR", help="vnode data directory to rebuild")
    p.add_argument("--to-version", type=int, default=0, metavar="N", help="stop after version N (default: all)")
    p.add_argument("--flush-rows", type=int, default=1_000_000, metavar="N",
                   help="flush the memtable every N rows (default 1000000)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_replay)


def _progress(enabled: bool, counts: bool = False):
    """A rich progress bar on stderr (bytes, or counts), or None when not wanted / not a tty."""
    if not enabled or (not sys.stderr.isatty() and not os.environ.get("VREPL_FORCE_PROGRESS")):
        return None
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, ProgressColumn,
                               TextColumn, TimeRemainingColumn, TransferSpeedColumn)

    class Amount(ProgressColumn):
        """M/N for a task added with `count=True` (the restore's files), bytes otherwise."""

        def __init__(self) -> None:
            super().__init__()
            self.of_count, self.of_bytes = MofNCompleteColumn(), DownloadColumn()

        def render(self, task: Any) -> Any:
            return (self.of_count if task.fields.get("count") else self.of_bytes).render(task)

    class Speed(TransferSpeedColumn):
        def render(self, task: Any) -> Any:
            return "" if task.fields.get("count") else super().render(task)

    amount = MofNCompleteColumn() if counts else Amount()
    speed = TextColumn("") if counts else Speed()
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), amount, speed, TimeRemainingColumn(),
                    console=Console(stderr=True), transient=False)


def _read_secret(args: argparse.Namespace) -> bytes:
    return read_secret(args.secret_file, SECRET_ENV, "cluster secret")


def _lock_data(data: str, holder: str) -> Any:
    """The --data directory's lock (one process per data directory), or CliError(EXIT_IN_USE).
    Taken here, at the command's entry, never by the restore code a node also runs."""
    try:
        return lock_dir(data, holder)
    except DirInUseError as exc:
        raise CliError(str(exc), EXIT_IN_USE) from None


# ---------------------------------------------------------------------------------------------
# restore


def restore_once(host: str, port: int, *, vgroup: int, data: str, secret: bytes, timeout_s: float = 30.0,
                 progress: Any = None, sink: Any = None) -> Any:
    """One restore session into `data` (through `sink`, a DirSink of `data` by default; a node
    restoring itself passes its own, vrepl/node/selfrestore.py); returns the Receiver (stats)
    or raises RestoreError."""

    stream = connect_sync(host, port, secret=secret, kind=ConnKind.BACKUP, vgroup_id=vgroup,
                          node=RESTORE_TOOL_NODE_ID, target_node=None, timeout_s=min(timeout_s, 10.0),
                          io_timeout_s=timeout_s)
    try:
        receiver = Receiver(sink or DirSink(data), progress=progress, name=f"restore vg{vgroup} from {host}:{port}")
        try:
            receiver.run(stream)
        except Exception as exc:
            if not isinstance(exc, (PeerError, FilesChanged)):  # both came from the peer: it has stopped
                stream.send_error(str(exc))
            raise
        return receiver
    finally:
        stream.close()


def run_restore(args: argparse.Namespace) -> int:
    lock = None
    try:
        try:
            host, port = parse_endpoint(args.source)
        except ConfigError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
        if args.retries < 0:
            raise CliError(f"--retries must be >= 0, got {args.retries}", EXIT_USAGE)
        if not args.timeout > 0:  # a socket timeout of 0 is non-blocking, a negative one a ValueError
            raise CliError(f"--timeout must be > 0, got {args.timeout:g}", EXIT_USAGE)
        secret = _read_secret(args)
        data = os.path.abspath(args.data)
        if os.path.exists(data) and not os.path.isdir(data):
            raise CliError(f"{data}: not a directory", EXIT_USAGE)
        os.makedirs(data, exist_ok=True)
        lock = _lock_data(data, "vrepl restore")
        recovered = recover_interrupted_swap(data)
        if recovered:
            print(f"vrepl: {recovered}", file=sys.stderr)
        prog = _progress(not args.no_progress)
        attempt = 0
        while True:
            attempt += 1
            bar = prog
            tasks: dict[str, Any] = {}

            def progress(kind: str, n: int) -> None:
                if bar is None:
                    return
                if kind == "total_files":
                    tasks["files"] = bar.add_task(f"files 0/{n}", total=n, count=True)
                    tasks["nfiles"], tasks["done"] = n, 0
                elif kind == "total_bytes":
                    tasks["bytes"] = bar.add_task("file bytes", total=n)
                    tasks["wal"] = bar.add_task("WAL bytes", total=None)
                elif kind == "files" and "files" in tasks:
                    tasks["done"] += n
                    bar.update(tasks["files"], advance=n, description=f"files {tasks['done']}/{tasks['nfiles']}")
                elif kind == "file_bytes" and "bytes" in tasks:
                    bar.advance(tasks["bytes"], n)
                elif kind == "wal_bytes" and "wal" in tasks:
                    bar.advance(tasks["wal"], n)

            try:
                if bar is not None:
                    bar.start()
                receiver = restore_once(host, port, vgroup=args.vgroup, data=data, secret=secret,
                                        timeout_s=args.timeout, progress=progress)
                st = receiver.stats
                if bar is not None:
                    bar.stop()
                b = receiver.begin
                print(f"restored vg{args.vgroup} from {args.source} into {data}: {st.files_checked} files"
                      f" ({st.files_received} received, {st.file_bytes_received} bytes; {st.files_same} same,"
                      f" {st.files_resumed} resumed, {st.files_removed} removed), WAL v{st.from_version}..v{st.last_version}"
                      f" ({st.wal_records_received} records); source log end v{b.last_version if b else '?'}")
                return EXIT_OK
            except RestoreError as exc:
                if bar is not None:
                    bar.stop()
                # The last attempt (or one no retry can help) ends with the one error line
                # below and nothing before it: "resuming" only when a retry follows.
                if not exc.restart or attempt > args.retries:
                    raise CliError(_failure_text(exc, attempt), exc.exit_code) from None
                print(f"vrepl: restore attempt {attempt} stopped: {printable(exc)}; resuming", file=sys.stderr)
                time.sleep(min(0.2 * attempt, 2.0))
    except CliError as exc:
        _err(str(exc))
        return exc.code
    except KeyboardInterrupt:
        _err("interrupted; run the same command again to resume")
        return EXIT_INTERRUPTED
    except OSError as exc:
        _err(f"{getattr(exc, 'filename', '') or ''} {exc.strerror or exc}".strip())
        return EXIT_FAILED
    finally:
        if lock is not None:
            lock.release()


# ---------------------------------------------------------------------------------------------
# replay


def run_replay(args: argparse.Namespace) -> int:
    lock = None
    try:
        if not os.path.isdir(args.wal):
            raise CliError(f"{args.wal}: no such WAL directory", EXIT_USAGE)
        if args.to_version < 0:
            raise CliError("--to-version must be >= 0", EXIT_USAGE)
        if args.flush_rows < 1:
            raise CliError(f"--flush-rows must be >= 1, got {args.flush_rows}", EXIT_USAGE)
        if os.path.exists(args.data) and not os.path.isdir(args.data):
            raise CliError(f"{args.data}: not a directory", EXIT_USAGE)
        lock = _lock_data(args.data, "vrepl replay")
        # docs/restore.md §8: a torn last record (a crash mid-write) is left out with a
        # warning; other corruption is refused unless --to-version stops before it.
        torn = None
        try:
            state = _wal.inspect(args.wal)
            if not state.files:  # most likely the wrong directory (the vgroup's, not its wal/)
                raise CliError(f"{args.wal}: no WAL file found (no NNNNNNNNNNNN.wal)", EXIT_USAGE)
            last_good, torn = state.last_version, state.torn_tail
            # inspect() trusts a sealed file's index; every byte up to the last version to
            # replay is verified before anything is written (a bad record in a sealed file
            # is refused here, not found halfway through the replay).
            _wal.inspect(args.wal, verify_all=True, through_version=args.to_version or last_good)
        except WalCorruptError as exc:
            last_good = exc.last_good_version
            if not args.to_version or args.to_version > last_good:
                hint = f"; 'vrepl replay --to-version {last_good}' rebuilds the good prefix" if last_good else ""
                raise CliError(f"{exc}{hint}", EXIT_FAILED) from None
        except _wal.WalError as exc:  # not a WAL directory, a WAL file that is not a regular file
            raise CliError(str(exc), EXIT_USAGE) from None
        if args.to_version and args.to_version > last_good:
            after = f" (it ends in a torn record after v{last_good})" if torn is not None else ""
            raise CliError(f"--to-version {args.to_version} is beyond the WAL's last version {last_good}{after}",
                        EXIT_USAGE)
        vnode = Vnode(args.data)
        start = vnode.get_version() + 1
        end = args.to_version or last_good
        if end < start - 1:
            vnode.close()
            raise CliError(f"{args.data} already holds v{start - 1}, beyond v{end}: replay cannot go back"
                        " (restore a copy, then replay to the wanted version)", EXIT_USAGE)
        bar = _progress(not args.no_progress, counts=True)
        task = None
        if bar is not None:
            bar.start()
            task = bar.add_task("replay", total=max(end - start + 1, 0))
        applied = 0
        last_applied = start - 1
        rows_since = 0
        t0 = time.monotonic()
        try:
            reader = _wal.WalReader(args.wal, vnode.config.max_payload_bytes)
            first = True
            for rec in reader.iter_records(start) if end >= start else ():
                if first and rec.version != start:  # a gap, also when it begins after `end`
                    raise CliError(f"{args.wal}: the WAL resumes at v{rec.version} but {args.data} holds versions"
                                f" up to v{start - 1}: v{start}..v{rec.version - 1} are missing", EXIT_FAILED)
                first = False
                if rec.version > end:
                    break
                vnode.write_to_cache(rec.version, rec.epoch, rec.payload, rec.msg_type)
                applied += 1
                last_applied = rec.version
                rows_since += 1
                if bar is not None and applied % 1000 == 0:
                    bar.update(task, completed=applied)
                if rows_since >= args.flush_rows or vnode.flush_due() is not None:
                    vnode.flush()
                    rows_since = 0
                if rec.version == end:
                    break  # never read past it: the WAL may be corrupt after `end`
            vnode.flush()
        finally:
            if bar is not None:
                bar.update(task, completed=applied)
                bar.stop()
            vnode.close()
        # What was applied, not what was archived: a flush with no rows in the memtable
        # writes nothing, so no-op records (the first version of every mastership) applied
        # since the last flush leave archived_version below them (docs/restore.md §8).
        if last_applied < end:
            raise CliError(f"replayed up to v{last_applied}, expected v{end}: the WAL ended early", EXIT_FAILED)
        if torn is not None and end == last_good:
            print(f"vrepl: warning: {torn.describe()}: that record was not replayed ('vrepl wal repair"
                  f" {args.wal}' truncates it)", file=sys.stderr)
        print(f"replayed v{start}..v{end} ({applied} records) from {args.wal} into {args.data} in"
              f" {time.monotonic() - t0:.2f} s; archived version v{vnode.archived_version}")
        return EXIT_OK
    except CliError as exc:
        _err(str(exc))
        return exc.code
    except KeyboardInterrupt:
        _err("interrupted; replay again to continue from the archived version")
        return EXIT_INTERRUPTED
    except (VreplError, OSError) as exc:
        _err(str(exc))
        return EXIT_FAILED
    finally:
        if lock is not None:
            lock.release()


def build_parser() -> argparse.ArgumentParser:
    """The parser of `python -m vrepl.restore` (restore and replay, as in `vrepl`)."""
    parser = OneLineArgumentParser(prog="python -m vrepl.restore",
                                     description="vrepl restore and replay (docs/restore.md §8)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log the restore's steps to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """`python -m vrepl.restore restore|replay ...` (the same commands as `vrepl`)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.func(args)
