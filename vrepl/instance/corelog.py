"""Log lines of a sync instance's driver: the replica's (logger `vrepl.replica`, each with
its event name for JSON logs) and the driver's own (logger `vrepl.sync`).

Owns: the table of event names of replica log lines (docs/operations.md §Logs) and the one
function the driver calls for every log line (`log_line`).
Must not: format or filter text beyond the event name (the replica wrote the line).
"""

from __future__ import annotations

import logging

log = logging.getLogger("vrepl.sync")
core_log = logging.getLogger("vrepl.replica")

# Replica log lines (Log actions) that carry an event name in JSON logs (vrepl/logsetup.py):
# the first words of the text after the "vgX nY eZ: " prefix.
_CORE_EVENTS = (
    ("election ", "election"),
    ("became master", "election_won"),
    ("master steps down", "step_down"),
    ("unsynced", "unsynced"),
    ("arbitrator refused", "arbitrator_refused"),
    ("arbitrator lease expired", "lease_expired"),
    ("peer n", "peer"),
    ("restore", "restore"),
    ("truncating", "truncation"),
    ("sync request", "resync"),
)


def core_event(text: str) -> str:
    """The event name of a replica log line (docs/operations.md §Logs), "replica" if none."""
    body = text.split(": ", 1)[-1]
    for start, event in _CORE_EVENTS:
        if body.startswith(start):
            return event
    return "replica"


def log_line(origin: str, level: int, text: str) -> None:
    """The driver's log lines: the replica's (vrepl.replica, with its event name) and the
    driver's own (vrepl.sync: streams, flow control)."""
    if origin == "replica":
        if core_log.isEnabledFor(level):
            core_log.log(level, text, extra={"event": core_event(text)})
    else:
        log.log(level, text)
