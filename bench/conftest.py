"""Shared data for the micro-benchmarks (pytest-benchmark). Run: see docs/benchmarks.md."""
import os

import numpy as np
import pytest


@pytest.fixture(scope="session")
def payloads_128():
    rng = np.random.default_rng(1)
    return [rng.bytes(128) for _ in range(1000)]


@pytest.fixture(scope="session")
def payloads_4k():
    rng = np.random.default_rng(2)
    return [rng.bytes(4096) for _ in range(256)]


@pytest.fixture(scope="session")
def buffer_64mib():
    return os.urandom(64 * 1024 * 1024)
