"""vrepl.transport: the asyncio edge between the replica and the network (docs/embedding.md).

Owns: the wire codec (codec.py), the hello / HMAC handshake (handshake.py, state machines
without I/O; framed.py runs them over asyncio streams for the arbitrator), one TCP server per node and its connections (node.py), the
shared I/O thread (loop.py), the shared WAL thread (walflush.py) and the sync instance's
storage: WAL jobs, promise file, truncation (storage.py). The embedding API on top is vrepl/sync.py.
Must not: make replication decisions; those are vrepl.replica's.
"""
