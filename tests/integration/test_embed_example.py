"""tools/embed_example.py, the runnable example of docs/embedding.md, run as a reader would:
it ends well, logs no ERROR, and leaves nothing behind (its temporary directory included)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from vrepl.child import python_argv

EXAMPLE = Path(__file__).resolve().parents[2] / "tools" / "embed_example.py"

pytestmark = pytest.mark.timeout(180)


def test_embed_example_runs_clean_and_leaves_nothing(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    work = tmp_path / "cwd"
    work.mkdir()
    p = subprocess.run(python_argv(str(EXAMPLE), "--records", "3000"), cwd=work,
                       capture_output=True, text=True, timeout=150,
                       env={**os.environ, "TMPDIR": str(tmp)})
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "ERROR" not in out and "Traceback" not in out, out
    assert "3000 records confirmed" in out
    assert "rebuilt v1..v3000 from its WAL, then caught up to v3001 as a slave" in out, out
    assert os.listdir(tmp) == [] and os.listdir(work) == []
