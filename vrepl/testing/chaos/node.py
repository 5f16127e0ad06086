"""A chaos-test node: one SyncInstance in its own process, a client write API over TCP, and
a control line protocol on stdin/stdout for the harness.

    python -m vrepl.testing.chaos.node CONFIG.json

Config: node_runner's keys (vgroup_id, replicas, self_index, data_path, secret, quorum,
arbitrator, options, log_file, lifetime_s) plus `client_port` (the write API listens on this
node's replica host, so in the namespaced topology only the bridge network reaches it).

Write API (one connection per client, requests answered in order):
    W KEY            ->  OK KEY VERSION EPOCH | NM KEY MASTER | FL KEY STATUS | ER KEY REASON
OK: confirmed (quorum durable). NM: this node is not master (nothing written; MASTER is its
hint or -). FL: failed or timed_out after the record was queued: outcome unknown. ER: refused
before anything was queued (not running, flow control): nothing written.

Control (stdin; the harness never uses the network):
    roles ID | stats ID | write ID KEY | quit
Events (stdout JSON lines): ready, role, roles, stats, write, error.

Versions: the app must forward strictly last_version + 1. This node allocates versions under
one lock; after any non-ok confirmation or role change it waits until nothing it forwarded is
still unanswered, then re-reads the log end (a refused forward does not consume its version).
Safety: exits when stdin closes, when its parent dies (PR_SET_PDEATHSIG) or after lifetime_s.
Must not: be used as a real vnode.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

from vrepl.errors import VreplError
from vrepl.replica import ConfirmStatus
from vrepl.sync import SyncCallbacks, SyncInstance
from vrepl.testing.node_runner import emit, run_node_process, sync_config

PAYLOAD_PREFIX = b"chaos|"
DRAIN_WAIT_S = 5.0     # longest wait for unanswered forwards before re-reading the log end
CONFIRM_WAIT_S = 10.0  # a forward unanswered this long is reported FL unknown
MAX_CLIENTS = 64


def payload_of(key: str) -> bytes:
    return PAYLOAD_PREFIX + key.encode()


def key_of(payload: bytes) -> str | None:
    return payload[len(PAYLOAD_PREFIX):].decode() if payload.startswith(PAYLOAD_PREFIX) else None


class ChaosNode:
    def __init__(self, conf: dict) -> None:
        self.conf = conf
        self.inst: SyncInstance | None = None
        self.alloc_lock = threading.Lock()      # held while choosing a version and forwarding
        self.state = threading.Condition()      # guards waiters / need_resync / role
        self.waiters: dict[int, list] = {}      # version -> [event, status]
        self.need_resync = True
        self.next_version = 0
        self.role = "unsynced"
        self.master: int | None = None
        self.epoch = 0
        self.clients = 0

    # -- callbacks (I/O thread; never block) -----------------------------------------------------

    def write_to_cache_batch(self, first: int, payloads: tuple[bytes, ...]) -> None:
        assert self.inst is not None
        self.inst.ack_forward(first + len(payloads) - 1)

    def confirm_forward_range(self, first: int, last: int, status: ConfirmStatus) -> None:
        with self.state:
            for v in range(first, last + 1):
                w = self.waiters.pop(v, None)
                if w is not None:
                    w[1] = status
                    w[0].set()
            if status != ConfirmStatus.OK:
                self.need_resync = True
            self.state.notify_all()

    def notify_role(self, role: str, epoch: int, master: int | None) -> None:
        with self.state:
            self.role, self.epoch, self.master = role, epoch, master
            self.need_resync = True
        emit("role", role=role, epoch=epoch, master=master)

    # -- writing ---------------------------------------------------------------------------------

    def write(self, key: str) -> tuple[str, str]:
        """One write: (code, detail) as in the write API."""
        inst = self.inst
        assert inst is not None
        with self.alloc_lock:
            with self.state:
                if self.role != "master":
                    return "NM", str(self.master if self.master is not None else "-")
                resync, self.need_resync = self.need_resync, False
                if resync:
                    self.state.wait_for(lambda: not self.waiters, DRAIN_WAIT_S)
            if resync:
                try:
                    r = inst.roles()
                except VreplError as exc:
                    return "ER", f"roles: {exc}".replace(" ", "_")
                if r["role"] != "master":
                    return "NM", str(r["master"] if r["master"] is not None else "-")
                self.next_version = r["last_version"] + 1
            v = self.next_version
            w = [threading.Event(), None]
            with self.state:
                self.waiters[v] = w
            try:
                inst.forward(v, payload_of(key))
            except VreplError as exc:
                with self.state:
                    self.waiters.pop(v, None)
                    self.need_resync = True
                return "ER", type(exc).__name__
            self.next_version = v + 1
            epoch = self.epoch
        if not w[0].wait(CONFIRM_WAIT_S):
            with self.state:
                self.waiters.pop(v, None)
                self.need_resync = True
            return "FL", "no_answer"
        status = w[1]
        if status == ConfirmStatus.OK:
            return "OK", f"{v} {epoch}"
        if status == ConfirmStatus.NOT_MASTER:
            return "NM", "-"
        return "FL", status.describe()

    # -- the client API (one thread per connection) ----------------------------------------------

    def serve_clients(self, host: str, port: int) -> None:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((host, port))
        srv.listen(MAX_CLIENTS)
        while True:
            conn, _ = srv.accept()
            with self.state:
                if self.clients >= MAX_CLIENTS:
                    conn.close()
                    continue
                self.clients += 1
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            fh = conn.makefile("rwb", buffering=0)
            for line in fh:
                parts = line.decode(errors="replace").split()
                if len(parts) != 2 or parts[0] != "W" or len(parts[1]) > 200:
                    break
                code, detail = self.write(parts[1])
                fh.write(f"{code} {parts[1]} {detail}\n".encode())
        except OSError:
            pass
        finally:
            conn.close()
            with self.state:
                self.clients -= 1

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        c = self.conf
        cfg = sync_config(c)
        cb = SyncCallbacks(
            write_to_cache_batch=self.write_to_cache_batch,
            confirm_forward_range=self.confirm_forward_range,
            notify_role=self.notify_role,
        )
        self.inst = SyncInstance(cfg, cb).start()
        if c.get("client_port"):
            threading.Thread(target=self.serve_clients, args=(cfg.me.host, c["client_port"]),
                             daemon=True).start()
        emit("ready", node=cfg.me.node, pid=os.getpid())

    def serve(self) -> None:
        deadline = time.monotonic() + float(self.conf.get("lifetime_s", 300))

        def watchdog() -> None:
            while time.monotonic() < deadline:
                time.sleep(0.5)
            emit("error", text="lifetime_s exceeded, exiting")
            os._exit(3)

        threading.Thread(target=watchdog, daemon=True).start()
        assert self.inst is not None
        for line in sys.stdin:
            parts = line.split()
            if not parts:
                continue
            cmd = parts[0]
            if cmd == "quit":
                break
            ident = int(parts[1]) if len(parts) > 1 else 0
            try:
                if cmd == "roles":
                    emit("roles", id=ident, state="running", **self.inst.roles())
                elif cmd == "stats":
                    emit("stats", id=ident, stats=self.inst.stats())
                elif cmd == "write":
                    key = parts[2]
                    threading.Thread(target=self._write_cmd, args=(ident, key), daemon=True).start()
                else:
                    emit("error", id=ident, text=f"unknown command {cmd}")
            except VreplError as exc:
                emit(cmd, id=ident, state="failed", text=str(exc))
        self.inst.stop()

    def _write_cmd(self, ident: int, key: str) -> None:
        code, detail = self.write(key)
        emit("write", id=ident, key=key, code=code, detail=detail)


def main(argv: list[str] | None = None) -> int:
    return run_node_process(argv, ChaosNode)


if __name__ == "__main__":
    sys.exit(main())
