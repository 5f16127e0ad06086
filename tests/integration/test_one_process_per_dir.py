"""Refusals of a real `vrepl node` process and of `vrepl restore` / `vrepl replay` run as an
operator would (subprocesses): a data directory another process holds (exit 8, one line
naming the holder's pid, nothing read), an address in use (exit 8, one line naming it),
and `vrepl restore --from` given a node's HTTP port instead of its replication port
(one line, at once). docs/operations.md §Exit codes, docs/restore.md §8."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest

from vrepl.child import python_argv
from vrepl.node.local import LocalCluster

pytestmark = pytest.mark.timeout(120)

EXIT_IN_USE = 8
SECRET = "vrepl-local-secret"     # LocalCluster's default


def vrepl(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(python_argv("-m", "vrepl.cli", *args), capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **env})


def one_line(p: subprocess.CompletedProcess) -> str:
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    return lines[0]


@pytest.fixture
def node(tmp_path):
    """One running single-replica node (vgroup 1), with a few rows written."""
    c = LocalCluster(str(tmp_path / "c"), 1, vgroup=1, quorum=1)
    try:
        c.start()
        c.wait_ready()
        c.wait_master()
        client = c.client(timeout_s=10)
        try:
            client.write(1, [["t", 1000 + i, {"v": i}] for i in range(100)])
        finally:
            client.close()
        yield c
    finally:
        c.close()


def data_root(c: LocalCluster) -> str:
    return os.path.join(c.nodes[1].dir, "data")


def test_a_second_node_on_the_same_data_is_refused_naming_the_holder(node):
    pid = node.nodes[1].proc.pid
    log = os.path.join(node.nodes[1].dir, "node.log")
    log_before = open(log).read()
    p = vrepl("node", "--config", node.nodes[1].config_path)
    assert p.returncode == EXIT_IN_USE, p.stderr
    line = one_line(p)
    assert f"pid {pid}" in line and data_root(node) in line, line
    assert p.stdout == ""                               # never became ready
    # Refused before reading anything: the second process logged no recovery.
    assert "recovered" not in open(log).read()[len(log_before):]
    assert node.status(1) is not None                   # the first node is untouched


@pytest.mark.parametrize("command", ["restore", "replay"])
def test_restore_and_replay_into_a_running_nodes_vgroup_are_refused(node, tmp_path, command):
    pid = node.nodes[1].proc.pid
    vg = os.path.join(data_root(node), "vg1")
    before = sorted(os.listdir(vg))
    if command == "restore":
        p = vrepl("restore", "--from", node.nodes[1].replication, "--vgroup", "1", "--data", vg,
                  "--no-progress", VREPL_SECRET=SECRET)
    else:
        p = vrepl("replay", "--wal", os.path.join(vg, "wal"), "--data", vg, "--no-progress")
    assert p.returncode == EXIT_IN_USE, p.stderr
    line = one_line(p)
    assert f"pid {pid}" in line and vg in line and "vrepl node 1" in line, line
    assert sorted(os.listdir(vg)) == before             # nothing staged, nothing swapped
    assert node.status(1) is not None


def test_a_node_does_not_start_on_a_directory_a_restore_holds(tmp_path):
    """The other way round: a process holding a vgroup directory (as `vrepl restore` does
    while it runs) keeps a node off it, and the lock dies with its holder."""
    c = LocalCluster(str(tmp_path / "c"), 1, vgroup=1, quorum=1)
    vg = os.path.join(data_root(c), "vg1")
    holder = subprocess.Popen(
        python_argv("-c", "import sys, time; from vrepl.dirlock import lock_dir;"
                    " lock = lock_dir(sys.argv[1], 'vrepl restore'); print('held', flush=True);"
                    " time.sleep(60)", vg),
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        p = vrepl("node", "--config", c.nodes[1].config_path)
        assert p.returncode == EXIT_IN_USE, p.stderr
        line = one_line(p)
        assert f"pid {holder.pid}, vrepl restore" in line and vg in line, line
        assert not os.path.exists(os.path.join(vg, "wal"))     # nothing recovered or created
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    try:                                  # SIGKILL released the lock: the node starts
        c.start()
        c.wait_ready()
    finally:
        c.close()


@pytest.mark.parametrize("which", ["http", "replication"])
def test_an_address_in_use_is_one_line_and_exit_8(tmp_path, which):
    c = LocalCluster(str(tmp_path / "c"), 1, vgroup=1, quorum=1)
    host, port = getattr(c.nodes[1], which).rsplit(":", 1)
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind((host, int(port)))
    squatter.listen()
    try:
        p = vrepl("node", "--config", c.nodes[1].config_path)
    finally:
        squatter.close()
    assert p.returncode == EXIT_IN_USE, p.stderr
    line = one_line(p)
    what = "HTTP API" if which == "http" else "replication"
    assert f"{host}:{port}" in line and what in line and "in use" in line, line
    # The lock was given up on the way out: the node starts once the port is free.
    try:
        c.start()
        c.wait_ready()
    finally:
        c.close()


def test_restore_from_the_http_port_says_it_needs_the_replication_port(node, tmp_path):
    t0 = time.monotonic()
    p = vrepl("restore", "--from", node.nodes[1].http, "--vgroup", "1", "--data",
              str(tmp_path / "copy"), "--no-progress", VREPL_SECRET=SECRET)
    took = time.monotonic() - t0
    assert p.returncode == 4, p.stderr
    line = one_line(p)
    assert "replication port" in line and node.nodes[1].http in line, line
    # At once (it used to wait for its 10 s handshake timeout); the bound leaves room for
    # the interpreter's start on a loaded machine.
    assert took < 5.0, took
    assert node.status(1) is not None
