"""vrepl/dirlock.py: one holder per directory, the holder's pid in the lock file, the
refusal as one line; released by release() (or the process's end, tested with real
processes in tests/integration/test_one_process_per_dir.py)."""
from __future__ import annotations

import os

import pytest

from vrepl.dirlock import LOCK_NAME, DirInUseError, lock_dir
from vrepl.errors import VreplError


def test_lock_writes_the_holder_and_refuses_a_second_taker(tmp_path):
    d = tmp_path / "data"
    with lock_dir(str(d), "vrepl node 3"):
        assert (d / LOCK_NAME).read_text() == f"{os.getpid()} vrepl node 3\n"
        # flock belongs to the open file: even this process's second open is refused.
        with pytest.raises(DirInUseError) as exc:
            lock_dir(str(d), "vrepl restore")
        err = exc.value
        assert isinstance(err, VreplError) and isinstance(err, RuntimeError)
        assert err.pid == os.getpid() and err.path == str(d)
        assert str(err) == (f"{d} is in use by another process (pid {os.getpid()}, vrepl node 3):"
                            " one process per data directory; stop it first")
        assert (d / LOCK_NAME).read_text() == f"{os.getpid()} vrepl node 3\n"  # untouched
    with lock_dir(str(d), "vrepl replay") as again:                # released: free again
        assert (d / LOCK_NAME).read_text() == f"{os.getpid()} vrepl replay\n"
        again.release()
        again.release()                                             # idempotent


def test_a_holder_that_wrote_nothing_yet_is_named_pid_unknown():
    err = DirInUseError("/d", "")
    assert err.pid is None and "(pid unknown)" in str(err)
