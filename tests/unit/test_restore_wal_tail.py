"""The last-WAL cases of the seed (数据恢复流程: LastWal), each a test: the sender tails a WAL
that a writer is still appending to, over a real TCP connection on 127.0.0.1, and the
receiver must get every record once, in order (vrepl/restore/sender.py _WalTail)."""
from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from vrepl._core import record as _rec
from vrepl.restore.receiver import Receiver
from vrepl.restore.sender import Sender, SenderOptions
from vrepl.restore.stream import SyncStream
from vrepl.wal import Durability, WalOptions, WalWriter, list_wal_files

pytestmark = pytest.mark.timeout(30)


def payload(v: int) -> bytes:
    return (b"%08d" % v) * 16  # 128 bytes


class Source:
    def __init__(self, wal_dir: str, target: int, writer: WalWriter) -> None:
        self.data_path = os.path.dirname(wal_dir)
        self.wal_dir = wal_dir
        self.max_record_bytes = 1 << 20
        self.target = target
        self.writer = writer

    def file_info(self, index):
        return None

    def begin(self):
        return 1, self.target

    def history_upto(self, v):
        return (1 if v else 0), (((1, 1),) if v else ())

    def switch_to_live(self):
        return self.target

    def last_version(self):
        return self.target

    def stop_reason(self):
        return None


class ListSink:
    def __init__(self, path: str) -> None:
        self.data_path = path
        self.versions: list[int] = []
        self.payloads: dict[int, bytes] = {}

    def on_begin(self, b): pass
    def own_file(self, i, n): return None
    def own_files(self): return []
    def files_synced(self): pass
    def wal_from_version(self): return 1
    def on_wal_begin(self, m): pass

    def feed(self, block, scan):
        for k in range(scan.count):
            rec = _rec.decode_record(block, int(scan.offsets[k]))
            self.versions.append(rec.version)
            self.payloads[rec.version] = rec.payload

    def on_wal_end(self, last):
        return self.versions[-1] if self.versions else 0


def run_session(tmp_path, writer: WalWriter, target: int, act, poll: bool = False) -> tuple[Sender, ListSink]:
    src = Source(writer.directory, target, writer)
    sender = Sender(src, SenderOptions(live=True, files=False, poll=poll, wal_wait_s=5))
    sink = ListSink(str(tmp_path))
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    errors: list[BaseException] = []

    def serve() -> None:
        conn = lst.accept()[0]
        try:
            sender.run(SyncStream(conn, io_timeout_s=10))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    w = threading.Thread(target=act, daemon=True)
    w.start()
    cli = socket.create_connection(lst.getsockname(), timeout=5)
    try:
        Receiver(sink).run(SyncStream(cli, io_timeout_s=10))
    finally:
        cli.close()
        lst.close()
        t.join(10)
        w.join(10)
        sender.close()
    assert not errors, errors
    assert sink.versions == list(range(1, target + 1))
    assert all(sink.payloads[v] == payload(v) for v in sink.versions)
    return sender, sink


def new_writer(tmp_path, max_file_bytes: int = 1 << 20) -> WalWriter:
    return WalWriter(str(tmp_path / "wal"), WalOptions(max_file_bytes=max_file_bytes, durability=Durability.NONE))


def append(writer: WalWriter, first: int, n: int) -> None:
    writer.append_batch([payload(v) for v in range(first, first + n)], 1)


@pytest.mark.parametrize("poll", [False, True], ids=["inotify", "polling"])
def test_last_wal_growing(tmp_path, poll):
    writer = new_writer(tmp_path)
    append(writer, 1, 100)

    def act() -> None:
        for k in range(10):
            time.sleep(0.02)
            append(writer, 101 + 10 * k, 10)

    sender, _ = run_session(tmp_path, writer, 200, act, poll=poll)
    assert "last WAL growing" in sender.stats.events


def test_last_wal_open_but_empty(tmp_path):
    writer = new_writer(tmp_path)
    assert [f.size for f in list_wal_files(writer.directory)] == [0]

    def act() -> None:
        time.sleep(0.15)
        append(writer, 1, 50)

    sender, _ = run_session(tmp_path, writer, 50, act)
    assert "last WAL open but empty" in sender.stats.events


def test_last_wal_closed_and_replaced_by_a_new_file(tmp_path):
    writer = new_writer(tmp_path, max_file_bytes=4 * 1024)  # ~25 records per file
    append(writer, 1, 20)

    def act() -> None:
        for k in range(10):
            time.sleep(0.02)
            append(writer, 21 + 10 * k, 10)  # each append may rotate: the tailed file is sealed

    sender, _ = run_session(tmp_path, writer, 120, act)
    assert len(list_wal_files(writer.directory)) > 3
    assert "last WAL closed and replaced" in sender.stats.events


def test_last_wal_partial_record_at_the_end(tmp_path):
    writer = new_writer(tmp_path)
    append(writer, 1, 10)
    writer.close()
    rec = _rec.encode_record(1, 11, 1, payload(11))
    last = list_wal_files(writer.directory)[-1].path
    with open(last, "ab") as fh:
        fh.write(rec[:50])  # the header and part of the payload: a write in progress

    def act() -> None:
        time.sleep(0.15)
        with open(last, "ab") as fh:
            fh.write(rec[50:])

    sender, _ = run_session(tmp_path, writer, 11, act)
    assert "partial record at the end" in sender.stats.events


def test_last_wal_records_not_yet_readable(tmp_path):
    writer = new_writer(tmp_path)
    append(writer, 1, 20)

    def act() -> None:
        time.sleep(0.2)  # the master's log says v40; the WAL thread has written only v20
        append(writer, 21, 20)

    sender, _ = run_session(tmp_path, writer, 40, act)
    assert "records not yet readable" in sender.stats.events


def test_records_never_readable_fail_after_wal_wait(tmp_path):
    writer = new_writer(tmp_path)
    append(writer, 1, 5)
    src = Source(writer.directory, 9, writer)
    sender = Sender(src, SenderOptions(live=True, files=False, wal_wait_s=0.3))
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    errors: list[BaseException] = []

    def serve() -> None:
        conn = lst.accept()[0]
        try:
            sender.run(SyncStream(conn, io_timeout_s=5))
        except BaseException as exc:
            errors.append(exc)
        finally:
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    cli = socket.create_connection(lst.getsockname(), timeout=5)
    with pytest.raises(Exception):
        Receiver(ListSink(str(tmp_path))).run(SyncStream(cli, io_timeout_s=5))
    cli.close()
    t.join(5)
    lst.close()
    assert errors and "did not appear in the WAL" in str(errors[0])
