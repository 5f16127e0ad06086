"""The replication core does no I/O: no module under vrepl/replica imports a network, clock,
randomness or threading module (STYLE.md: events in, actions out)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import vrepl.replica

FORBIDDEN = {"asyncio", "socket", "time", "random", "threading", "select", "selectors"}
PACKAGE = Path(vrepl.replica.__file__).parent
MODULES = sorted(PACKAGE.glob("*.py"))


def imported_roots(source: str) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            if node.args and isinstance(node.args[0], ast.Constant):
                roots.add(str(node.args[0].value).split(".")[0])
    return roots


def test_the_package_has_the_expected_modules():
    names = {p.stem for p in MODULES}
    assert {"election", "messages", "events", "actions", "forward", "replica", "invariant"} <= names


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_no_io_imports(path):
    bad = imported_roots(path.read_text()) & FORBIDDEN
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_the_checker_catches_forbidden_imports():
    # The walk above must not pass vacuously: each import form is detected.
    assert imported_roots("import time") == {"time"}
    assert imported_roots("from asyncio import sleep") == {"asyncio"}
    assert imported_roots("import os.path, socket as s") == {"os", "socket"}
    assert imported_roots("def f():\n    import random\n") == {"random"}
    assert imported_roots("__import__('threading')") == {"threading"}
