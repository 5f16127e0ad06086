"""What a new user meets first (issue 14): a clone's unbuilt source tree in the current
directory (one line saying so; the `vrepl` command and the children vrepl starts use the
installed package), and `vrepl demo` on a machine without Java (one line before any node
starts). Real processes, as the user runs them."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import vrepl
from vrepl.child import python_argv

pytestmark = pytest.mark.timeout(120)

INSTALLED = Path(vrepl.__file__).resolve().parent


@pytest.fixture
def clone(tmp_path) -> Path:
    """A source tree like a fresh clone's: vrepl/ without the built extensions."""
    root = tmp_path / "clone"
    shutil.copytree(INSTALLED, root / "vrepl",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.c", "*.html"))
    return root


def run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def test_python_m_from_an_unbuilt_tree_is_one_line_naming_it(clone):
    p = run([sys.executable, "-m", "vrepl.cli", "--version"], clone)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"vrepl: error: vrepl was imported from the source tree {clone},")
    assert "run vrepl from another directory" in lines[0] and "pip install -e ." in lines[0]
    # Any other entry point: the same line, no traceback (the exception is uncaught).
    p = run([sys.executable, "-m", "vrepl.restore", "replay", "--wal", "w", "--data", "d"], clone)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines() == lines


def test_children_import_the_installed_package_wherever_they_start(clone):
    p = run(python_argv("-c", "import vrepl.wal, vrepl; print(vrepl.__file__)"), clone)
    assert p.returncode == 0, p.stderr
    assert Path(p.stdout.strip()).resolve().parent == INSTALLED
    p = run(python_argv("-m", "vrepl.cli", "--version"), clone)
    assert p.returncode == 0 and p.stdout.startswith("vrepl "), p.stderr


def test_demo_without_java_says_so_before_starting_anything(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # No java on PATH and no JAVA_HOME (the interpreter is called by its absolute path).
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    p = subprocess.run(python_argv("-m", "vrepl.cli", "demo"), capture_output=True, text=True,
                       timeout=60, env={**env, "PATH": str(tmp_path / "empty"), "TMPDIR": str(tmp)})
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "Java" in lines[0] and "apt-get install openjdk-17-jre-headless" in lines[0]
    assert "--no-spark" in lines[0]
    assert p.stdout == "" and os.listdir(tmp) == []     # no node, no directory
