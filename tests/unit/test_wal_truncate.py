"""WalWriter.truncate_after: discarding a suffix the new master does not have."""
import pytest

from vrepl import wal
from vrepl.errors import VersionError

pytestmark = pytest.mark.timeout(60)


def _writer(path, **kw):
    return wal.WalWriter(str(path), wal.WalOptions(max_file_bytes=1024, group_commit_ms=0), **kw)


@pytest.mark.parametrize("keep", [0, 1, 5, 17, 18, 30, 59, 60])
def test_truncate_after_across_files_then_append(tmp_path, keep):
    w = _writer(tmp_path)
    for i in range(1, 61):
        w.append(f"r{i}".encode() * 4, epoch=1 if i <= 30 else 2)
    assert len(w.files) > 2
    assert w.truncate_after(keep) == keep
    assert w.last_version == keep
    assert w.last_epoch == (0 if keep == 0 else (1 if keep <= 30 else 2))
    # New records continue right after the cut, in a newer epoch.
    w.append(b"new", epoch=3)
    w.close()
    recs = wal.read_records(str(tmp_path))
    assert [r.version for r in recs] == list(range(1, keep + 2))
    assert recs[-1].payload == b"new" and recs[-1].epoch == 3
    assert all(r.payload == f"r{r.version}".encode() * 4 for r in recs[:-1])
    state = wal.verify(str(tmp_path))
    assert state.torn_tail is None and state.last_version == keep + 1
    # Reopening sees the same log.
    w2 = _writer(tmp_path)
    assert (w2.last_version, w2.last_epoch) == (keep + 1, 3)
    w2.close()


def test_truncate_after_at_or_beyond_end_is_noop(tmp_path):
    w = _writer(tmp_path)
    w.append_batch([b"a", b"b", b"c"], epoch=1)
    assert w.truncate_after(3) == 3 and w.truncate_after(10) == 3
    w.close()
    assert len(wal.read_records(str(tmp_path))) == 3


def test_truncate_below_recycled_start_refused(tmp_path):
    w = _writer(tmp_path)
    for i in range(1, 61):
        w.append(b"x" * 40, epoch=1)
    removed = w.recycle(30)
    assert removed
    with pytest.raises(VersionError):
        w.truncate_after(w.first_version - 2)
    w.close()
