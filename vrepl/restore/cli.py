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

Exit codes: 0 done, 1 the data is corrupt or inconsistent (a gap, a bad file), 2 usage
(bad argument, missing directory, no secret), 3 interrupted, 4 the peer is unreachable,
refused the connection or broke off, 5 a hostile file name was refused, 6 disk full (the
previous data is intact), 7 the source kept changing (retries exhausted).
Must not: touch the data directory before the transfer is verified (the receiver stages).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

EXIT_OK = 0
EXIT_CORRUPT = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 3
EXIT_PEER = 4
EXIT_UNSAFE = 5
EXIT_DISK_FULL = 6
EXIT_CHANGING = 7

SECRET_ENV = "VREPL_SECRET"


def _err(message: str) -> None:
    print(f"vrepl: error: {message}", file=sys.stderr)


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
    from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeRemainingColumn, TransferSpeedColumn)
    amount = MofNCompleteColumn() if counts else DownloadColumn()
    speed = TextColumn("") if counts else TransferSpeedColumn()
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), amount, speed, TimeRemainingColumn(),
                    console=Console(stderr=True), transient=False)


def _read_secret(args: argparse.Namespace) -> bytes:
    if args.secret_file:
        try:
            with open(args.secret_file, "rb") as fh:
                secret = fh.read().strip()
        except OSError as exc:
            raise _Fail(f"{args.secret_file}: {exc.strerror}", EXIT_USAGE) from None
    else:
        secret = os.environ.get(SECRET_ENV, "").encode()
    if not secret:
        raise _Fail(f"no cluster secret: pass --secret-file or set ${SECRET_ENV}", EXIT_USAGE)
    return secret


