"""Installing what a peer needs, through the ordinary package clients, or saying why not.

Each function returns None when the requirement is met (installing it if it can), or a one-line
reason for skipping the peer. It never raises for a missing package: a peer that cannot be
installed is skipped with that reason in the table, the JSON and the console.
"""
from __future__ import annotations

import importlib
import os
import shutil
import subprocess

from vrepl.child import python_argv

_apt_updated = False


def _apt_install(package: str) -> tuple[bool, str]:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", package]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode == 0, (proc.stderr or proc.stdout).strip().splitlines()[-1:]


def ensure_apt(package: str, binary: str, allow_install: bool = True) -> str | None:
    """The Debian package's binary on PATH: None if present or installed now, else why not.
    Runs `apt-get update` once per harness run, only if the first install attempt fails.
    Debian's maintainer scripts may try to start the packaged service; in containers
    policy-rc.d usually forbids it, and the harness never uses the packaged service (it starts
    its own servers on free ports) nor touches it."""
    global _apt_updated
    if shutil.which(binary):
        return None
    if not allow_install:
        return f"{binary} not found and --no-install given (apt-get install {package})"
    if os.geteuid() != 0:
        return f"{binary} not found; not root, so not installing (apt-get install {package})"
    if not shutil.which("apt-get"):
        return f"{binary} not found and no apt-get on this machine (package {package})"
    print(f"[install] apt-get install {package}", flush=True)
    ok, why = _apt_install(package)
    if not ok and not _apt_updated:
        _apt_updated = True
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=600)
        ok, why = _apt_install(package)
    if not ok:
        return f"apt-get install {package} failed: {' '.join(why)}"
    if not shutil.which(binary):
        return f"package {package} installed but no {binary} on PATH"
    return None


def ensure_pip(module: str, dist: str, allow_install: bool = True) -> str | None:
    """The Python module importable: None if it is or was installed now, else why not."""
    try:
        importlib.import_module(module)
        return None
    except ImportError:
        pass
    if not allow_install:
        return f"Python module {module} missing and --no-install given (pip install {dist})"
    print(f"[install] pip install {dist}", flush=True)
    proc = subprocess.run(python_argv("-m", "pip", "install", "-q", dist),
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        return f"pip install {dist} failed: {' '.join(last)}"
    importlib.invalidate_caches()
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return f"pip install {dist} succeeded but import {module} fails: {exc}"
    return None


def tool_version(argv: list[str]) -> str:
    """First line of a tool's version output, or '?'."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    return lines[0].strip() if lines else "?"
