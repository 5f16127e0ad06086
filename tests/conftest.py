"""The suite leaves nothing in the temporary directory.

Each test session runs with its own TMPDIR, a fresh `vrepl-tests-*` directory made in the
temporary directory the suite was started with, so what any test, fixture or process it
starts creates through `tempfile` (or Spark's JVM, which vrepl points at TMPDIR) lands
there. At the end of the session the check below fails, naming the entries, if anything
but pytest's own `pytest-of-<user>` (tmp_path) is left in it; after a session without
failures the whole directory is removed. After a failed session pytest-of-<user> stays for
inspection (the path is printed), as pytest keeps tmp_path after failures.

It also marks as `slow` every test of the directories that start clusters of processes, Spark
or long fault runs (SLOW_DIRS), so `python3 -m pytest -m "not slow"` is the inner loop the
README describes; single tests that take seconds elsewhere carry `@pytest.mark.slow` themselves.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_state: dict[str, object] = {}

# Directories whose tests start `vrepl node` clusters, Spark, or chaos and fuzz campaigns.
SLOW_DIRS = frozenset({"chaos", "integration", "spark", "fuzz"})
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        rel = os.path.relpath(str(item.path), _TESTS_DIR)
        if rel.split(os.sep, 1)[0] in SLOW_DIRS:
            item.add_marker(pytest.mark.slow)


def pytest_configure(config: pytest.Config) -> None:
    session_tmp = tempfile.mkdtemp(prefix="vrepl-tests-")
    _state["dir"] = session_tmp
    _state["old_tmpdir"] = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = session_tmp
    tempfile.tempdir = None              # gettempdir() reads TMPDIR again


def leftovers(session_tmp: str) -> list[str]:
    """Entries of the session's TMPDIR that are not pytest's own tmp_path tree."""
    return sorted(name for name in os.listdir(session_tmp) if not name.startswith("pytest-of-"))


@pytest.fixture(scope="session", autouse=True)
def tmpdir_left_clean():
    """Fails the session if it left entries in its TMPDIR (set up first, so checked last)."""
    yield
    session_tmp = str(_state["dir"])
    left = leftovers(session_tmp)
    if left:
        pytest.fail(f"the test session left {len(left)} entries in its TMPDIR {session_tmp}:"
                    f" {', '.join(left[:20])}", pytrace=False)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _state["failed"] = exitstatus != 0


def pytest_unconfigure(config: pytest.Config) -> None:
    session_tmp = _state.get("dir")
    if not isinstance(session_tmp, str):
        return
    old = _state.get("old_tmpdir")
    if old is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = str(old)
    tempfile.tempdir = None
    if _state.get("failed"):
        print(f"\nthe session's temporary files (failed run): {session_tmp}")
    else:
        shutil.rmtree(session_tmp, ignore_errors=True)
