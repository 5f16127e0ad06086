"""Proposed fixes for the core bugs the simulator found, applied in-process on request.

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
import dataclasses

from vrepl.replica import replica as _replica_mod
from vrepl.replica.election import Verdict
from vrepl.replica.messages import NO_NODE

Replica = _replica_mod.Replica


@contextlib.contextmanager
def assumed_fixes():
    orig_init = Replica.__init__
    orig_input = Replica._election_input
    orig_promise = Replica._promise
    orig_apply = Replica._apply

    def __init__(self, config):
        orig_init(self, config)
        self._sim_stale_own_promise = config.promised_epoch > 0 and config.promised_master == self.node

    def _election_input(self):
        inp = orig_input(self)
        if getattr(self, "_sim_stale_own_promise", False):
            views = list(inp.views)
            views[self.me] = dataclasses.replace(views[self.me], promised_master=NO_NODE)
            inp = dataclasses.replace(inp, views=tuple(views))
        return inp

    def _promise(self, epoch, master):
        self._sim_stale_own_promise = False
        return orig_promise(self, epoch, master)

    def _apply(self, d):
        if self.truncating_to is not None and d.verdict in (Verdict.ANNOUNCE, Verdict.BECOME_MASTER, Verdict.REQUEST_GRANT):
            if self.role in (_replica_mod.Role.SLAVE, _replica_mod.Role.SYNCING):
                self._become_unsynced(f"no online master: {d.reason}")
            return False
        return orig_apply(self, d)

    Replica.__init__, Replica._election_input, Replica._promise, Replica._apply = (
        __init__, _election_input, _promise, _apply)
    try:
        yield
    finally:
        Replica.__init__, Replica._election_input, Replica._promise, Replica._apply = (
            orig_init, orig_input, orig_promise, orig_apply)
