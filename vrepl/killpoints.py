"""Named kill points: places in product code where a test makes the process die (issue 16).

Owns: the registry of kill point names (each registered once, with what has happened and
what has not when the process dies there), arming them, and `killpoint(name)`, which
product code calls at each step of a crash-sensitive sequence. It does nothing unless the
point is armed, so it stays in production code at the cost of one dict lookup.

Arming:
* `VREPL_KILLPOINT=name[@N][:stop][,...]` in the environment of a process (read once, at
  the first call): the process SIGKILLs itself (no cleanup, no flush, no atexit: a real
  crash) the N-th time (default 1st) it reaches `name`. Tests start a real `vrepl node`
  with it, then restart the node without it and check what recovery made of the crash.
  With `:stop` the process SIGSTOPs itself instead (every thread freezes there until a
  SIGCONT): a test changes the world at that exact step, then lets it go on.
* `arm(name, action, hit=1)` in-process (unit tests): `action()` runs instead of the kill,
  typically raising a BaseException of the test's (no `except Exception` on the way may
  swallow the crash); `disarm()` clears everything.

An armed name that no module registered is refused (KeyError with the known names) the
first time any kill point is reached, so a typo cannot make a crash test pass vacuously;
`registered()` lists the names for tests that iterate over them.
Must not: import anything from vrepl (every layer may call it), or do anything observable
while nothing is armed.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Callable

ENV = "VREPL_KILLPOINT"

_registry: dict[str, str] = {}
_armed: dict[str, list] = {}   # name -> [hit number, action / signal / None (kill), hits]
_env_read = False
_lock = threading.Lock()


def register(name: str, doc: str) -> str:
    """Declare a kill point (at import time of the module that has it); returns the name."""
    prev = _registry.get(name)
    if prev is not None and prev != doc:
        raise ValueError(f"kill point {name!r} registered twice with different meanings")
    _registry[name] = doc
    return name


def registered(prefix: str = "") -> dict[str, str]:
    """Registered kill points whose name starts with `prefix`: name -> what it means."""
    return {k: v for k, v in sorted(_registry.items()) if k.startswith(prefix)}


def split_hit(spec: str, where: str) -> tuple[str, int]:
    """`name[@N]` -> (name, N), N 1 when absent; ValueError prefixed by `where` when N is not
    an integer >= 1. The hit-count syntax of every test hook armed from the environment
    (VREPL_KILLPOINT here, VREPL_FAULT_STAGE_FSYNC in vrepl/vnode/stagingfault.py)."""
    name, _, hit = spec.partition("@")
    try:
        n = int(hit) if hit else 1
    except ValueError:
        raise ValueError(f"{where}: the hit count after @ is not an integer") from None
    if n < 1:
        raise ValueError(f"{where}: the hit count must be >= 1")
    return name, n


def parse_spec(text: str) -> dict[str, tuple[int, int]]:
    """`name[@N][:stop],...` -> {name: (N, signal)}; ValueError with the reason when
    malformed."""
    out: dict[str, tuple[int, int]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        spec, _, how = part.partition(":")
        if how not in ("", "kill", "stop"):
            raise ValueError(f"{ENV}: {part!r}: after ':' comes kill or stop")
        sig = signal.SIGSTOP if how == "stop" else signal.SIGKILL
        name, n = split_hit(spec, f"{ENV}: {part!r}")
        out[name] = (n, sig)
    return out


def _read_env() -> None:
    global _env_read
    _env_read = True
    for name, (hit, sig) in parse_spec(os.environ.get(ENV, "")).items():
        _armed.setdefault(name, [hit, sig, 0])


def arm(name: str, action: Callable[[], None] | None = None, hit: int = 1) -> None:
    """Arm `name` in this process: at its hit-th reach run `action` (None: SIGKILL)."""
    with _lock:
        _armed[name] = [hit, action, 0]


def disarm() -> None:
    """Forget every armed point (the environment is not read again)."""
    global _env_read
    with _lock:
        _armed.clear()
        _env_read = True


def _check_names() -> None:
    unknown = sorted(n for n in _armed if n not in _registry)
    if unknown:
        raise KeyError(f"{ENV}: unknown kill point(s) {', '.join(unknown)};"
                       f" registered: {', '.join(sorted(_registry))}")


def killpoint(name: str) -> None:
    """Die here if `name` is armed and this is its hit; nothing otherwise."""
    if not _env_read:
        with _lock:
            if not _env_read:
                _read_env()
    if not _armed:
        return
    with _lock:
        _check_names()
        entry = _armed.get(name)
        if entry is None:
            return
        entry[2] += 1
        if entry[2] != entry[0]:
            return
        action = entry[1]
    if callable(action):
        action()
        return
    os.kill(os.getpid(), signal.SIGKILL if action is None else action)
