"""Small promises of the docs that the code must keep word for word (docs/client-api.md,
docs/wal-format.md): headers and byte layouts an outside client relies on."""
from __future__ import annotations

import pathlib
import re
import struct

from vrepl import wal
from vrepl._core import crc32c
from vrepl.node import metrics

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"


def test_metrics_content_type_is_the_documented_one():
    text = (DOCS / "client-api.md").read_text()
    quoted = re.search(r"`Content-Type: (text/plain[^`]*)`", text)
    assert quoted is not None
    assert metrics.CONTENT_TYPE == quoted.group(1)


def test_index_file_layout_is_the_documented_one(tmp_path):
    # docs/wal-format.md §Files: the .idx byte layout, read here with struct, not the WAL code.
    w = wal.WalWriter(str(tmp_path), wal.WalOptions(max_file_bytes=4096, group_commit_ms=0))
    for i in range(1, 301):
        w.append(b"x" * 20, epoch=1)
    w.close()
    sealed = sorted(tmp_path.glob("*.idx"))[0]
    data = sealed.read_bytes()
    magic, fmt, index, first, count, size, stride = struct.unpack_from("<4sIQQQQQ", data)
    assert (magic, fmt, stride) == (b"VRIX", 1, 64)
    walfile = sealed.with_suffix(".wal")
    assert index == int(sealed.stem) and size == walfile.stat().st_size and first == 1
    n = -(-count // 64)
    assert len(data) == 48 + 8 * n + 4
    offsets = struct.unpack_from(f"<{n}Q", data, 48)
    body = walfile.read_bytes()
    for k, off in enumerate(offsets):
        # each sampled offset starts record 64*k: its version field (offset 8) says so
        assert body[off:off + 4] == b"VRWL"
        assert struct.unpack_from("<Q", body, off + 8)[0] == first + 64 * k
    assert struct.unpack_from("<I", data, len(data) - 4)[0] == crc32c.crc32c(data[:-4])


def test_wal_dump_json_fields_are_the_documented_ones(tmp_path):
    import json
    import subprocess
    import sys

    w = wal.WalWriter(str(tmp_path), wal.WalOptions(group_commit_ms=0))
    w.append(b"payload", epoch=3)
    w.close()
    out = subprocess.run([sys.executable, "-m", "vrepl.cli", "wal", "dump", "--json", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    (obj,) = [json.loads(line) for line in out.stdout.splitlines()]
    text = (DOCS / "wal-format.md").read_text()
    para = text[text.index("`dump --json` prints"):text.index("the text form")]
    assert set(obj) == set(re.findall(r'"(\w+)"', para))
    assert (obj["version"], obj["epoch"], obj["length"], obj["offset"]) == (1, 3, 7, 0)


def test_python_m_validate_refuses_with_one_line(tmp_path):
    # docs/validation.md: `python -m vrepl.spark.validate ...` is `vrepl validate`; an empty
    # replica directory is exit 2 with one line (no runpy warning before it).
    import subprocess
    import sys

    (tmp_path / "r1").mkdir()
    out = subprocess.run([sys.executable, "-m", "vrepl.spark.validate", str(tmp_path / "r1")],
                         capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert out.returncode == 2
    assert out.stderr.splitlines() == [out.stderr.strip()]
    assert out.stderr.startswith("vrepl: error: vgroup 1 replica 1 (")


def test_sync_stats_has_the_documented_shape(tmp_path):
    # docs/embedding.md §Observability: where stats() keeps what.
    from vrepl.child import free_ports
    from vrepl.config import SyncConfig
    from vrepl.sync import SyncInstance

    (port,) = free_ports(1)
    inst = SyncInstance(SyncConfig(vgroup_id=1, replicas=((1, f"127.0.0.1:{port}"),), self_index=0,
                                   data_path=str(tmp_path), secret=b"s" * 16)).start()
    try:
        st = inst.stats()
    finally:
        inst.stop()
    for key in ("vgroup_id", "node", "role", "epoch", "master", "last_version", "last_epoch",
                "durable_version", "pending_forwards", "sync_cache_records", "arbitrator_connected",
                "committed_version", "peers", "sync", "queued_forwards", "flow_control", "role_ms",
                "role_changes", "epochs_promised", "arbitrator_lease", "wal", "restore", "counters"):
        assert key in st, key
    for key in ("forwards_sent", "acks_received", "confirmed_ok", "confirmed_timed_out",
                "confirmed_failed", "resyncs", "truncations", "role_changes", "elections_won"):
        assert key in st["counters"], key
    assert set(st["wal"]) == {"durable_version", "appended_bytes", "group_commits"}
    assert isinstance(st["role_changes"], dict) and st["peers"] == {}


def test_series_table_names_follow_the_documented_rule():
    # docs/client-api.md §A series is a table, computed here from the text, not the code.
    import hashlib

    from vrepl.vnode.ingest import table_of_series

    def documented(measurement: str, tags: dict[str, str]) -> str:
        if not tags and re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,191}", measurement) and "__" not in measurement:
            return measurement
        name = re.sub(r"[^A-Za-z0-9_]", "_", measurement)
        if not name or name[0].isdigit():
            name = "m" + name
        h = hashlib.blake2b(digest_size=16)
        for part in [measurement, *[x for kv in sorted(tags.items()) for x in kv]]:
            b = part.encode()
            h.update(len(b).to_bytes(4, "little") + b)
        return name[:158] + "__" + h.hexdigest()

    cases = [("mem", {}), ("cpu", {"host": "a"}), ("cpu", {"z": "1", "a": "2"}), ("9lives", {}),
             ("", {"k": "v"}), ("a__b", {}), ("x" * 300, {}), ("7" + "y" * 200, {"t": "é"}),
             ("disk io", {"dev": "sda"})]
    for measurement, tags in cases:
        assert table_of_series(measurement, tags) == documented(measurement, tags), measurement


def test_every_log_event_is_in_the_documented_table():
    # docs/operations.md §Logs: `event` names what happened, from the table; a line the
    # code names with an event of its own must be there, or a JSON-log reader cannot know it.
    from vrepl.instance import corelog

    root = DOCS.parent
    table = (DOCS / "operations.md").read_text().split("| event | level |")[1].split("\n\n")[0]
    documented = {name for row in table.splitlines() if row.startswith("| `")
                  for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])}
    emitted = {event for _, event in corelog._CORE_EVENTS}
    for path in [*(root / "vrepl").rglob("*.py"), *(root / "arbitrator").rglob("*.py")]:
        if "testing" in path.parts:
            continue
        emitted |= set(re.findall(r"""["']event["']: *["']([a-z_]+)["']""", path.read_text()))
    assert emitted - documented == set()
