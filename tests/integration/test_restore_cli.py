"""`vrepl restore` and `vrepl replay` end to end (vrepl/restore/cli.py), a full disk during
a restore (a small tmpfs: old data intact, exit 6), and hostile file names refused
(docs/restore.md §Safety). Nodes run in this process on 127.0.0.1."""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import threading

import pytest

from vrepl._core import crc32c as _crc
from vrepl.child import wait_for
from vrepl.exitcodes import EXIT_DISK_FULL, EXIT_OK, EXIT_PEER, EXIT_USAGE
from vrepl.restore import protocol as P
from vrepl.restore.cli import add_parsers, run_replay, run_restore
from vrepl.restore.config import RestoreConfig
from vrepl.restore.dirsink import DirSink
from vrepl.restore.errors import UnsafeName
from vrepl.restore.receiver import Receiver
from vrepl.restore.stream import SyncStream
from vrepl.testing.vnodeapp import SECRET, VnodeApp, make_configs, strip_epoch
from vrepl.vnode import Vnode
from vrepl.vnode.config import VnodeConfig

pytestmark = pytest.mark.timeout(60)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_parsers(p.add_subparsers(dest="command"))
    return p.parse_args(argv)


def rows_for(k0: int, n: int, pad: int = 0) -> list:
    return [["t", 1_000 + k, {"v": k, "s": os.urandom(pad).hex() if pad else f"r{k}"}] for k in range(k0, k0 + n)]


@pytest.fixture
def group(tmp_path):
    cfgs = make_configs(tmp_path, n=1, max_wal_file_bytes=32 * 1024)
    app = VnodeApp(cfgs[0], restore=RestoreConfig()).start()
    wait_for("master", lambda: app.role() == "master")
    yield app
    app.stop()


def tree_digest(root: str) -> dict[str, str]:
    out = {}
    for d, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def opened_rows(path: str) -> list:
    v = Vnode(path, VnodeConfig(fsync=False))
    v.recover(os.path.join(path, "wal"))
    return strip_epoch(v.query("t", 0, 1 << 60))


def test_restore_cli_pulls_a_complete_copy_and_resumes(group, tmp_path, monkeypatch):
    app = group
    last = 0
    for k in range(0, 2000, 200):
        last = app.write(rows_for(k, 200))
        if k == 1000:
            app.wait_confirmed(last)
            app.flush()
    app.wait_confirmed(last)
    app.flush()
    for k in range(2000, 2300, 100):  # in the WAL only
        last = app.write(rows_for(k, 100))
    app.wait_confirmed(last)
    monkeypatch.setenv("VREPL_SECRET", SECRET.decode())
    dest = tmp_path / "copy"
    port = app.cfg.me.port
    args = parse(["restore", "--from", f"127.0.0.1:{port}", "--vgroup", str(app.cfg.vgroup_id), "--data", str(dest),
                  "--no-progress"])
    assert run_restore(args) == EXIT_OK
    assert opened_rows(str(dest)) == app.rows("t")
    # A second run over the now-current copy sends no file again (resumable, skips identical).
    last = app.write(rows_for(3000, 10))
    app.wait_confirmed(last)
    assert run_restore(args) == EXIT_OK
    assert opened_rows(str(dest)) == app.rows("t")
    assert not os.path.exists(dest / ".vrepl-restore")


