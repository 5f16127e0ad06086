"""An arbitrator process on 127.0.0.1 for tests and benchmarks (`vrepl-arbitrator`).

Owns: starting `python -m arbitrator.main` on a free port (and its metrics listener on
another, docs/arbitrator.md §Metrics) with its own secret file and state directory, reading
the ports it chose, and stopping it (SIGTERM, then SIGKILL). Use stop() in
a finally or a fixture: the process never outlives the test.
"""
from __future__ import annotations

import os
import signal
import subprocess

from vrepl.child import python_argv


class ArbitratorProcess:
    def __init__(self, workdir: str, secret: bytes, lease_ms: int = 2000,
                 extra: tuple[str, ...] = ()):
        os.makedirs(workdir, exist_ok=True)
        secret_file = os.path.join(workdir, "secret")
        with open(secret_file, "wb") as fh:
            fh.write(secret)
        self.proc = subprocess.Popen(
            [*python_argv("-m", "arbitrator.main"), "--host", "127.0.0.1", "--port", "0",
             "--secret-file", secret_file, "--state-dir", os.path.join(workdir, "state"),
             "--lease-ms", str(lease_ms), "--log-level", "info", "--metrics-listen", "127.0.0.1:0",
             *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            err = self.stop(signal.SIGKILL)
            raise RuntimeError(f"arbitrator did not start: {line!r} {err}")
        self.port = int(line.rsplit(":", 1)[1])
        self.metrics_url: str | None = None
        if "--metrics-listen" not in extra or extra[extra.index("--metrics-listen") + 1]:
            line = self.proc.stdout.readline()
            if "metrics on" not in line:
                err = self.stop(signal.SIGKILL)
                raise RuntimeError(f"arbitrator metrics did not start: {line!r} {err}")
            self.metrics_url = line.split("metrics on ", 1)[1].strip()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM) -> str:
        """Stop the process; returns what it logged on stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.stderr.read() if self.proc.stderr else ""
