"""`vrepl demo` end to end (a short run): 3 node processes, SIGKILL of the master, election,
restart, identical replicas, the closing Spark validation, everything stopped and removed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(180)


def test_demo_short_run(tmp_path):
    base = tmp_path / "demo"
    p = subprocess.run([sys.executable, "-m", "vrepl.cli", "demo", "--rows", "1500",
                        "--batch", "50", "--dir", str(base), "--json"],
                       capture_output=True, text=True, timeout=170)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["ok"] and summary["identical"]
    assert summary["rows_confirmed"] == 3001 == summary["rows_per_replica"]
    assert summary["stop_exit_codes"] == {"1": 0, "2": 0, "3": 0}
    assert "SIGKILL" in p.stdout and "is a slave again" in p.stdout
    # The demo ends with the Spark validation of the three replicas (issue 6).
    if shutil.which("java"):
        assert summary["spark_validation"].startswith("Spark validation: the 3 replicas agree")
    # Nothing left running: every node's pid is gone (the cluster's close() killed any left).
    out = subprocess.run(["pgrep", "-f", str(base)], capture_output=True, text=True)
    assert out.stdout.strip() == ""
    assert os.path.isdir(base)          # --dir given: the demo keeps the caller's directory
