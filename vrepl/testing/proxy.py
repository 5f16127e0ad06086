"""A TCP proxy on 127.0.0.1 whose link a test can cut and heal (a network partition between
two processes without root or namespaces).

Owns: one listening socket, the connections through it and their pump threads. `cut()`
closes every connection and refuses new ones (accepted, then closed at once) until `heal()`;
`close()` stops everything. Only ever connects to the loopback target it was given.
"""
from __future__ import annotations

import socket
import threading


class LinkProxy:
    def __init__(self, target_port: int, listen_port: int = 0, target_host: str = "127.0.0.1"):
        if target_host not in ("127.0.0.1", "localhost"):
            raise ValueError("LinkProxy only forwards to loopback")
        self.target = (target_host, target_port)
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind(("127.0.0.1", listen_port))
        self._lsock.listen(16)
        self.port = self._lsock.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._cut = False
        self._closed = False
        threading.Thread(target=self._accept_loop, name="proxy-accept", daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def heal(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._lsock.close()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._lsock.accept()
            except OSError:
                return
            with self._lock:
                refuse = self._cut
            if refuse:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
