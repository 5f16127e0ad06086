"""The ship sender's on-disk state and the ship messages (docs/ship.md §3.1, §4.1, §5.1).

Real files in a temporary directory: the seed's sender recovery algorithm from every state a
crash can leave (a sync.log with confirmations and a torn line, an interrupted fold, a list
cut short, a lost uuid.txt), and every ship message through encode/decode and the record
frame, with malformed payloads refused in one line."""
from __future__ import annotations

import os

import pytest

from vrepl._core import record as _rec
from vrepl.errors import FrameError
from vrepl.ship import protocol as P
from vrepl.ship.errors import StateError
from vrepl.ship.state import (
    CURRENT_LIST,
    LAST_LIST,
    SYNC_LOG,
    FileList,
    SenderDir,
    SyncLog,
    digest_of_keys,
    entry_line,
    load_uuid,
)


def entry(table: str, bucket: int = 0, size: int = 100, magic: int = 7, name: str = "") -> P.FileEntry:
    return P.FileEntry(0, table, bucket, size, magic, 3, name or f"data/{table}/b{bucket}-v1.parquet")


@pytest.fixture
def sdir(tmp_path) -> SenderDir:
    d = SenderDir(str(tmp_path), "127.0.0.1:6101", 1)
    d.ensure()
    return d


def test_a_fresh_directory_has_an_empty_list(sdir):
    assert sdir.recover() == []
    fl = sdir.read_last()
    assert fl.entries == {} and fl.seq == 0
    assert os.path.basename(sdir.path) == "127.0.0.1_6101_vg1"


def test_sync_log_is_folded_and_a_torn_line_ignored(sdir):
    a, b, c = entry("a"), entry("b"), entry("c")
    sdir.write_last(FileList({a.key: a, b.key: b}, 1, 0x11))
    log = SyncLog.start(sdir.p(SYNC_LOG), 2, 0x22)
    log.write(["sync deleted file names start", "- " + entry_line(a), "sync deleted file names end",
               "sync tsfile start", "+ " + entry_line(c)])
    log.close()
    with open(sdir.p(SYNC_LOG), "a") as fh:          # a crash mid-append: no newline
        fh.write("+ " + entry_line(entry("d"))[:10])
    os.makedirs(sdir.snapshot)
    done = sdir.recover()
    assert any("1 loaded, 1 removed" in d for d in done)
    fl = sdir.read_last()
    assert set(fl.entries) == {b.key, c.key}
    assert (fl.seq, fl.round_id) == (2, 0x22)
    assert not os.path.exists(sdir.p(SYNC_LOG)) and not os.path.exists(sdir.snapshot)
    assert not os.path.exists(sdir.p(CURRENT_LIST))


def test_an_interrupted_fold_is_redone(sdir):
    a, c = entry("a"), entry("c")
    sdir.write_last(FileList({a.key: a}, 1, 1))
    log = SyncLog.start(sdir.p(SYNC_LOG), 2, 2)
    log.write(["+ " + entry_line(c)])
    log.close()
    # The crash came after current_local_files.txt was written, before the rename.
    with open(sdir.p(CURRENT_LIST), "wb") as fh:
        fh.write(FileList({a.key: a, c.key: c}, 2, 2).to_bytes()[:20])
    sdir.recover()
    assert set(sdir.read_last().entries) == {a.key, c.key}


def test_a_complete_current_list_without_a_last_one_becomes_it(sdir):
    a = entry("a")
    os.unlink(sdir.p(LAST_LIST))
    with open(sdir.p(CURRENT_LIST), "wb") as fh:
        fh.write(FileList({a.key: a}, 4, 4).to_bytes())
    sdir.recover()
    assert set(sdir.read_last().entries) == {a.key} and sdir.read_last().seq == 4


def test_a_cut_current_list_without_a_last_one_is_dropped(sdir):
    a = entry("a")
    os.unlink(sdir.p(LAST_LIST))
    with open(sdir.p(CURRENT_LIST), "wb") as fh:
        fh.write(FileList({a.key: a}, 4, 4).to_bytes()[:-8])
    done = sdir.recover()
    assert "dropped a cut current_local_files.txt" in done
    assert sdir.read_last().entries == {}


