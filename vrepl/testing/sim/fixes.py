"""Proposed fixes for the core bugs the simulator found, applied in-process on request.

STATUS: fixes 1 and 2 below are now part of vrepl/replica/; assumed_fixes() is a
no-op kept so that `--assume-fixes` in recorded commands still works.

Owns: `assumed_fixes()`, a context manager that patches `vrepl.replica.Replica` for the
duration of a run (`--assume-fixes`), so a campaign can look past the known bugs for the
next one, and so the proposed rules are shown to hold under the same faults. The real
fix belongs in vrepl/replica/ (not edited from here); see docs/simulation.md §Findings.

1. restart-epoch: a replica that starts from disk with a promise for ITSELF must announce a
   new epoch before it can be master again. Its WAL may have lost (un-fsynced tail) records
   it wrote as master of that epoch while a slave still holds them; reusing the epoch would
   write a different record at the same (epoch, version) (election.decide only refuses reuse
   when the log itself shows a record of the epoch).
2. truncate-then-elect: a replica whose TruncateWalAfter has not completed (TruncateDone) must
   not announce itself or become master: its log end still counts records it is discarding,
   and TruncateDone would later rewind a master's log.

Must not: be used by anything but the simulator and its tests.
"""

from __future__ import annotations

import contextlib




@contextlib.contextmanager
def assumed_fixes():
    """Both fixes have landed in vrepl/replica/ (`_own_promise_from_disk`, and no
    candidacy while `truncating_to` is set), so there is nothing left to patch: the flag is
    kept so that recorded commands still run, and now runs the real core unchanged."""
    yield
