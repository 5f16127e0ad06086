"""Always-on invariants for the replication core.

Owns: `invariant(cond, why)` (the exception it raises, InvariantViolation, a VreplError and an
AssertionError, lives in vrepl/errors.py). A broken invariant is a bug in vrepl,
never an expected condition (a stale message, a peer gone): those are ignored with a logged
reason instead. Unlike `assert`, this check survives `python -O`.
Must not: import anything but the standard library and vrepl.errors.
"""

from __future__ import annotations

from vrepl.errors import InvariantViolation


def invariant(cond: object, why: str) -> None:
    """Raise InvariantViolation(why) unless `cond` is truthy. `why` says what must hold."""
    if not cond:
        raise InvariantViolation(why)
