"""`vrepl wal ...` and `vrepl replay` on hostile WAL directories, as real processes (issue 14,
Deliver 9; docs/wal-format.md §Command line, docs/restore.md §8): a FIFO named like a WAL
file is refused without being opened (no hang), a directory without WAL files is not
"clean", a torn last record is reported by replay, and corruption after --to-version N does
not stop the good prefix from being rebuilt."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vrepl import wal
from vrepl.vnode import Vnode
from vrepl.vnode.config import VnodeConfig
from vrepl.vnode.rows import encode_rows

pytestmark = pytest.mark.timeout(120)


def vrepl(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vrepl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def one_error(out: subprocess.CompletedProcess) -> str:
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vrepl: error: "), out.stderr
    return lines[0]


def write_wal(d, n: int, max_file_bytes: int = 64 * 1024 * 1024) -> None:
    with wal.WalWriter(str(d), wal.WalOptions(max_file_bytes=max_file_bytes, durability="none")) as w:
        for v in range(1, n + 1):
            w.append(encode_rows([["t", 1000 + v, {"v": v}]]), epoch=1)


@pytest.mark.parametrize("command", [["wal", "verify"], ["wal", "repair"], ["wal", "dump"], ["replay"]])
@pytest.mark.parametrize("which", ["only", "last"])
def test_a_fifo_named_like_a_wal_file_is_refused_not_opened(tmp_path, command, which):
    d = tmp_path / "wal"
    d.mkdir()
    if which == "last":
        write_wal(d, 3)
        os.mkfifo(d / wal.wal_file_name(1))
    else:
        os.mkfifo(d / wal.wal_file_name(0))
    args = [*command, str(d)] if command[0] == "wal" else ["replay", "--wal", str(d), "--data",
                                                            str(tmp_path / "data"), "--no-progress"]
    out = vrepl(*args, timeout=20)  # opening the FIFO for reading would block forever
    assert out.returncode == 2, out.stderr
    assert "not a regular file (a FIFO); refused" in one_error(out)
    assert out.stdout == ""


def test_a_fifo_index_is_ignored(tmp_path):
    d = tmp_path / "wal"
    write_wal(d, 200, max_file_bytes=4096)
    idx = d / wal.index_file_name(0)
    assert idx.exists()
    idx.unlink()
    os.mkfifo(idx)
    out = vrepl("wal", "dump", str(d), "--from-version", "150", timeout=20)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "# 51 records\n"
    assert vrepl("wal", "verify", str(d), timeout=20).returncode == 0


def test_a_symlink_named_like_a_wal_file_is_refused(tmp_path):
    d = tmp_path / "wal"
    write_wal(d, 3)
    os.symlink("/dev/zero", d / wal.wal_file_name(1))
    out = vrepl("wal", "verify", str(d), timeout=20)
    assert out.returncode == 2
    assert "not a regular file (a symlink); refused" in one_error(out)


@pytest.mark.parametrize("command", ["verify", "repair"])
def test_wal_verify_of_a_directory_without_wal_files_is_an_error(tmp_path, command):
    """Nothing to verify (or repair) is most likely the wrong directory: exit 2, not 'clean' or
    'nothing to repair'."""
    d = tmp_path / "empty"
    d.mkdir()
    (d / "notes.txt").write_text("not a WAL")
    out = vrepl("wal", command, str(d))
    assert out.returncode == 2
    assert one_error(out) == f"vrepl: error: {d}: no WAL file found (no NNNNNNNNNNNN.wal)"
    assert out.stdout == ""
    assert out.stdout == ""
    write_wal(d, 2)
    out = vrepl("wal", "verify", str(d))
    assert out.returncode == 0 and out.stdout == f"{d}: clean: 1 files, versions 1..2\n"


@pytest.mark.parametrize("damage", ["torn", "bad_crc"])
def test_replay_says_it_left_out_a_torn_last_record(tmp_path, damage):
    d = tmp_path / "wal"
    write_wal(d, 5)
    path = d / wal.wal_file_name(0)
    size = path.stat().st_size
    if damage == "torn":
        with open(path, "ab") as fh:  # a crash mid-write: half a record
            fh.write(wal._rec.encode_record(1, 6, 1, encode_rows([["t", 1006, {"v": 6}]]))[:30])
    else:  # the last record's payload damaged, nothing valid after it
        with open(path, "r+b") as fh:
            fh.seek(size - 1)
            last = fh.read(1)
            fh.seek(size - 1)
            fh.write(bytes([last[0] ^ 0xFF]))
    data = tmp_path / "data"
    out = vrepl("replay", "--wal", str(d), "--data", str(data), "--no-progress")
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vrepl: warning: "), out.stderr
    last_good = 5 if damage == "torn" else 4
    assert f"torn tail at offset" in lines[0] and f"(last good version {last_good})" in lines[0]
    assert "that record was not replayed" in lines[0]
    assert out.stdout.startswith(f"replayed v1..v{last_good} ")
    v = Vnode(str(data), VnodeConfig(fsync=False))
    assert v.archived_version == last_good
    assert [r["v"] for r in v.query("t", 0, 1 << 60)] == list(range(1, last_good + 1))
    v.close()
    # Asking beyond the good records is out of range (exit 2), one line.
    out = vrepl("replay", "--wal", str(d), "--data", str(tmp_path / "d2"), "--to-version", "6", "--no-progress")
    assert out.returncode == 2
    assert f"ends in a torn record after v{last_good}" in one_error(out)


def corrupt_middle(d, n: int, at_version: int) -> None:
    """Damage record `at_version`'s payload in a log of n records (valid records follow it:
    corruption, not a torn tail)."""
    path = d / wal.wal_file_name(0)
    recs = wal.read_records(str(d))
    offset = 0
    for r in recs[:at_version - 1]:
        offset += wal.HEADER_SIZE + len(r.payload)
    with open(path, "r+b") as fh:
        fh.seek(offset + wal.HEADER_SIZE + 2)
        b = fh.read(1)
        fh.seek(offset + wal.HEADER_SIZE + 2)
        fh.write(bytes([b[0] ^ 0xFF]))


def test_replay_to_a_version_before_the_corruption_rebuilds_the_good_prefix(tmp_path):
    d = tmp_path / "wal"
    write_wal(d, 10)
    corrupt_middle(d, 10, 8)
    assert vrepl("wal", "verify", str(d)).returncode == 1
    # Without --to-version: refused, one line, with the way out.
    out = vrepl("replay", "--wal", str(d), "--data", str(tmp_path / "all"), "--no-progress")
    assert out.returncode == 1
    line = one_error(out)
    assert "corrupt at offset" in line and "last good version 7" in line
    assert "'vrepl replay --to-version 7' rebuilds the good prefix" in line
    assert not os.path.exists(tmp_path / "all" / "data")
    # --to-version beyond the corruption: refused the same way.
    out = vrepl("replay", "--wal", str(d), "--data", str(tmp_path / "all"), "--to-version", "9", "--no-progress")
    assert out.returncode == 1 and "last good version 7" in one_error(out)
    # --to-version N before it: the prefix is rebuilt, exit 0, nothing on stderr.
    for n in (5, 7):
        data = tmp_path / f"to{n}"
        out = vrepl("replay", "--wal", str(d), "--data", str(data), "--to-version", str(n), "--no-progress")
        assert out.returncode == 0, out.stderr
        assert out.stderr == "" and out.stdout.startswith(f"replayed v1..v{n} ({n} records)")
        v = Vnode(str(data), VnodeConfig(fsync=False))
        assert v.archived_version == n
        assert [r["v"] for r in v.query("t", 0, 1 << 60)] == list(range(1, n + 1))
        v.close()


def test_replay_refuses_corruption_in_a_sealed_file_before_writing_anything(tmp_path):
    """A bad record in a sealed file whose index is intact (the index alone says the file is
    fine): replay refuses it up front with the way out, and writes nothing (docs/restore.md §8)."""
    d = tmp_path / "wal"
    write_wal(d, 300, max_file_bytes=8192)
    assert os.path.exists(d / wal.index_file_name(0)) and os.path.exists(d / wal.wal_file_name(2))
    records = wal.read_records(str(d))  # records[i] is version i + 1
    n0 = wal.inspect(str(d)).files[0].last_version
    with open(d / wal.wal_file_name(1), "r+b") as fh:  # a payload byte of file 1's second record
        first_len = wal.HEADER_SIZE + len(records[n0].payload)
        fh.seek(first_len + wal.HEADER_SIZE + 2)
        b = fh.read(1)
        fh.seek(first_len + wal.HEADER_SIZE + 2)
        fh.write(bytes([b[0] ^ 0xFF]))
    last_good = n0 + 1
    for extra in ([], ["--to-version", str(last_good + 5)]):
        data = tmp_path / f"all{len(extra)}"
        out = vrepl("replay", "--wal", str(d), "--data", str(data), "--no-progress", *extra)
        assert out.returncode == 1, out.stderr
        line = one_error(out)
        assert f"last good version {last_good}" in line
        assert f"'vrepl replay --to-version {last_good}' rebuilds the good prefix" in line
        assert not os.path.exists(data / "data"), "nothing is written before the refusal"
    out = vrepl("replay", "--wal", str(d), "--data", str(tmp_path / "ok"), "--to-version", str(last_good),
                "--no-progress")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout.startswith(f"replayed v1..v{last_good} ({last_good} records)")


@pytest.mark.parametrize("flush_rows", ["0", "-5"])
def test_replay_refuses_flush_rows_below_one(tmp_path, flush_rows):
    d = tmp_path / "wal"
    write_wal(d, 3)
    data = tmp_path / "data"
    out = vrepl("replay", "--wal", str(d), "--data", str(data), "--flush-rows", flush_rows, "--no-progress")
    assert out.returncode == 2, out.stderr
    assert f"--flush-rows must be >= 1, got {flush_rows}" in one_error(out)
    assert not os.path.exists(data / "data")


@pytest.mark.parametrize("across_files", [False, True])
def test_an_epoch_going_back_is_corruption(tmp_path, across_files):
    """docs/wal-format.md: epochs never decrease; verify and repair report a record whose epoch
    is below the one before it as corruption (exit 1, file, offset, last good version), and
    replay refuses it."""
    d = tmp_path / "wal"
    with wal.WalWriter(str(d), wal.WalOptions(durability="none")) as w:
        for v in range(1, 6):
            w.append(encode_rows([["t", 1000 + v, {"v": v}]]), epoch=2)
    # Record 6 with epoch 1, appended as raw bytes (the writer itself never goes back).
    blob = wal._rec.encode_record(1, 6, 1, encode_rows([["t", 1006, {"v": 6}]]))
    name = wal.wal_file_name(1 if across_files else 0)
    offset = 0 if across_files else os.path.getsize(d / wal.wal_file_name(0))
    with open(d / name, "ab") as fh:
        fh.write(blob)
    for command in (["wal", "verify", str(d)], ["wal", "repair", str(d)]):
        out = vrepl(*command)
        assert out.returncode == 1, out.stderr
        line = one_error(out)
        assert f"{name}: corrupt at offset {offset}: epoch goes back: version 6 has epoch 1 after epoch 2" in line
        assert "(last good version 5)" in line
    out = vrepl("replay", "--wal", str(d), "--data", str(tmp_path / "data"), "--no-progress")
    assert out.returncode == 1 and "'vrepl replay --to-version 5' rebuilds the good prefix" in one_error(out)


@pytest.mark.parametrize("case", ["version_0", "msg_type_16", "msg_type_0"])
def test_a_record_that_is_no_wal_data_is_corruption(tmp_path, case):
    """docs/wal-format.md §Record: versions start at 1 and a WAL holds data types 1..15 (16..63
    are replication messages on the wire): verify and repair report anything else as
    corruption at that record, and replay refuses it."""
    d = tmp_path / "wal"
    d.mkdir()
    rows = encode_rows([["t", 1000, {"v": 1}]])
    if case == "version_0":
        records, offset, msg = [(1, 0), (1, 1)], 0, "version 0: versions start at 1"
    else:
        t = 16 if case == "msg_type_16" else 0
        records, msg = [(1, 1), (1, 2), (t, 3)], f"msg_type {t} at version 3 is not a WAL data type (1..15)"
    blob = b""
    for msg_type, version in records:
        if version == 3:
            offset = len(blob)
        blob += wal._rec.encode_record(msg_type, version, 1, rows)
    (d / wal.wal_file_name(0)).write_bytes(blob)
    for command in (["wal", "verify", str(d)], ["wal", "repair", str(d)]):
        out = vrepl(*command)
        assert out.returncode == 1, out.stdout + out.stderr
        line = one_error(out)
        assert f"corrupt at offset {offset}: {msg}" in line, line
    out = vrepl("replay", "--wal", str(d), "--data", str(tmp_path / "data"), "--no-progress")
    assert out.returncode == 1, out.stdout + out.stderr


def test_replay_into_a_data_path_that_is_a_file_is_a_usage_error(tmp_path):
    d = tmp_path / "wal"
    write_wal(d, 3)
    (tmp_path / "afile").write_text("x")
    out = vrepl("replay", "--wal", str(d), "--data", str(tmp_path / "afile"), "--no-progress")
    assert out.returncode == 2, out.stderr
    assert one_error(out) == f"vrepl: error: {tmp_path / 'afile'}: not a directory"
    assert (tmp_path / "afile").read_text() == "x"


def test_replay_of_a_directory_without_wal_files_is_a_usage_error(tmp_path):
    """`--wal` naming the vgroup's directory instead of its wal/: refused as `wal verify` does,
    not 'replayed 0 records'."""
    d = tmp_path / "vg1"
    (d / "data").mkdir(parents=True)
    out = vrepl("replay", "--wal", str(d), "--data", str(tmp_path / "data"), "--no-progress")
    assert out.returncode == 2, out.stdout + out.stderr
    assert one_error(out) == f"vrepl: error: {d}: no WAL file found (no NNNNNNNNNNNN.wal)"
    assert out.stdout == "" and not os.path.exists(tmp_path / "data" / "data")


def test_replay_to_a_version_before_a_recycled_wal_begins_names_the_gap(tmp_path):
    """A WAL that starts at v4 (v1..v3 recycled) replayed into an empty directory with
    --to-version 2: the gap is named (exit 1), not 'the WAL ended early'."""
    d = tmp_path / "wal"
    write_wal(d, 6, max_file_bytes=200)
    assert wal.inspect(str(d)).files[0].last_version < 4
    for f in wal.inspect(str(d)).files:
        if f.last_version < 4:
            os.remove(f.path)
            idx = d / wal.index_file_name(f.index)
            if idx.exists():
                idx.unlink()
    first = wal.inspect(str(d)).files[0].first_version
    assert first > 2
    out = vrepl("replay", "--wal", str(d), "--data", str(tmp_path / "data"), "--to-version", "2", "--no-progress")
    assert out.returncode == 1, out.stderr
    assert one_error(out).endswith(f"the WAL resumes at v{first} but {tmp_path / 'data'} holds versions up to v0:"
                                   f" v1..v{first - 1} are missing")


def test_replay_cannot_go_back_below_the_archived_version(tmp_path):
    d = tmp_path / "wal"
    write_wal(d, 6)
    data = tmp_path / "data"
    assert vrepl("replay", "--wal", str(d), "--data", str(data), "--no-progress").returncode == 0
    out = vrepl("replay", "--wal", str(d), "--data", str(data), "--to-version", "3", "--no-progress")
    assert out.returncode == 2, out.stderr
    assert one_error(out).startswith(f"vrepl: error: {data} already holds v6, beyond v3: replay cannot go back")
