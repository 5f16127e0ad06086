"""The shared log format of the node and the arbitrator (vrepl/logsetup.py): text and JSON
lines, the fields taken from the `vgX nY eZ:` prefix or from `extra=`, ISO times with
milliseconds and zone, and reopening the file after logrotate renamed it."""
from __future__ import annotations

import io
import json
import logging
import os
import re

import pytest

from vrepl.logsetup import reopen_logs, setup_logging

ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d$")


@pytest.fixture(autouse=True)
def restore_root_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def lines_of(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_take_vgroup_node_epoch_from_the_prefix_or_extra():
    out = io.StringIO()
    setup_logging(level="INFO", log_format="json", node=4, stream=out)
    logging.getLogger("vrepl.sync").info("vg7 n2 e3: role %s -> %s", "unsynced", "master",
                                         extra={"event": "role_change", "role": "master", "previous_role_ms": 12})
    logging.getLogger("vrepl.node").warning("vg9: recovered")
    logging.getLogger("vrepl.arbitrator").info("arbitrator: vg5 n1 e2: granted",
                                               extra={"event": "grant", "vgroup": 5, "node": 1, "epoch": 2})
    logging.getLogger("vrepl.transport").debug("vg1 n1 e1: filtered out")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("vrepl.node").exception("node 4: failed")
    a, b, c, d = lines_of(out)
    assert a == {"time": a["time"], "level": "INFO", "logger": "vrepl.sync", "node": 2, "vgroup": 7, "epoch": 3,
                 "event": "role_change", "message": "vg7 n2 e3: role unsynced -> master", "role": "master",
                 "previous_role_ms": 12}
    assert ISO_MS.match(a["time"])
    assert (b["vgroup"], b["node"], b["epoch"], b["event"], b["level"]) == (9, 4, None, "node", "WARNING")
    assert (c["vgroup"], c["node"], c["epoch"], c["event"]) == (5, 1, 2, "grant")
    assert d["event"] == "node" and "ValueError: boom" in d["exception"]


def test_text_lines_carry_an_iso_time_level_and_logger():
    out = io.StringIO()
    setup_logging(level="DEBUG", log_format="text", stream=out)
    logging.getLogger("vrepl.replica").debug("vg1 n1 e1: hello")
    stamp, level, name, rest = out.getvalue().rstrip("\n").split(" ", 3)
    assert ISO_MS.match(stamp) and (level, name, rest) == ("DEBUG", "vrepl.replica", "vg1 n1 e1: hello")


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="log_format 'xml'"):
        setup_logging(log_format="xml")


def test_reopen_after_rename_writes_a_new_file(tmp_path):
    path = str(tmp_path / "node.log")
    setup_logging(log_file=path, log_format="json")
    log = logging.getLogger("vrepl.node")
    log.info("before")
    os.rename(path, path + ".1")
    log.info("after the rename, before the reopen")   # still the renamed file (logrotate's rule)
    assert reopen_logs() is True
    log.info("after")
    assert [e["message"] for e in map(json.loads, open(path + ".1"))] == [
        "before", "after the rename, before the reopen"]
    assert [e["message"] for e in map(json.loads, open(path))] == ["after"]


def test_reopen_on_a_stream_is_a_no_op():
    setup_logging(stream=io.StringIO())
    assert reopen_logs() is False
