"""Every server the harness starts, and the guarantee that it stops them.

Each server runs in its own session (so its own process group, pgid == pid), is tied to the
harness with PR_SET_PDEATHSIG (so it dies even if the harness is SIGKILLed), and is registered
here. `stop_all()` sends SIGTERM to each group, waits, then SIGKILL; it runs from the harness's
`finally`, from atexit and after SIGTERM/SIGHUP (turned into SystemExit). `leftovers()` then
checks that no group survived and no process still names the harness's work directory.

This module must not kill anything it did not start: it signals only the process groups it
created, by id.
"""
from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from vrepl.child import free_ports, python_argv, start_child  # noqa: F401  (free_ports: drivers')
REPO_ROOT = Path(__file__).resolve().parents[2]


def bench_module_argv(module: str, *args: str) -> list[str]:
    """argv running `python -m <module> args` for a module of bench/ (not installed): the
    child gets no current directory on sys.path (vrepl.child.python_argv) and this
    checkout's root appended after site-packages, so it imports the installed vrepl and
    finds bench here, wherever it was started from."""
    boot = (f"import runpy, sys; sys.path.append({str(REPO_ROOT)!r});"
            f" runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return python_argv("-c", boot, *args)


class ProcessRegistry:
    """The servers of one harness run. Not thread-safe: servers are started from one thread."""

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self._procs: list[tuple[str, subprocess.Popen]] = []
        self._stopped: list[tuple[str, subprocess.Popen]] = []
        self._logs: list = []
        #: prefix of log file names, set by the harness per system and mode ("redis-fsync")
        self.phase = "run"

    def spawn(self, name: str, argv: Sequence[str], *, log_name: str | None = None,
              env: dict | None = None, stdin=None, stdout=None,
              cwd: Path | None = None) -> subprocess.Popen:
        """Start argv in a new session, stderr (and stdout unless given) to a log file in the
        work directory. Returns the Popen; its pid is also its process group id."""
        log_path = self.log_path(log_name or name)
        log = open(log_path, "ab")
        self._logs.append(log)
        proc = start_child(argv, stdin=stdin if stdin is not None else subprocess.DEVNULL,
                           stdout=stdout if stdout is not None else log, stderr_path=str(log_path),
                           env=env, cwd=str(cwd) if cwd else None)
        self._procs.append((name, proc))
        return proc

    def log_path(self, name: str) -> Path:
        return self.workdir / f"{self.phase}-{name}.log"

    def log_tail(self, name: str, n_bytes: int = 2000) -> str:
        path = self.log_path(name)
        try:
            data = path.read_bytes()
        except OSError:
            return ""
        return data[-n_bytes:].decode(errors="replace")

    def names(self) -> list[str]:
        """Names of the servers of the current phase (for their log tails on failure)."""
        return [name for name, _ in self._procs]

    def exited(self) -> list[str]:
        """Names of running-phase servers that have exited (a crash during a run)."""
        return [f"{name} (status {p.returncode})" for name, p in self._procs
                if p.poll() is not None]

    def stop_all(self, timeout_s: float = 5.0) -> None:
        """SIGTERM every group, wait up to timeout_s, SIGKILL what is left, reap. Idempotent."""
        for _, proc in self._procs:
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for _, proc in self._procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for _, proc in self._procs:
            # Kill the whole group even if the leader exited: a server's helpers may remain.
            _signal_group(proc.pid, signal.SIGKILL)
            try:
                proc.wait(2.0)
            except subprocess.TimeoutExpired:
                pass
        for log in self._logs:
            log.close()
        self._logs.clear()
        # Never signal a reaped group again: its id may be reused by an unrelated process.
        # leftovers() still looks for members of these groups.
        self._stopped += [(n, p) for n, p in self._procs if p.poll() is not None]
        self._procs = [(n, p) for n, p in self._procs if p.poll() is None]

    def leftovers(self) -> list[str]:
        """Descriptions of processes that survived stop_all: members of our groups, or any
        process whose command line names our work directory (its unique mkdtemp name, which
        drivers also put in the names of directories they create elsewhere)."""
        out = []
        groups = {p.pid for _, p in self._procs + self._stopped}
        marker = self.workdir.name.encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                pgid = os.getpgid(int(entry))
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                stat = Path(f"/proc/{entry}/stat").read_text()
            except (OSError, ProcessLookupError):
                continue
            if stat.rsplit(")", 1)[-1].split()[0] == "Z":
                continue  # a zombie is not running; its parent will reap it
            if pgid in groups or marker in cmdline:
                text = cmdline.replace(b"\0", b" ").decode(errors="replace")
                out.append(f"pid {entry}: {text}")
        return out


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


_registries: list[ProcessRegistry] = []


def install_exit_handlers(registry: ProcessRegistry) -> None:
    """Stop the registry's servers on normal exit, on an exception, on Ctrl-C (through the
    caller's finally) and on SIGTERM/SIGHUP (turned into SystemExit so finally blocks run)."""
    _registries.append(registry)
    if len(_registries) == 1:
        atexit.register(lambda: [r.stop_all() for r in _registries])

        def on_signal(signum, _frame):
            raise SystemExit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, on_signal)


def wait_port(port: int, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Until something accepts on 127.0.0.1:port; raises RuntimeError on timeout or if proc
    exits first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with status {proc.returncode} before "
                               f"listening on port {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listening on 127.0.0.1:{port} after {timeout_s} s")
            time.sleep(0.05)
