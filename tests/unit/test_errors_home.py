"""One home for error types, always-on invariants, one table of exit codes (STYLE.md, three
kinds of error).

Every exception class of the product code (vrepl/ but its test harnesses in vrepl/testing/,
and arbitrator/) is defined in vrepl/errors.py, subclasses VreplError, and, unless it is
only a base of others, the builtin it behaves like. Every process exit code is a name of
vrepl/exitcodes.py, and docs/operations.md lists each code once. Product code checks its own
bugs with `invariant()` or an explicit `raise InvariantViolation`, never `assert` (which
`python -O` removes).
"""
from __future__ import annotations

import ast
import builtins
import inspect
import re
from pathlib import Path

import pytest

import vrepl.errors as E
import vrepl.exitcodes as X

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [p for pkg in ("vrepl", "arbitrator") for p in sorted((ROOT / pkg).rglob("*.py"))
           if "testing" not in p.relative_to(ROOT).parts]

# Error types defined outside vrepl/errors.py: none (the `driver` branch of issue 15 moved
# the sync instance's and the handshake's there; their old modules re-export them). Nothing
# may be added here.
ELSEWHERE: set[tuple[str, str]] = set()
BUILTIN_ERRORS = {v for v in vars(builtins).values()
                  if isinstance(v, type) and issubclass(v, Exception) and v is not Exception}


def exception_classes(path: Path) -> list[str]:
    """Classes in `path` whose bases name an Exception/Error (by name: no import needed)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            names = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
            if any(n.endswith(("Error", "Exception", "Violation")) or n in ("Exception",)
                   or n in E.__dict__ for n in names):
                out.append(node.name)
    return out


def test_every_error_type_is_defined_in_vrepl_errors():
    errors_py = ROOT / "vrepl" / "errors.py"
    elsewhere = {(str(p.relative_to(ROOT)), name) for p in PRODUCT if p != errors_py
                 for name in exception_classes(p)}
    assert elsewhere - ELSEWHERE == set(), "define these in vrepl/errors.py (re-export them where" \
                                           f" they were): {sorted(elsewhere - ELSEWHERE)}"
    assert ELSEWHERE <= elsewhere, f"moved: remove from ELSEWHERE: {ELSEWHERE - elsewhere}"


def vrepl_error_types() -> list[type]:
    return [c for _, c in inspect.getmembers(E, inspect.isclass)
            if issubclass(c, BaseException) and c.__module__ == E.__name__]


@pytest.mark.parametrize("cls", vrepl_error_types(), ids=lambda c: c.__name__)
def test_each_is_a_vrepl_error_and_a_builtin(cls):
    assert issubclass(cls, E.VreplError)
    is_base = any(c is not cls and issubclass(c, cls) for c in vrepl_error_types())
    if cls is not E.VreplError and not is_base:
        assert any(issubclass(cls, b) for b in BUILTIN_ERRORS), \
            f"{cls.__name__} names no builtin it behaves like (ValueError, OSError...)"


def test_the_re_exports_are_the_same_objects():
    from vrepl import client, dirlock
    from vrepl._core import CoreNotBuiltError
    from vrepl._core.window import WindowInvariantError
    from vrepl.replica import InvariantViolation
    from vrepl.restore import errors as restore_errors
    from vrepl.vnode import errors as vnode_errors
    assert restore_errors.DiskFull is E.DiskFull and vnode_errors.ArchiveError is E.ArchiveError
    assert client.OutcomeUnknownError is E.OutcomeUnknownError
    assert dirlock.DirInUseError is E.DirInUseError
    assert InvariantViolation is E.InvariantViolation and CoreNotBuiltError is E.CoreNotBuiltError
    assert issubclass(WindowInvariantError, InvariantViolation)


# Plain asserts left in modules other branches are rewriting (issue 15): `lineproto` (the
# node's write path). {path: how many}; the lead empties this as those branches merge.
ASSERTS_LEFT = {
    "vrepl/node/vgroup.py": 2,          # _write_to_cache_batch(), _confirm()
    "vrepl/node/vgroup_client.py": 1,   # write()
}


def test_product_code_has_no_plain_assert():
    found = {}
    for p in PRODUCT:
        n = sum(isinstance(node, ast.Assert) for node in ast.walk(ast.parse(p.read_text())))
        rel = str(p.relative_to(ROOT))
        if n and not rel.startswith("vrepl/replica/"):   # roles' package: its own final pass
            found[rel] = n
    extra = {k: v for k, v in found.items() if v > ASSERTS_LEFT.get(k, 0)}
    assert not extra, f"use invariant() (vrepl/replica/invariant.py) instead of assert: {extra}"
    fixed = {k: v for k, v in ASSERTS_LEFT.items() if found.get(k, 0) < v}
    assert not fixed, f"fewer asserts now, lower ASSERTS_LEFT: {fixed}"


# -- exit codes -------------------------------------------------------------------------------

def test_documented_exit_codes_keep_their_values():
    # Operators' scripts and systemd units (Restart= except after 2) depend on these numbers.
    assert (X.EXIT_OK, X.EXIT_FAILED, X.EXIT_USAGE, X.EXIT_INTERRUPTED, X.EXIT_PEER,
            X.EXIT_UNSAFE_NAME, X.EXIT_DISK_FULL, X.EXIT_SOURCE_CHANGING, X.EXIT_IN_USE) == \
        (0, 1, 2, 3, 4, 5, 6, 7, 8)
    names = {k: v for k, v in vars(X).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert sorted(names.values()) == sorted(X.EXIT_CODES), "every code is in EXIT_CODES once"


def test_no_other_module_defines_exit_codes():
    found = []
    for p in PRODUCT:
        if p.name == "exitcodes.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Assign):
                found += [f"{p.relative_to(ROOT)}:{node.lineno} {t.id}" for t in node.targets
                          if isinstance(t, ast.Name) and t.id.startswith("EXIT_")]
    assert not found, f"exit codes belong in vrepl/exitcodes.py: {found}"


def exit_table(text: str) -> list[tuple[int, str]]:
    section = text.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    return [(int(m.group(1)), m.group(2))
            for m in re.finditer(r"^\| (\d+) \| `(EXIT_\w+)` \|", section, re.M)]


def test_operations_md_lists_every_code_once_by_its_name():
    rows = exit_table((ROOT / "docs" / "operations.md").read_text())
    assert sorted(code for code, _ in rows) == sorted(X.EXIT_CODES)
    for code, name in rows:
        assert getattr(X, name) == code, f"docs/operations.md: {name} is not {code}"


def test_no_other_page_has_an_exit_code_table():
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name == "operations.md":
            continue
        heads = re.findall(r"^\|\s*(?:exit|code)\s*\|", page.read_text(), re.M | re.I)
        assert not heads, f"{page.name}: exit codes are listed once, in docs/operations.md"
