"""vrepl/directio.py: SequentialWriter writes exactly the bytes given, from any start, with
O_DIRECT where the file system takes it and ordinary writes where not."""
from __future__ import annotations

import errno
import fcntl
import os
import random

import pytest

from vrepl.directio import DIRECT_BLOCK_BYTES, SequentialWriter, drop_cached
from vrepl.testing.pagecache import page_cache_drops, resident_pages


def _write(path: str, data: bytes, start: int, pieces: list[int], **kw) -> SequentialWriter:
    with open(path, "wb") as fh:
        fh.write(data[:start])
    fd = os.open(path, os.O_RDWR)
    try:
        os.lseek(fd, start, os.SEEK_SET)
        w = SequentialWriter(fd, start, **kw)
        i = start
        for n in pieces:
            w.write(data[i:i + n])
            i += n
        w.write(data[i:])
        w.finish()
        assert os.lseek(fd, 0, os.SEEK_CUR) == len(data)    # the position a caller expects
    finally:
        os.close(fd)
    return w


@pytest.mark.parametrize("seed", range(12))
def test_random_pieces_and_starts_give_the_same_bytes(tmp_path, seed):
    rng = random.Random(seed)
    data = rng.randbytes(rng.choice([0, 1, 4095, 4096, 4097, 3 << 20, (9 << 20) + 123]))
    start = rng.choice([0, 0, rng.randint(0, len(data)), len(data) - len(data) % DIRECT_BLOCK_BYTES])
    pieces = [rng.randint(1, 2 << 20) for _ in range(rng.randint(0, 8))]
    buffer_bytes = rng.choice([DIRECT_BLOCK_BYTES, 65536, 4 << 20])
    path = str(tmp_path / "f")
    _write(path, data, start, pieces, buffer_bytes=buffer_bytes)
    with open(path, "rb") as fh:
        assert fh.read() == data


def test_direct_is_used_where_the_file_system_takes_it(tmp_path):
    path = str(tmp_path / "f")
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        takes = True
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags)
        except OSError:
            takes = False
        w = SequentialWriter(fd)
        assert w.direct == takes
        w.write(b"x" * 5000)
        w.finish()
        # The flag is off again once the writer is done: the caller's later I/O (a read
        # of the file for its checksum) needs no alignment.
        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT
        assert not w.direct
        assert os.pread(fd, 10, 4990) == b"x" * 10
    finally:
        os.close(fd)
    assert os.path.getsize(path) == 5000


def test_ordinary_writes_when_direct_is_not_asked(tmp_path):
    path = str(tmp_path / "f")
    data = os.urandom(100_001)
    w = _write(path, data, 777, [1, 2, 50_000], direct=False)
    assert not w.direct
    with open(path, "rb") as fh:
        assert fh.read() == data


def test_a_cut_transfer_keeps_every_byte_that_came(tmp_path):
    """finish() after an error of the receive: the file holds exactly what was written,
    so a resumed transfer continues from its true end."""
    path = str(tmp_path / "f")
    data = os.urandom(3 << 20)
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        w = SequentialWriter(fd, buffer_bytes=1 << 20)
        with pytest.raises(ConnectionError):
            try:
                w.write(data[:1_500_001])
                raise ConnectionError("the link was cut")
            finally:
                w.finish()
    finally:
        os.close(fd)
    with open(path, "rb") as fh:
        assert fh.read() == data[:1_500_001]
    # ...and a writer resuming there (inside a block) completes the file.
    _write(path, data, 1_500_001, [12345])
    with open(path, "rb") as fh:
        assert fh.read() == data


def test_a_full_disk_is_the_callers_error(tmp_path):
    """ENOSPC reaches the caller, as an ordinary write's would (a tmpfs mounted small is the
    full disk; needs root, skipped otherwise)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.system(f"mount -t tmpfs -o size=1m tmpfs {mnt} 2>/dev/null") != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        fd = os.open(str(mnt / "f"), os.O_RDWR | os.O_CREAT)
        try:
            w = SequentialWriter(fd, buffer_bytes=256 << 10)
            with pytest.raises(OSError) as err:
                try:
                    for _ in range(16):
                        w.write(b"\1" * (256 << 10))
                finally:
                    w.finish()
            assert err.value.errno in (errno.ENOSPC, errno.EDQUOT)
            # What the file holds is a prefix of what was written, every byte of it real.
            assert os.fstat(fd).st_size == w.end <= 1 << 20
            assert os.pread(fd, w.end, 0) == b"\1" * w.end
        finally:
            os.close(fd)
    finally:
        os.system(f"umount {mnt}")


def test_a_refused_flag_is_logged_once_as_a_warning(caplog):
    """A descriptor whose file refuses O_DIRECT (a socket: the kernel refuses the flag
    there as a file system without direct I/O does) is written through ordinary writes, and
    the first such refusal of the process is a warning, later ones debug lines."""
    import socket

    import vrepl.directio as D

    a, b = socket.socketpair()
    with a, b:
        D._fallback_logged = False
        with caplog.at_level("DEBUG", logger="vrepl.directio"):
            for _ in range(2):
                w = SequentialWriter(a.fileno())
                assert not w.direct
                w.write(b"abc")
                w.finish()
        assert b.recv(10) == b"abcabc"
    records = [rec for rec in caplog.records if rec.name == "vrepl.directio"]
    assert [rec.levelname for rec in records] == ["WARNING", "DEBUG"]
    assert records[0].event == "direct_io_fallback"
    assert "refuses O_DIRECT" in records[0].getMessage()


def test_drop_cached_takes_a_durable_file_out_of_the_page_cache(tmp_path):
    if not page_cache_drops(str(tmp_path)):
        pytest.skip("this file system keeps a file's pages (tmpfs)")
    path = str(tmp_path / "f")
    with open(path, "wb") as fh:
        fh.write(os.urandom(64 << 10))
        fh.flush()
        os.fsync(fh.fileno())
    assert resident_pages(path) == (16, 16)
    drop_cached(path)
    assert resident_pages(path) == (0, 16)
    with open(path, "rb") as fh:        # the bytes are the file's, read back from disk
        assert len(fh.read()) == 64 << 10
    drop_cached(str(tmp_path / "absent"))   # advice only: nothing to drop is no error
