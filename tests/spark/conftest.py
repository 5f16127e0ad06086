"""Fixtures of the Spark validation tests: one shared SparkSession (local[2]) for the whole
session, and three identical replicas copied from one vnode data path (sparkdata.py).

Skips (with the reason) only when Java or pyspark is missing; CI installs both.
"""
from __future__ import annotations

import pytest

from sparkdata import SKIP, build_replica, copies


def pytest_configure(config):
    config.addinivalue_line("markers", "cluster: starts a Spark standalone master and worker"
                                       " (tools/spark_cluster.sh); runs in the normal suite")


@pytest.fixture(scope="session")
def base_replica(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("base") / "n1")
    build_replica(path)
    return path


@pytest.fixture
def replicas(base_replica, tmp_path) -> list[str]:
    """Three identical replicas (copies of one vnode's data path)."""
    return copies(base_replica, str(tmp_path))


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    if SKIP:
        pytest.skip(SKIP)
    from vrepl.spark.session import start_session, stop_jvm
    log = str(tmp_path_factory.mktemp("spark") / "spark.log")
    session = start_session("local[2]", log_path=log)
    yield session
    session.stop()
    stop_jvm()    # its temporary directories (in the session's TMPDIR) go with it
