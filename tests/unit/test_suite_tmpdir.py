"""The suite's TMPDIR check (tests/conftest.py) catches a test that leaves a file behind,
and a clean session leaves nothing: an inner pytest session with the same conftest."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

pytestmark = pytest.mark.timeout(120)


def inner_session(tmp_path: Path, test_body: str) -> tuple[subprocess.CompletedProcess, Path]:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(CONFTEST, project / "conftest.py")
    (project / "test_inner.py").write_text("import tempfile\n\n\ndef test_inner(tmp_path):\n"
                                           f"    {test_body}\n")
    outer_tmp = tmp_path / "tmp"
    outer_tmp.mkdir()
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(project)], cwd=project, capture_output=True,
                       text=True, timeout=100, env={**os.environ, "TMPDIR": str(outer_tmp)})
    return p, outer_tmp


@pytest.mark.slow  # seconds: outside the `-m "not slow"` loop
def test_a_leaking_test_fails_the_session_naming_the_entry(tmp_path):
    p, outer_tmp = inner_session(tmp_path, "tempfile.mkdtemp(prefix='leaked-by-a-test-')")
    assert p.returncode != 0, p.stdout
    assert "left 1 entries" in p.stdout and "leaked-by-a-test-" in p.stdout, p.stdout


@pytest.mark.slow  # seconds: outside the `-m "not slow"` loop
def test_a_clean_session_leaves_nothing(tmp_path):
    p, outer_tmp = inner_session(tmp_path, "(tmp_path / 'x').write_text('in tmp_path')")
    assert p.returncode == 0, p.stdout
    assert os.listdir(outer_tmp) == []
