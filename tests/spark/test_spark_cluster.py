"""The job on a real Spark standalone cluster (issue 6, Deliver 5): tools/spark_cluster.sh
starts a master and a worker on 127.0.0.1 from the installed pyspark, spark-submit runs the
validation on it, and the script stops both by PID, also when the test fails.

Marked `cluster` (it runs in the normal suite; `-m "not cluster"` leaves it out).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sparkdata import SKIP

from vrepl.child import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "spark_cluster.sh")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
def test_spark_submit_to_standalone_cluster(replicas, tmp_path):
    import pyspark

    from vrepl.spark.session import log4j2_config_path
    state = tmp_path / "cluster"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    pids = []
    try:
        started = subprocess.run([SCRIPT, "start", "--dir", str(state), "--port",
                                  str(free_port()), "--cores", "2", "--memory", "1g"],
                                 capture_output=True, text=True, timeout=180, env=env)
        assert started.returncode == 0, started.stderr[-2000:]
        url = started.stdout.strip()
        assert url.startswith("spark://127.0.0.1:")
        pids = [int((state / f"{n}.pid").read_text()) for n in ("master", "worker")]
        assert all(alive(p) for p in pids)

        spark_submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
        entry = subprocess.run([sys.executable, "-m", "vrepl.spark.submit"],
                               capture_output=True, text=True, check=True).stdout.strip()
        out = tmp_path / "report"
        job = subprocess.run(
            [spark_submit, "--master", url,
             "--conf", "spark.driver.host=127.0.0.1",
             "--conf", "spark.driver.bindAddress=127.0.0.1",
             "--conf", "spark.ui.enabled=false",
             "--conf", "spark.executor.memory=512m",
             "--driver-java-options", f"-Dlog4j2.configurationFile=file:{log4j2_config_path(directory=str(tmp_path))}",
             entry, *replicas, "--out", str(out), "--json"],
            capture_output=True, text=True, timeout=240,
            env=dict(env, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_DRIVER_PYTHON=sys.executable))
        assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-3000:]
        doc = json.loads(job.stdout)
        assert doc["result"] == "agree" and doc["master"] == url
        assert "\tat " not in job.stderr and "Traceback" not in job.stderr
    finally:
        stopped = subprocess.run([SCRIPT, "stop", "--dir", str(state)], capture_output=True,
                                 text=True, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
    assert pids and not any(alive(p) for p in pids)
