"""`vrepl restore` against a hostile sender (issue 14, Deliver 9; docs/restore.md §6, §8).

The sender is a fake node in this process that speaks the real protocol (the HELLO /
CHALLENGE / AUTH / WELCOME handshake of vrepl/transport/handshake.py, then sync frames) over
a real loopback socket; the tool is the real CLI, run as a subprocess. Each refusal is one
line on stderr with the exit code docs/restore.md §8 gives, text from the peer escaped, and
nothing of the previous data lost.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest

from vrepl._core import crc32c as _crc
from vrepl._core import record as _rec
from vrepl.restore import protocol as P
from vrepl.restore.stream import SyncStream
from vrepl.transport import codec
from vrepl.transport.handshake import ServerHandshake

pytestmark = pytest.mark.timeout(60)

SECRET = b"hostile-test-secret"


class HostileSender:
    """Accepts `vrepl restore` connections on 127.0.0.1, authenticates them like a node, then
    runs `script(stream)` for each; stops by itself when the test ends."""

    def __init__(self, script) -> None:
        self.script = script
        self.sessions = 0
        self.errors: list[str] = []  # ERROR reasons the tool sent back
        self.lst = socket.create_server(("127.0.0.1", 0))
        self.lst.settimeout(0.2)
        self.port = self.lst.getsockname()[1]
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.lst.accept()
            except socket.timeout:
                continue
            self.sessions += 1
            s = SyncStream(conn, io_timeout_s=10)
            try:
                hs = ServerHandshake(SECRET, 1, lambda hello: None)
                while not hs.done:
                    out = hs.on_message(codec.decode(s.recv_record(4096)))
                    if out:
                        s.send_bytes(out)
                self.script(s)
                try:  # what the tool says back before it closes
                    s.recv()
                except Exception as exc:
                    self.errors.append(str(exc))
            except Exception as exc:
                self.errors.append(f"sender: {exc}")
            finally:
                s.close()

    def close(self) -> None:
        self._stop.set()
        self._t.join(5)
        self.lst.close()


@pytest.fixture
def hostile():
    senders = []

    def make(script) -> HostileSender:
        senders.append(HostileSender(script))
        return senders[-1]

    yield make
    for s in senders:
        s.close()


def restore(port: int, data, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, VREPL_SECRET=SECRET.decode())
    return subprocess.run([sys.executable, "-m", "vrepl.restore", "restore", "--from", f"127.0.0.1:{port}",
                           "--vgroup", "1", "--data", str(data), "--no-progress", "--timeout", "10", *extra],
                          capture_output=True, text=True, env=env, timeout=50)


def one_line(out: subprocess.CompletedProcess) -> str:
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("vrepl: error: ")
    return lines[0]


def wal_phase(s: SyncStream, data: bytes) -> None:
    """No files; the WAL from v1: `data` as the WAL bytes."""
    s.send(P.SyncBegin(1, 10, 0, 0, 0, 0))
    req = s.recv()
    assert type(req) is P.WalRequest
    s.send(P.WalBegin(req.from_version, 0, ()))
    s.send(P.WalData(len(data)))
    s.send_bytes(data)
    s.send(P.WalEnd(10))


@pytest.fixture
def old_data(tmp_path):
    d = tmp_path / "d"
    (d / "data").mkdir(parents=True)
    (d / "data" / "old.bin").write_bytes(b"old data")
    return d


def assert_old_data_intact(d) -> None:
    assert (d / "data" / "old.bin").read_bytes() == b"old data"
    assert not (d / "wal").exists()


def test_bad_wal_data_is_exit_1_not_a_peer_error(hostile, old_data):
    good = _rec.encode_record(1, 1, 1, b"one")
    bad = bytearray(_rec.encode_record(1, 2, 1, b"two"))
    bad[-1] ^= 0xFF  # payload checksum
    sender = hostile(lambda s: wal_phase(s, good + bytes(bad)))
    out = restore(sender.port, old_data, "--retries", "0")
    assert out.returncode == 1, out.stderr
    assert "bad WAL data from the sender" in one_line(out)
    assert sender.sessions == 1 and any("bad WAL data" in e for e in sender.errors)
    assert_old_data_intact(old_data)


def test_epochs_going_back_in_the_wal_stream_is_exit_1(hostile, old_data):
    recs = _rec.encode_record(1, 1, 2, b"one") + _rec.encode_record(1, 2, 1, b"two")
    sender = hostile(lambda s: wal_phase(s, recs))
    out = restore(sender.port, old_data, "--retries", "0")
    assert out.returncode == 1, out.stderr
    assert "bad WAL data from the sender" in one_line(out)


def test_retries_0_prints_only_the_error_and_retries_n_say_resuming(hostile, old_data):
    def drop(s: SyncStream) -> None:
        s.send(P.SyncBegin(1, 10, 0, 0, 0, 0))
        s.close()

    sender = hostile(drop)
    out = restore(sender.port, old_data, "--retries", "0")
    assert out.returncode == 4
    assert "closed by the other side" in one_line(out)
    out = restore(sender.port, old_data, "--retries", "2")
    assert out.returncode == 4
    lines = out.stderr.splitlines()
    assert [ln.endswith("; resuming") for ln in lines] == [True, True, False], out.stderr
    assert lines[-1].startswith("vrepl: error: ")
    assert sender.sessions == 4


def test_peer_error_reason_cannot_forge_lines_or_escapes(hostile, old_data):
    forged = "boom\nvrepl: error: forged line\r\x1b[2K\x1b[31mred\x07\u202etxt.exe"

    def refuse(s: SyncStream) -> None:
        s.send(P.SyncBegin(1, 10, 0, 0, 0, 0))
        s.recv()
        s.send(P.Error(forged))

    sender = hostile(refuse)
    out = restore(sender.port, old_data, "--retries", "0")
    assert out.returncode == 4
    line = one_line(out)
    assert "\x1b" not in out.stderr and "\r" not in out.stderr and "\x07" not in out.stderr
    assert "\u202e" not in out.stderr
    assert "boom\\nvrepl: error: forged line\\r\\x1b[2K\\x1b[31mred\\x07\\u202etxt.exe" in line
    assert out.stdout == ""


@pytest.mark.parametrize("name", ["data/a\nb", "data/\x1b[31mred", "data/bell\x07", "data/x\u2028y",
                                  "data/rtl\u202egpj.exe", "data/tab\tname"])
def test_control_characters_in_a_name_are_refused(hostile, old_data, name):
    def send_name(s: SyncStream) -> None:
        s.send(P.SyncBegin(1, 10, P.FLAG_FILES, 1, 3, 0))
        s.send(P.FileInfo(0, 3, _crc.crc32c(b"bad") or 1, name))
        try:
            s.recv()
            s.send(P.FileData(0, 3))
            s.send_bytes(b"bad")
        except Exception:
            pass

    sender = hostile(send_name)
    out = restore(sender.port, old_data, "--retries", "3")
    assert out.returncode == 5, out.stderr
    line = one_line(out)
    assert "non-printable character" in line
    assert not any(ch in out.stderr for ch in "\x1b\x07\u2028\u202e\t")
    assert sender.sessions == 1, "a refused name is not retried"
    assert_old_data_intact(old_data)
    staged = old_data / ".vrepl-restore" / "files" / "data"
    assert not staged.exists() or os.listdir(staged) == []


def announce(size: int):
    def script(s: SyncStream) -> None:
        s.send(P.SyncBegin(1, 10, P.FLAG_FILES, 1, size, 0))
        s.send(P.FileInfo(0, size, 12345, "data/huge.bin"))
        if type(s.recv()) is P.FileAck:
            s.send(P.FileData(0, size))
            s.send_bytes(b"x" * 4096)  # then nothing: the tool must not wait for 10^12 bytes
    return script


def test_a_size_above_the_free_space_says_needs_n_bytes_m_free(hostile, old_data):
    st = os.statvfs(old_data)
    free = st.f_bavail * st.f_frsize
    size = 10 ** 12
    if free >= size:
        pytest.skip(f"{free} bytes free under {old_data}: the announced 10^12 bytes would fit")
    sender = hostile(announce(size))
    out = restore(sender.port, old_data, "--retries", "2")
    assert out.returncode == 6, out.stderr
    line = one_line(out)
    assert f"not enough disk space for data/huge.bin: it needs {size} bytes," in line
    assert "are free under" in line and "the previous data is intact" in line
    assert "no space left" not in line
    assert sender.sessions == 1
    assert_old_data_intact(old_data)


def test_a_size_above_max_file_bytes_is_refused_as_bad_data(hostile, old_data):
    size = (1 << 40) + 1  # max_file_bytes (1 TiB) + 1
    sender = hostile(announce(size))
    out = restore(sender.port, old_data, "--retries", "2")
    assert out.returncode == 1, out.stderr
    assert f"the sender announces {size} bytes, above max_file_bytes {1 << 40}" in one_line(out)
    assert sender.sessions == 1
    assert_old_data_intact(old_data)


def test_negative_retries_is_a_usage_error(old_data):
    out = restore(1, old_data, "--retries", "-1")
    assert out.returncode == 2
    assert one_line(out) == "vrepl: error: --retries must be >= 0, got -1"
