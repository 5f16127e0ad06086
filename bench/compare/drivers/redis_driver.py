"""Redis: 1 master + 2 replicas on 127.0.0.1; a write is confirmed by `WAIT 1 <timeout>`.

WAIT 1 returns once the master and at least 1 of the 2 replicas have the write: quorum 2 of 3,
the semantics vrepl gives with quorum 2. A batch is N pipelined SETs followed by one WAIT 1 in
the same round trip. The client is a minimal RESP client over a socket (below), so no client
library cost or dependency enters the figures; it pre-encodes a whole batch into one send.

fsync: in the `fsync` mode every server runs with `appendonly yes`, `appendfsync always`: the
master fsyncs its AOF before replying, and a replica fsyncs its AOF in the same event-loop
iteration before its output (including the REPLCONF ACK that WAIT counts) is written. Redis
7.0 does not promise that ordering for WAIT; Redis 7.2's WAITAOF would, Debian 12 ships 7.0.
In the `nofsync` mode: `appendonly no` (no AOF at all). RDB snapshots are off (`--save ''`).
"""
from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

from ..install import ensure_apt, tool_version
from ..procs import ProcessRegistry, free_ports, wait_port
from .base import Driver, FsyncSetting

WAIT_TIMEOUT_MS = 2000


class RespError(RuntimeError):
    pass


def encode_command(*args: bytes) -> bytes:
    """RESP array of bulk strings: encode_command(b'SET', b'k', b'v')."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(parts)


class RespConnection:
    """A blocking RESP2 connection that sends pre-encoded commands and reads replies.
    Replies: simple string -> bytes, error -> RespError instance (returned, not raised, so a
    pipeline reads all its replies), integer -> int, bulk -> bytes or None, array -> list."""

    def __init__(self, port: int, timeout_s: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.pos = 0

    def close(self) -> None:
        self.sock.close()

    def _fill(self) -> None:
        if self.pos > 65536:
            del self.buf[:self.pos]
            self.pos = 0
        data = self.sock.recv(262144)
        if not data:
            raise ConnectionError("redis closed the connection")
        self.buf += data

    def _line(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n", self.pos)
            if end >= 0:
                line = bytes(self.buf[self.pos:end])
                self.pos = end + 2
                return line
            self._fill()

    def read_reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            return RespError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) - self.pos < n + 2:
                self._fill()
            data = bytes(self.buf[self.pos:self.pos + n])
            self.pos += n + 2
            return data
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read_reply() for _ in range(n)]
        raise RespError(f"unexpected RESP reply type {line[:20]!r}")

    def call(self, *args: bytes):
        self.sock.sendall(encode_command(*args))
        reply = self.read_reply()
        if isinstance(reply, RespError):
            raise reply
        return reply

    def pipeline(self, payload: bytes, n_replies: int) -> list:
        self.sock.sendall(payload)
        return [self.read_reply() for _ in range(n_replies)]


class RedisClient:
    """write_one: SET then WAIT 1 in one round trip; write_batch: N SETs then WAIT 1."""

    def __init__(self, port: int):
        self.conn = RespConnection(port)
        self.wait = encode_command(b"WAIT", b"1", b"%d" % WAIT_TIMEOUT_MS)

    def _check(self, replies: list) -> None:
        for r in replies[:-1]:
            if isinstance(r, RespError):
                raise r
        acked = replies[-1]
        if isinstance(acked, RespError):
            raise acked
        if acked < 1:
            raise TimeoutError(f"WAIT 1 returned {acked}: no replica confirmed in "
                               f"{WAIT_TIMEOUT_MS} ms")

    def write_one(self, key: bytes, value: bytes) -> None:
        self._check(self.conn.pipeline(encode_command(b"SET", key, value) + self.wait, 2))

    def write_batch(self, items: list[tuple[bytes, bytes]]) -> None:
        payload = b"".join([encode_command(b"SET", k, v) for k, v in items]) + self.wait
        self._check(self.conn.pipeline(payload, len(items) + 1))

    def close(self) -> None:
        self.conn.close()


class RedisClientFactory:
    def __init__(self, port: int):
        self.port = port

    def __call__(self) -> RedisClient:
        return RedisClient(self.port)


class RedisDriver(Driver):
    name = "redis"

    def __init__(self):
        self.master_port: int | None = None

    def prepare(self, allow_install: bool) -> str | None:
        return ensure_apt("redis-server", "redis-server", allow_install)

    def version(self) -> str:
        return tool_version(["redis-server", "--version"])

    def fsync_setting(self, fsync: bool) -> FsyncSetting:
        if fsync:
            return FsyncSetting("fsync", "appendonly yes, appendfsync always (every server "
                                "fsyncs its AOF before replying/acking)", True)
        return FsyncSetting("nofsync", "appendonly no (no AOF, no RDB): memory only", False)

    def start(self, workdir: Path, fsync: bool, procs: ProcessRegistry) -> None:
        ports = free_ports(3)
        self.master_port = ports[0]
        binary = shutil.which("redis-server")
        persistence = (["--appendonly", "yes", "--appendfsync", "always"] if fsync
                       else ["--appendonly", "no"])
        servers = []
        for i, port in enumerate(ports):
            d = workdir / f"redis{i}"
            d.mkdir()
            argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d),
                    "--save", "", "--daemonize", "no", "--logfile", "",
                    # The harness's writes stay far below these, but a replica must never be
                    # dropped for a full output buffer during the throughput run.
                    "--client-output-buffer-limit", "replica 0 0 0",
                    "--repl-backlog-size", "256mb", "--repl-diskless-sync-delay", "0",
                    *persistence]
            if i > 0:
                argv += ["--replicaof", "127.0.0.1", str(ports[0])]
            servers.append(procs.spawn(f"redis{i}", argv))
        for port, proc in zip(ports, servers):
            wait_port(port, 20, proc)
        self._wait_replicas(timeout_s=30)

    def _wait_replicas(self, timeout_s: float) -> None:
        conn = RespConnection(self.master_port)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                info = conn.call(b"INFO", b"replication").decode()
                online = sum(1 for line in info.splitlines()
                             if line.startswith("slave") and "state=online" in line)
                if online == 2:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {online} of 2 redis replicas online after "
                                       f"{timeout_s} s")
                time.sleep(0.1)
            # A confirmed write proves the path end to end before measuring.
            RedisClient(self.master_port).write_one(b"ready", b"1")
        finally:
            conn.close()

    def stop(self) -> None:
        self.master_port = None

    def client_factory(self) -> RedisClientFactory:
        return RedisClientFactory(self.master_port)
