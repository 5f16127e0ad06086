"""Talking to a benchmark node process over its stdin/stdout, one JSON object per line.

Owns: the request/reply and shutdown steps shared by the PySyncObj and vrepl library-level
drivers and bench/scaling.py, whose node processes run the writer loops themselves.
"""
from __future__ import annotations

import json
import subprocess


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
