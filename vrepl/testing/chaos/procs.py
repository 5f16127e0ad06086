"""The processes of a chaos run: a child whose stdout is JSON event lines (Proc) and a `vrepl
node` whose log file tells its role history (NodeProc) (the harness: vrepl/testing/chaos/harness.py).

Owns: starting a process (dies with the harness, PR_SET_PDEATHSIG), reading its event lines
on a thread, its command pipe, signals, a graceful stop (SIGTERM or "quit", then SIGKILL),
the tail of its stderr, and a node's role lines (ROLE_LINE) read from its log across
restarts.
Must not: open a socket or know the cluster (which node, which fault): ChaosCluster does.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field

from vrepl.child import python_argv, start_child

# The log line of every role change, in the node's text log format: the node's own
# (`vg7 n2: role master, epoch 3, master 2`) or the sync layer's
# (`vg7 n2 e3: role unsynced -> master, epoch 3, master n2 (...)`).
ROLE_LINE = re.compile(r"vg\d+ n\d+(?: e\S+)?: role (?:\w+ -> )?(?P<role>\w+), epoch (?P<epoch>\d+),"
                       r" master (?P<master>n?\d+|none|None)")


def _command(script: str, module: str) -> list[str]:
    """The installed console script (what an operator runs), else `python -P -m module`."""
    path = os.path.join(os.path.dirname(sys.executable), script)
    return [path] if os.access(path, os.X_OK) else python_argv("-m", module)


@dataclass
class Proc:
    """One process of the run: stdout parsed as JSON event lines, stderr to a file."""

    name: str
    argv: list[str]
    stderr_path: str
    stdin: bool = True               # a command pipe (the workload); nodes get /dev/null
    proc: subprocess.Popen | None = None
    events: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    paused: bool = False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.events = []
        self.paused = False
        self.proc = start_child(self.argv, stderr_path=self.stderr_path, text=True, new_session=False,
                                stdin=subprocess.PIPE if self.stdin else subprocess.DEVNULL,
                                stdout=subprocess.PIPE)
        threading.Thread(target=self._reader, args=(self.proc,), daemon=True).start()

    def _reader(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if not isinstance(ev, dict):
                continue
            with self.lock:
                if self.proc is proc:
                    self.events.append(ev)

    def send(self, line: str) -> bool:
        if not self.alive() or not self.stdin:
            return False
        try:
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.events)

    def signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)  # type: ignore[union-attr]

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self.paused = False

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM (a node's graceful stop; the workload's stdin closes too), wait, else
        SIGKILL. The exit code."""
        if not self.alive():
            return self.proc.returncode if self.proc is not None else None
        assert self.proc is not None
        if self.paused:
            self.proc.send_signal(signal.SIGCONT)
            self.paused = False
        if self.stdin:
            self.send("quit")
            try:
                self.proc.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass
        else:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode

    def stderr_tail(self, lines: int = 3) -> str:
        return " | ".join(_read(self.stderr_path).strip().splitlines()[-lines:])


@dataclass
class NodeProc(Proc):
    """A `vrepl node` process and the role lines of its log file (across restarts)."""

    log_path: str = ""
    role_events: list[dict] = field(default_factory=list)
    started_at_event: int = 0        # role_events index where the running process began
    _log_offset: int = 0

    def start(self) -> None:
        self.poll_log()
        self.started_at_event = len(self.role_events)
        super().start()

    def poll_log(self) -> None:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_offset)
                data = fh.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1     # whole lines only
        self._log_offset += end
        for line in data[:end].decode(errors="replace").splitlines():
            m = ROLE_LINE.search(line)
            if m:
                master = m["master"].lstrip("n")
                self.role_events.append({"role": m["role"], "epoch": int(m["epoch"]),
                                         "master": int(master) if master.isdigit() else None})

    def role(self) -> str | None:
        """The latest role the running process logged (None before its first)."""
        self.poll_log()
        current = self.role_events[self.started_at_event:]
        return current[-1]["role"] if current else None


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except FileNotFoundError:
        return ""