def test_restore_cli_fails_with_one_line_and_exit_codes(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("VREPL_SECRET", raising=False)
    args = parse(["restore", "--from", "127.0.0.1:1", "--vgroup", "1", "--data", str(tmp_path / "d")])
    assert run_restore(args) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no cluster secret" in err[0]
    monkeypatch.setenv("VREPL_SECRET", "x")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = parse(["restore", "--from", f"127.0.0.1:{port}", "--vgroup", "1", "--data", str(tmp_path / "d"),
                  "--retries", "0"])
    assert run_restore(args) == EXIT_PEER
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot connect" in err[0]


@pytest.mark.parametrize("timeout", ["0", "-1"])
def test_restore_timeout_not_above_zero_is_a_usage_error(tmp_path, timeout):
    """`--timeout 0` made a non-blocking socket ('Operation now in progress', exit 4) and a
    negative one a traceback: both are usage errors, one line, exit 2, before connecting."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        out = subprocess.run([sys.executable, "-m", "vrepl.cli", "restore", "--from",
                              f"127.0.0.1:{listener.getsockname()[1]}", "--vgroup", "1", "--data",
                              str(tmp_path / "d"), "--timeout", timeout, "--no-progress"],
                             capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
                             env={**os.environ, "VREPL_SECRET": "x"})
    assert out.returncode == EXIT_USAGE, out.stderr
    assert out.stderr.splitlines() == [f"vrepl: error: --timeout must be > 0, got {timeout}"]


def test_a_source_that_keeps_changing_exits_7(group, tmp_path):
    """The sender's files change during every files phase (a thread touches them: the
    sender's inotify watch sees ATTRIB): each attempt is reported and resumed, and when the
    retries run out the tool exits 7, 'the source kept changing' (docs/restore.md §8), not 4
    (the peer broke off): the sender's ERROR says so with code 1 (§2)."""
    app = group
    last = 0
    for k in range(0, 3000, 300):
        last = app.write(rows_for(k, 300, pad=64))
    app.wait_confirmed(last)
    app.flush()
    files = [os.path.join(d, f) for d, _dirs, names in os.walk(os.path.join(app.cfg.data_path, "data"))
             for f in names]
    assert files
    stop = threading.Event()

    def touch() -> None:
        while not stop.is_set():
            for f in files:
                os.utime(f)

    toucher = threading.Thread(target=touch)
    toucher.start()
    try:
        out = subprocess.run([sys.executable, "-m", "vrepl.cli", "restore", "--from", f"127.0.0.1:{app.cfg.me.port}",
                              "--vgroup", str(app.cfg.vgroup_id), "--data", str(tmp_path / "copy"), "--retries", "1",
                              "--no-progress"], capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL, env={**os.environ, "VREPL_SECRET": SECRET.decode()})
    finally:
        stop.set()
        toucher.join()
    assert out.returncode == 7, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 2, out.stderr
    assert lines[0].startswith("vrepl: restore attempt 1 stopped: the source changed: ") and lines[0].endswith("; resuming")
    assert "changed on the source during the restore" in lines[0]
    assert lines[1].startswith("vrepl: error: the source kept changing (2 attempts): the source changed: ")
    assert not os.path.exists(tmp_path / "copy" / "data" / "manifest.json"), "nothing swapped in"


def test_restore_progress_counts_files_as_files_and_bytes_as_bytes(group, tmp_path):
    """The progress bar (docs/restore.md §8: files and bytes): the files task shows M/N, not
    'M/N bytes' (it used the bytes column for the file count)."""
    app = group
    app.wait_confirmed(app.write(rows_for(0, 300)))
    app.flush()
    out = subprocess.run([sys.executable, "-m", "vrepl.cli", "restore", "--from", f"127.0.0.1:{app.cfg.me.port}",
                          "--vgroup", str(app.cfg.vgroup_id), "--data", str(tmp_path / "copy")],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                         env={**os.environ, "VREPL_SECRET": SECRET.decode(), "VREPL_FORCE_PROGRESS": "1",
                              "COLUMNS": "120", "NO_COLOR": "1"})
    assert out.returncode == EXIT_OK, out.stderr
    lines = [ln.strip() for ln in out.stderr.replace("\r", "\n").splitlines()]
    files = [ln for ln in lines if ln.startswith("files ")]
    assert files and all("bytes" not in ln and "B/s" not in ln for ln in files), files
    assert re.search(r"^files (\d+)/\1 .* \1/\1\b", files[-1]), files[-1]
    assert any(ln.startswith("file bytes ") for ln in lines), lines


def test_restore_cli_wrong_secret_is_refused(group, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VREPL_SECRET", "not the secret")
    args = parse(["restore", "--from", f"127.0.0.1:{group.cfg.me.port}", "--vgroup", str(group.cfg.vgroup_id),
                  "--data", str(tmp_path / "d"), "--retries", "0"])
    assert run_restore(args) == EXIT_PEER
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cluster secret" in err[0]


def test_replay_rebuilds_archived_data_to_a_version(group, tmp_path):
    app = group
    versions = []
    for k in range(0, 1000, 100):
        versions.append(app.write(rows_for(k, 100)))
    app.wait_confirmed(versions[-1])
    wal = tmp_path / "walcopy"
    shutil.copytree(os.path.join(app.cfg.data_path, "wal"), wal)
    full = tmp_path / "full"
    assert run_replay(parse(["replay", "--wal", str(wal), "--data", str(full), "--no-progress",
                             "--flush-rows", "3"])) == EXIT_OK
    v = Vnode(str(full), VnodeConfig(fsync=False))
    assert v.archived_version == versions[-1]
    assert strip_epoch(v.query("t", 0, 1 << 60)) == app.rows("t")
    part = tmp_path / "part"
    assert run_replay(parse(["replay", "--wal", str(wal), "--data", str(part), "--to-version",
                             str(versions[4]), "--no-progress"])) == EXIT_OK
    v = Vnode(str(part), VnodeConfig(fsync=False))
    assert v.archived_version == versions[4]
    assert [r["v"] for r in v.query("t", 0, 1 << 60)] == list(range(500))
    # As a process, with its exit code and one line.
    out = subprocess.run([sys.executable, "-m", "vrepl.restore", "replay", "--wal", str(tmp_path / "nope"),
                          "--data", str(part)], capture_output=True, text=True, timeout=30)
    assert out.returncode == EXIT_USAGE and out.stderr.count("\n") == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (the injected-ENOSPC test covers this)")
def test_disk_full_during_restore_keeps_old_data(group, tmp_path, monkeypatch, capsys):
    app = group
    last = app.write(rows_for(0, 50))
    app.wait_confirmed(last)
    app.flush()
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True, timeout=10)
    try:
        monkeypatch.setenv("VREPL_SECRET", SECRET.decode())
        dest = mnt / "copy"
        args = parse(["restore", "--from", f"127.0.0.1:{app.cfg.me.port}", "--vgroup", str(app.cfg.vgroup_id),
                      "--data", str(dest), "--no-progress", "--retries", "0"])
        assert run_restore(args) == EXIT_OK
        before = tree_digest(str(dest))
        rows_before = opened_rows(str(dest))
        for k in range(50, 3050, 500):  # incompressible rows: a file far above 1 MiB
            last = app.write(rows_for(k, 500, pad=400))
        app.wait_confirmed(last)
        app.flush()
        capsys.readouterr()
        assert run_restore(args) == EXIT_DISK_FULL
        err = capsys.readouterr().err.strip().splitlines()
        # The statvfs check before a file ("it needs N bytes, M are free") or ENOSPC on a write.
        assert len(err) == 1 and "intact" in err[0]
        assert "no space left" in err[0] or ("not enough disk space" in err[0] and "are free under" in err[0])
        after = {k: v for k, v in tree_digest(str(dest)).items() if not k.startswith(".vrepl-restore")}
        assert after == before
        assert opened_rows(str(dest)) == rows_before
    finally:
        subprocess.run(["umount", "-l", str(mnt)], timeout=10)


def test_disk_full_injected_enospc_keeps_old_data(tmp_path, monkeypatch):
    """Without root: the staging writes (os.write, os.pwritev) raising ENOSPC."""
    import errno

    from vrepl.restore import receiver as R
    from vrepl.restore.errors import DiskFull

    dest = tmp_path / "d"
    (dest / "data").mkdir(parents=True)
    (dest / "data" / "old.bin").write_bytes(b"old")
    payload = os.urandom(100_000)
    magic = _crc.crc32c(payload) or 1

    def serve(conn: socket.socket) -> None:
        s = SyncStream(conn)
        s.send(P.SyncBegin(1, 0, P.FLAG_FILES, 1, len(payload), 0))
        s.send(P.FileInfo(0, len(payload), magic, "data/new.bin"))
        s.recv()
        s.send(P.FileData(0, len(payload)))
        try:
            s.send_bytes(payload)
        except Exception:
            pass

    real_write = os.write
    calls = {"n": 0}

    def full_write(fd, data):
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data[:1000])

    def full_pwritev(fd, buffers, offset):
        # The receiver writes around the page cache (vrepl/directio.py): the disk is full
        # at its first direct write.
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(R.os, "write", full_write)
    monkeypatch.setattr(R.os, "pwritev", full_pwritev)
    with pytest.raises(DiskFull, match="no space left.*intact"):
        run_fake_sender(serve, DirSink(str(dest)))
    assert (dest / "data" / "old.bin").read_bytes() == b"old"
    assert not (dest / "data" / "new.bin").exists()


def run_fake_sender(serve, sink) -> int:
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    t = threading.Thread(target=lambda: serve(lst.accept()[0]), daemon=True)
    t.start()
    cli = socket.create_connection(lst.getsockname(), timeout=5)
    try:
        return Receiver(sink).run(SyncStream(cli, io_timeout_s=5))
    finally:
        cli.close()
        lst.close()
        t.join(5)


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "data/../../x", "link/evil", "a//b", "./a"])
def test_hostile_names_are_refused(tmp_path, name):
    dest = tmp_path / "d"
    dest.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, dest / "link")

    def serve(conn: socket.socket) -> None:
        s = SyncStream(conn)
        s.send(P.SyncBegin(1, 0, P.FLAG_FILES, 1, 3, 0))
        s.send(P.FileInfo(0, 3, _crc.crc32c(b"bad") or 1, name))
        try:
            s.recv()
            s.send(P.FileData(0, 3))
            s.send_bytes(b"bad")
        except Exception:
            pass

    with pytest.raises(UnsafeName, match="refused"):
        run_fake_sender(serve, DirSink(str(dest)))
    assert os.listdir(outside) == []
    assert not (tmp_path / "x").exists()
