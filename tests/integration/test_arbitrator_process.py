"""The arbitrator as a real process on 127.0.0.1: grants, refusals, restarts, bad clients."""
import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from vrepl.replica.messages import ArbitratorGrant, ArbitratorRequest
from vrepl.testing.arbitrator_proc import ArbitratorProcess
from vrepl.transport import codec
from vrepl.transport.framed import FramedStream, client_handshake
from vrepl.transport.handshake import HandshakeError

pytestmark = pytest.mark.timeout(60)
SECRET = b"arbitrator-test-secret"


@pytest.fixture()
def arb(tmp_path):
    procs = []

    def start(lease_ms=600):
        # Short leases for quick tests: 600 ms backs the 500 ms asked below with the margin
        # (500 x 1.01 + 50 = 555 ms, docs/design.md §5).
        p = ArbitratorProcess(str(tmp_path), SECRET, lease_ms=lease_ms,
                              extra=("--lease-allowance-ms", "50"))
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop(signal.SIGKILL)


async def _client(port, node, vgroup=7, secret=SECRET):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    stream = FramedStream(reader, writer)
    await client_handshake(stream, secret=secret, kind=codec.ConnKind.ARBITRATOR,
                           vgroup_id=vgroup, node=node, target_node=codec.ARBITRATOR_NODE_ID)
    return stream


async def _ask(stream, vgroup, node, epoch, lease_ms=500) -> ArbitratorGrant:
    stream.send(ArbitratorRequest(vgroup, node, epoch, lease_ms))
    await stream.drain()
    msg = await asyncio.wait_for(stream.recv(), 5)
    assert isinstance(msg, ArbitratorGrant)
    return msg


def test_one_master_per_vgroup_and_epoch(arb):
    a = arb()

    async def run():
        n0 = await _client(a.port, 0)
        n1 = await _client(a.port, 1)
        assert (await _ask(n0, 7, 0, 1)).granted == 1
        assert (await _ask(n1, 7, 1, 1)).granted == 0       # same epoch, other node
        assert (await _ask(n1, 7, 1, 2)).granted == 0       # n0's lease is live
        assert (await _ask(n0, 7, 0, 1)).granted == 1       # renewal
        await asyncio.sleep(0.8)                            # n0 stops renewing: lease ends
        assert (await _ask(n1, 7, 1, 2)).granted == 1
        assert (await _ask(n0, 7, 0, 1)).granted == 0       # older epoch never again
        assert (await _ask(n0, 7, 0, 2)).granted == 0       # e2 belongs to n1
        n0.close(); n1.close()

    asyncio.run(run())


def test_restart_keeps_grants_and_holds_the_lease(arb, tmp_path):
    a = arb()

    async def grant():
        n0 = await _client(a.port, 0)
        assert (await _ask(n0, 7, 0, 5)).granted == 1
        n0.close()

    asyncio.run(grant())
    a.stop(signal.SIGKILL)  # crash right after granting
    b = arb()

    async def after():
        n1 = await _client(b.port, 1)
        n0 = await _client(b.port, 0)
        # The restarted arbitrator cannot know when n0 last renewed: n0's lease is held for a
        # full lease from the restart, and epoch 5 or older is never granted to n1.
        assert (await _ask(n1, 7, 1, 6)).granted == 0
        assert (await _ask(n1, 7, 1, 5)).granted == 0
        assert (await _ask(n0, 7, 0, 5)).granted == 1
        await asyncio.sleep(0.8)
        assert (await _ask(n1, 7, 1, 5)).granted == 0
        assert (await _ask(n1, 7, 1, 6)).granted == 1
        n0.close(); n1.close()

    asyncio.run(after())


def test_lease_longer_than_configured_refused(arb):
    a = arb()

    async def run():
        n0 = await _client(a.port, 0)
        g = await _ask(n0, 7, 0, 1, lease_ms=5000)
        assert g.granted == 0
        n0.close()

    asyncio.run(run())
    assert "lease of 5000 ms asked" in a.stop()


def test_bad_clients_refused_and_arbitrator_keeps_serving(arb):
    a = arb()

    async def run():
        with pytest.raises((HandshakeError, EOFError, ConnectionError)):
            await _client(a.port, 0, secret=b"wrong secret")
        # garbage bytes
        r, w = await asyncio.open_connection("127.0.0.1", a.port)
        w.write(os.urandom(200))
        await w.drain()
        assert await asyncio.wait_for(r.read(), 5) == b""
        w.close()
        # a peer-kind hello
        r, w = await asyncio.open_connection("127.0.0.1", a.port)
        stream = FramedStream(r, w)
        with pytest.raises((HandshakeError, EOFError, ConnectionError)):
            await client_handshake(stream, secret=SECRET, kind=codec.ConnKind.PEER,
                                   vgroup_id=7, node=0, target_node=1)
        w.close()
        # a request for another node than the one authenticated
        n0 = await _client(a.port, 0)
        n0.send(ArbitratorRequest(7, 1, 1, 500))
        await n0.drain()
        with pytest.raises((EOFError, ConnectionError)):
            await asyncio.wait_for(n0.recv(), 5)
        # still serving
        n2 = await _client(a.port, 2, vgroup=8)
        assert (await _ask(n2, 8, 2, 1)).granted == 1
        n2.close()

    asyncio.run(run())
    err = a.stop()
    assert "closed" in err


def test_bad_config_is_one_line_exit_2(tmp_path):
    cfg = tmp_path / "arb.toml"
    cfg.write_text('[arbitrator]\nport = "x"\n')
    proc = subprocess.run([sys.executable, "-m", "arbitrator.main", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("vrepl-arbitrator: error:")
    assert "port" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = subprocess.run([sys.executable, "-m", "arbitrator.main", "--port", "0"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "secret" in proc.stderr


def test_sigterm_stops_cleanly(arb):
    a = arb()
    t0 = time.monotonic()
    a.stop(signal.SIGTERM)
    assert a.proc.returncode == 0 and time.monotonic() - t0 < 5
