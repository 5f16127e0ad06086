"""The `vrepl` command line: exit codes, one-line errors, dump/verify/repair/demo.

Runs the real console entry point in a subprocess, as an operator would.
"""
import json
import os
import subprocess
import sys

import pytest

from vrepl import wal

pytestmark = pytest.mark.timeout(120)


def run(*args, check_no_traceback=True):
    proc = subprocess.run([sys.executable, "-m", "vrepl.cli", *args], capture_output=True,
                          text=True, timeout=60)
    if check_no_traceback:
        assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture()
def wal_dir(tmp_path):
    d = tmp_path / "wal"
    w = wal.WalWriter(str(d), wal.WalOptions(max_file_bytes=2048, group_commit_ms=0))
    for i in range(1, 41):
        w.append(f"row-{i}".encode(), epoch=1 if i <= 20 else 2)
    w.close()
    return d


def test_version():
    proc = run("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip().startswith("vrepl 0.")


def test_no_command_is_usage_error():
    assert run().returncode == 2


def test_dump_text_and_from_version(wal_dir):
    proc = run("wal", "dump", str(wal_dir), "--from-version", "39")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["39", "40"]
    assert "epoch=2" in lines[0] and "row-39" in lines[0]


def test_dump_json_offsets_point_at_records(wal_dir):
    proc = run("wal", "dump", str(wal_dir), "--json")
    assert proc.returncode == 0
    objs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [o["version"] for o in objs] == list(range(1, 41))
    assert {o["epoch"] for o in objs} == {1, 2}
    from vrepl._core import record
    for o in objs[::7]:
        data = (wal_dir / o["file"]).read_bytes()
        rec = record.decode_record(data, o["offset"])
        assert rec.version == o["version"]


def test_verify_clean(wal_dir):
    proc = run("wal", "verify", str(wal_dir))
    assert proc.returncode == 0
    assert "clean" in proc.stdout and "1..40" in proc.stdout


@pytest.mark.slow  # seconds: outside the `-m "not slow"` loop
def test_verify_torn_tail_then_repair(wal_dir):
    last = sorted(wal_dir.glob("*.wal"))[-1]
    with open(last, "ab") as fh:
        fh.write(b"VRWL\x01\x01\x00")  # a header cut short
    proc = run("wal", "verify", str(wal_dir))
    assert proc.returncode == 1
    assert last.name in proc.stderr and "torn tail" in proc.stderr
    assert "repairable" in proc.stderr
    proc = run("wal", "repair", str(wal_dir))
    assert proc.returncode == 0 and "last good version 40" in proc.stdout
    assert run("wal", "verify", str(wal_dir)).returncode == 0


def test_verify_corrupt_sealed_file_names_file_and_offset(wal_dir):
    first = sorted(wal_dir.glob("*.wal"))[0]
    data = bytearray(first.read_bytes())
    data[100] ^= 0x01
    first.write_bytes(bytes(data))
    proc = run("wal", "verify", str(wal_dir))
    assert proc.returncode == 1
    assert first.name in proc.stderr and "offset" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    # repair refuses corruption that is not a torn tail
    proc = run("wal", "repair", str(wal_dir))
    assert proc.returncode == 1 and "corrupt" in proc.stderr


def test_repair_refuses_payload_corruption_in_an_indexed_sealed_file(tmp_path):
    # A sealed file with a good index: repair's quick inspection trusts the index, so
    # `vrepl wal repair` verifies every byte first (docs/wal-format.md: repair refuses
    # corruption, never skips it silently).
    wal_dir = tmp_path / "wal"
    w = wal.WalWriter(str(wal_dir), wal.WalOptions(max_file_bytes=512, group_commit_ms=0))
    for i in range(1, 41):
        w.append(f"row-{i}".encode(), epoch=1)
    w.close()
    files = sorted(wal_dir.glob("*.wal"))
    assert len(files) >= 3
    middle = files[1]
    assert middle.with_suffix(".idx").exists()
    data = bytearray(middle.read_bytes())
    data[-2] ^= 0x01  # the payload of the file's last record
    middle.write_bytes(bytes(data))
    sizes = {f.name: f.stat().st_size for f in files}
    proc = run("wal", "repair", str(wal_dir))
    assert proc.returncode == 1, proc.stdout
    assert middle.name in proc.stderr and "corrupt" in proc.stderr
    assert {f.name: f.stat().st_size for f in files} == sizes


def test_missing_directory_is_one_line_exit_2(tmp_path):
    proc = run("wal", "verify", str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("vrepl: error:")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_bad_argument_exit_2(wal_dir):
    proc = run("wal", "dump", str(wal_dir), "--from-version", "0")
    assert proc.returncode == 2 and "--from-version" in proc.stderr


def test_demo_small(tmp_path):
    proc = run("wal", "demo", "--records", "5000", "--batch", "500", "--dir",
               str(tmp_path / "demo"), "--max-file-mb", "1")
    assert proc.returncode == 0, proc.stderr
    assert "read back all 5,000 records" in proc.stdout
    assert wal.inspect(str(tmp_path / "demo")).last_version == 5000


def test_console_script_installed():
    import shutil
    exe = shutil.which("vrepl")
    assert exe, "the vrepl console script is not on PATH"
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0


@pytest.mark.parametrize("argv, line", [
    (["status"], "vrepl: error: status: the following arguments are required: --node"
                 " (see vrepl status --help)"),
    (["status", "--node", "nonsense"],
     "vrepl: error: status: argument --node: address 'nonsense' is not host:port"
     " (see vrepl status --help)"),
    (["status", "--node", "127.0.0.1:6201", "--timeout", "soon"],
     "vrepl: error: status: argument --timeout: invalid float value: 'soon' (see vrepl status --help)"),
    (["txn", "list", "--node", "6201"],
     "vrepl: error: txn list: argument --node: address '6201' is not host:port"
     " (see vrepl txn list --help)"),
    (["bench", "--nodes", "127.0.0.1:6201,nohost"],
     "vrepl: error: bench: argument --nodes: address 'nohost' is not host:port (see vrepl bench --help)"),
    (["ship-owner", "--node", "x:y", "cpu"],
     "vrepl: error: ship-owner: argument --node: address 'x:y' is not host:port"
     " (see vrepl ship-owner --help)"),
])
def test_a_usage_mistake_is_one_line_exit_2(argv, line):
    """docs/operations.md §Exit codes: every failure is one line, `vrepl: error: <reason>`; a
    usage error exits 2 (argparse printed its usage block first, and a malformed --node
    was a ValueError traceback, exit 1)."""
    proc = run(*argv)
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [line])


def test_an_arbitrator_usage_mistake_is_one_line_exit_2():
    proc = subprocess.run([sys.executable, "-P", "-m", "arbitrator.main", "--lease-ms", "long"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "vrepl-arbitrator: error: argument --lease-ms: invalid int value: 'long'"
        " (see vrepl-arbitrator --help)"]
