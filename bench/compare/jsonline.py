"""Talking to a benchmark node process over its stdin/stdout, one JSON object per line.

Owns: the request/reply and shutdown steps shared by the PySyncObj and vrepl library-level
drivers and bench/scaling.py, whose node processes run the writer loops themselves; on the
node side, `serve`, the command loop of those node processes.
"""
from __future__ import annotations

import json
import subprocess
import sys
import traceback
from collections.abc import Callable


def serve(handlers: dict[str, Callable[[dict], dict]]) -> None:
    """The node side: read one command per line from stdin, answer each with one line on
    stdout, until {"cmd": "quit"} or the end of stdin. An unknown command or a handler's
    exception is answered {"error": ...} and the loop goes on."""
    out = sys.stdout
    for line in sys.stdin:
        try:
            msg = json.loads(line)
            cmd = msg["cmd"]
            if cmd == "quit":
                break
            handler = handlers.get(cmd)
            reply = handler(msg) if handler else {"error": f"unknown command {cmd!r}"}
        except Exception:
            reply = {"error": traceback.format_exc(limit=5)}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def ask(proc: subprocess.Popen, msg: dict, who: str) -> dict:
    """Send one command, wait for its one-line reply; RuntimeError if the node died or
    answered with an error."""
    proc.stdin.write((json.dumps(msg) + "\n").encode())
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{who} node exited (status {proc.poll()})")
    reply = json.loads(line)
    if "error" in reply:
        raise RuntimeError(f"{who} node: {reply['error']}")
    return reply


def quit_all(procs: list[subprocess.Popen], kill_on_timeout: bool = False) -> None:
    """Ask every node to quit, then wait up to 5 s for each (killing it if asked to; the
    harness otherwise kills the process group)."""
    for p in procs:
        try:
            p.stdin.write(b'{"cmd": "quit"}\n')
            p.stdin.close()
        except OSError:
            pass
    for p in procs:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            if kill_on_timeout:
                p.kill()
        if p.stdout:
            p.stdout.close()
