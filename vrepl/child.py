"""Python child processes on this machine: how vrepl starts them, the loopback ports they
listen on, and waiting for them.

Owns: the interpreter's command line for every Python child vrepl starts (`python_argv`;
`node_argv` for a `vrepl node --config` process: the demo's and the load generator's nodes,
test, chaos and benchmark nodes), starting one that dies with its parent (`start_child`,
`start_node`: the one way a node process is started), free loopback ports
(`free_port`, `free_ports`) and polling a condition under a deadline (`wait_for`).
`-P` (Python >= 3.11) keeps the current directory (with `-m`) and the script's directory
off the child's sys.path, so the child imports the same installed vrepl as its parent even
when started from a clone's root, whose unbuilt `vrepl/` would otherwise shadow it.
Must not: bind or connect anywhere but loopback, or import anything of vrepl (every layer,
tests and benchmarks use it).
"""
from __future__ import annotations

import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from typing import IO, Any, Callable, Sequence, TypeVar

LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1
T = TypeVar("T")


def python_argv(*args: str) -> list[str]:
    """[python, -P, *args] for subprocess: this interpreter, no current directory on sys.path."""
    return [sys.executable, "-P", *args]


def node_argv(config_path: str, *, console_script: bool = False) -> list[str]:
    """The command line of `vrepl node --config PATH` (docs/operations.md): `python -P -m
    vrepl.cli node ...`, or with `console_script` the installed `vrepl` script beside this
    interpreter (what an operator runs) when there is one."""
    script = os.path.join(os.path.dirname(sys.executable), "vrepl")
    head = [script] if console_script and os.access(script, os.X_OK) else python_argv("-m", "vrepl.cli")
    return [*head, "node", "--config", config_path]


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux PR_SET_PDEATHSIG;
    elsewhere nothing). Runs in the child: as a preexec_fn, or first thing in its main()."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def start_child(argv: Sequence[str], *, stderr_path: str | None = None, stdin: Any = subprocess.DEVNULL,
                stdout: Any = subprocess.DEVNULL, text: bool = False, new_session: bool = True,
                cwd: str | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start `argv` so that it dies with this process; stderr appended to `stderr_path`
    (None: inherited). `new_session`: its own process group, so a terminal's Ctrl-C reaches
    only the parent, which stops it. `text`: line-buffered text pipes."""
    err: IO[bytes] | None = open(stderr_path, "ab") if stderr_path else None
    try:
        return subprocess.Popen(list(argv), stdin=stdin, stdout=stdout, stderr=err, text=text,
                                bufsize=1 if text else -1, preexec_fn=die_with_parent,
                                start_new_session=new_session, cwd=cwd, env=env)
    finally:
        if err is not None:
            err.close()           # the child has its own descriptor


def start_node(config_path: str, *, prefix: Sequence[str] = (), console_script: bool = False,
               **kw: Any) -> subprocess.Popen:
    """Start `vrepl node --config config_path` (node_argv), behind `prefix` (e.g. `ip netns
    exec NS`), with start_child's options."""
    return start_child([*prefix, *node_argv(config_path, console_script=console_script)], **kw)


def _listen_port_range() -> tuple[int, int]:
    """Ports to hand out: those below the kernel's ephemeral range (outgoing connections take
    their local port from that range, so a port picked there can be taken by any connect()
    before the child binds it: the "address already in use" flake). [lo, hi) or (0, 0)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            eph_lo = int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0, 0
    lo = 10000
    return (lo, eph_lo) if eph_lo - lo >= 4096 else (0, 0)


# Ports this process handed out lately: not handed out again while they may still be starting.
_HANDED_OUT: deque[int] = deque(maxlen=2048)
_PICK = random.Random(os.getpid() ^ time.monotonic_ns())


def _bindable(port: int) -> socket.socket | None:
    s = socket.socket()
    try:
        s.bind((LOOPBACK, port))
        return s
    except OSError:
        s.close()
        return None


def free_ports(n: int) -> list[int]:
    """`n` distinct ports that were free on 127.0.0.1 a moment ago (bound together, then
    closed: another process may still take one before the child binds it). Picked at random
    below the ephemeral range when the kernel leaves room there, and never one this process
    handed out lately, so neither a client's outgoing connection nor the previous test's
    node can hold it."""
    lo, hi = _listen_port_range()
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        tries = 0
        while len(ports) < n:
            tries += 1
            if lo and tries <= 200 * n:
                port = _PICK.randrange(lo, hi)
                if port in _HANDED_OUT or port in ports:
                    continue
                s = _bindable(port)
            else:  # no room below the ephemeral range (or unlucky): let the kernel pick
                s = _bindable(0)
            if s is None:
                continue
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    _HANDED_OUT.extend(ports)
    return ports


def free_port() -> int:
    """One port that was free on 127.0.0.1 a moment ago."""
    return free_ports(1)[0]


def wait_for(what: str, cond: Callable[[], T], timeout_s: float = 20.0, poll_s: float = 0.02, *,
             check: Callable[[], None] | None = None, detail: Callable[[], str] | None = None) -> T:
    """Poll `cond` until it returns something truthy and return that; TimeoutError "not
    within <timeout_s> s: <what>[; <detail()>]" after `timeout_s`. `check` runs each round
    and may raise sooner (a child that exited, say)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        if check is not None:
            check()
        if time.monotonic() > deadline:
            more = f"; {detail()}" if detail is not None else ""
            raise TimeoutError(f"not within {timeout_s} s: {what}{more}")
        time.sleep(poll_s)
