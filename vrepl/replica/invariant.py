"""Always-on invariants for the replication core.

Owns: `invariant(cond, why)` and the exception it raises. A broken invariant is a bug in vrepl,
never an expected condition (a stale message, a peer gone): those are ignored with a logged
reason instead. Unlike `assert`, this check survives `python -O`.
Must not: import anything outside the standard library.
"""

from __future__ import annotations


class InvariantViolation(AssertionError):
    """A vrepl bug: the state machine reached a state its design rules out."""


def invariant(cond: object, why: str) -> None:
    """Raise InvariantViolation(why) unless `cond` is truthy. `why` says what must hold."""
    if not cond:
        raise InvariantViolation(why)
