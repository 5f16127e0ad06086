"""Logging of the vrepl processes (`vrepl node`, `vrepl-arbitrator`): one format for both.

Owns: the root handler of a process (a log file that `reopen()` reopens, for logrotate's
SIGHUP, or stderr), the two line formats (`text`, `json`; docs/operations.md §Logs) and the
fields every JSON line carries: time (ISO-8601, milliseconds, zone), level, logger, node,
vgroup, epoch, event, message, plus whatever a call passes in `extra=`.
vgroup, node and epoch come from `extra=` when given, else from the `vg7 n2 e3:` prefix that
every replication log line starts with (docs/embedding.md §Observability); `node` defaults to
the process's own node id. `event` is the call's `extra={"event": ...}`, else the logger's
last name (`sync`, `replica`, `transport`, ...).
Must not: import the rest of vrepl (every layer logs through it), or do work for a record
its level filters out.
"""
from __future__ import annotations

import json
import logging
import re
import sys
import threading
from datetime import datetime
from typing import IO, Any

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

_PREFIX = re.compile(r"(?:arbitrator: )?vg(?P<vgroup>\d+)(?: n(?P<node>\d+))?(?: e(?P<epoch>\d+|-))?[:\s]")
# Attributes every LogRecord has: anything else on a record came from `extra=`.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime",
                                                                                   "taskName"}
_FIELDS = ("time", "level", "logger", "node", "vgroup", "epoch", "event", "message")


def iso_time(created: float) -> str:
    """2026-03-01T12:34:56.789+01:00: local time with milliseconds and the zone's offset."""
    return datetime.fromtimestamp(created).astimezone().isoformat(timespec="milliseconds")


def record_fields(record: logging.LogRecord, default_node: int | None) -> dict[str, Any]:
    """The JSON fields of one record (docs/operations.md §Logs)."""
    message = record.getMessage()
    extra = {k: v for k, v in record.__dict__.items() if k not in _STANDARD}
    vgroup = extra.pop("vgroup", None)
    node = extra.pop("node", None)
    epoch = extra.pop("epoch", None)
    m = _PREFIX.match(message)
    if m is not None:
        vgroup = int(m["vgroup"]) if vgroup is None else vgroup
        if node is None and m["node"]:
            node = int(m["node"])
        if epoch is None and m["epoch"] and m["epoch"] != "-":
            epoch = int(m["epoch"])
    out: dict[str, Any] = {
        "time": iso_time(record.created),
        "level": record.levelname,
        "logger": record.name,
        "node": default_node if node is None else node,
        "vgroup": vgroup,
        "epoch": epoch,
        "event": extra.pop("event", None) or record.name.rsplit(".", 1)[-1],
        "message": message,
    }
    for key, value in extra.items():
        if key not in out:
            out[key] = value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
    if record.exc_info:
        out["exception"] = logging.Formatter().formatException(record.exc_info)
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def __init__(self, node: int | None = None) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(record_fields(record, self.node), ensure_ascii=False, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """`2026-03-01T12:34:56.789+01:00 INFO vrepl.sync vg1 n2 e3: ...`"""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return iso_time(record.created)


class ReopenableFileHandler(logging.FileHandler):
    """A log file that `reopen()` closes and opens again by name: after logrotate renamed it,
    new lines go to a new file at the configured path."""

    def reopen(self) -> None:
        self.acquire()
        try:
            old, self.stream = self.stream, self._open()
            if old is not None:
                old.close()
        finally:
            self.release()


_lock = threading.Lock()
_handler: logging.Handler | None = None


def setup_logging(*, level: str = "INFO", log_file: str | None = None, log_format: str = "text",
                  node: int | None = None, stream: IO[str] | None = None) -> logging.Handler:
    """Configure the root logger of this process (replacing any handler); returns the handler.
    `log_file` None logs to `stream` (stderr)."""
    global _handler
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log_format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    handler: logging.Handler
    if log_file:
        handler = ReopenableFileHandler(log_file, encoding="utf-8")
    else:
        handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(node) if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    with _lock:
        _handler = handler
    return handler


def reopen_logs() -> bool:
    """Reopen the log file (SIGHUP, after logrotate moved it). False when logging to a stream."""
    with _lock:
        handler = _handler
    if isinstance(handler, ReopenableFileHandler):
        handler.reopen()
        return True
    return False