def test_a_cut_last_list_is_refused_with_the_repair(sdir):
    with open(sdir.p(LAST_LIST), "wb") as fh:
        fh.write(FileList({entry("a").key: entry("a")}).to_bytes()[:-5])
    SyncLog.start(sdir.p(SYNC_LOG), 1, 1).close()
    with pytest.raises(StateError, match="cut short.*remove"):
        sdir.recover()


def test_digest_is_order_free_and_content_bound():
    a, b = entry("a"), entry("b")
    assert digest_of_keys([a.key, b.key]) == digest_of_keys([b.key, a.key])
    assert digest_of_keys([a.key]) != digest_of_keys([entry("a", magic=8).key])


def test_a_lost_uuid_is_restored_from_the_receiver_state(tmp_path):
    data = str(tmp_path)
    uuid, note = load_uuid(data)
    assert note is None and len(uuid) == 32
    d = SenderDir(data, "h:1", 1)
    d.ensure()
    d.write_state({"uuid": uuid})
    os.unlink(os.path.join(data, "ship", "uuid.txt"))
    again, note = load_uuid(data)
    assert again == uuid and "restored" in note
    # Two receiver directories naming different UUIDs: the operator decides.
    os.unlink(os.path.join(data, "ship", "uuid.txt"))
    other = SenderDir(data, "h:2", 1)
    other.ensure()
    other.write_state({"uuid": "f" * 32})
    with pytest.raises(StateError, match="different UUIDs"):
        load_uuid(data)
    assert load_uuid(data, given="F" * 32)[0] == "f" * 32