class _Fail(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------------------------
# restore


def restore_once(host: str, port: int, *, vgroup: int, data: str, secret: bytes, timeout_s: float = 30.0,
                 progress: Any = None, sink: Any = None) -> Any:
    """One restore session into `data` (through `sink`, a DirSink of `data` by default; a node
    restoring itself passes its own, vrepl/node/selfrestore.py); returns the Receiver (stats)
    or raises RestoreError."""
    from vrepl.restore.dirsink import DirSink
    from vrepl.restore.receiver import Receiver
    from vrepl.restore.stream import connect_sync
    from vrepl.transport.codec import RESTORE_TOOL_NODE_ID, ConnKind

    stream = connect_sync(host, port, secret=secret, kind=ConnKind.BACKUP, vgroup_id=vgroup,
                          node=RESTORE_TOOL_NODE_ID, target_node=None, timeout_s=min(timeout_s, 10.0),
                          io_timeout_s=timeout_s)
    try:
        receiver = Receiver(sink or DirSink(data), progress=progress, name=f"restore vg{vgroup} from {host}:{port}")
        try:
            receiver.run(stream)
        except Exception as exc:
            from vrepl.restore.errors import PeerError
            if not isinstance(exc, PeerError):
                stream.send_error(str(exc))
            raise
        return receiver
    finally:
        stream.close()


def run_restore(args: argparse.Namespace) -> int:
    from vrepl.config import parse_endpoint
    from vrepl.errors import ConfigError
    from vrepl.restore.errors import DiskFull, FilesChanged, PeerError, RestoreError, UnsafeName
    from vrepl.restore.receiver import recover_interrupted_swap

    try:
        try:
            host, port = parse_endpoint(args.source)
        except ConfigError as exc:
            raise _Fail(str(exc), EXIT_USAGE) from None
        secret = _read_secret(args)
        data = os.path.abspath(args.data)
        if os.path.exists(data) and not os.path.isdir(data):
            raise _Fail(f"{data}: not a directory", EXIT_USAGE)
        os.makedirs(data, exist_ok=True)
        recovered = recover_interrupted_swap(data)
        if recovered:
            print(f"vrepl: {recovered}", file=sys.stderr)
        prog = _progress(not args.no_progress)
        attempt = 0
        last_exc: Exception | None = None
        while attempt <= args.retries:
            attempt += 1
            bar = prog
            tasks: dict[str, Any] = {}

            def progress(kind: str, n: int) -> None:
                if bar is None:
                    return
                if kind == "total_files":
                    tasks["files"] = bar.add_task(f"files 0/{n}", total=n)
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
            except (FilesChanged, PeerError) as exc:
                if bar is not None:
                    bar.stop()
                last_exc = exc
                if not exc.restart:
                    break
                print(f"vrepl: restore attempt {attempt} stopped: {exc}; resuming", file=sys.stderr)
                time.sleep(min(0.2 * attempt, 2.0))
            except RestoreError as exc:
                if bar is not None:
                    bar.stop()
                last_exc = exc
                if not exc.restart:
                    break
                print(f"vrepl: restore attempt {attempt} stopped: {exc}; resuming", file=sys.stderr)
                time.sleep(min(0.2 * attempt, 2.0))
        assert last_exc is not None
        if isinstance(last_exc, UnsafeName):
            raise _Fail(str(last_exc), EXIT_UNSAFE)
        if isinstance(last_exc, DiskFull):
            raise _Fail(str(last_exc), EXIT_DISK_FULL)
        if isinstance(last_exc, FilesChanged):
            raise _Fail(f"the source kept changing ({args.retries + 1} attempts): {last_exc}", EXIT_CHANGING)
        if isinstance(last_exc, PeerError):
            raise _Fail(str(last_exc), EXIT_PEER)
        raise _Fail(str(last_exc), EXIT_CORRUPT)
    except _Fail as exc:
        _err(str(exc))
        return exc.code
    except KeyboardInterrupt:
        _err("interrupted; run the same command again to resume")
        return EXIT_INTERRUPTED
    except OSError as exc:
        _err(f"{getattr(exc, 'filename', '') or ''} {exc.strerror or exc}".strip())
        return EXIT_CORRUPT


# ---------------------------------------------------------------------------------------------
# replay


def run_replay(args: argparse.Namespace) -> int:
    from vrepl import wal as _wal
    from vrepl.errors import VreplError
    from vrepl.vnode import Vnode

    try:
        if not os.path.isdir(args.wal):
            raise _Fail(f"{args.wal}: no such WAL directory", EXIT_USAGE)
        if args.to_version < 0:
            raise _Fail("--to-version must be >= 0", EXIT_USAGE)
        try:
            state = _wal.inspect(args.wal)
        except _wal.WalError as exc:
            raise _Fail(str(exc), EXIT_CORRUPT) from None
        vnode = Vnode(args.data)
        start = vnode.get_version() + 1
        end = state.last_version if not args.to_version else min(args.to_version, state.last_version)
        if args.to_version and args.to_version > state.last_version:
            raise _Fail(f"--to-version {args.to_version} is beyond the WAL's last version {state.last_version}",
                        EXIT_USAGE)
        if end < start - 1:
            raise _Fail(f"{args.data} already holds v{start - 1}, beyond v{end}: replay cannot go back"
                        " (restore a copy, then replay to the wanted version)", EXIT_USAGE)
        bar = _progress(not args.no_progress, counts=True)
        task = None
        if bar is not None:
            bar.start()
            task = bar.add_task("replay", total=max(end - start + 1, 0))
        applied = 0
        rows_since = 0
        t0 = time.monotonic()
        try:
            reader = _wal.WalReader(args.wal, vnode.config.max_payload_bytes)
            first = True
            for rec in reader.iter_records(start) if end >= start else ():
                if rec.version > end:
                    break
                if first and rec.version != start:
                    raise _Fail(f"{args.wal}: the WAL resumes at v{rec.version} but {args.data} holds versions"
                                f" up to v{start - 1}: v{start}..v{rec.version - 1} are missing", EXIT_CORRUPT)
                first = False
                vnode.write_to_cache(rec.version, rec.epoch, rec.payload, rec.msg_type)
                applied += 1
                rows_since += 1
                if bar is not None and applied % 1000 == 0:
                    bar.update(task, completed=applied)
                if rows_since >= args.flush_rows or vnode.flush_due() is not None:
                    vnode.flush()
                    rows_since = 0
            vnode.flush()
        finally:
            if bar is not None:
                bar.update(task, completed=applied)
                bar.stop()
            vnode.close()
        if vnode.archived_version < end:
            raise _Fail(f"replayed up to v{vnode.archived_version}, expected v{end}: the WAL ended early", EXIT_CORRUPT)
        print(f"replayed v{start}..v{end} ({applied} records) from {args.wal} into {args.data} in"
              f" {time.monotonic() - t0:.2f} s; archived version v{vnode.archived_version}")
        return EXIT_OK
    except _Fail as exc:
        _err(str(exc))
        return exc.code
    except KeyboardInterrupt:
        _err("interrupted; replay again to continue from the archived version")
        return EXIT_INTERRUPTED
    except (VreplError, OSError) as exc:
        _err(str(exc))
        return EXIT_CORRUPT


def main(argv: list[str] | None = None) -> int:
    """`python -m vrepl.restore restore|replay ...` (the same commands as `vrepl`)."""
    parser = argparse.ArgumentParser(prog="python -m vrepl.restore")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_parsers(sub)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.func(args)