MESSAGES = [
    P.Begin(3, bytes(range(16)), 0xABC, 0xDEF, P.FLAG_RESYNC, "us", 86_400_000, 5, bytes(32), 1, 2, 300, "edge-1"),
    P.State(2, 0xDEF, True, 5, b"\x01" * 32),
    P.Schema(b'{"tables":{"cpu":{"x":"float"}}}'),
    P.SchemaEnd(1), P.SchemaOk(), P.ListRequest(),
    P.ListPart((entry("cpu"), entry("mem", -3, 1 << 40, 0xFFFFFFFF, "data/mem/b-3-v9.parquet"))),
    P.ListEnd(2, b"\x02" * 32),
    P.Delete((entry("cpu"),)), P.Offer((P.FileEntry(4, "t", 1, 2, 3, 4, "n"),)),
    P.Want(((0, P.WANT_SEND, 17), (1, P.WANT_LOADED, 0), (2, P.WANT_RECEIVED, 0))),
    P.Data(4, 1 << 20, 123), P.Result(4, P.RESULT_BAD, "checksum"), P.Loaded(90, 2, (0, 1), (5,)),
    P.End(2, 1), P.Done(3, 5, b"\x03" * 32), P.Error(4, "table cpu belongs to sender x"),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_a_record_frame(msg):
    rec = _rec.decode_record(P.encode(msg), 0, P.MAX_FRAME_PAYLOAD_BYTES)
    assert P.decode(rec) == msg


@pytest.mark.parametrize("msg_type, payload, why", [
    (P.ShipMsg.WANT, b"\x01\x00\x00\x00", "WANT"),
    (P.ShipMsg.OFFER, b"\x01\x00\x00\x00" + b"\x00" * 10, "entry cut short"),
    (P.ShipMsg.OFFER, b"\xff\xff\x00\x00", "entries"),
    (P.ShipMsg.BEGIN, b"\x00" * 5, "BEGIN"),
    (P.ShipMsg.DATA, b"\x00" * 15, "DATA"),
    (99, b"", "unknown ship message type"),
])
def test_malformed_payloads_are_refused(msg_type, payload, why):
    rec = _rec.decode_record(_rec.encode_record(msg_type, 0, 0, payload), 0, P.MAX_FRAME_PAYLOAD_BYTES)
    with pytest.raises(FrameError, match=why):
        P.decode(rec)


def test_a_file_replaced_by_a_flush_before_the_snapshot_waits_for_the_next_round(tmp_path):
    """The manifest named two files; a flush replaced one before it was hard-linked: the
    round ships the other, and the snapshot holds a link (not a copy) of what it ships."""
    from vrepl.ship.sender import Sender, SenderOptions

    data = str(tmp_path / "vg1")
    os.makedirs(os.path.join(data, "data", "a"))
    kept = os.path.join(data, "data", "a", "b0-v1.parquet")
    with open(kept, "wb") as fh:
        fh.write(b"x" * 100)
    a = entry("a", size=100, name="data/a/b0-v1.parquet")
    gone = entry("b", size=100, name="data/b/b0-v1.parquet")
    s = Sender(SenderOptions(data=data, addresses=[("127.0.0.1", 1)], receiver="h:1", sender_id=1, secret=b"s"))
    s.sdir.ensure()
    new = [a, gone]
    snap = s._snapshot(new, {a.key: a, gone.key: gone})
    assert new == [a] and set(snap) == {a.key}
    assert os.stat(snap[a.key]).st_ino == os.stat(kept).st_ino


def _manifest(data: str, files: list[P.FileEntry]) -> None:
    from vrepl.vnode.files import ArchivedFile, Manifest
    m = Manifest("ms", 864_000_000, archived_version=len(files), archived_epoch=1)
    for k, e in enumerate(files):
        m.schemas[e.table] = {"v": "int"}
        m.files.append(ArchivedFile(e.name, e.size, e.magic, e.table, e.bucket, 0, 1, k + 1, k + 1, e.rows))
    m.sort()
    os.makedirs(os.path.join(data, "data"), exist_ok=True)
    with open(os.path.join(data, "data", "manifest.json"), "wb") as fh:
        fh.write(m.to_bytes())


def test_the_selection_memo_skips_the_diff_only_for_the_same_two_files(tmp_path, monkeypatch):
    """unchanged.json (docs/ship.md §4.1) says "this manifest against this list selects
    nothing": a round with both files byte for byte the same parses neither; a changed
    manifest, a changed list or a damaged memo diffs in full, as without it."""
    from vrepl.ship import select
    from vrepl.ship.state import SELECTION_MEMO

    data = str(tmp_path / "vg1")
    a, b = entry("a", name="data/a/b0-v1.parquet"), entry("b", name="data/b/b0-v1.parquet")
    _manifest(data, [a, b])
    sdir = SenderDir(data, "h:1", 1)
    sdir.ensure()
    sdir.write_last(FileList({a.key: a, b.key: b}, 3, 0x33))
    sel = select.Selection(sdir, data)
    assert not sel.unchanged and sel.diff() == ([], [])
    sdir.write_memo(sel.manifest_fp, sel.list_fp, sel.last_summary(), sel.precision, sel.file_span_ms)

    parsed = []
    real = select.Manifest.from_bytes
    monkeypatch.setattr(select.Manifest, "from_bytes", lambda raw, path: parsed.append(path) or real(raw, path))
    sel = select.Selection(sdir, data)
    assert sel.unchanged and sel.diff() == ([], []) and parsed == []
    summary = sel.last_summary()
    assert (summary.files, summary.seq, summary.round_id) == (2, 3, 0x33)
    assert summary.digest == sdir.read_last().digest() and (sel.precision, sel.file_span_ms) == ("ms", 864_000_000)
    assert parsed == [] and sel._last is None           # nothing parsed for all of that

    c = entry("c", name="data/c/b0-v1.parquet")           # a flush archived a new file
    _manifest(data, [a, b, c])
    sel = select.Selection(sdir, data)
    assert not sel.unchanged and sel.diff() == ([], [c]) and len(parsed) == 1

    _manifest(data, [a, b])                               # the manifest as it was, the list not
    sdir.write_last(FileList({a.key: a}, 4, 0x44))
    sel = select.Selection(sdir, data)
    assert not sel.unchanged and sel.diff() == ([], [b])

    sdir.write_last(FileList({a.key: a, b.key: b}, 3, 0x33))   # both as memoized, memo damaged
    sel = select.Selection(sdir, data)
    assert sel.unchanged
    with open(sdir.p(SELECTION_MEMO), "r+b") as fh:
        fh.truncate(20)
    sel = select.Selection(sdir, data)
    assert not sel.unchanged and sel.diff() == ([], [])
